"""The master as Determined 0.38.1's trial harness sees it (the Core API contract, §2 and §5.1):
bodies without a Content-Type, the allocation token header, the early exit, the persisted
preemption ack, the optional routes, and malformed bodies answered with a 400 naming the
field, never a 500."""

from __future__ import annotations

import asyncio
import json
import uuid as uuidlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.db.models import AllocationModel, TrialModel
from master.db.session import session_scope
from master.services import scheduler, trial_reports
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_agent_link import connect, hub_of, of_kind, sent
from tests.api.test_logs import messages, read
from tests.api.test_trial_reports import (
    Trial,
    checkpoint_body,
    curve,
    metrics_body,
    ok,
    submit,
    trial_json,
)

# What the harness's session sends: no Content-Type, the token in gRPC-gateway's header.
TOKEN_HEADER = "Grpc-Metadata-x-allocation-token"


@dataclass
class Rank:
    """A running trial as its ranks see it: the trial and a client that posts like the
    harness (JSON text without a Content-Type, the allocation token header)."""

    trial: Trial
    client: httpx.AsyncClient

    async def post(self, path: str, body: Any = None, *, raw: str | None = None) -> httpx.Response:
        content = raw if raw is not None else ("" if body is None else json.dumps(body))
        return await self.client.post(path, content=content.encode())

    async def get(self, path: str, **params: Any) -> httpx.Response:
        return await self.client.get(path, params=params)


async def running(app: FastAPI, api: httpx.AsyncClient) -> Rank:
    """One one-slot agent running a new experiment's one trial; the client holds the
    DET_SESSION_TOKEN the master gave its ranks."""
    (trial,) = await submit(api)
    hub = hub_of(app)
    agent = await connect(hub, "agent-a")
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 1
    await hub.tick()
    (prepare,) = of_kind(sent(agent), "prepare")
    await hub.on_message(
        agent,
        pb.AgentMessage(
            prepared=pb.AllocationPrepared(allocation_id=prepare.allocation_id, master_port=29500)
        ),
    )
    (start,) = of_kind(sent(agent), "start")
    await hub.on_message(
        agent, pb.AgentMessage(started=pb.AllocationStarted(allocation_id=prepare.allocation_id))
    )
    assert (await trial_json(api, trial))["state"] == "STATE_RUNNING"
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://master",
        headers={TOKEN_HEADER: f"Bearer {start.env['DET_SESSION_TOKEN']}"},
    )
    return Rank(trial, client)


@pytest.fixture
async def rank(app: FastAPI, api: httpx.AsyncClient) -> AsyncIterator[Rank]:
    harness = await running(app, api)
    async with harness.client:
        yield harness


# -- bodies are JSON whatever their Content-Type ------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [None, "application/x-www-form-urlencoded", "text/plain", "application/json; charset=utf-8"],
)
async def test_login_reads_json_whatever_the_content_type(
    anon: httpx.AsyncClient, content_type: str | None
) -> None:
    # `curl -d '{"username":"determined","password":""}' .../api/v1/auth/login` sends
    # application/x-www-form-urlencoded; Determined's gateway reads JSON all the same.
    headers = {"content-type": content_type} if content_type else {}
    reply = await anon.post(
        "/api/v1/auth/login",
        content=b'{"username":"determined","password":""}',
        headers=headers,
    )
    assert reply.status_code == 200, reply.text
    me = await anon.get("/api/v1/me", headers={"Authorization": f"Bearer {reply.json()['token']}"})
    assert me.json()["user"]["username"] == "determined"
    bad = await anon.post("/api/v1/auth/login", content=b'{"username": 7}', headers=headers)
    assert bad.status_code == 400, bad.text
    assert "username" in bad.json()["message"]


# -- the calls of a normal trial, as the harness makes them ------------------------------------


