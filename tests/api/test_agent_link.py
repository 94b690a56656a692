"""The master's agent hub in-process, on SQLite and Postgres: the gang state machine driven
with the protocol's own messages, without sockets (the e2e tests run it over real gRPC)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.db.session import session_scope
from master.services import agent_link, counters, scheduler
from master.services.agent_enrolment import Refusal
from master.services.agent_link import AgentHub, Connection
from resolute_proto.agent.v1 import agent_pb2 as pb

CONFIG = """
name: gang
entrypoint: python3 train.py
resources: {slots_per_trial: 2}
max_restarts: 1
searcher: {name: single, metric: loss, max_length: 1}
"""


def hub_of(app: FastAPI) -> AgentHub:
    hub: AgentHub = app.state.agent_hub
    hub.connections.clear()
    hub.gangs.clear()
    hub.absent_since.clear()
    return hub


# What each simulated agent's credential file would hold, per hub: an agent id enrolls on
# its first Hello and must show its secret on every later one.
_SECRETS: dict[tuple[int, str], str] = {}


async def open_as_agent(hub: AgentHub, hello: pb.Hello) -> Connection:
    """`hub.open`, keeping the credential the master issues, as det-agent does."""
    key = (id(hub), hello.agent_id)
    hello.agent_secret = _SECRETS.get(key, "")
    connection, welcome = await hub.open(hello)
    if welcome.agent_secret:
        _SECRETS[key] = welcome.agent_secret
    return connection


async def connect(hub: AgentHub, agent_id: str) -> Connection:
    hello = pb.Hello(
        agent_id=agent_id,
        resource_pool="default",
        join_token=hub.join_token,
        instance_id=agent_id,
        devices=[pb.Device(slot_id=0, type="cpu", index=-1)],
        interfaces=[
            pb.NetworkInterface(name="lo", ipv4=["127.0.0.1"]),
            pb.NetworkInterface(name="eth0", ipv4=[f"198.18.0.{ord(agent_id[-1]) % 200}"]),
        ],
    )
    return await open_as_agent(hub, hello)


def sent(connection: Connection) -> list[pb.MasterMessage]:
    out = []
    while not connection.outbox.empty():
        message = connection.outbox.get_nowait()
        if message is not None:
            out.append(message)
    return out


def of_kind(messages: list[pb.MasterMessage], kind: str) -> list[Any]:
    return [getattr(m, kind) for m in messages if m.WhichOneof("body") == kind]


async def trial_of(api: httpx.AsyncClient, experiment_id: int) -> dict[str, Any]:
    trials = (await api.get(f"/api/v1/experiments/{experiment_id}/trials")).json()["trials"]
    trial: dict[str, Any] = trials[0]
    return trial


async def started_gang(
    app: FastAPI, api: httpx.AsyncClient
) -> tuple[AgentHub, Connection, Connection, int, str]:
    """Two one-slot agents running a two-rank trial: returns the hub, both connections,
    the experiment id and the allocation id."""
    hub = hub_of(app)
    a, b = await connect(hub, "agent-a"), await connect(hub, "agent-b")
    reply = await api.post("/api/v1/experiments", json={"config": CONFIG, "activate": True})
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 1
    await hub.tick()
    (prepare,) = of_kind(sent(a), "prepare")  # the chief (first by id) reserves the port
    assert not of_kind(sent(b), "prepare")
    allocation_id = prepare.allocation_id
    await hub.on_message(
        a,
        pb.AgentMessage(
            prepared=pb.AllocationPrepared(allocation_id=allocation_id, master_port=29500)
        ),
    )
    (start_a,), (start_b,) = of_kind(sent(a), "start"), of_kind(sent(b), "start")
    assert [r.rank for r in start_a.ranks] == [0] and [r.rank for r in start_b.ranks] == [1]
    for start in (start_a, start_b):
        assert start.env["MASTER_ADDR"] == "198.18.0.97"  # agent-a's eth0 ("a" = 97)
        assert start.env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert start.env["WORLD_SIZE"] == "2" and start.env["MASTER_PORT"] == "29500"
    for connection in (a, b):
        await hub.on_message(
            connection,
            pb.AgentMessage(started=pb.AllocationStarted(allocation_id=allocation_id)),
        )
    assert (await trial_of(api, experiment_id))["state"] == "STATE_RUNNING"
    return hub, a, b, experiment_id, allocation_id


def exited(allocation_id: str, kind: int, message: str = "") -> pb.AgentMessage:
    return pb.AgentMessage(
        exited=pb.AllocationExited(allocation_id=allocation_id, kind=kind, message=message)  # type: ignore[arg-type]
    )


async def test_a_failed_rank_stops_the_gang_and_the_exit_is_acked_only_on_release(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    await hub.on_message(b, exited(allocation_id, pb.EXIT_KIND_FAILED, "rank 1 exited with code 1"))
    assert of_kind(sent(a), "stop")  # the other agent's ranks are told to stop
    assert not of_kind(sent(b), "exit_ack")  # not yet: the gang has not ended
    assert (await trial_of(api, experiment_id))["state"] == "STATE_RUNNING"

    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_STOPPED, "stopping the gang"))
    assert of_kind(sent(a), "exit_ack") and of_kind(sent(b), "exit_ack")
    trial = await trial_of(api, experiment_id)
    assert trial["restarts"] == 1  # a user failure counts
    assert trial["state"] == "STATE_QUEUED"


async def test_an_agent_outside_the_gang_cannot_end_it(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, _, _, experiment_id, allocation_id = await started_gang(app, api)
    stranger = await connect(hub, "agent-z")
    await hub.on_message(stranger, exited(allocation_id, pb.EXIT_KIND_FAILED, "lies"))
    assert not of_kind(sent(stranger), "exit_ack")
    trial = await trial_of(api, experiment_id)
    assert (trial["state"], trial["restarts"]) == ("STATE_RUNNING", 0)


async def test_a_kill_before_the_start_releases_at_once(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    await connect(hub, "agent-a")
    await connect(hub, "agent-b")
    reply = await api.post("/api/v1/experiments", json={"config": CONFIG, "activate": True})
    experiment_id = reply.json()["experiment"]["id"]
    async with session_scope(app.state.session_factory) as session:
        await scheduler.run_pass(session, app.state.settings)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/kill")).status_code == 200
    await hub.tick()
    assert (await trial_of(api, experiment_id))["state"] == "STATE_CANCELED"


async def test_a_wrong_join_token_is_refused_and_registers_nothing(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    with pytest.raises(Refusal, match="join token"):
        await hub.open(pb.Hello(agent_id="intruder", join_token="guess"))
    assert (await api.get("/api/v1/agents/intruder")).status_code == 404


# -- preemption, resuming ------------------------------------------------------------------


def stops(*connections: Connection) -> list[list[Any]]:
    """The StopAllocation messages each connection was sent since the last look."""
    return [of_kind(sent(c), "stop") for c in connections]


async def until_polls_wait(app: FastAPI, allocation_id: str, count: int = 1) -> None:
    """Until `count` long-polls of the allocation's signal wait in the master (a loaded
    machine may take far longer than usual to get a request there)."""
    deadline = time.monotonic() + 30
    while app.state.preemption._waiting.get(allocation_id, 0) < count:
        assert time.monotonic() < deadline, f"fewer than {count} polls of {allocation_id} wait"
        await asyncio.sleep(0.01)


async def long_poll(
    app: FastAPI, api: httpx.AsyncClient, allocation_id: str
) -> asyncio.Task[httpx.Response]:
    """The chief's preemption watcher, waiting in its long-poll."""
    task = asyncio.create_task(
        api.get(
            f"/api/v1/allocations/{allocation_id}/signals/preemption",
            params={"timeout_seconds": 30},
            timeout=60,
        )
    )
    await until_polls_wait(app, allocation_id)
    assert not task.done()
    return task


