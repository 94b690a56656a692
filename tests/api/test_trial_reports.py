"""What trial code reports (metrics, checkpoints, progress) and what users read back:
metrics, workloads, checkpoints, best validation, trial and experiment summaries."""

from __future__ import annotations

import json
import math
import uuid as uuidlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from master.core.thinning import FIRST_REPORT_LEVEL
from master.db.models import CheckpointModel, ExperimentModel, TrialMetricModel, TrialModel
from master.db.session import session_scope
from master.services import scheduler, trial_reports
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_agent_link import connect, exited, hub_of, of_kind, sent
from tests.factories import create_experiment, row_counts

CONFIG = """
name: reports
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 100}}
"""
TWO_TRIALS_BY = """
name: best
entrypoint: python3 train.py
hyperparameters: {{lr: {{type: double, minval: 0.001, maxval: 0.1}}}}
searcher: {{name: random, {searcher}, max_trials: 2, max_length: {{batches: 100}}}}
"""
THREE_TRIALS = """
name: three
entrypoint: python3 train.py
hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}
searcher: {name: random, metric: loss, max_trials: 3, max_length: {batches: 100}}
"""


@dataclass
class Trial:
    id: int
    run_id: int
    allocation_id: str
    task_id: str
    experiment_id: int


async def submit(api: httpx.AsyncClient, config: str = CONFIG) -> list[Trial]:
    """An experiment's queued trials, each with its first allocation ("<trial>.<run>")."""
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    tasks = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    trials = [
        Trial(
            t["trialId"],
            int(t["allocationId"].split(".")[1]),
            t["allocationId"],
            t["taskId"],
            experiment_id,
        )
        for t in tasks.values()
        if t["experimentId"] == experiment_id
    ]
    return sorted(trials, key=lambda t: t.id)


def metrics_body(
    trial: Trial,
    group: str,
    steps: int,
    values: dict[str, Any],
    *,
    run_id: int | None = None,
    trial_id: int | None = None,
) -> dict[str, Any]:
    """The body Determined's harness (and resolute's library) posts."""
    return {
        "group": group,
        "metrics": {
            "trialId": trial.id if trial_id is None else trial_id,
            "trialRunId": trial.run_id if run_id is None else run_id,
            "stepsCompleted": steps,
            "metrics": {"avgMetrics": values, "batchMetrics": None},
            "reportTime": None,
        },
    }


async def report(
    api: httpx.AsyncClient,
    trial: Trial,
    group: str,
    steps: int,
    values: dict[str, Any],
    **overrides: Any,
) -> httpx.Response:
    return await api.post(
        f"/api/v1/trials/{trial.id}/metrics",
        json=metrics_body(trial, group, steps, values, **overrides),
    )


async def ok(request: Awaitable[httpx.Response]) -> dict[str, Any]:
    """The reply's JSON, after checking the request succeeded."""
    response = await request
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def curve(api: httpx.AsyncClient, trial: Trial, *groups: str) -> list[tuple[Any, ...]]:
    """(group, step, metrics) rows as GET /trials/{id}/metrics shows them."""
    body = await ok(api.get(f"/api/v1/trials/{trial.id}/metrics", params={"group": list(groups)}))
    return [(m["group"], m["stepsCompleted"], m["metrics"]) for m in body["metrics"]]


async def trial_json(api: httpx.AsyncClient, trial: Trial) -> dict[str, Any]:
    trial_view: dict[str, Any] = (await ok(api.get(f"/api/v1/trials/{trial.id}")))["trial"]
    return trial_view


async def experiment_json(api: httpx.AsyncClient, experiment_id: int) -> dict[str, Any]:
    experiment: dict[str, Any] = (await ok(api.get(f"/api/v1/experiments/{experiment_id}")))[
        "experiment"
    ]
    return experiment


def checkpoint_body(
    trial: Trial, steps: int, uuid: str | None = None, **fields: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "uuid": uuid or str(uuidlib.uuid4()),
        "state": "STATE_COMPLETED",
        "metadata": {"steps_completed": steps, "framework": "torch"},
        "resources": {"model.pt": "2048", "optimizer.pt": "1024"},
        "training": {"trialId": trial.id},
        "taskId": trial.task_id,
        "allocationId": trial.allocation_id,
        "reportTime": None,
        "storageId": None,
    }
    body.update(fields)
    return body


async def save(api: httpx.AsyncClient, trial: Trial, steps: int, uuid: str | None = None) -> str:
    body = checkpoint_body(trial, steps, uuid)
    await ok(api.post("/api/v1/checkpoints", json=body))
    return str(body["uuid"])


# -- metrics --------------------------------------------------------------------------------


