"""The preemption long-poll trial code watches: answered at once when the master wants the
allocation to stop, held otherwise, and never holding a database connection while it waits."""

from __future__ import annotations

import asyncio
import time

import httpx
from fastapi import FastAPI

from master.db.session import session_scope
from master.services import scheduler
from tests.api.test_agent_link import connect, hub_of, until_polls_wait
from tests.factories import create_experiment

# Bounds: "at once" is a few milliseconds idle; a loaded machine at half speed, running the
# suite beside, has been much slower. Each bound stays far below the timeout of the poll it
# is about, so a poll that is held instead of answered still fails it.
AT_ONCE_S = 5.0
HELD_S = 30  # the timeout of polls that must be answered before it

CONFIG = """
name: preemption
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 100}}
"""


async def queued_allocation(api: httpx.AsyncClient) -> tuple[int, str]:
    """A new experiment's id and its one trial's (pending) allocation id."""
    reply = await create_experiment(api, CONFIG)
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    tasks = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    (allocation_id,) = [a for a, t in tasks.items() if t["experimentId"] == experiment_id]
    return experiment_id, allocation_id


async def poll(
    api: httpx.AsyncClient, allocation_id: str, timeout_seconds: int
) -> tuple[httpx.Response, float]:
    """The reply and how long it took, in seconds."""
    began = time.monotonic()
    reply = await api.get(
        f"/api/v1/allocations/{allocation_id}/signals/preemption",
        params={"timeout_seconds": timeout_seconds},
        timeout=timeout_seconds + 30,
    )
    return reply, time.monotonic() - began


async def test_a_quiet_poll_answers_false_when_its_timeout_passes(api: httpx.AsyncClient) -> None:
    _, allocation_id = await queued_allocation(api)
    reply, took = await poll(api, allocation_id, 0)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"preempt": False}
    assert took < AT_ONCE_S
    reply, took = await poll(api, allocation_id, 1)
    assert reply.json() == {"preempt": False}
    assert 0.9 <= took < 1 + AT_ONCE_S


async def test_a_waiting_poll_answers_true_as_soon_as_the_signal_is_raised(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    _, allocation_id = await queued_allocation(api)
    waiting = asyncio.create_task(poll(api, allocation_id, HELD_S))
    await until_polls_wait(app, allocation_id)
    assert not waiting.done()
    raised_at = time.monotonic()
    app.state.preemption.raise_signal(allocation_id)
    reply, took = await waiting
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"preempt": True}
    assert time.monotonic() - raised_at < AT_ONCE_S and took < HELD_S
    # Later polls say so at once too.
    reply, took = await poll(api, allocation_id, HELD_S)
    assert reply.json() == {"preempt": True} and took < AT_ONCE_S


async def test_a_paused_running_trial_is_told_at_once(api: httpx.AsyncClient, app: FastAPI) -> None:
    hub = hub_of(app)
    await connect(hub, "agent-a")
    experiment_id, allocation_id = await queued_allocation(api)
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 1
    assert (await poll(api, allocation_id, 0))[0].json() == {"preempt": False}
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    reply, took = await poll(api, allocation_id, HELD_S)
    assert reply.json() == {"preempt": True} and took < AT_ONCE_S


async def test_a_waiting_poll_hears_of_a_pause_at_the_hubs_next_tick(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    hub = hub_of(app)
    await connect(hub, "agent-a")
    experiment_id, allocation_id = await queued_allocation(api)
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 1
    waiting = asyncio.create_task(poll(api, allocation_id, HELD_S))
    await until_polls_wait(app, allocation_id)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    ticked_at = time.monotonic()
    await hub.tick()
    reply, took = await waiting
    assert reply.json() == {"preempt": True}
    assert time.monotonic() - ticked_at < AT_ONCE_S and took < HELD_S


async def test_an_ended_allocation_says_stop(api: httpx.AsyncClient) -> None:
    experiment_id, allocation_id = await queued_allocation(api)
    # Pausing a queued trial ends its pending allocation.
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    tasks = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    assert allocation_id not in tasks  # ended
    reply, took = await poll(api, allocation_id, HELD_S)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"preempt": True}
    assert took < AT_ONCE_S


async def test_acknowledging_and_what_is_refused(api: httpx.AsyncClient) -> None:
    _, allocation_id = await queued_allocation(api)
    bodies: tuple[dict[str, object] | None, ...] = ({}, None)
    for body in bodies:  # the harness sends an empty object; other clients nothing
        reply = await api.post(
            f"/api/v1/allocations/{allocation_id}/signals/ack_preemption", json=body
        )
        assert reply.status_code == 200, reply.text
        assert reply.json() == {}
    reply, _ = await poll(api, "999999.1", 5)
    assert reply.status_code == 404, reply.text
    assert reply.json()["code"] == 5
    reply = await api.post("/api/v1/allocations/999999.1/signals/ack_preemption", json={})
    assert reply.status_code == 404, reply.text
    # The harness authenticates with its allocation token header; nothing at all is a 401.
    token = api.headers.pop("Authorization")
    reply, _ = await poll(api, allocation_id, 0)
    assert reply.status_code == 401, reply.text
    reply = await api.get(
        f"/api/v1/allocations/{allocation_id}/signals/preemption",
        headers={"Grpc-Metadata-x-allocation-token": token},
    )
    assert reply.json() == {"preempt": False}


async def test_waiting_polls_do_not_starve_other_requests(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    # More waiting polls than the connection pool holds (5 + 10 overflow by default): were
    # each to keep its connection, the GET below would wait for one to come free, until the
    # polls' 8 s run out. (It takes milliseconds idle; the bound leaves a loaded machine room.)
    experiment_id, allocation_id = await queued_allocation(api)
    waiting = [asyncio.create_task(poll(api, allocation_id, 8)) for _ in range(20)]
    await until_polls_wait(app, allocation_id, 20)
    assert not any(w.done() for w in waiting)
    began = time.monotonic()
    reply = await api.get(f"/api/v1/experiments/{experiment_id}")
    took = time.monotonic() - began
    assert reply.status_code == 200, reply.text
    assert took < 3.0
    assert not any(w.done() for w in waiting)  # they really were waiting meanwhile
    for reply, _ in await asyncio.gather(*waiting):
        assert reply.json() == {"preempt": False}