async def test_a_trial_watching_its_signal_gets_the_preemption_timeout_to_stop(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    # Two seconds: the acknowledgement and the tick below come well inside it, even on a
    # loaded machine.
    monkeypatch.setattr(hub.link, "preemption_timeout_s", 2.0)
    watcher = await long_poll(app, api, allocation_id)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    await hub.tick()
    assert (await watcher).json() == {"preempt": True}  # the tick raised the signal
    ack = f"/api/v1/allocations/{allocation_id}/signals/ack_preemption"
    assert (await api.post(ack, json={})).status_code == 200
    assert stops(a, b) == [[], []]  # time to checkpoint and exit
    await hub.tick()
    assert stops(a, b) == [[], []]

    await asyncio.sleep(2.1)
    await hub.tick()
    stop_a, stop_b = stops(a, b)
    assert [s.allocation_id for s in stop_a + stop_b] == [allocation_id] * 2
    for connection in (a, b):
        await hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_STOPPED, "SIGTERM"))
    trial = await trial_of(api, experiment_id)
    assert (trial["state"], trial["restarts"]) == ("STATE_PAUSED", 0)


async def test_a_trial_told_by_its_long_poll_keeps_the_whole_timeout_without_an_ack(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Determined's harness stops polling once told, and acknowledges only when user code
    # next calls should_preempt(): it was listening, and must get preemption_timeout_s,
    # however long ago its (last) poll was answered.
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    # The first tick comes past the poll window and, even on a loaded machine, well
    # within the timeout; the second past the timeout.
    monkeypatch.setattr(hub.link, "preemption_timeout_s", 3.0)
    monkeypatch.setattr(agent_link, "PREEMPTION_POLL_WINDOW_S", 0.2)
    watcher = await long_poll(app, api, allocation_id)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    await hub.tick()
    assert (await watcher).json() == {"preempt": True}
    await asyncio.sleep(0.4)  # past the poll window, well within the timeout
    await hub.tick()
    assert stops(a, b) == [[], []]
    await asyncio.sleep(2.7)
    await hub.tick()
    assert all(stops(a, b))


async def test_a_trial_not_watching_its_signal_is_stopped_at_the_next_tick(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    await hub.tick()
    stop_a, stop_b = stops(a, b)
    assert [s.allocation_id for s in stop_a + stop_b] == [allocation_id] * 2


async def test_a_kill_does_not_wait_for_a_watching_trial(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    watcher = await long_poll(app, api, allocation_id)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    await hub.tick()
    assert (await watcher).json() == {"preempt": True}
    assert stops(a, b) == [[], []]
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/kill")).status_code == 200
    await hub.tick()
    assert all(stops(a, b))


@pytest.mark.parametrize(
    ("how", "after"),
    [("pause", "STATE_PAUSED"), ("disable", "STATE_QUEUED")],
)
async def test_ranks_that_exit_0_when_asked_to_stop_have_not_completed(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient, how: str, after: str
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    if how == "pause":
        reply = await api.post(f"/api/v1/experiments/{experiment_id}/pause")
    else:  # an agent taken out of service asks its trials to stop and move elsewhere
        reply = await admin.post("/api/v1/agents/agent-b/disable", json={"drain": False})
    assert reply.status_code == 200, reply.text
    await api.post(f"/api/v1/allocations/{allocation_id}/signals/ack_preemption", json={})
    await hub.tick()
    assert stops(a, b) == [[], []]
    # The trial saved a checkpoint and returned from training: exit code 0 on every rank.
    for connection in (a, b):
        await hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_COMPLETED))
    trial = await trial_of(api, experiment_id)
    assert (trial["state"], trial["restarts"]) == (after, 0)
    experiment = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
    assert experiment["state"] == ("STATE_PAUSED" if how == "pause" else "STATE_ACTIVE")


async def report_training(
    api: httpx.AsyncClient, trial_id: int, run_id: int, steps: int, headers: dict[str, str]
) -> None:
    body = {
        "group": "training",
        "metrics": {
            "trialId": trial_id,
            "trialRunId": run_id,
            "stepsCompleted": steps,
            "metrics": {"avgMetrics": {"loss": 1.0 / steps}, "batchMetrics": None},
        },
    }
    reply = await api.post(f"/api/v1/trials/{trial_id}/metrics", json=body, headers=headers)
    assert reply.status_code == 200, reply.text


async def next_start(
    app: FastAPI, hub: AgentHub, a: Connection, b: Connection
) -> tuple[pb.StartAllocation, pb.StartAllocation]:
    """Place the queued trial again and start its gang: each agent's StartAllocation."""
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 1
    await hub.tick()
    (prepare,) = of_kind(sent(a), "prepare")
    await hub.on_message(
        a,
        pb.AgentMessage(
            prepared=pb.AllocationPrepared(allocation_id=prepare.allocation_id, master_port=29501)
        ),
    )
    (start_a,), (start_b,) = of_kind(sent(a), "start"), of_kind(sent(b), "start")
    return start_a, start_b


async def test_the_next_run_resumes_from_the_latest_checkpoint(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    trial_id, run_id = (int(x) for x in allocation_id.split("."))
    rank_auth = {"Authorization": api.headers["Authorization"]}
    for steps in (10, 20, 30):
        await report_training(api, trial_id, run_id, steps, rank_auth)
    uuids = [str(uuid.uuid4()) for _ in range(2)]
    for steps, checkpoint in zip((10, 20), uuids, strict=True):
        body = {
            "uuid": checkpoint,
            "state": "STATE_COMPLETED",
            "metadata": {"steps_completed": steps},
            "resources": {"state.pt": "10"},
            "allocationId": allocation_id,
        }
        reply = await api.post("/api/v1/checkpoints", json=body)
        assert reply.status_code == 200, reply.text

    await hub.on_message(b, exited(allocation_id, pb.EXIT_KIND_FAILED, "rank 1 exited with 1"))
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_STOPPED))
    assert (await trial_of(api, experiment_id))["state"] == "STATE_QUEUED"

    start_a, start_b = await next_start(app, hub, a, b)
    for start in (start_a, start_b):
        assert start.env["DET_TRIAL_RUN_ID"] == str(run_id + 1)
        assert start.env["DET_LATEST_CHECKPOINT"] == uuids[1]
        assert start.env["DET_STEPS_COMPLETED"] == "20"
    # What the failed run reported after its checkpoint belongs to a lost timeline.
    metrics = (await api.get(f"/api/v1/trials/{trial_id}/metrics")).json()["metrics"]
    assert [m["stepsCompleted"] for m in metrics] == [10, 20]
    trial = await trial_of(api, experiment_id)
    assert trial["totalBatchesProcessed"] == 20
    assert trial["latestCheckpointUuid"] == uuids[1]
    # The new run reports with its own token and run id; the old run's id is refused.
    new_rank = {"Grpc-Metadata-x-allocation-token": f"Bearer {start_a.env['DET_SESSION_TOKEN']}"}
    await report_training(api, trial_id, run_id + 1, 30, new_rank)
    body = {
        "group": "training",
        "metrics": {
            "trialId": trial_id,
            "trialRunId": run_id,
            "stepsCompleted": 40,
            "metrics": {"avgMetrics": {"loss": 0.1}},
        },
    }
    reply = await api.post(f"/api/v1/trials/{trial_id}/metrics", json=body, headers=new_rank)
    assert reply.status_code == 400, reply.text


async def test_a_fresh_run_of_a_trial_without_checkpoints_starts_from_zero(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, _, allocation_id = await started_gang(app, api)
    trial_id, run_id = (int(x) for x in allocation_id.split("."))
    await report_training(api, trial_id, run_id, 10, {})
    await hub.on_message(b, exited(allocation_id, pb.EXIT_KIND_FAILED, "rank 1 exited with 1"))
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_STOPPED))
    start_a, start_b = await next_start(app, hub, a, b)
    for start in (start_a, start_b):
        assert "DET_LATEST_CHECKPOINT" not in start.env
        assert start.env["DET_STEPS_COMPLETED"] == "0"
    assert (await api.get(f"/api/v1/trials/{trial_id}/metrics")).json()["metrics"] == []


