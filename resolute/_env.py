"""What a rank learns from its environment: the DET_* variables the master sets, and the
torchrun-style RANK / WORLD_SIZE ones. Without DET_TRIAL_ID the process runs in local mode."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class BadEnvironment(RuntimeError):
    """A variable the master sets is malformed: the launch is broken, not the user's code."""


@dataclass(frozen=True)
class Environment:
    cluster: bool
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_url: str | None = None
    session_token: str | None = None
    trial_id: int | None = None
    experiment_id: int | None = None
    run_id: int | None = None
    allocation_id: str | None = None
    task_id: str | None = None
    trial_seed: int = 0
    hparams: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    steps_completed: int = 0
    latest_checkpoint: str | None = None
    global_batch_size: int | None = None
    per_slot_batch_size: int | None = None


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise BadEnvironment(f"{name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadEnvironment(f"{name}={raw!r} is not an integer") from None


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    return _int(env, name) if env.get(name) else None


def _json_object(env: Mapping[str, str], name: str) -> dict[str, Any]:
    raw = env.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise BadEnvironment(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadEnvironment(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


def _batch_size(hparams: Mapping[str, Any]) -> int | None:
    value = hparams.get("global_batch_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_environment(
    env: Mapping[str, str] | None = None,
    *,
    hparams: Mapping[str, Any] | None = None,
    seed: int = 0,
    config: Mapping[str, Any] | None = None,
    latest_checkpoint: str | None = None,
) -> Environment:
    """The keyword arguments stand in for the master in local mode; a cluster ignores them."""
    env = os.environ if env is None else env
    rank = _int(env, "RANK", 0)
    world_size = _int(env, "WORLD_SIZE", 1)
    local_rank = _int(env, "LOCAL_RANK", 0)
    local_world_size = _int(env, "LOCAL_WORLD_SIZE", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise BadEnvironment(f"RANK={rank} is not within WORLD_SIZE={world_size}")
    if not env.get("DET_TRIAL_ID"):
        local_hparams = dict(hparams or {})
        global_batch = _batch_size(local_hparams)
        return Environment(
            cluster=False,
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            trial_seed=seed,
            hparams=local_hparams,
            config=dict(config or {}),
            latest_checkpoint=latest_checkpoint,
            global_batch_size=global_batch,
            per_slot_batch_size=None if global_batch is None else global_batch // world_size,
        )
    master_url = env.get("DET_MASTER")
    if not master_url:
        raise BadEnvironment("DET_TRIAL_ID is set but DET_MASTER is not")
    trial_hparams = _json_object(env, "DET_HPARAMS")
    global_batch = _optional_int(env, "DET_GLOBAL_BATCH_SIZE")
    if global_batch is None:
        global_batch = _batch_size(trial_hparams)
    per_slot = _optional_int(env, "DET_PER_SLOT_BATCH_SIZE")
    if per_slot is None and global_batch is not None:
        per_slot = global_batch // world_size
    return Environment(
        cluster=True,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        master_url=master_url.rstrip("/"),
        session_token=env.get("DET_SESSION_TOKEN") or None,
        trial_id=_int(env, "DET_TRIAL_ID"),
        experiment_id=_optional_int(env, "DET_EXPERIMENT_ID"),
        run_id=_optional_int(env, "DET_TRIAL_RUN_ID"),
        allocation_id=env.get("DET_ALLOCATION_ID") or None,
        task_id=env.get("DET_TASK_ID") or None,
        trial_seed=_int(env, "DET_TRIAL_SEED", 0),
        hparams=trial_hparams,
        config=_json_object(env, "DET_EXPERIMENT_CONFIG"),
        steps_completed=_int(env, "DET_STEPS_COMPLETED", 0),
        latest_checkpoint=env.get("DET_LATEST_CHECKPOINT") or None,
        global_batch_size=global_batch,
        per_slot_batch_size=per_slot,
    )


def max_length_batches(config: Mapping[str, Any]) -> int | None:
    """searcher.max_length in batches: an int, or {batches: N}; records/epochs have no
    batch count the library could know, so they give None. The ASHA searchers' max_time
    counts when their time_metric is batches."""
    searcher = config.get("searcher")
    if not isinstance(searcher, Mapping):
        return None
    max_time = searcher.get("max_time")
    if searcher.get("time_metric") == "batches" and isinstance(max_time, int):
        return max_time
    value = searcher.get("max_length")
    if isinstance(value, Mapping):
        value = value.get("batches")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
