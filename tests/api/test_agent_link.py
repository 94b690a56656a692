"""The master's agent hub in-process, on SQLite and Postgres: the gang state machine driven
with the protocol's own messages, without sockets (the e2e tests run it over real gRPC)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.db.session import session_scope
from master.services import scheduler
from master.services.agent_link import AgentHub, Connection, Refusal
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
    connection, _ = await hub.open(hello)
    return connection


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