async def test_a_warm_started_experiment_begins_from_its_source_checkpoint(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    source = str(uuid.uuid4())
    body = {
        "uuid": source,
        "metadata": {"steps_completed": 70},
        "resources": {},
        "allocationId": allocation_id,
    }
    assert (await api.post("/api/v1/checkpoints", json=body)).status_code == 200
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_COMPLETED))
    await hub.on_message(b, exited(allocation_id, pb.EXIT_KIND_COMPLETED))
    assert (await trial_of(api, experiment_id))["state"] == "STATE_COMPLETED"

    config = CONFIG.replace("metric: loss", f"metric: loss, source_checkpoint_uuid: '{source}'")
    reply = await api.post("/api/v1/experiments", json={"config": config, "activate": True})
    assert reply.status_code == 200, reply.text
    start_a, start_b = await next_start(app, hub, a, b)
    for start in (start_a, start_b):
        assert start.env["DET_LATEST_CHECKPOINT"] == source
        assert start.env["DET_STEPS_COMPLETED"] == "70"


async def pass_the_lost_window(hub: AgentHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every absent agent's reconnect window runs out (a short window, really waited)."""
    monkeypatch.setattr(hub.link, "lost_after_s", 0.05)
    await asyncio.sleep(0.1)
    await hub.tick()


async def test_a_rank_that_fails_because_its_peer_vanished_costs_no_restart(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    hub.close(b)  # agent-b dies (kill -9): its stream ends first ...
    # ... then agent-a's rank dies on the broken collective.
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_FAILED, "rank 0 exited with 1"))
    await pass_the_lost_window(hub, monkeypatch)
    trial = await trial_of(api, experiment_id)
    assert trial["state"] == "STATE_QUEUED"
    assert trial["restarts"] == 0  # the lost agent, not the trial, ended the run


