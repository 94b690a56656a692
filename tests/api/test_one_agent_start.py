"""A gang that lies wholly on one agent starts without the prepare round trip when that
agent picks the rendezvous port itself (Hello.picks_master_port); gangs across agents, and
agents that do not pick, still prepare."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from sqlalchemy import select

from master.db.models import AllocationModel
from master.db.session import session_scope
from master.services import scheduler
from master.services.agent_link import AgentHub, Connection
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_agent_link import exited, hub_of, of_kind, open_as_agent, sent, trial_of


def config(slots: int) -> str:
    return f"""
name: one-agent
entrypoint: python3 train.py
resources: {{slots_per_trial: {slots}}}
max_restarts: 0
searcher: {{name: single, metric: loss, max_length: 1}}
"""


async def connect_picking(hub: AgentHub, agent_id: str, slots: int = 2) -> Connection:
    hello = pb.Hello(
        agent_id=agent_id,
        resource_pool="default",
        join_token=hub.join_token,
        instance_id=agent_id,
        devices=[pb.Device(slot_id=s, type="cpu", index=-1) for s in range(slots)],
        interfaces=[pb.NetworkInterface(name="eth0", ipv4=[f"198.18.1.{ord(agent_id[-1])}"])],
        picks_master_port=True,
    )
    return await open_as_agent(hub, hello)


async def submit_and_place(app: FastAPI, api: httpx.AsyncClient, slots: int) -> int:
    reply = await api.post("/api/v1/experiments", json={"config": config(slots), "activate": True})
    assert reply.status_code == 200, reply.text
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 1
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


async def allocation_row(app: FastAPI, allocation_id: str) -> AllocationModel:
    async with session_scope(app.state.session_factory) as session:
        row = await session.scalar(
            select(AllocationModel).where(AllocationModel.id == allocation_id)
        )
        assert row is not None
        return row


async def test_a_one_agent_gang_starts_at_once_and_the_port_the_agent_picked_is_kept(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    agent = await connect_picking(hub, "pick-a")
    experiment_id = await submit_and_place(app, api, 2)
    await hub.tick()
    messages = sent(agent)
    assert not of_kind(messages, "prepare")
    (start,) = of_kind(messages, "start")
    assert start.pick_master_port is True
    assert [r.rank for r in start.ranks] == [0, 1]
    assert start.env["MASTER_ADDR"] == "198.18.1.97" and start.env["WORLD_SIZE"] == "2"
    row = await allocation_row(app, start.allocation_id)
    # Started as far as the master knows: ranks may run from this commit on.
    assert row.state == "STARTING" and row.master_port == 0

    await hub.on_message(
        agent,
        pb.AgentMessage(
            started=pb.AllocationStarted(allocation_id=start.allocation_id, master_port=41234)
        ),
    )
    row = await allocation_row(app, start.allocation_id)
    assert row.state == "RUNNING" and row.master_port == 41234
    assert (await trial_of(api, experiment_id))["state"] == "STATE_RUNNING"


async def test_a_kill_before_the_agent_answers_waits_for_its_ranks(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    """The start went out without a prepare: ranks may already run, so a kill stops them
    and the slots stay held until the agent says they are gone."""
    hub = hub_of(app)
    agent = await connect_picking(hub, "pick-b")
    experiment_id = await submit_and_place(app, api, 1)
    await hub.tick()
    (start,) = of_kind(sent(agent), "start")
    reply = await api.post(f"/api/v1/experiments/{experiment_id}/kill")
    assert reply.status_code == 200, reply.text
    await hub.tick()
    (stop,) = of_kind(sent(agent), "stop")
    assert stop.allocation_id == start.allocation_id
    assert (await allocation_row(app, start.allocation_id)).state == "TERMINATING"
    await hub.on_message(agent, exited(start.allocation_id, pb.EXIT_KIND_STOPPED, "killed"))
    assert (await allocation_row(app, start.allocation_id)).state == "TERMINATED"
    assert (await trial_of(api, experiment_id))["state"] == "STATE_CANCELED"


async def test_a_gang_across_two_agents_still_prepares(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    a, b = await connect_picking(hub, "pick-c", 1), await connect_picking(hub, "pick-d", 1)
    await submit_and_place(app, api, 2)
    await hub.tick()
    (prepare,) = of_kind(sent(a), "prepare")
    assert not of_kind(sent(b), "prepare")
    await hub.on_message(
        a,
        pb.AgentMessage(
            prepared=pb.AllocationPrepared(allocation_id=prepare.allocation_id, master_port=29510)
        ),
    )
    starts = of_kind(sent(a), "start") + of_kind(sent(b), "start")
    assert len(starts) == 2
    assert all(not s.pick_master_port and s.env["MASTER_PORT"] == "29510" for s in starts)
