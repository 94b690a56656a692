"""The scheduler loop's in-memory view stays what the database says, through a random mix
of what users and agents do (submits, passes, releases of every outcome, kills, pauses),
and it loads from the database only when a change was not described to it."""

from __future__ import annotations

import random

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from master.core.cluster_view import ClusterView
from master.db.models import AllocationModel, AllocationState
from master.db.session import session_scope
from master.services import experiments, scheduler
from master.services.allocations import HELD_STATES, ReleaseOutcome, hold_scheduler_for_pass
from master.services.release import release_allocation
from tests.api.test_scheduling import config, register, submit
from tests.conftest import reset_database

STEPS = 60
SEED = 20261127


async def fresh_view(app: FastAPI) -> ClusterView:
    """What a pass would load now, under the scheduler's lock."""
    view = ClusterView()
    async with session_scope(app.state.session_factory) as session:
        epoch = await hold_scheduler_for_pass(session)
        await scheduler.load_view(session, view, epoch, app.state.settings)
    return view


async def held_allocations(app: FastAPI) -> list[tuple[str, str]]:
    async with session_scope(app.state.session_factory) as session:
        rows = await session.execute(
            select(AllocationModel.id, AllocationModel.state)
            .where(AllocationModel.state.in_(HELD_STATES))
            .order_by(AllocationModel.id)
        )
        return [(allocation_id, state) for allocation_id, state in rows.all()]


# What the hub decides when an allocation's ranks have all exited (AgentHub._outcome): a
# kill's allocation ends KILLED; any other, as its ranks ended.
ENDINGS = [
    ReleaseOutcome.COMPLETED,
    ReleaseOutcome.FAILED,
    ReleaseOutcome.PREEMPTED,
    ReleaseOutcome.AGENT_LOST,
    ReleaseOutcome.UNRUNNABLE,
]


async def test_the_view_matches_the_database_after_every_step(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    rng = random.Random(SEED)
    for name in ("v1", "v2", "v3"):
        await register(app, name, 4)
    loop = scheduler.SchedulerLoop(app.state.session_factory, app.state.settings)
    experiments: list[int] = []
    done: list[str] = []
    passes_with_a_load = 0
    actions: list[str] = []
    for step in range(STEPS):
        action = rng.choice(["submit", "submit", "pass", "pass", "release", "kill", "pause"])
        actions.append(action)
        if action == "submit" or not experiments:
            slots = rng.choice([1, 1, 2, 4, 8])
            trials = rng.choice([1, 1, 3])
            # Some capped by resources.max_slots: the view must hold the cap as a load does.
            extra = rng.choice(["", "", f", max_slots: {slots * 2}"])
            body = await submit(api, config(slots, name=f"s{step}", trials=trials, extra=extra))
            experiments.append(body["experiment"]["id"])
        elif action == "pass":
            loop.wake()
            await loop.run_once()
            assert loop.last is not None
            passes_with_a_load += loop.last.loaded_view
        elif action == "release":
            held = await held_allocations(app)
            if held:
                allocation_id, state = rng.choice(held)
                terminating = state == AllocationState.TERMINATING
                outcome = ReleaseOutcome.KILLED if terminating else rng.choice(ENDINGS)
                async with session_scope(app.state.session_factory) as session:
                    await release_allocation(session, allocation_id, outcome, "random step")
                done.append(f"{allocation_id} {outcome}")
        elif action == "kill":
            reply = await api.post(f"/api/v1/experiments/{rng.choice(experiments)}/kill")
            assert reply.status_code == 200, reply.text
        else:  # pause, then activate: a change the view is not told the details of
            experiment_id = rng.choice(experiments)
            await api.post(f"/api/v1/experiments/{experiment_id}/pause")
            await api.post(f"/api/v1/experiments/{experiment_id}/activate")
        loop.wake()
        await loop.run_once()
        assert loop.last is not None
        passes_with_a_load += loop.last.loaded_view
        fresh = await fresh_view(app)
        view = loop.view
        assert view.exact_at(fresh.epoch or -1), f"step {step} ({action}): epoch {view.epoch}"
        assert view.pending == fresh.pending, f"step {step} ({action}): the queue differs"
        assert view.held == fresh.held, f"step {step} ({action}): the held slots differ"
        assert view.agents == fresh.agents, f"step {step} ({action}): the agents differ"
    async with session_scope(app.state.session_factory) as session:
        states = set((await session.scalars(select(AllocationModel.state).distinct())).all())
    # The mix did what it is for: something was placed, released and still waits.
    assert {AllocationState.TERMINATED, AllocationState.PENDING} <= states, states
    assert any(s in states for s in HELD_STATES), states
    assert len(done) >= 5, done
    # Most passes used the view as the commits left it; the loads are the pauses'.
    passes = STEPS + actions.count("pass")
    assert passes_with_a_load <= actions.count("pause") + passes // 10, (passes_with_a_load, passes)


async def test_a_submit_says_why_it_cannot_fit_from_the_loaded_view(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the loop's view is loaded, a submit's capacity warning reads the agents from it
    (no query), and says what the database would."""
    await register(app, "w1", 2)
    loop = scheduler.SchedulerLoop(app.state.session_factory, app.state.settings)
    await loop.run_once()  # loads the view
    assert loop.view.epoch is not None

    async def no_query(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("the agents were read from the database")

    monkeypatch.setattr(experiments, "load_agent_states", no_query)
    body = await submit(api, config(4, name="too-big"))
    [warning] = body["warningMessages"]
    assert "cannot run yet" in warning and "(the pool has 1)" in warning, warning
    assert "LAUNCH_WARNING_CURRENT_SLOTS_EXCEEDED" in body["warnings"]
    monkeypatch.undo()

    # An agent change is not described to the view: until a pass loads it again, a submit
    # reads the database, and sees the new agent.
    await register(app, "w2", 4)
    assert loop.view.epoch is None
    body = await submit(api, config(4, name="fits-now"))
    assert not any("cannot run yet" in w for w in body["warningMessages"])


async def test_a_failed_pass_or_a_database_started_afresh_makes_the_view_load(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    await register(app, "f1", 2)
    await submit(api, config(1, name="first"))
    loop = scheduler.SchedulerLoop(app.state.session_factory, app.state.settings)
    await loop.run_once()
    assert loop.view.epoch is not None and loop.view.held

    await submit(api, config(1, name="second"))

    async def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("the write failed")

    monkeypatch.setattr(scheduler, "_write_assignments", broken)
    loop.wake()
    with pytest.raises(RuntimeError, match="the write failed"):
        await loop.run_once()
    assert loop.view.epoch is None  # what it planned on is in doubt
    monkeypatch.undo()
    loop.wake()
    await loop.run_once()
    assert loop.last is not None and loop.last.loaded_view and loop.last.placed == 1

    # A database whose scheduler state starts again (epoch 0): the view was of another one.
    await reset_database(app)
    assert loop.view.epoch is None
