"""Plain helpers that build configs and objects through the public API."""

from __future__ import annotations

import base64
from typing import Any

import httpx

EXPERIMENT_YAML = """\
name: mnist-random
entrypoint: python3 train.py
hyperparameters:
  global_batch_size: 64
  lr:
    type: double
    minval: 0.001
    maxval: 0.1
  layers:
    type: int
    minval: 1
    maxval: 4
searcher:
  name: random
  metric: validation_loss
  max_trials: 3
  max_length:
    batches: 100
reproducibility:
  experiment_seed: 1234
"""

TEMPLATE_CONFIG: dict[str, Any] = {
    "description": "template-cpu",
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/mnt/ckpt", "storage_path": "runs"},
    "resources": {"slots_per_trial": 2, "priority": 10},
    # A host path every machine has: a master that shares its agents' host checks it exists.
    "bind_mounts": [{"host_path": "/usr", "container_path": "/usr", "read_only": True}],
    "environment": {"environment_variables": ["FROM_TEMPLATE=1"]},
}


def v1_file(path: str, content: bytes = b"print('hi')\n", kind: int = 48) -> dict[str, Any]:
    return {
        "path": path,
        "type": kind,
        "content": base64.b64encode(content).decode(),
        "mtime": "1700000000",
        "mode": 0o644,
        "uid": 0,
        "gid": 0,
    }


async def create_template(
    api: httpx.AsyncClient, name: str, config: dict[str, Any] | None = None
) -> httpx.Response:
    body = {"name": name, "config": config or TEMPLATE_CONFIG, "workspaceId": 0}
    return await api.post(f"/api/v1/templates/{name}", json=body)


async def create_experiment(
    api: httpx.AsyncClient, config: str = EXPERIMENT_YAML, **fields: Any
) -> httpx.Response:
    body: dict[str, Any] = {
        "activate": True,
        "config": config,
        "modelDefinition": [v1_file("train.py")],
        "parentId": None,
        "projectId": None,
        "template": None,
        "validateOnly": False,
    }
    body.update(fields)
    return await api.post("/api/v1/experiments", json=body)


async def row_counts(api: httpx.AsyncClient) -> tuple[int, int]:
    """(experiments, templates) as a user sees them: proof that a bad request wrote nothing.

    Trials and allocations cannot exist without an experiment, but a stray one would
    show in the task list, so that is checked to be empty of orphans too."""
    experiments = (await api.get("/api/v1/experiments")).json()["pagination"]["total"]
    templates = (await api.get("/api/v1/templates")).json()["pagination"]["total"]
    tasks = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    known = {e["id"] for e in (await api.get("/api/v1/experiments")).json()["experiments"]}
    assert {t["experimentId"] for t in tasks.values()} <= known
    return experiments, templates
