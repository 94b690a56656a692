"""Checkpoint retention, deletion and download through the master, on both databases, with
a shared_fs storage in a temporary directory (the object stores are exercised end to end
in tests/e2e/test_object_store_checkpoints.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.services.checkpoint_gc import CheckpointDeleter
from tests.api.test_trial_reports import Trial, ok, report, save, submit


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


def config_for(storage: Path, **retention: int) -> str:
    keys = "".join(f", {k}: {v}" for k, v in retention.items())
    return f"""
name: gc
entrypoint: python3 train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 100}}}}
checkpoint_storage: {{type: shared_fs, host_path: {storage}{keys}}}
"""


async def checkpoint_with_files(
    api: httpx.AsyncClient, storage: Path, trial: Trial, steps: int, loss: float | None
) -> str:
    """Write a checkpoint's files as a trial would, report its validation, then it."""
    if loss is not None:
        await ok(report(api, trial, "validation", steps, {"loss": loss}))
    uuid = await save(api, trial, steps)
    (storage / uuid).mkdir(parents=True)
    (storage / uuid / "model.pt").write_bytes(bytes([steps]) * 2048)
    (storage / uuid / "optimizer.pt").write_bytes(bytes([steps]) * 1024)
    return uuid


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def states(api: httpx.AsyncClient, experiment_id: int) -> dict[int, tuple[str, str]]:
    found = (await ok(api.get(f"/api/v1/experiments/{experiment_id}/checkpoints")))["checkpoints"]
    return {c["stepsCompleted"]: (c["storageState"], c["state"]) for c in found}


async def deleter_pass(app: FastAPI) -> None:
    await CheckpointDeleter(app.state.session_factory).run_once()


async def test_retention_deletes_what_the_settings_do_not_keep(
    app: FastAPI, api: httpx.AsyncClient, storage: Path
) -> None:
    (trial,) = await submit(api, config_for(storage))  # keeps the best and the latest
    uuids = {
        steps: await checkpoint_with_files(api, storage, trial, steps, loss)
        for steps, loss in ((1, 0.5), (2, 0.1), (3, 0.9), (4, None))
    }
    await ok(api.post(f"/api/v1/experiments/{trial.experiment_id}/kill"))
    assert await states(api, trial.experiment_id) == {
        1: ("DELETING", "STATE_PARTIALLY_DELETED"),
        2: ("ACTIVE", "STATE_COMPLETED"),
        3: ("DELETING", "STATE_PARTIALLY_DELETED"),
        4: ("ACTIVE", "STATE_COMPLETED"),
    }
    await deleter_pass(app)
    assert await states(api, trial.experiment_id) == {
        1: ("DELETED", "STATE_DELETED"),
        2: ("ACTIVE", "STATE_COMPLETED"),
        3: ("DELETED", "STATE_DELETED"),
        4: ("ACTIVE", "STATE_COMPLETED"),
    }
    assert listing(storage) == sorted([uuids[2], uuids[4]])
    # A deleted checkpoint still says why it went (users saw checkpoints vanish seconds
    # after a run with no reason shown).
    gone = (await ok(api.get(f"/api/v1/checkpoints/{uuids[1]}")))["checkpoint"]
    assert gone["stateReason"] == (
        "retention: not among save_experiment_best=0, save_trial_best=1 or save_trial_latest=1"
    )
    # Only Determined's COMPLETED ones when its client filters by state.
    found = await ok(
        api.get(
            f"/api/v1/experiments/{trial.experiment_id}/checkpoints",
            params={"states": "STATE_COMPLETED"},
        )
    )
    assert {c["uuid"] for c in found["checkpoints"]} == {uuids[2], uuids[4]}