async def test_a_rank_that_failed_before_its_peer_was_lost_still_counts(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_FAILED, "rank 0 exited with 1"))
    b.last_heartbeat = time.monotonic()  # agent-b was still heard from after the failure
    hub.close(b)
    await pass_the_lost_window(hub, monkeypatch)
    trial = await trial_of(api, experiment_id)
    assert trial["state"] == "STATE_QUEUED"
    assert trial["restarts"] == 1


async def test_a_lost_agents_trial_waits_for_its_surviving_ranks_before_it_is_requeued(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent-b goes silent; agent-a's rank of the same gang still runs. The replacement
    must not be placed until agent-a says that rank is gone."""
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    hub.close(b)
    monkeypatch.setattr(hub.link, "lost_after_s", 0.05)
    await asyncio.sleep(0.1)
    a.last_heartbeat = time.monotonic()  # agent-a keeps its heartbeats going
    await hub.tick()
    (stop,) = of_kind(sent(a), "stop")
    assert stop.allocation_id == allocation_id and "lost" in stop.reason
    # Still held: its slots are not free and no second run is placed.
    assert (await trial_of(api, experiment_id))["state"] == "STATE_RUNNING"
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 0

    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_STOPPED, "stopped"))
    trial = await trial_of(api, experiment_id)
    assert trial["state"] == "STATE_QUEUED"
    assert trial["restarts"] == 0  # the agent's loss is not the trial's fault
    assert of_kind(sent(a), "exit_ack")


async def test_a_fenced_exit_requeues_without_a_restart_and_takes_the_agent_out(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    """Agent-b heard no acknowledgement (a one-way partition) and fenced its ranks; the
    master hears it. The gang stops, the trial is requeued for free, and agent-b gets no
    more work until it reconnects."""
    hub, a, b, experiment_id, allocation_id = await started_gang(app, api)
    await hub.on_message(b, exited(allocation_id, pb.EXIT_KIND_FENCED, "fenced"))
    assert of_kind(sent(a), "stop")
    assert "agent-b" not in hub.connections
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_STOPPED, "stopped"))
    trial = await trial_of(api, experiment_id)
    assert trial["state"] == "STATE_QUEUED" and trial["restarts"] == 0
    agent = (await api.get("/api/v1/agents/agent-b")).json()["agent"]
    assert agent["connected"] is False


def test_heartbeats_must_fit_in_the_fence_window() -> None:
    from pydantic import ValidationError

    from master.settings import AgentLinkSettings

    link = AgentLinkSettings(lost_after_s=10)
    assert (link.fence_after_s, link.fence_kill_after_s) == (6.0, 2.0)
    with pytest.raises(ValidationError, match="heartbeat_interval_s"):
        AgentLinkSettings(lost_after_s=5, heartbeat_interval_s=2)


async def started_gang_with_token(
    app: FastAPI, api: httpx.AsyncClient
) -> tuple[AgentHub, Connection, Connection, int, str, dict[str, str]]:
    """started_gang, and the headers its ranks report with (their DET_SESSION_TOKEN)."""
    hub = hub_of(app)
    a, b = await connect(hub, "agent-a"), await connect(hub, "agent-b")
    reply = await api.post("/api/v1/experiments", json={"config": CONFIG, "activate": True})
    experiment_id = reply.json()["experiment"]["id"]
    start_a, _ = await next_start(app, hub, a, b)
    rank = {"Authorization": f"Bearer {start_a.env['DET_SESSION_TOKEN']}"}
    return hub, a, b, experiment_id, start_a.allocation_id, rank


def training_body(trial_id: int, run_id: int, steps: int) -> dict[str, Any]:
    return {
        "group": "training",
        "metrics": {
            "trialId": trial_id,
            "trialRunId": run_id,
            "stepsCompleted": steps,
            "metrics": {"avgMetrics": {"loss": 0.5}},
        },
    }


async def test_a_report_from_a_run_that_has_ended_is_refused_and_counted(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id, rank = await started_gang_with_token(app, api)
    trial = await trial_of(api, experiment_id)
    run_id = int(allocation_id.split(".")[1])
    path = f"/api/v1/trials/{trial['id']}/metrics"
    reply = await api.post(path, json=training_body(trial["id"], run_id, 10), headers=rank)
    assert reply.status_code == 200, reply.text

    for connection in (a, b):
        await hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_STOPPED, "fenced"))
    before = sum(counters.stale_reports.values())
    reply = await api.post(path, json=training_body(trial["id"], run_id, 20), headers=rank)
    assert reply.status_code == 401, reply.text
    assert "a run that has ended" in reply.json()["message"]
    assert sum(counters.stale_reports.values()) == before + 1
    metrics = (await api.get(path)).json()["metrics"]
    assert [m["stepsCompleted"] for m in metrics] == [10]  # nothing of the stale report


async def test_a_report_racing_its_runs_end_waits_for_it_and_is_refused(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    """The release that ends the run has revoked the token but not committed when the
    report arrives: the report waits for that commit (the check is held in its own
    transaction) and is refused, on Postgres and SQLite alike."""
    from master.db.models import AllocationModel
    from master.services import auth

    _hub, _a, _b, experiment_id, allocation_id, rank = await started_gang_with_token(app, api)
    trial = await trial_of(api, experiment_id)
    run_id = int(allocation_id.split(".")[1])
    path = f"/api/v1/trials/{trial['id']}/metrics"
    async with session_scope(app.state.session_factory) as release:
        allocation = await release.get(AllocationModel, allocation_id)
        assert allocation is not None and allocation.task_session_id is not None
        await auth.revoke_session(release, allocation.task_session_id)
        await release.flush()
        report = asyncio.create_task(
            api.post(path, json=training_body(trial["id"], run_id, 10), headers=rank)
        )
        await asyncio.sleep(0.5)
        assert not report.done(), "the report must wait for the release to commit"
    reply = await asyncio.wait_for(report, 15)
    assert reply.status_code == 401, reply.text
    metrics = (await api.get(path)).json()["metrics"]
    assert metrics == []


# -- agent identity (issue 15) ---------------------------------------------------------------


async def test_an_enrolled_agent_id_admits_only_its_own_secret(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    hello = pb.Hello(
        agent_id="node-1",
        join_token=hub.join_token,
        devices=[pb.Device(slot_id=0, type="cpu", index=-1)],
    )
    first, welcome = await hub.open(hello)
    lost = welcome.agent_secret
    assert len(lost) >= 32
    hub.close(first)
    # That Welcome never reached the agent: until it shows its secret back, the join token
    # enrolls it again (with a new secret) rather than locking the id out.
    second, welcome = await hub.open(pb.Hello(agent_id="node-1", join_token=hub.join_token))
    secret = welcome.agent_secret
    assert secret and secret != lost
    # Its first heartbeat shows it holds the secret: from then on only the secret admits it.
    await hub.on_message(second, pb.AgentMessage(heartbeat=pb.Heartbeat(seq=1)))
    await asyncio.gather(*hub._tasks)
    assert (await api.get("/api/v1/agents/node-1")).json()["agent"]["enrolled"] is True
    hub.close(second)
    for shown in ("", "guess", lost):
        impostor = pb.Hello(agent_id="node-1", join_token=hub.join_token, agent_secret=shown)
        with pytest.raises(Refusal, match="credential does not match agent id 'node-1'"):
            await hub.open(impostor)
    # Its own secret admits it without the join token, and no new secret is issued.
    again, welcome = await hub.open(pb.Hello(agent_id="node-1", agent_secret=secret))
    assert welcome.agent_secret == ""
    assert hub.connections["node-1"] is again


async def test_a_revoked_agent_is_cut_off_and_stays_out(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    connection = await connect(hub, "agent-r")
    assert "for admins" in (await api.post("/api/v1/agents/agent-r/revoke")).json()["message"]
    reply = await admin.post("/api/v1/agents/agent-r/revoke")
    assert reply.status_code == 200, reply.text
    assert (reply.json()["agent"]["enabled"], reply.json()["agent"]["revoked"]) == (False, True)
    assert connection.closed and "agent-r" not in hub.connections
    for hello in (
        pb.Hello(agent_id="agent-r", join_token=hub.join_token),
        pb.Hello(agent_id="agent-r", agent_secret=_SECRETS[(id(hub), "agent-r")]),
    ):
        with pytest.raises(Refusal, match="was revoked"):
            await hub.open(hello)
    assert (await admin.post("/api/v1/agents/nobody/revoke")).status_code == 404


async def test_an_agent_writes_only_the_logs_of_its_own_allocations(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, _b, experiment_id, allocation_id = await started_gang(app, api)
    outsider = await connect(hub, "agent-c")
    before = counters.foreign_agent_messages["logs"]

    def line(text: str) -> pb.AgentMessage:
        entry = pb.LogEntry(
            allocation_id=allocation_id,
            rank=0,
            stdtype="stdout",
            unix_micros=int(time.time() * 1e6),
            message=text,
        )
        return pb.AgentMessage(logs=pb.LogBatch(entries=[entry]))

    await hub.on_message(a, line("from a rank of the trial\n"))
    await hub.on_message(outsider, line("forged by another node\n"))
    trial_id = (await trial_of(api, experiment_id))["id"]
    reply = await api.get(f"/api/v1/trials/{trial_id}/logs")
    assert "from a rank of the trial" in reply.text
    assert "forged by another node" not in reply.text
    assert counters.foreign_agent_messages["logs"] == before + 1
    scrape = (await api.get("/metrics")).text
    assert f'resolute_foreign_agent_messages_total{{kind="logs"}} {before + 1}' in scrape


SINGLE = CONFIG.replace("slots_per_trial: 2", "slots_per_trial: 1")


async def running_singles(
    app: FastAPI, api: httpx.AsyncClient, agents: list[str]
) -> tuple[AgentHub, list[tuple[Connection, str, int]]]:
    """One one-slot trial running on each of `agents`, then killed and its stop sent:
    (connection, allocation id, experiment id) per agent."""
    hub = hub_of(app)
    connections = [await connect(hub, agent) for agent in agents]
    experiments = []
    for _ in agents:
        reply = await api.post("/api/v1/experiments", json={"config": SINGLE, "activate": True})
        assert reply.status_code == 200, reply.text
        experiments.append(reply.json()["experiment"]["id"])
    by_trial = {(await trial_of(api, e))["id"]: e for e in experiments}
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == len(agents)
    await hub.tick()
    running = []
    for connection in connections:
        (prepare,) = of_kind(sent(connection), "prepare")
        allocation_id = prepare.allocation_id
        prepared = pb.AllocationPrepared(allocation_id=allocation_id, master_port=29500)
        await hub.on_message(connection, pb.AgentMessage(prepared=prepared))
        assert of_kind(sent(connection), "start")
        started = pb.AllocationStarted(allocation_id=allocation_id)
        await hub.on_message(connection, pb.AgentMessage(started=started))
        experiment_id = by_trial[int(allocation_id.split(".")[0])]
        running.append((connection, allocation_id, experiment_id))
    for experiment_id in experiments:
        assert (await api.post(f"/api/v1/experiments/{experiment_id}/kill")).status_code == 200
    await hub.tick()
    for connection, _, _ in running:
        assert of_kind(sent(connection), "stop")
    return hub, running


async def test_exits_arriving_together_from_several_agents_share_one_transaction(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, running = await running_singles(app, api, ["agent-a", "agent-b", "agent-c", "agent-d"])
    transactions, messages = hub.state_transactions, hub.state_messages
    await asyncio.gather(
        *(
            hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_STOPPED, "killed"))
            for connection, allocation_id, _ in running
        )
    )
    assert (hub.state_transactions - transactions, hub.state_messages - messages) == (1, 4)
    for connection, allocation_id, experiment_id in running:
        assert [a.allocation_id for a in of_kind(sent(connection), "exit_ack")] == [allocation_id]
        assert (await trial_of(api, experiment_id))["state"] == "STATE_CANCELED"


async def test_a_message_that_fails_in_a_batch_fails_only_its_own_stream(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, running = await running_singles(app, api, ["agent-a", "agent-b", "agent-c"])
    _, broken, broken_experiment = running[1]
    release_allocation = agent_link.release.release_allocation

    async def failing_for_one(session: Any, allocation_id: str, *args: Any, **kw: Any) -> Any:
        if allocation_id == broken:
            raise RuntimeError("a bug in the release of one allocation")
        return await release_allocation(session, allocation_id, *args, **kw)

    monkeypatch.setattr(agent_link.release, "release_allocation", failing_for_one)
    results = await asyncio.gather(
        *(
            hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_STOPPED, "killed"))
            for connection, allocation_id, _ in running
        ),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], agent_link.StateMessageFailed)
    for index, (connection, allocation_id, experiment_id) in enumerate(running):
        acks = [a.allocation_id for a in of_kind(sent(connection), "exit_ack")]
        state = (await trial_of(api, experiment_id))["state"]
        if index == 1:
            # Not acknowledged, so the agent says it again on its next stream.
            assert acks == [] and state != "STATE_CANCELED"
        else:
            assert acks == [allocation_id] and state == "STATE_CANCELED"
    assert (await trial_of(api, broken_experiment))["state"] == "STATE_STOPPING_KILLED"
