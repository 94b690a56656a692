"""Forking an experiment (issue 32): POST /api/v1/experiments with `parentId`, as Determined's
web UI forks, on both databases: the fork takes the parent's model definition and secrets
unless it brings its own, says where it came from, and forgets it when the parent goes."""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path
from typing import Any

import httpx
import yaml
from fastapi import FastAPI

from master.db.models import ExperimentModel
from master.db.session import session_scope
from tests.api.test_access import refusal
from tests.api.test_checkpoint_gc import deleter_pass
from tests.api.test_trial_reports import ok
from tests.factories import create_experiment, v1_file

SCRIPT = b"print('the parent trains')\n"
PARENT = """\
name: parent
entrypoint: python3 train.py
hyperparameters: {lr: 0.1}
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""
S3 = """\
checkpoint_storage:
  type: s3
  bucket: models
  access_key: AKIAPARENT
  secret_key: parent-secret-key
"""


async def new_experiment(api: httpx.AsyncClient, config: str, **fields: Any) -> dict[str, Any]:
    reply = await create_experiment(api, config, **fields)
    assert reply.status_code == 200, reply.text
    experiment: dict[str, Any] = reply.json()["experiment"]
    return experiment


async def model_files(api: httpx.AsyncClient, experiment_id: int) -> dict[str, bytes]:
    body = await ok(api.get(f"/api/v1/experiments/{experiment_id}/model_def"))
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(body["b64Tgz"]))) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


async def test_a_fork_takes_the_parents_files_and_records_its_parent(
    api: httpx.AsyncClient,
) -> None:
    parent = await new_experiment(api, PARENT, modelDefinition=[v1_file("train.py", SCRIPT)])
    # What the web UI sends: the parent's config, edited, and no files.
    config = {**parent["config"], "hyperparameters": {"lr": 0.05}, "name": "lr halved"}
    fork = await new_experiment(
        api, yaml.safe_dump(config), parentId=parent["id"], modelDefinition=None
    )
    assert fork["forkedFrom"] == parent["id"] and parent["forkedFrom"] is None
    assert fork["config"]["hyperparameters"]["lr"]["val"] == 0.05
    assert fork["name"] == "lr halved"
    assert await model_files(api, fork["id"]) == {"train.py": SCRIPT}
    # Its own files, when it brings them, win over the parent's.
    own = await new_experiment(
        api, PARENT, parentId=parent["id"], modelDefinition=[v1_file("train.py", b"mine")]
    )
    assert await model_files(api, own["id"]) == {"train.py": b"mine"}
    listed = await ok(api.get("/api/v1/experiments"))
    assert {e["id"]: e["forkedFrom"] for e in listed["experiments"]} == {
        parent["id"]: None,
        fork["id"]: parent["id"],
        own["id"]: parent["id"],
    }


async def test_a_fork_of_an_unknown_experiment_is_refused_and_stores_nothing(
    api: httpx.AsyncClient,
) -> None:
    before = (await ok(api.get("/api/v1/experiments")))["pagination"]["total"]
    reply = await create_experiment(api, PARENT, parentId=999999, modelDefinition=None)
    assert refusal(reply, 400) == "parentId: experiment 999999 not found"
    assert (await ok(api.get("/api/v1/experiments")))["pagination"]["total"] == before


async def test_a_forks_masked_secrets_are_the_parents(app: FastAPI, api: httpx.AsyncClient) -> None:
    parent = await new_experiment(api, PARENT + S3)
    shown = parent["config"]["checkpoint_storage"]
    assert shown["secret_key"] == "********"  # how the API shows it
    fork = await new_experiment(
        api, yaml.safe_dump(parent["config"]), parentId=parent["id"], modelDefinition=None
    )
    async with session_scope(app.state.session_factory) as session:
        stored = await session.get(ExperimentModel, fork["id"])
        assert stored is not None
        assert stored.config["checkpoint_storage"]["secret_key"] == "parent-secret-key"
        assert stored.config["checkpoint_storage"]["access_key"] == "AKIAPARENT"
    # Without a parent to take it from, a masked secret is refused as before.
    reply = await create_experiment(api, yaml.safe_dump(parent["config"]))
    assert "checkpoint_storage.secret_key: ******** is how the master shows a secret" in refusal(
        reply, 400
    )


async def test_deleting_the_parent_leaves_the_fork_without_one(
    app: FastAPI, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    storage = f"checkpoint_storage: {{type: shared_fs, host_path: {tmp_path}}}\n"
    parent = await new_experiment(api, PARENT + storage)
    fork = await new_experiment(
        api, yaml.safe_dump(parent["config"]), parentId=parent["id"], modelDefinition=None
    )
    await ok(api.post(f"/api/v1/experiments/{parent['id']}/kill"))
    await ok(api.delete(f"/api/v1/experiments/{parent['id']}"))
    await deleter_pass(app)
    assert (await api.get(f"/api/v1/experiments/{parent['id']}")).status_code == 404
    kept = (await ok(api.get(f"/api/v1/experiments/{fork['id']}")))["experiment"]
    assert kept["forkedFrom"] is None and kept["state"] == "STATE_ACTIVE"