async def test_a_harness_run_without_content_types_is_stored(
    rank: Rank, api: httpx.AsyncClient
) -> None:
    trial = rank.trial
    # Every rank announces the run at the same moment.
    starts = await asyncio.gather(
        *(
            rank.post("/api/v1/runs/start", {"runId": trial.id, "checkpointStorage": None})
            for _ in range(4)
        )
    )
    assert [r.status_code for r in starts] == [200] * 4, [r.text for r in starts]
    assert all(r.json() == {} for r in starts)

    view = await trial_json(api, trial)
    assert "latestValidation" in view and view["latestValidation"] is None
    best = f"/api/v1/experiments/{trial.experiment_id}/searcher/best_searcher_validation_metric"
    missing = await rank.get(best)
    assert missing.status_code == 404, missing.text

    assert (
        await rank.post(f"/api/v1/trials/{trial.id}/runner/metadata", {"state": "training"})
    ).status_code == 200
    values = {"loss": 0.5, "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "none": None}
    reply = await rank.post(
        f"/api/v1/trials/{trial.id}/metrics", metrics_body(trial, "training", 10, values)
    )
    assert reply.status_code == 200, reply.text
    reply = await rank.post(
        f"/api/v1/trials/{trial.id}/metrics", metrics_body(trial, "validation", 10, {"loss": 0.25})
    )
    assert reply.status_code == 200, reply.text
    reply = await rank.post(
        f"/api/v1/trials/{trial.id}/progress", {"progress": 0.1, "is_raw": True}
    )
    assert reply.status_code == 200, reply.text

    # The checkpoint exactly as core/_checkpoint.py reports it: steps only in metadata.
    uuid = str(uuidlib.uuid4())
    checkpoint = {
        "allocationId": trial.allocation_id,
        "metadata": {"steps_completed": 10, "format": "saved_weights"},
        "resources": {"model.pt": "1234", "sub/dir/state.json": "0"},
        "taskId": trial.task_id,
        "training": {},
        "uuid": uuid,
        "reportTime": "2026-11-23T10:00:00.123456+00:00",
        "state": "STATE_COMPLETED",
        "storageId": None,
    }
    reply = await rank.post("/api/v1/checkpoints", checkpoint)
    assert reply.status_code == 200, reply.text

    assert await curve(api, trial, "training") == [("training", 10, values)]
    view = await trial_json(api, trial)
    assert view["runnerState"] == "training" and view["progress"] == 0.1
    assert view["latestValidation"]["totalBatches"] == 10
    assert view["latestCheckpointUuid"] == uuid
    assert (await rank.get(best)).json() == {"metric": 0.25}
    stored = (await ok(api.get(f"/api/v1/checkpoints/{uuid}")))["checkpoint"]
    assert stored["stepsCompleted"] == 10
    assert stored["resources"] == {"model.pt": "1234", "sub/dir/state.json": "0"}
    assert stored["trialId"] == trial.id


async def test_group_names_with_spaces_percent_and_slashes_round_trip(rank: Rank) -> None:
    trial = rank.trial
    groups = ["my group", "100% done", "eval/top-1", "gpu"]
    for steps, group in enumerate(groups, start=1):
        reply = await rank.post(
            f"/api/v1/trials/{trial.id}/metrics", metrics_body(trial, group, steps, {"x": steps})
        )
        assert reply.status_code == 200, (group, reply.text)
    for steps, group in enumerate(groups, start=1):
        assert await curve(rank.client, trial, group) == [(group, steps, {"x": steps})], group
    for bad in ("", "x" * 65, "tab\there", "nul\x00"):
        reply = await rank.post(
            f"/api/v1/trials/{trial.id}/metrics", metrics_body(trial, bad, 1, {"x": 1})
        )
        assert reply.status_code == 400, (bad, reply.text)
        assert reply.json()["message"].startswith("group"), bad


async def test_profiler_reports_without_steps_are_stored_at_the_current_step(
    rank: Rank,
) -> None:
    # The profiler sends system metrics with "stepsCompleted": null and a report time.
    trial = rank.trial
    base = f"/api/v1/trials/{trial.id}/metrics"
    assert (
        await rank.post(base, metrics_body(trial, "training", 30, {"loss": 1}))
    ).status_code == 200
    body = metrics_body(trial, "gpu", 0, {"agent-a": {"gpu_util": 0.5}})
    body["metrics"]["stepsCompleted"] = None
    body["metrics"]["reportTime"] = "2026-11-23T10:00:00+00:00"
    reply = await rank.post(base, body)
    assert reply.status_code == 200, reply.text
    assert await curve(rank.client, trial, "gpu") == [("gpu", 30, {"agent-a": {"gpu_util": 0.5}})]
    # Training and validation without a step cannot be placed on the curve.
    for group in ("training", "validation"):
        body = metrics_body(trial, group, 0, {"loss": 1})
        del body["metrics"]["stepsCompleted"]
        reply = await rank.post(base, body)
        assert reply.status_code == 400, reply.text
        assert "metrics.stepsCompleted" in reply.json()["message"]


# -- early exit (det.InvalidHP) ----------------------------------------------------------------


async def test_an_invalid_hp_early_exit_is_recorded_and_the_first_reason_kept(
    rank: Rank, api: httpx.AsyncClient, app: FastAPI
) -> None:
    trial = rank.trial
    path = f"/api/v1/trials/{trial.id}/early_exit"
    assert (await trial_json(api, trial))["endReason"] == ""
    reply = await rank.post(path, {"reason": "EXITED_REASON_INVALID_HP"})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {}
    sentence = "the trial reported invalid hyperparameters (det.InvalidHP)"
    assert (await trial_json(api, trial))["endReason"] == sentence
    # Every rank of a distributed trial reports it, and 0.38.1's client raises on any
    # error status: the same reason again must be a 200.
    again = await rank.post(path, {"reason": "EXITED_REASON_INVALID_HP"})
    assert again.status_code == 200, again.text
    other = await rank.post(path, {"reason": "EXITED_REASON_USER_REQUESTED_STOP"})
    assert other.status_code == 400, other.text
    assert "already reported" in other.json()["message"]
    assert (await trial_json(api, trial))["endReason"] == sentence
    # What the agent hub asks when the ranks exit 0.
    async with session_scope(app.state.session_factory) as session:
        row = await session.get(TrialModel, trial.id)
        assert row is not None
        assert await trial_reports.early_exit_reason(session, row) == sentence
        # A new run of the trial starts without it.
        await trial_reports.start_run_from(session, row, None)
    async with session_scope(app.state.session_factory) as session:
        row = await session.get(TrialModel, trial.id)
        assert row is not None
        assert await trial_reports.early_exit_reason(session, row) is None
    assert (await trial_json(api, trial))["endReason"] == ""


async def test_all_ranks_reporting_an_early_exit_at_once_succeed(
    rank: Rank, api: httpx.AsyncClient
) -> None:
    path = f"/api/v1/trials/{rank.trial.id}/early_exit"
    replies = await asyncio.gather(
        *(rank.post(path, {"reason": "EXITED_REASON_INVALID_HP"}) for _ in range(4))
    )
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    assert (await trial_json(api, rank.trial))["endReason"] == (
        "the trial reported invalid hyperparameters (det.InvalidHP)"
    )


@pytest.mark.parametrize(
    ("reason", "sentence"),
    [
        ("EXITED_REASON_UNSPECIFIED", "the trial exited early without saying why"),
        ("EXITED_REASON_USER_REQUESTED_STOP", "the trial's code asked to stop early"),
    ],
)
async def test_other_early_exit_reasons_are_recorded(
    rank: Rank, api: httpx.AsyncClient, reason: str, sentence: str
) -> None:
    reply = await rank.post(f"/api/v1/trials/{rank.trial.id}/early_exit", {"reason": reason})
    assert reply.status_code == 200, reply.text
    assert (await trial_json(api, rank.trial))["endReason"] == sentence


async def test_bad_early_exits_are_refused_and_change_nothing(
    rank: Rank, api: httpx.AsyncClient
) -> None:
    path = f"/api/v1/trials/{rank.trial.id}/early_exit"
    for body in ({"reason": "EXITED_REASON_BOGUS"}, {"reason": 3}, {}, {"reason": None}):
        reply = await rank.post(path, body)
        assert reply.status_code == 400, (body, reply.text)
        assert "reason" in reply.json()["message"], body
    assert (await trial_json(api, rank.trial))["endReason"] == ""
    ghost = await rank.post(
        "/api/v1/trials/999999/early_exit", {"reason": "EXITED_REASON_INVALID_HP"}
    )
    assert ghost.status_code == 403, ghost.text  # a rank's token opens only its own trial
    nobody = await rank.client.post(
        path, json={"reason": "EXITED_REASON_INVALID_HP"}, headers={TOKEN_HEADER: ""}
    )
    assert nobody.status_code == 401, nobody.text
    assert (await trial_json(api, rank.trial))["endReason"] == ""


# -- preemption ack ------------------------------------------------------------------------


async def test_the_preemption_ack_is_stored(rank: Rank, app: FastAPI) -> None:
    allocation_id = rank.trial.allocation_id
    poll = await rank.get(
        f"/api/v1/allocations/{allocation_id}/signals/preemption", timeout_seconds=0
    )
    assert poll.json() == {"preempt": False}
    # The harness posts an empty body (Content-Length: 0) and no Content-Type.
    reply = await rank.post(f"/api/v1/allocations/{allocation_id}/signals/ack_preemption")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {}
    async with session_scope(app.state.session_factory) as session:
        allocation = await session.get(AllocationModel, allocation_id)
        assert allocation is not None and allocation.preempt_acked is True
    ghost = await rank.post("/api/v1/allocations/999999.1/signals/ack_preemption")
    assert ghost.status_code == 403, ghost.text  # a rank's token opens only its own trial


# -- optional routes -------------------------------------------------------------------------


async def test_an_alert_becomes_a_line_of_the_trials_logs(rank: Rank) -> None:
    trial = rank.trial
    body: dict[str, Any] = {
        "data": {
            "title": "loss diverged",
            "description": "at step 10",
            "level": "LOG_LEVEL_WARNING",
        },
        "experimentId": trial.experiment_id,
        "trialId": trial.id,
    }
    reply = await rank.post("/api/v1/webhooks/custom", body)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {}
    lines = await read(rank.client, f"/api/v1/trials/{trial.id}/logs")
    assert messages(lines) == ["WARNING: alert: loss diverged: at step 10\n"]
    assert lines[0]["level"] == "LOG_LEVEL_WARNING"

    wrong = dict(body, experimentId=trial.experiment_id + 1)
    reply = await rank.post("/api/v1/webhooks/custom", wrong)
    assert reply.status_code == 400, reply.text
    assert reply.json()["message"].startswith("experimentId")
    bad_level = {**body, "data": {**body["data"], "level": "LOUD"}}
    reply = await rank.post("/api/v1/webhooks/custom", bad_level)
    assert reply.status_code == 400, reply.text
    assert "data.level" in reply.json()["message"]
    assert len(await read(rank.client, f"/api/v1/trials/{trial.id}/logs")) == 1


async def test_run_metadata_is_merged_and_read_back(rank: Rank) -> None:
    """TrainContext.set_metadata / get_metadata: a run is a trial here."""
    trial_id = rank.trial.id
    path = f"/api/v1/runs/{trial_id}/metadata"
    empty = await rank.get(path)
    assert (empty.status_code, empty.json()) == (200, {"metadata": {}})
    first = await rank.post(path, {"runId": trial_id, "metadata": {"a": 1, "nested": {"x": 1}}})
    assert first.json() == {"metadata": {"a": 1, "nested": {"x": 1}}}, first.text
    update = {"b": "two", "nested": {"y": 2}}
    second = await rank.post(path, {"runId": trial_id, "metadata": update})
    merged = {"a": 1, "b": "two", "nested": {"x": 1, "y": 2}}
    assert second.json() == {"metadata": merged}, second.text
    assert (await rank.get(path)).json() == {"metadata": merged}
    wrong = await rank.post(path, {"runId": trial_id + 1, "metadata": {"c": 3}})
    assert wrong.status_code == 400 and "runId" in wrong.json()["message"], wrong.text
    not_an_object = await rank.post(path, {"runId": trial_id, "metadata": [1, 2]})
    assert not_an_object.status_code == 400 and "metadata" in not_an_object.text
    assert (await rank.get(path)).json() == {"metadata": merged}  # nothing changed
    # A rank's token opens only its own trial's routes.
    assert (await rank.get("/api/v1/runs/999999/metadata")).status_code == 403


async def test_accelerator_data_is_accepted(rank: Rank) -> None:
    allocation_id = rank.trial.allocation_id
    body = {
        "allocationId": allocation_id,
        "acceleratorData": {
            "containerId": "",
            "allocationId": allocation_id,
            "nodeName": "agent-a",
            "taskId": rank.trial.task_id,
            "acceleratorType": "cpu",
            "acceleratorUuids": [],
        },
    }
    reply = await rank.post(f"/api/v1/allocations/{allocation_id}/acceleratorData", body)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {}
    ghost = await rank.post("/api/v1/allocations/999999.1/acceleratorData", body)
    assert ghost.status_code == 403, ghost.text  # a rank's token opens only its own trial
    reply = await rank.post(
        f"/api/v1/allocations/{allocation_id}/acceleratorData", {"acceleratorData": []}
    )
    assert reply.status_code == 400, reply.text
    assert "acceleratorData" in reply.json()["message"]


# -- malformed bodies: a 400 naming the field, never a 500 ------------------------------------


def _routes(trial: Trial) -> dict[str, dict[str, Any]]:
    """Each Core API route that takes a body, with a valid body to break."""
    return {
        f"/api/v1/trials/{trial.id}/metrics": metrics_body(trial, "training", 1, {"loss": 1}),
        f"/api/v1/trials/{trial.id}/progress": {"progress": 0.5},
        f"/api/v1/trials/{trial.id}/runner/metadata": {"state": "training"},
        "/api/v1/runs/start": {"runId": trial.id},
        "/api/v1/checkpoints": checkpoint_body(trial, 1),
        f"/api/v1/trials/{trial.id}/early_exit": {"reason": "EXITED_REASON_INVALID_HP"},
        f"/api/v1/allocations/{trial.allocation_id}/signals/ack_preemption": {},
        "/api/v1/webhooks/custom": {
            "data": {"title": "t", "description": "d", "level": "LOG_LEVEL_INFO"},
            "experimentId": trial.experiment_id,
            "trialId": trial.id,
        },
        f"/api/v1/allocations/{trial.allocation_id}/acceleratorData": {
            "allocationId": trial.allocation_id,
            "acceleratorData": {"acceleratorType": "cpu"},
        },
    }


async def test_bodies_that_are_not_objects_are_a_400_naming_the_body(rank: Rank) -> None:
    for path in _routes(rank.trial):
        for raw in ("[]", '"text"', "{", "[1, 2", "7", "nul"):
            reply = await rank.post(path, raw=raw)
            assert reply.status_code == 400, (path, raw, reply.text)
            error = reply.json()
            assert error["code"] == 3 and error["message"].startswith("body"), (path, raw)


WRONG_FIELDS: list[tuple[str, list[Any], Any, str]] = [
    ("metrics", ["group"], 7, "body group:"),
    ("metrics", ["metrics"], "x", "body metrics:"),
    ("metrics", ["metrics", "trialRunId"], "one", "body metrics.trialRunId:"),
    ("metrics", ["metrics", "stepsCompleted"], -1, "body metrics.stepsCompleted:"),
    ("metrics", ["metrics", "metrics", "avgMetrics"], [1], "body metrics.metrics.avgMetrics:"),
    ("metrics", ["metrics", "metrics", "batchMetrics"], {"a": 1}, "metrics.batchMetrics"),
    ("metrics", ["metrics", "reportTime"], "yesterday", "body metrics.reportTime:"),
    ("progress", ["progress"], "half", "body progress:"),
    ("progress", ["progress"], None, "body progress:"),
    ("runner/metadata", ["state"], ["training"], "body state:"),
    ("runs/start", ["runId"], "seven", "body runId:"),
    ("runs/start", ["checkpointStorage"], "shared_fs", "body checkpointStorage:"),
    ("checkpoints", ["uuid"], None, "body uuid:"),
    ("checkpoints", ["metadata"], [], "body metadata:"),
    ("checkpoints", ["resources"], "1234", "body resources:"),
    ("checkpoints", ["training"], "t", "body training:"),
    ("checkpoints", ["storageId"], "s3", "body storageId:"),
    ("webhooks/custom", ["data"], None, "body data:"),
    ("webhooks/custom", ["data", "title"], 5, "body data.title:"),
    ("webhooks/custom", ["experimentId"], "one", "body experimentId:"),
    ("acceleratorData", ["acceleratorData"], "cpu", "body acceleratorData:"),
]


def _set(body: dict[str, Any], keys: list[Any], value: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(body))
    target = copy
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value
    return copy


def _drop(body: dict[str, Any], keys: list[Any]) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(body))
    target = copy
    for key in keys[:-1]:
        target = target[key]
    del target[keys[-1]]
    return copy