async def test_deleting_checkpoints_is_all_or_nothing_and_spares_a_running_trials_latest(
    app: FastAPI, api: httpx.AsyncClient, storage: Path
) -> None:
    (trial,) = await submit(api, config_for(storage, save_trial_latest=5))
    first = await checkpoint_with_files(api, storage, trial, 1, 0.5)
    latest = await checkpoint_with_files(api, storage, trial, 2, 0.4)

    reply = await api.request(
        "DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [first, "no-such-uuid"]}
    )
    assert reply.status_code == 404 and "no-such-uuid" in reply.json()["message"]
    reply = await api.request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [latest]})
    assert reply.status_code == 400, reply.text
    assert f"{latest} is the latest checkpoint of trial {trial.id}" in reply.json()["message"]
    reply = await api.request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": []})
    assert reply.status_code == 400 and "checkpointUuids" in reply.json()["message"]
    assert await states(api, trial.experiment_id) == {
        1: ("ACTIVE", "STATE_COMPLETED"),
        2: ("ACTIVE", "STATE_COMPLETED"),
    }

    await ok(api.request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [first]}))
    found = (await ok(api.get(f"/api/v1/checkpoints/{first}")))["checkpoint"]
    assert found["storageState"] == "DELETING"
    assert found["stateReason"] == "deleted by determined"
    await deleter_pass(app)
    assert (await states(api, trial.experiment_id))[1][0] == "DELETED"
    found = (await ok(api.get(f"/api/v1/checkpoints/{first}")))["checkpoint"]
    assert found["stateReason"] == "deleted by determined"
    assert not (storage / first).exists() and (storage / latest).is_dir()
    # Asking again changes nothing.
    await ok(api.request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [first]}))
    assert (await states(api, trial.experiment_id))[1][0] == "DELETED"


async def test_a_checkpoint_downloads_as_a_tar_gz_until_it_is_deleted(
    app: FastAPI, api: httpx.AsyncClient, storage: Path
) -> None:
    (trial,) = await submit(api, config_for(storage, save_trial_latest=5))
    uuid = await checkpoint_with_files(api, storage, trial, 3, 0.2)
    (storage / uuid / "sub").mkdir()
    (storage / uuid / "sub" / "notes.txt").write_text("kept")
    for path in (f"/checkpoints/{uuid}", f"/api/v1/checkpoints/{uuid}"):
        reply = await api.get(path, headers={"Accept": "application/gzip"})
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"] == "application/gzip"
        with tarfile.open(fileobj=io.BytesIO(reply.content), mode="r:gz") as tar:
            files: dict[str, Any] = {
                m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers()
            }
        assert files == {
            "model.pt": bytes([3]) * 2048,
            "optimizer.pt": bytes([3]) * 1024,
            "sub/notes.txt": b"kept",
        }
    # Without the header, the same path on /api/v1 is the checkpoint's JSON.
    assert (await ok(api.get(f"/api/v1/checkpoints/{uuid}")))["checkpoint"]["uuid"] == uuid

    await ok(api.post(f"/api/v1/experiments/{trial.experiment_id}/kill"))
    await ok(api.request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [uuid]}))
    reply = await api.get(f"/checkpoints/{uuid}", headers={"Accept": "application/gzip"})
    assert reply.status_code == 404 and "DELETING" in reply.json()["message"]


async def test_a_checkpoint_whose_files_are_missing_is_a_503_not_a_broken_download(
    api: httpx.AsyncClient, storage: Path
) -> None:
    (trial,) = await submit(api, config_for(storage))
    uuid = await save(api, trial, 1)  # reported, but nothing was written
    reply = await api.get(f"/checkpoints/{uuid}", headers={"Accept": "application/gzip"})
    assert reply.status_code == 503, reply.text
    assert uuid in reply.json()["message"]


async def test_deleting_an_experiment_removes_its_checkpoints_then_it(
    app: FastAPI, api: httpx.AsyncClient, storage: Path
) -> None:
    (trial,) = await submit(api, config_for(storage, save_trial_latest=5))
    uuid = await checkpoint_with_files(api, storage, trial, 1, 0.3)
    experiment = f"/api/v1/experiments/{trial.experiment_id}"
    reply = await api.delete(experiment)
    assert reply.status_code == 400, reply.text
    assert "kill it or wait for it to end" in reply.json()["message"]
    assert (storage / uuid).is_dir()

    await ok(api.post(f"{experiment}/kill"))
    await ok(api.delete(experiment))
    assert (await ok(api.get(experiment)))["experiment"]["state"] == "STATE_DELETING"
    await ok(api.delete(experiment))  # again: still in progress, nothing more
    await deleter_pass(app)  # the files
    assert not (storage / uuid).exists()
    await deleter_pass(app)  # then the experiment
    assert (await api.get(experiment)).status_code == 404
    assert (await api.get(f"/api/v1/checkpoints/{uuid}")).status_code == 404