async def test_reported_metrics_read_back_by_group_and_step(api: httpx.AsyncClient) -> None:
    (trial,) = await submit(api)
    for steps, loss in ((10, 0.9), (20, 0.7)):
        assert await ok(report(api, trial, "training", steps, {"loss": loss})) == {}
    await ok(report(api, trial, "validation", 20, {"loss": 0.8, "accuracy": 0.6}))
    await ok(report(api, trial, "inference", 20, {"latency_ms": 3}))

    assert await curve(api, trial, "training") == [
        ("training", 10, {"loss": 0.9}),
        ("training", 20, {"loss": 0.7}),
    ]
    assert await curve(api, trial, "validation") == [
        ("validation", 20, {"loss": 0.8, "accuracy": 0.6})
    ]
    everything = await curve(api, trial)
    assert ("inference", 20, {"latency_ms": 3}) in everything and len(everything) == 4
    body = await ok(api.get(f"/api/v1/trials/{trial.id}/metrics"))
    assert {m["trialRunId"] for m in body["metrics"]} == {trial.run_id}
    assert all(m["reportTime"] for m in body["metrics"])


async def test_workloads_are_ordered_by_step_then_training_validation_checkpoint(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    # Reported out of order on purpose: the view sorts them.
    await ok(report(api, trial, "validation", 10, {"loss": 0.5}))
    uuid = await save(api, trial, 10)
    await ok(report(api, trial, "training", 10, {"loss": 0.6}))
    await ok(report(api, trial, "training", 20, {"loss": 0.4}))
    await ok(report(api, trial, "training", 5, {"loss": 0.8}))
    await ok(report(api, trial, "inference", 10, {"latency_ms": 3}))  # not a workload

    body = await ok(api.get(f"/api/v1/trials/{trial.id}/workloads"))
    kinds = [(next(iter(w)), next(iter(w.values()))["totalBatches"]) for w in body["workloads"]]
    assert kinds == [
        ("training", 5),
        ("training", 10),
        ("validation", 10),
        ("checkpoint", 10),
        ("training", 20),
    ]
    assert body["pagination"]["total"] == 5 and body["pagination"]["endIndex"] == 5
    training = body["workloads"][1]["training"]
    assert training["metrics"]["avgMetrics"] == {"loss": 0.6}
    assert training["endTime"] and training["numInputs"] == 0
    checkpoint = body["workloads"][3]["checkpoint"]
    assert checkpoint["uuid"] == uuid and checkpoint["state"] == "STATE_COMPLETED"
    assert checkpoint["resources"] == {"model.pt": "2048", "optimizer.pt": "1024"}

    page = await ok(
        api.get(f"/api/v1/trials/{trial.id}/workloads", params={"offset": 1, "limit": 2})
    )
    assert [next(iter(w)) for w in page["workloads"]] == ["training", "validation"]
    assert page["pagination"] == {
        "offset": 1,
        "limit": 2,
        "startIndex": 1,
        "endIndex": 3,
        "total": 5,
    }
    tail = await ok(
        api.get(f"/api/v1/trials/{trial.id}/workloads", params={"offset": 4, "limit": 10})
    )
    assert [next(iter(w)) for w in tail["workloads"]] == ["training"]
    assert (tail["pagination"]["endIndex"], tail["pagination"]["total"]) == (5, 5)


async def test_the_same_step_reported_again_replaces_the_value(api: httpx.AsyncClient) -> None:
    (trial,) = await submit(api)
    await ok(report(api, trial, "training", 10, {"loss": 0.9, "stale": 1}))
    await ok(report(api, trial, "training", 10, {"loss": 0.5}))
    assert await curve(api, trial, "training") == [("training", 10, {"loss": 0.5})]
    workloads = (await ok(api.get(f"/api/v1/trials/{trial.id}/workloads")))["workloads"]
    assert len(workloads) == 1


async def test_report_ordinals_count_the_reports_kept_across_a_resume(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """What the compare chart thins by: each group numbered on its own, a replaced step
    keeping its number, and a run resumed from a checkpoint numbering on from the reports
    it keeps."""
    (trial,) = await submit(api)
    for steps in (10, 20, 30, 40, 50):
        await ok(report(api, trial, "validation", steps, {"loss": 1.0}))
    await ok(report(api, trial, "validation", 20, {"loss": 0.5}))
    await ok(report(api, trial, "training", 10, {"loss": 1.0}))
    uuid = await save(api, trial, 30)
    async with session_scope(app.state.session_factory) as session:
        row = await session.get(TrialModel, trial.id)
        checkpoint = await session.get(CheckpointModel, uuid)
        assert row is not None and checkpoint is not None
        await trial_reports.start_run_from(session, row, checkpoint)  # drops steps 40, 50
    await ok(report(api, trial, "validation", 40, {"loss": 0.4}))
    async with session_scope(app.state.session_factory) as session:
        numbered = (
            await session.execute(
                select(
                    TrialMetricModel.group_name,
                    TrialMetricModel.steps_completed,
                    TrialMetricModel.ordinal,
                    TrialMetricModel.thinning_level,
                )
                .where(TrialMetricModel.trial_id == trial.id)
                .order_by(TrialMetricModel.group_name, TrialMetricModel.steps_completed)
            )
        ).all()
    assert [tuple(r) for r in numbered] == [
        ("training", 10, 0, FIRST_REPORT_LEVEL),
        ("validation", 10, 0, FIRST_REPORT_LEVEL),
        ("validation", 20, 1, 0),
        ("validation", 30, 2, 1),
        ("validation", 40, 3, 0),
    ]


async def test_refused_metric_reports_store_nothing(api: httpx.AsyncClient) -> None:
    first, second, _ = await submit(api, THREE_TRIALS)
    for stale_run in (first.run_id - 1, first.run_id + 1):  # a process of another run
        reply = await report(api, first, "training", 10, {"loss": 1.0}, run_id=stale_run)
        assert reply.status_code == 400, reply.text
        assert reply.json()["code"] == 3
        assert "metrics.trialRunId" in reply.json()["message"]
    reply = await report(api, first, "training", 10, {"loss": 1.0}, trial_id=second.id)
    assert reply.status_code == 400, reply.text
    assert "metrics.trialId" in reply.json()["message"]
    for group in ("", "x" * 65, "line\nbreak"):
        reply = await report(api, first, group, 10, {"loss": 1.0})
        assert reply.status_code == 400, (group, reply.text)
        assert reply.json()["message"].startswith("group"), group
    assert await curve(api, first) == [] and await curve(api, second) == []
    assert (await trial_json(api, first))["totalBatchesProcessed"] == 0


async def test_non_finite_values_are_stored_as_determined_strings(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    sent_as_strings = {"loss": "NaN", "grad": "Infinity", "low": "-Infinity", "none": None}
    await ok(report(api, trial, "training", 10, sent_as_strings))
    # Python's json module (and so a careless client) writes bare NaN/Infinity tokens.
    raw = json.dumps(
        metrics_body(trial, "training", 20, {"loss": math.nan, "grad": math.inf, "low": -math.inf})
    )
    assert "NaN" in raw and '"NaN"' not in raw
    await ok(
        api.post(
            f"/api/v1/trials/{trial.id}/metrics",
            content=raw,
            headers={"content-type": "application/json"},
        )
    )
    assert await curve(api, trial, "training") == [
        ("training", 10, sent_as_strings),
        ("training", 20, {"loss": "NaN", "grad": "Infinity", "low": "-Infinity"}),
    ]
    workloads = await ok(api.get(f"/api/v1/trials/{trial.id}/workloads"))
    assert workloads["workloads"][1]["training"]["metrics"]["avgMetrics"]["loss"] == "NaN"
    assert (await trial_json(api, trial))["latestTraining"]["metrics"]["avgMetrics"] == {
        "loss": "NaN",
        "grad": "Infinity",
        "low": "-Infinity",
    }


async def test_non_finite_values_inside_a_report_never_fail_the_master(
    api: httpx.AsyncClient,
) -> None:
    # Per-class values and checkpoint metadata nest; a bare NaN there is still a client's
    # everyday JSON. Either kept as Determined's strings or refused with a 400, never a 500
    # (nor silently turned into null).
    (trial,) = await submit(api)
    nested = {"per_class": [math.nan, 0.5], "parts": {"grad": math.inf}}
    reply = await api.post(
        f"/api/v1/trials/{trial.id}/metrics",
        content=json.dumps(metrics_body(trial, "training", 10, nested)),
        headers={"content-type": "application/json"},
    )
    assert reply.status_code in (200, 400), reply.text
    if reply.status_code == 200:
        assert await curve(api, trial) == [
            ("training", 10, {"per_class": ["NaN", 0.5], "parts": {"grad": "Infinity"}})
        ]
    else:
        assert await curve(api, trial) == []

    body = checkpoint_body(trial, 20)
    body["metadata"]["best_loss"] = math.nan
    reply = await api.post(
        "/api/v1/checkpoints",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
    )
    assert reply.status_code in (200, 400), reply.text
    listed = await ok(api.get(f"/api/v1/trials/{trial.id}/checkpoints"))
    if reply.status_code == 200:
        assert listed["checkpoints"][0]["metadata"]["best_loss"] == "NaN"
    else:
        assert listed["checkpoints"] == []


async def test_reports_for_an_unknown_trial_are_not_found(api: httpx.AsyncClient) -> None:
    ghost = Trial(999999, 1, "999999.1", "1.x", 1)
    reply = await report(api, ghost, "training", 10, {"loss": 1.0})
    assert reply.status_code == 404, reply.text
    assert reply.json()["code"] == 5
    for path in ("metrics", "workloads", "checkpoints"):
        assert (await api.get(f"/api/v1/trials/999999/{path}")).status_code == 404
    reply = await api.post("/api/v1/trials/999999/progress", json={"progress": 0.5})
    assert reply.status_code == 404


async def test_total_batches_processed_follows_training_reports(api: httpx.AsyncClient) -> None:
    (trial,) = await submit(api)
    await ok(report(api, trial, "training", 10, {"loss": 1.0}))
    await ok(report(api, trial, "training", 30, {"loss": 0.8}))
    assert (await trial_json(api, trial))["totalBatchesProcessed"] == 30
    await ok(report(api, trial, "validation", 50, {"loss": 0.8}))
    await ok(report(api, trial, "inference", 60, {"latency_ms": 1}))
    assert (await trial_json(api, trial))["totalBatchesProcessed"] == 30


async def test_the_allocation_token_header_authenticates_like_authorization(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    token = api.headers.pop("Authorization")
    reply = await api.post(
        f"/api/v1/trials/{trial.id}/metrics",
        json=metrics_body(trial, "training", 10, {"loss": 1.0}),
        headers={"Grpc-Metadata-x-allocation-token": token},
    )
    assert reply.status_code == 200, reply.text
    reply = await api.post(
        f"/api/v1/trials/{trial.id}/metrics",
        json=metrics_body(trial, "training", 20, {"loss": 0.5}),
    )
    assert reply.status_code == 401, reply.text
    assert reply.json()["code"] == 16
    reply = await api.post(
        f"/api/v1/trials/{trial.id}/metrics",
        json=metrics_body(trial, "training", 20, {"loss": 0.5}),
        headers={"Grpc-Metadata-x-allocation-token": "Bearer not-a-token"},
    )
    assert reply.status_code == 401, reply.text
    api.headers["Authorization"] = token
    assert await curve(api, trial) == [("training", 10, {"loss": 1.0})]


# -- checkpoints ----------------------------------------------------------------------------


async def test_a_reported_checkpoint_reads_back_by_uuid_trial_and_experiment(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    (trial,) = await submit(api)
    # Reported out of step order: lists come back by steps.
    later = await save(api, trial, 200)
    earlier = await save(api, trial, 100)
    directory = app.state.settings.data_dir.resolve() / "checkpoints"

    checkpoint = (await ok(api.get(f"/api/v1/checkpoints/{earlier}")))["checkpoint"]
    assert checkpoint["uuid"] == earlier
    assert checkpoint["state"] == "STATE_COMPLETED"
    assert checkpoint["stepsCompleted"] == 100
    assert checkpoint["metadata"] == {"steps_completed": 100, "framework": "torch"}
    assert checkpoint["resources"] == {"model.pt": "2048", "optimizer.pt": "1024"}
    assert (checkpoint["trialId"], checkpoint["experimentId"]) == (trial.id, trial.experiment_id)
    assert (checkpoint["allocationId"], checkpoint["taskId"]) == (
        trial.allocation_id,
        trial.task_id,
    )
    assert checkpoint["storagePath"] == f"{directory}/{earlier}"
    training = checkpoint["training"]
    assert (training["trialId"], training["experimentId"]) == (trial.id, trial.experiment_id)
    assert training["hparams"] == (await trial_json(api, trial))["hparams"]
    assert training["searcherMetric"] is None  # no validation at step 100

    by_trial = await ok(api.get(f"/api/v1/trials/{trial.id}/checkpoints"))
    assert [c["uuid"] for c in by_trial["checkpoints"]] == [earlier, later]
    assert by_trial["pagination"]["total"] == 2
    by_experiment = await ok(api.get(f"/api/v1/experiments/{trial.experiment_id}/checkpoints"))
    assert [c["uuid"] for c in by_experiment["checkpoints"]] == [earlier, later]
    assert (await trial_json(api, trial))["latestCheckpointUuid"] == later
    workloads = (await ok(api.get(f"/api/v1/trials/{trial.id}/workloads")))["workloads"]
    assert [w["checkpoint"]["uuid"] for w in workloads] == [earlier, later]


async def test_the_experiment_checkpoint_list_spans_its_trials(api: httpx.AsyncClient) -> None:
    first, second, third = await submit(api, THREE_TRIALS)
    # A report may name its trial by training.trialId alone, without an allocation.
    alone = checkpoint_body(third, 10, allocationId=None, taskId=None)
    await ok(api.post("/api/v1/checkpoints", json=alone))
    uuids = {await save(api, first, 10), alone["uuid"]}
    listed = await ok(api.get(f"/api/v1/experiments/{first.experiment_id}/checkpoints"))
    assert {c["uuid"] for c in listed["checkpoints"]} == uuids
    assert (await ok(api.get(f"/api/v1/trials/{second.id}/checkpoints")))["checkpoints"] == []
    checkpoint = (await ok(api.get(f"/api/v1/checkpoints/{alone['uuid']}")))["checkpoint"]
    assert checkpoint["trialId"] == third.id


STORAGE_DIRECTORIES = [
    ("{type: shared_fs, host_path: /mnt/ckpt}", "/mnt/ckpt"),
    ("{type: shared_fs, host_path: /mnt/ckpt, storage_path: runs}", "/mnt/ckpt/runs"),
    ("{type: shared_fs, host_path: /mnt/ckpt, storage_path: /mnt/ckpt/abs}", "/mnt/ckpt/abs"),
    ("{type: directory, container_path: /ckpt}", "/ckpt"),
]


async def test_the_storage_path_follows_the_experiments_checkpoint_storage(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    for storage, directory in STORAGE_DIRECTORIES:
        (trial,) = await submit(api, CONFIG + f"checkpoint_storage: {storage}\n")
        uuid = await save(api, trial, 10)
        checkpoint = (await ok(api.get(f"/api/v1/checkpoints/{uuid}")))["checkpoint"]
        assert checkpoint["storagePath"] == f"{directory}/{uuid}", storage
    # Without checkpoint_storage, the master's default goes into the stored config.
    (trial,) = await submit(api)
    storage = (await experiment_json(api, trial.experiment_id))["config"]["checkpoint_storage"]
    assert storage["type"] == "shared_fs"
    assert storage["host_path"] == str(app.state.settings.data_dir.resolve() / "checkpoints")
    assert not storage.get("storage_path")


BAD_CHECKPOINTS: list[tuple[dict[str, Any], int, str]] = [
    ({"metadata": {"framework": "torch"}}, 400, "metadata.steps_completed"),
    ({"metadata": {"steps_completed": "10"}}, 400, "metadata.steps_completed"),
    ({"metadata": {"steps_completed": -1}}, 400, "metadata.steps_completed"),
    ({"uuid": "not-a-uuid"}, 400, "uuid"),
    ({"allocationId": "999999.1", "training": {}}, 404, "allocation 999999.1"),
    ({"allocationId": None, "training": {}}, 400, "allocationId"),
    ({"resources": {"model.pt": "big"}}, 400, "resources.model.pt"),
    ({"state": "STATE_DELETED"}, 400, "state"),
]


async def test_bad_checkpoint_reports_are_refused_and_store_nothing(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    for change, status, needle in BAD_CHECKPOINTS:
        reply = await api.post("/api/v1/checkpoints", json=checkpoint_body(trial, 10, **change))
        assert reply.status_code == status, (change, reply.text)
        assert needle in reply.json()["message"], change
    assert (await ok(api.get(f"/api/v1/trials/{trial.id}/checkpoints")))["checkpoints"] == []


async def test_the_same_checkpoint_twice_is_one_and_another_step_conflicts(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    body = checkpoint_body(trial, 10)
    for _ in range(2):  # the harness retries a report it did not hear answered
        await ok(api.post("/api/v1/checkpoints", json=body))
    listed = await ok(api.get(f"/api/v1/trials/{trial.id}/checkpoints"))
    assert [c["uuid"] for c in listed["checkpoints"]] == [body["uuid"]]

    reply = await api.post("/api/v1/checkpoints", json=checkpoint_body(trial, 20, body["uuid"]))
    assert reply.status_code == 409, reply.text
    assert body["uuid"] in reply.json()["message"]
    checkpoint = (await ok(api.get(f"/api/v1/checkpoints/{body['uuid']}")))["checkpoint"]
    assert checkpoint["stepsCompleted"] == 10


async def test_a_checkpoint_is_found_by_the_uuid_it_was_reported_with(
    api: httpx.AsyncClient,
) -> None:
    # UUIDs are case-insensitive (Determined keeps them in a Postgres uuid column): the
    # spelling a client reported must find the checkpoint again, here and as a warm start.
    (trial,) = await submit(api)
    spelled = str(uuidlib.uuid4()).upper()
    await save(api, trial, 10, spelled)
    checkpoint = (await ok(api.get(f"/api/v1/checkpoints/{spelled}")))["checkpoint"]
    assert checkpoint["uuid"].lower() == spelled.lower()
    config = CONFIG.replace("metric: loss", f"metric: loss, source_checkpoint_uuid: '{spelled}'")
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text


async def test_a_checkpoint_carries_the_metrics_reported_at_its_step(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    await ok(report(api, trial, "training", 20, {"loss": 0.45}))
    await ok(report(api, trial, "validation", 20, {"loss": 0.5, "accuracy": 0.8}))
    await ok(report(api, trial, "validation", 30, {"loss": 0.1}))
    uuid = await save(api, trial, 20)
    training = (await ok(api.get(f"/api/v1/checkpoints/{uuid}")))["checkpoint"]["training"]
    assert training["searcherMetric"] == 0.5
    assert training["validationMetrics"] == {"avgMetrics": {"loss": 0.5, "accuracy": 0.8}}
    assert training["trainingMetrics"] == {"avgMetrics": {"loss": 0.45}}


# -- best validation and the trial summary ---------------------------------------------------


async def test_best_validation_is_not_found_before_any_validation(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    path = f"/api/v1/experiments/{trial.experiment_id}/searcher/best_searcher_validation_metric"
    await ok(report(api, trial, "training", 10, {"loss": 0.1}))
    reply = await api.get(path)
    assert reply.status_code == 404, reply.text
    assert reply.json()["code"] == 5
    assert (await experiment_json(api, trial.experiment_id))["bestValidationMetric"] is None
    view = await trial_json(api, trial)
    assert view["latestValidation"] is None and view["bestValidation"] is None
    assert view["latestCheckpointUuid"] is None
    assert view["latestTraining"]["totalBatches"] == 10


BEST_CASES: list[tuple[str, list[Any], float, int]] = [
    ("metric: loss", [0.5, 0.2, 0.4], 0.2, 20),
    ("metric: loss, smaller_is_better: true", [0.5, "NaN", 0.4], 0.4, 30),
    ("metric: accuracy, smaller_is_better: false", [0.5, 0.9, 0.7], 0.9, 20),
]


async def test_best_validation_follows_smaller_is_better(api: httpx.AsyncClient) -> None:
    for searcher, values, best, best_step in BEST_CASES:
        first, _ = await submit(api, TWO_TRIALS_BY.format(searcher=searcher))
        name = searcher.split(",")[0].split(": ")[1]
        for steps, value in zip((10, 20, 30), values, strict=True):
            await ok(report(api, first, "validation", steps, {name: value, "other": steps}))
        await ok(report(api, first, "training", 40, {name: 1.0}))
        uuid = await save(api, first, 30)

        experiment_id = first.experiment_id
        path = f"/api/v1/experiments/{experiment_id}/searcher/best_searcher_validation_metric"
        assert await ok(api.get(path)) == {"metric": best}, searcher
        assert (await experiment_json(api, experiment_id))["bestValidationMetric"] == best
        view = await trial_json(api, first)
        assert view["bestValidation"]["totalBatches"] == best_step, searcher
        assert view["bestValidation"]["metrics"]["avgMetrics"][name] == best
        assert view["latestValidation"]["totalBatches"] == 30
        assert view["latestTraining"]["totalBatches"] == 40
        assert view["latestCheckpointUuid"] == uuid
        listed = (await ok(api.get(f"/api/v1/experiments/{experiment_id}/trials")))["trials"]
        assert [t["bestValidation"]["totalBatches"] for t in listed if t["id"] == first.id] == [
            best_step
        ]
        assert all(t["bestValidation"] is None for t in listed if t["id"] != first.id)


async def test_best_validation_spans_the_experiments_trials(api: httpx.AsyncClient) -> None:
    first, second, third = await submit(api, THREE_TRIALS)
    await ok(report(api, first, "validation", 10, {"loss": 0.3}))
    await ok(report(api, second, "validation", 10, {"loss": 0.1}))
    await ok(report(api, third, "validation", 10, {"accuracy": 0.01}))  # not the metric
    path = f"/api/v1/experiments/{first.experiment_id}/searcher/best_searcher_validation_metric"
    assert await ok(api.get(path)) == {"metric": 0.1}


async def stored_best(app: FastAPI, experiment_id: int) -> float | None:
    async with session_scope(app.state.session_factory) as session:
        experiment = await session.get(ExperimentModel, experiment_id)
        assert experiment is not None
        return experiment.best_metric


STORED_BEST_CASES: list[tuple[str, list[Any], float | None]] = [
    # NaN and infinities are never best, whichever way is better.
    ("metric: loss", ["NaN", "-Infinity", 0.5, 0.2, 0.4, "Infinity"], 0.2),
    ("metric: accuracy, smaller_is_better: false", ["Infinity", 0.5, 0.9, 0.7], 0.9),
    ("metric: loss", ["NaN", "text", True], None),
]


async def test_the_stored_best_metric_only_improves_and_ignores_non_finite_values(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    for searcher, values, best in STORED_BEST_CASES:
        first, second = await submit(api, TWO_TRIALS_BY.format(searcher=searcher))
        name = searcher.split(",")[0].split(": ")[1]
        assert await stored_best(app, first.experiment_id) is None
        for steps, value in enumerate(values, start=1):
            await ok(report(api, first, "validation", steps * 10, {name: value}))
        # Training reports and other metrics never count, however good.
        await ok(report(api, second, "training", 10, {name: 0.0 if best is None else best * 2}))
        await ok(report(api, second, "validation", 10, {"other": 0.0, name: "NaN"}))
        assert await stored_best(app, first.experiment_id) == best, searcher
        if best is not None:
            # The scan the API's best_searcher_validation_metric does agrees.
            path = (
                f"/api/v1/experiments/{first.experiment_id}"
                "/searcher/best_searcher_validation_metric"
            )
            assert await ok(api.get(path)) == {"metric": best}, searcher


# -- progress and runner state ---------------------------------------------------------------


async def test_progress_is_a_fraction_between_zero_and_one(api: httpx.AsyncClient) -> None:
    (trial,) = await submit(api)
    assert (await trial_json(api, trial))["progress"] is None
    for progress in (0.0, 1.0, 0.25):
        body = {"progress": progress, "is_raw": True}
        assert await ok(api.post(f"/api/v1/trials/{trial.id}/progress", json=body)) == {}
        assert (await trial_json(api, trial))["progress"] == progress
        assert (await experiment_json(api, trial.experiment_id))["progress"] == progress
    for bad in ("1.5", "-0.1", "NaN", "Infinity"):
        reply = await api.post(
            f"/api/v1/trials/{trial.id}/progress",
            content=f'{{"progress": {bad}, "is_raw": true}}',
            headers={"content-type": "application/json"},
        )
        assert reply.status_code == 400, (bad, reply.text)
        assert "progress" in reply.json()["message"], bad
    assert (await trial_json(api, trial))["progress"] == 0.25


async def run_one_to_completion(
    app: FastAPI, report_first: float | None = None, train_to: int | None = None
) -> int:
    """One one-slot agent runs one queued trial, whose ranks all exit 0; its id.
    With report_first, the trial reports that progress while it runs; with train_to, a
    training report at that step."""
    hub = hub_of(app)
    agent = await connect(hub, "agent-a")
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 1
    await hub.tick()
    (prepare,) = of_kind(sent(agent), "prepare")
    allocation_id = prepare.allocation_id
    await hub.on_message(
        agent,
        pb.AgentMessage(
            prepared=pb.AllocationPrepared(allocation_id=allocation_id, master_port=29500)
        ),
    )
    (start,) = of_kind(sent(agent), "start")
    await hub.on_message(
        agent, pb.AgentMessage(started=pb.AllocationStarted(allocation_id=allocation_id))
    )
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {start.env['DET_SESSION_TOKEN']}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as rank:
        if report_first is not None:
            reply = await rank.post(
                f"/api/v1/trials/{start.trial_id}/progress",
                json={"progress": report_first},
                headers=headers,
            )
            assert reply.status_code == 200, reply.text
        if train_to is not None:
            this_run = Trial(
                start.trial_id, int(start.env["DET_TRIAL_RUN_ID"]), allocation_id, "", 0
            )
            body = metrics_body(this_run, "training", train_to, {"loss": 0.5})
            reply = await rank.post(
                f"/api/v1/trials/{start.trial_id}/metrics", json=body, headers=headers
            )
            assert reply.status_code == 200, reply.text
    await hub.on_message(agent, exited(allocation_id, pb.EXIT_KIND_COMPLETED))
    trial_id: int = start.trial_id
    return trial_id


async def test_experiment_progress_is_the_mean_with_completed_trials_counting_one(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    trials = await submit(api, THREE_TRIALS)
    finished = await run_one_to_completion(app)
    done = next(t for t in trials if t.id == finished)
    assert (await trial_json(api, done))["state"] == "STATE_COMPLETED"

    other = next(t for t in trials if t.id != done.id)
    await ok(api.post(f"/api/v1/trials/{other.id}/progress", json={"progress": 0.5}))
    experiment = await experiment_json(api, other.experiment_id)
    assert experiment["progress"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)


async def test_a_completed_experiment_shows_full_progress(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    # The trial said 0.4 and then finished: nothing reports after that, yet a completed
    # trial counts 1, so the finished experiment is at 1, not stuck at 0.4.
    (trial,) = await submit(api)
    assert await run_one_to_completion(app, report_first=0.4) == trial.id
    experiment = await experiment_json(api, trial.experiment_id)
    assert experiment["state"] == "STATE_COMPLETED"
    assert experiment["progress"] == 1.0


async def test_a_trial_that_exits_0_short_of_its_length_says_how_far_it_got(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    # The first walkthrough's script printed a line and exited: COMPLETED is right (exit 0),
    # but without a reason it read as a finished 1,000-batch run.
    (trial,) = await submit(api)  # max_length: {batches: 100}
    await run_one_to_completion(app, train_to=40)
    shown = await trial_json(api, trial)
    assert shown["state"] == "STATE_COMPLETED"
    assert shown["endReason"].startswith("exited 0 after 40 of 100 batches (searcher.max_length)")


async def test_a_trial_that_reaches_its_length_ends_with_no_reason(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    (trial,) = await submit(api)
    await run_one_to_completion(app, train_to=100)
    shown = await trial_json(api, trial)
    assert (shown["state"], shown["endReason"]) == ("STATE_COMPLETED", "")


async def test_the_runner_state_is_shown_on_the_trial(api: httpx.AsyncClient) -> None:
    (trial,) = await submit(api)
    body = {"state": "validating"}
    assert await ok(api.post(f"/api/v1/trials/{trial.id}/runner/metadata", json=body)) == {}
    assert (await trial_json(api, trial))["runnerState"] == "validating"
    reply = await api.post(f"/api/v1/trials/{trial.id}/runner/metadata", json={"state": "x" * 257})
    assert reply.status_code == 400, reply.text
    assert (await trial_json(api, trial))["runnerState"] == "validating"
    # The harness announces its run; only a known trial is accepted.
    assert await ok(api.post("/api/v1/runs/start", json={"runId": trial.id})) == {}
    reply = await api.post("/api/v1/runs/start", json={"runId": 999999})
    assert reply.status_code == 404, reply.text


# -- experiment submit -----------------------------------------------------------------------


async def test_a_missing_source_checkpoint_is_refused_at_submit(api: httpx.AsyncClient) -> None:
    missing = str(uuidlib.uuid4())
    config = CONFIG.replace("metric: loss", f"metric: loss, source_checkpoint_uuid: '{missing}'")
    reply = await create_experiment(api, config)
    assert reply.status_code == 400, reply.text
    assert "searcher.source_checkpoint_uuid" in reply.json()["message"]
    assert await row_counts(api) == (0, 0)


async def test_a_known_source_checkpoint_and_determinism_are_accepted(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    uuid = await save(api, trial, 10)
    config = CONFIG.replace("metric: loss", f"metric: loss, source_checkpoint_uuid: '{uuid}'")
    reply = await create_experiment(api, config + "reproducibility: {deterministic: true}\n")
    assert reply.status_code == 200, reply.text
    stored = reply.json()["experiment"]["config"]
    assert stored["searcher"]["source_checkpoint_uuid"] == uuid
    assert stored["reproducibility"]["deterministic"] is True


async def test_report_times_are_stored_in_utc_and_unstorable_ones_refused(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    body = metrics_body(trial, "training", 1, {"loss": 1.0})
    body["metrics"]["reportTime"] = "2026-11-21T10:00:00"  # no zone: UTC
    await ok(api.post(f"/api/v1/trials/{trial.id}/metrics", json=body))
    (row,) = (await ok(api.get(f"/api/v1/trials/{trial.id}/metrics")))["metrics"]
    assert row["reportTime"].startswith("2026-11-21T10:00:00")
    for moment in ("9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+14:00"):
        body["metrics"]["reportTime"] = moment
        refused = await api.post(f"/api/v1/trials/{trial.id}/metrics", json=body)
        assert refused.status_code == 400, refused.text
        assert "reportTime" in refused.json()["message"]
        checkpoint = checkpoint_body(trial, 5, reportTime=moment)
        refused = await api.post("/api/v1/checkpoints", json=checkpoint)
        assert refused.status_code == 400, refused.text
    assert await curve(api, trial) == [("training", 1, {"loss": 1.0})]


async def test_out_of_range_ids_in_a_checkpoint_report_are_refused(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    for training in ({"trialId": 2**40}, {"trialId": "7"}):
        body = checkpoint_body(trial, 5, training=training, allocationId=None)
        refused = await api.post("/api/v1/checkpoints", json=body)
        assert refused.status_code == 400, refused.text
        assert "training.trialId" in refused.json()["message"]
    refused = await api.post("/api/v1/runs/start", json={"runId": 2**40})
    assert refused.status_code == 400 and "runId" in refused.json()["message"], refused.text
    sizes = checkpoint_body(trial, 5, resources={"model.pt": "١٢"})  # Arabic-Indic digits
    refused = await api.post("/api/v1/checkpoints", json=sizes)
    assert refused.status_code == 400 and "resources.model.pt" in refused.json()["message"]
    assert (await ok(api.get(f"/api/v1/trials/{trial.id}/checkpoints")))["checkpoints"] == []


async def test_the_trial_checkpoint_list_sorts_and_pages_like_the_experiments(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    for steps, loss in ((10, 0.5), (20, 0.25), (30, 0.75)):
        await ok(report(api, trial, "validation", steps, {"loss": loss}))
        await save(api, trial, steps)
    path = f"/api/v1/trials/{trial.id}/checkpoints"
    best = await ok(api.get(path, params={"sortByAttr": "SORT_BY_SEARCHER_METRIC", "limit": 1}))
    assert [c["stepsCompleted"] for c in best["checkpoints"]] == [20]
    assert best["pagination"]["total"] == 3
    newest = await ok(
        api.get(path, params={"sortByAttr": "SORT_BY_BATCH_NUMBER", "orderBy": "ORDER_BY_DESC"})
    )
    assert [c["stepsCompleted"] for c in newest["checkpoints"]] == [30, 20, 10]
    bad = await api.get(path, params={"sortByAttr": "SORT_BY_BOGUS"})
    assert bad.status_code == 400 and "sortByAttr" in bad.json()["message"]


async def test_an_integer_too_large_for_a_float_is_no_best_metric(api: httpx.AsyncClient) -> None:
    (trial,) = await submit(api)
    await ok(report(api, trial, "validation", 10, {"loss": 2**1100}))
    experiment = await experiment_json(api, trial.experiment_id)
    assert experiment["bestValidationMetric"] is None
    missing = await api.get(
        f"/api/v1/experiments/{trial.experiment_id}/searcher/best_searcher_validation_metric"
    )
    assert missing.status_code == 404
    await ok(report(api, trial, "validation", 20, {"loss": 0.5}))
    assert (await experiment_json(api, trial.experiment_id))["bestValidationMetric"] == 0.5