async def test_wrong_types_are_a_400_naming_the_field(rank: Rank, api: httpx.AsyncClient) -> None:
    routes = _routes(rank.trial)
    for suffix, keys, value, needle in WRONG_FIELDS:
        (path,) = [p for p in routes if p.endswith(suffix)]
        reply = await rank.post(path, _set(routes[path], keys, value))
        assert reply.status_code == 400, (suffix, keys, reply.text)
        assert needle in reply.json()["message"], (suffix, keys, reply.json()["message"])
    # Nothing was stored by any of them.
    assert await curve(api, rank.trial) == []
    view = await trial_json(api, rank.trial)
    assert (view["progress"], view["runnerState"], view["latestCheckpointUuid"]) == (None, "", None)


MISSING_FIELDS: list[tuple[str, list[Any], str]] = [
    ("metrics", ["group"], "body group:"),
    ("metrics", ["metrics", "trialId"], "body metrics.trialId:"),
    ("metrics", ["metrics", "trialRunId"], "body metrics.trialRunId:"),
    ("metrics", ["metrics", "metrics"], "body metrics.metrics:"),
    ("metrics", ["metrics", "metrics", "avgMetrics"], "body metrics.metrics.avgMetrics:"),
    ("progress", ["progress"], "body progress:"),
    ("runs/start", ["runId"], "runId"),
    ("checkpoints", ["uuid"], "body uuid:"),
    ("checkpoints", ["metadata"], "metadata.steps_completed"),
    ("early_exit", ["reason"], "reason"),
    ("webhooks/custom", ["data"], "body data:"),
    ("webhooks/custom", ["experimentId"], "body experimentId:"),
    ("acceleratorData", ["acceleratorData"], "body acceleratorData:"),
]


async def test_missing_required_keys_are_a_400_naming_them(rank: Rank) -> None:
    routes = _routes(rank.trial)
    for suffix, keys, needle in MISSING_FIELDS:
        (path,) = [p for p in routes if p.endswith(suffix)]
        reply = await rank.post(path, _drop(routes[path], keys))
        assert reply.status_code == 400, (suffix, keys, reply.text)
        assert needle in reply.json()["message"], (suffix, keys, reply.json()["message"])


async def test_an_empty_body_is_fine_only_where_every_field_is_optional(rank: Rank) -> None:
    for path in _routes(rank.trial):
        reply = await rank.post(path)
        optional = path.endswith(("ack_preemption", "runner/metadata"))
        assert reply.status_code == (200 if optional else 400), (path, reply.text)
        if not optional:
            assert reply.json()["message"].startswith("body"), path


async def test_a_bad_preemption_timeout_is_a_400_naming_it(rank: Rank) -> None:
    path = f"/api/v1/allocations/{rank.trial.allocation_id}/signals/preemption"
    for value in ("soon", "-1", "1.5"):
        reply = await rank.get(path, timeout_seconds=value)
        assert reply.status_code == 400, (value, reply.text)
        assert "timeout_seconds" in reply.json()["message"], value
