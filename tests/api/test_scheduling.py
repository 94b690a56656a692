"""The scheduler through the master, on SQLite and Postgres: gangs, reasons, restarts.

Agents register through master.services.agents.register_agent, the function the agent
protocol calls; passes run through master.services.scheduler.run_pass, what the loop runs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.app import create_app
from master.db.models import AllocationSlotModel
from master.db.session import session_scope
from master.errors import Conflict
from master.services import agents as agent_service
from master.services import allocations as allocation_service
from master.services import scheduler, states
from master.services.allocations import ReleaseOutcome
from master.services.release import release_allocation
from master.settings import MasterSettings, ResourcePoolSettings, SchedulerSettings

SINGLE = """\
name: {name}
entrypoint: python3 train.py
resources: {{slots_per_trial: {slots}{extra}}}
searcher: {{name: {searcher}, metric: loss, max_length: 10{search_extra}}}
"""


def config(
    slots: int, name: str = "exp", trials: int = 1, extra: str = "", priority: int | None = None
) -> str:
    if priority is not None:
        extra += f", priority: {priority}"
    searcher, search_extra = (
        ("single", "") if trials == 1 else ("random", f", max_trials: {trials}")
    )
    return SINGLE.format(
        name=name, slots=slots, extra=extra, searcher=searcher, search_extra=search_extra
    )


async def register(app: FastAPI, agent_id: str, slots: int, pool: str = "default") -> None:
    registration = agent_service.AgentRegistration(
        id=agent_id,
        resource_pool=pool,
        devices=tuple(agent_service.Device(slot_id=i) for i in range(slots)),
    )
    async with session_scope(app.state.session_factory) as session:
        await agent_service.register_agent(session, app.state.settings, registration)


async def schedule(app: FastAPI) -> scheduler.PassStats:
    async with session_scope(app.state.session_factory) as session:
        return await scheduler.run_pass(session, app.state.settings)


async def release(app: FastAPI, allocation_id: str, outcome: ReleaseOutcome) -> None:
    async with session_scope(app.state.session_factory) as session:
        await release_allocation(session, allocation_id, outcome)


async def submit(api: httpx.AsyncClient, text: str) -> dict[str, Any]:
    reply = await api.post("/api/v1/experiments", json={"config": text, "activate": True})
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


async def tasks_of(api: httpx.AsyncClient, experiment_id: int) -> list[dict[str, Any]]:
    summaries = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    return sorted(
        (t for t in summaries.values() if t["experimentId"] == experiment_id),
        key=lambda t: t["trialId"],
    )


def placed_on(task: dict[str, Any]) -> dict[str, list[int]]:
    return {
        agent: [d["id"] for d in devices["devices"]]
        for r in task["resources"] or []
        for agent, devices in r["agentDevices"].items()
    }


async def trial_states(api: httpx.AsyncClient, experiment_id: int) -> list[str]:
    trials = (await api.get(f"/api/v1/experiments/{experiment_id}/trials")).json()["trials"]
    return [t["state"] for t in trials]


async def test_small_trials_share_one_agent(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "a1", 8)
    await register(app, "a2", 8)
    experiment = (await submit(api, config(2, trials=3)))["experiment"]
    stats = await schedule(app)
    assert stats.placed == 3
    tasks = await tasks_of(api, experiment["id"])
    # Best fit packs: all three 2-slot trials on the same agent, on distinct slots.
    assert [placed_on(t) for t in tasks] == [{"a1": [0, 1]}, {"a1": [2, 3]}, {"a1": [4, 5]}]
    assert set(await trial_states(api, experiment["id"])) == {"STATE_STARTING"}


@pytest.mark.parametrize("slots,agents_used", [(16, 2), (24, 3)])
async def test_gang_takes_whole_idle_agents(
    api: httpx.AsyncClient, app: FastAPI, slots: int, agents_used: int
) -> None:
    for i in range(3):
        await register(app, f"n{i}", 8)
    experiment = (await submit(api, config(slots)))["experiment"]
    await schedule(app)
    [task] = await tasks_of(api, experiment["id"])
    placement = placed_on(task)
    assert len(placement) == agents_used
    assert all(s == list(range(8)) for s in placement.values())


async def test_impossible_gang_says_why_and_warns_at_submit(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "g1", 8)
    await register(app, "g2", 8)
    created = await submit(api, config(12))
    assert any("multiple of 8" in w for w in created["warningMessages"]), created
    # Determined's client prints its own text for this enum.
    assert created["warnings"] == ["LAUNCH_WARNING_CURRENT_SLOTS_EXCEEDED"]
    experiment_id = created["experiment"]["id"]
    for _ in range(2):  # reasons stay true pass after pass
        await schedule(app)
        [task] = await tasks_of(api, experiment_id)
        assert task["resources"] is None
        assert task["state"] == "STATE_PENDING"
        assert task["pendingReason"]["code"] == "NEVER_FITS"
        assert task["pendingReason"]["message"] == (
            "slots_per_trial=12 can never be placed in pool default: its agents have 8 "
            "slots, so a multi-agent trial needs a multiple of 8"
        )
    # ... and it blocks nobody: a small trial behind it runs.
    small = (await submit(api, config(1)))["experiment"]["id"]
    await schedule(app)
    assert placed_on((await tasks_of(api, small))[0]) == {"g1": [0]}


async def test_pool_without_agents(api: httpx.AsyncClient, app: FastAPI) -> None:
    experiment_id = (await submit(api, config(1)))["experiment"]["id"]
    await schedule(app)
    [task] = await tasks_of(api, experiment_id)
    assert task["pendingReason"]["code"] == "NO_AGENTS"
    assert "pool default has no agents" in task["pendingReason"]["message"]


async def test_an_agent_registering_during_a_listing_is_not_a_server_error(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """The listing reads agents, then their slots, in separate statements; on Postgres each
    sees what was committed when it ran, so an agent that registers in between (eight
    agents joining a fresh master did it) has slots but no row in the first read. It is
    left for the next listing instead of failing the request with a 500."""
    await register(app, "early", 2)

    class RegistersAfterTheFirstRead:
        def __init__(self, session: AsyncSession) -> None:
            self.session = session
            self.reads = 0

        async def scalars(self, *args: Any, **kwargs: Any) -> Any:
            result = await self.session.scalars(*args, **kwargs)
            self.reads += 1
            if self.reads == 1:
                await register(app, "late", 2)  # commits on a connection of its own
            return result

        async def execute(self, *args: Any, **kwargs: Any) -> Any:
            return await self.session.execute(*args, **kwargs)

    async with session_scope(app.state.session_factory) as session:
        views = await agent_service.list_agents(
            RegistersAfterTheFirstRead(session)  # type: ignore[arg-type]
        )
    assert [(v.agent.id, len(v.slots)) for v in views] == [("early", 2)]
    listed = (await api.get("/api/v1/agents")).json()["agents"]
    assert sorted(a["id"] for a in listed) == ["early", "late"]


class WakeCounter:
    """Stands in for the agent hub's loop (these tests run no loops): counts its wakes."""

    def __init__(self) -> None:
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


async def test_placements_and_kills_wake_the_hub_as_they_commit(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub launches what a pass placed and passes a kill on to the agents as soon as
    either commits, not on its next tick. A submit alone does not wake it: there is
    nothing for it to do until the pass has placed the trial."""
    hub = WakeCounter()
    monkeypatch.setattr(app.state, "hub_loop", hub, raising=False)
    loop = scheduler.SchedulerLoop(app.state.session_factory, app.state.settings)
    loop.after_commit = hub.wake
    await register(app, "solo", 2)
    experiment_id = (await submit(api, config(2)))["experiment"]["id"]
    assert hub.wakes == 0
    await loop.run_once()
    assert loop.last is not None and loop.last.placed == 1
    assert hub.wakes == 1
    await loop.run_once()  # nothing new to place: no wake
    assert hub.wakes == 1
    reply = await api.post(f"/api/v1/experiments/{experiment_id}/kill")
    assert reply.status_code == 200, reply.text
    assert hub.wakes == 2


async def test_unknown_pool_is_refused(api: httpx.AsyncClient) -> None:
    reply = await api.post(
        "/api/v1/experiments", json={"config": config(1, extra=", resource_pool: gpu-a100")}
    )
    assert reply.status_code == 400
    assert reply.json()["message"].startswith("resources.resource_pool: pool 'gpu-a100'")


async def test_waiting_gang_reason_counts_idle_agents(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "w1", 8)
    await register(app, "w2", 8)
    await submit(api, config(1))
    await schedule(app)  # w1 now has one busy slot
    gang = (await submit(api, config(16)))["experiment"]["id"]
    await schedule(app)
    [task] = await tasks_of(api, gang)
    assert task["pendingReason"]["code"] == "WAITING_FOR_IDLE_AGENTS"
    assert task["pendingReason"]["message"] == "waiting for 2 idle 8-slot agents, 1 is idle"


async def test_disabled_and_draining_agents_take_nothing(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "d1", 4)
    await register(app, "d2", 4)
    assert (await admin.post("/api/v1/agents/d1/disable", json={"drain": True})).status_code == 200
    agent = (await api.get("/api/v1/agents/d1")).json()["agent"]
    assert (agent["enabled"], agent["draining"]) == (False, True)
    first = (await submit(api, config(1)))["experiment"]["id"]
    await schedule(app)
    assert placed_on((await tasks_of(api, first))[0]) == {"d2": [0]}
    await admin.post("/api/v1/agents/d2/disable", json={"drain": False})
    # Without drain, the trial running there is asked to stop (it will be requeued).
    assert (await tasks_of(api, first))[0]["preemptRequested"] is True
    second = (await submit(api, config(1)))["experiment"]["id"]
    await schedule(app)
    [task] = await tasks_of(api, second)
    assert task["pendingReason"]["code"] == "NO_USABLE_AGENTS"
    await admin.post("/api/v1/agents/d1/enable")
    await schedule(app)
    assert placed_on((await tasks_of(api, second))[0]) == {"d1": [0]}


async def test_priority_then_fifo_and_priority_updates(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "p1", 2)
    first = (await submit(api, config(1, name="first")))["experiment"]
    second = (await submit(api, config(1, name="second")))["experiment"]
    urgent = (await submit(api, config(2, name="urgent", priority=10)))["experiment"]
    # Raising the second job above everything reorders the queue before the pass.
    update = {"updates": [{"jobId": second["jobId"], "priority": 5}]}
    assert (await api.post("/api/v1/job-queues", json=update)).status_code == 200
    await schedule(app)
    assert [t["resources"] is not None for t in await tasks_of(api, second["id"])] == [True]
    jobs = (await api.get("/api/v1/job-queues")).json()["jobs"]
    assert [j["name"] for j in jobs] == ["second", "urgent", "first"]
    assert [j["priority"] for j in jobs] == [5, 10, 42]
    assert jobs[0]["summary"]["state"] == "STATE_SCHEDULED"
    # The urgent 2-slot job heads the queue and reserves the agent: the older first job
    # would fit in the free slot, but waits behind it instead of starving it.
    [head] = await tasks_of(api, urgent["id"])
    [behind] = await tasks_of(api, first["id"])
    assert head["pendingReason"]["code"] == "WAITING_FOR_SLOTS"
    assert behind["pendingReason"]["code"] == "RESERVED_FOR_HEAD"
    assert behind["pendingReason"]["blockingJob"] == urgent["id"]
    assert behind["pendingReason"]["message"] == f"behind higher-priority job {urgent['id']}"


async def test_bad_priority_update(api: httpx.AsyncClient, app: FastAPI) -> None:
    job = (await submit(api, config(1)))["experiment"]["jobId"]
    for priority, status in ((0, 400), (100, 400)):
        reply = await api.post(
            "/api/v1/job-queues", json={"updates": [{"jobId": job, "priority": priority}]}
        )
        assert reply.status_code == status
        assert "priority" in reply.json()["message"]
    missing = await api.post(
        "/api/v1/job-queues", json={"updates": [{"jobId": "nope", "priority": 3}]}
    )
    assert missing.status_code == 404


async def test_release_frees_slots_for_the_queue(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "r1", 2)
    experiment_id = (await submit(api, config(2, trials=2)))["experiment"]["id"]
    await schedule(app)
    running, waiting = await tasks_of(api, experiment_id)
    assert running["resources"] is not None and waiting["resources"] is None
    await release(app, running["allocationId"], ReleaseOutcome.COMPLETED)
    await schedule(app)
    [now_running] = await tasks_of(api, experiment_id)
    assert now_running["allocationId"] == waiting["allocationId"]
    assert placed_on(now_running) == {"r1": [0, 1]}
    await release(app, now_running["allocationId"], ReleaseOutcome.COMPLETED)
    assert await trial_states(api, experiment_id) == ["STATE_COMPLETED", "STATE_COMPLETED"]
    experiment = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
    assert experiment["state"] == "STATE_COMPLETED"


async def test_failures_restart_until_max_restarts(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "f1", 1)
    experiment_id = (await submit(api, config(1) + "max_restarts: 1\n"))["experiment"]["id"]
    for expected_restarts in (1, 2):
        await schedule(app)
        [task] = await tasks_of(api, experiment_id)
        await release(app, task["allocationId"], ReleaseOutcome.FAILED)
        trial = (await api.get(f"/api/v1/experiments/{experiment_id}/trials")).json()["trials"][0]
        assert trial["restarts"] == expected_restarts
    assert trial["state"] == "STATE_ERROR"
    assert await tasks_of(api, experiment_id) == []


async def test_agent_loss_requeues_without_counting_a_restart(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "l1", 1)
    experiment_id = (await submit(api, config(1)))["experiment"]["id"]
    await schedule(app)
    [task] = await tasks_of(api, experiment_id)
    await release(app, task["allocationId"], ReleaseOutcome.AGENT_LOST)
    trial = (await api.get(f"/api/v1/experiments/{experiment_id}/trials")).json()["trials"][0]
    assert (trial["state"], trial["restarts"]) == ("STATE_QUEUED", 0)
    await schedule(app)
    [again] = await tasks_of(api, experiment_id)
    assert again["allocationId"].endswith(".2") and again["resources"] is not None


async def test_kill_and_pause_with_running_trials(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "k1", 2)
    killed = (await submit(api, config(1)))["experiment"]["id"]
    paused = (await submit(api, config(1)))["experiment"]["id"]
    await schedule(app)
    await api.post(f"/api/v1/experiments/{killed}/kill")
    [task] = await tasks_of(api, killed)
    assert task["state"] == "STATE_TERMINATING" and task["preemptRequested"]
    assert await trial_states(api, killed) == ["STATE_STOPPING_KILLED"]
    await release(app, task["allocationId"], ReleaseOutcome.KILLED)
    assert await trial_states(api, killed) == ["STATE_CANCELED"]
    experiment = (await api.get(f"/api/v1/experiments/{killed}")).json()["experiment"]
    assert experiment["state"] == "STATE_CANCELED"

    await api.post(f"/api/v1/experiments/{paused}/pause")
    [task] = await tasks_of(api, paused)
    assert task["preemptRequested"]
    await release(app, task["allocationId"], ReleaseOutcome.PREEMPTED)
    assert await trial_states(api, paused) == ["STATE_PAUSED"]
    await api.post(f"/api/v1/experiments/{paused}/activate")
    await schedule(app)
    assert (await tasks_of(api, paused))[0]["resources"] is not None


async def test_killing_one_trial_leaves_the_others_running(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """Determined's `det trial kill`: the placed trial stops through its agent, a queued
    one ends at once, the experiment goes on; when every trial was killed it is CANCELED."""
    await register(app, "t1", 1)
    experiment_id = (await submit(api, config(1, trials=3)))["experiment"]["id"]
    await schedule(app)
    first, second, third = await tasks_of(api, experiment_id)
    assert placed_on(first) and not placed_on(second)

    assert (await api.post(f"/api/v1/trials/{second['trialId']}/kill")).status_code == 200
    assert await trial_states(api, experiment_id) == [
        "STATE_STARTING",
        "STATE_CANCELED",
        "STATE_QUEUED",
    ]
    assert second["allocationId"] not in {
        t["allocationId"] for t in await tasks_of(api, experiment_id)
    }

    await api.post(f"/api/v1/trials/{first['trialId']}/kill")
    [stopping, *_] = await tasks_of(api, experiment_id)
    assert stopping["preemptRequested"] and stopping["state"] == "STATE_TERMINATING"
    assert (await trial_states(api, experiment_id))[0] == "STATE_STOPPING_KILLED"
    again = await api.post(f"/api/v1/trials/{first['trialId']}/kill")  # changes nothing
    assert again.status_code == 200
    await release(app, first["allocationId"], ReleaseOutcome.KILLED)
    await schedule(app)  # the freed slot goes to the trial still queued
    assert await trial_states(api, experiment_id) == [
        "STATE_CANCELED",
        "STATE_CANCELED",
        "STATE_STARTING",
    ]
    path = f"/api/v1/experiments/{experiment_id}"
    assert (await api.get(path)).json()["experiment"]["state"] == "STATE_ACTIVE"

    await api.post(f"/api/v1/trials/{third['trialId']}/kill")
    await release(app, third["allocationId"], ReleaseOutcome.KILLED)
    assert (await api.get(path)).json()["experiment"]["state"] == "STATE_CANCELED"
    missing = await api.post("/api/v1/trials/999999/kill")
    assert missing.status_code == 404 and "trial 999999 not found" in missing.text


async def test_a_failed_pass_writes_nothing(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All-or-nothing: a crash after the slot rows are written leaves no partial gang."""
    for i in range(2):
        await register(app, f"x{i}", 4)
    experiment_id = (await submit(api, config(8)))["experiment"]["id"]

    async def crash(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("master died mid-pass")

    monkeypatch.setattr(states, "set_trial_states", crash)
    with pytest.raises(RuntimeError):
        await schedule(app)
    monkeypatch.undo()
    async with app.state.session_factory() as session:
        held = await session.scalar(select(func.count()).select_from(AllocationSlotModel))
    assert held == 0
    [task] = await tasks_of(api, experiment_id)
    assert task["state"] == "STATE_PENDING"
    await schedule(app)
    assert len(placed_on((await tasks_of(api, experiment_id))[0])) == 2


async def test_master_restart_mid_queue(api: httpx.AsyncClient, app: FastAPI) -> None:
    """State is rebuilt from the database: nothing placed twice, the queue carries on."""
    await register(app, "m1", 4)
    experiment_id = (await submit(api, config(1, trials=6)))["experiment"]["id"]
    await schedule(app)
    before = {t["allocationId"]: placed_on(t) for t in await tasks_of(api, experiment_id)}
    assert sum(1 for p in before.values() if p) == 4

    settings: MasterSettings = app.state.settings
    restarted = create_app(settings)
    async with restarted.router.lifespan_context(restarted):
        await schedule(restarted)  # nothing free: nothing changes
        after = {t["allocationId"]: placed_on(t) for t in await tasks_of(api, experiment_id)}
        assert after == before
        running = [a for a, p in after.items() if p]
        await release(restarted, running[0], ReleaseOutcome.COMPLETED)
        await schedule(restarted)
    tasks = await tasks_of(api, experiment_id)
    slots = [(agent, s) for t in tasks for agent, ss in placed_on(t).items() for s in ss]
    assert len(slots) == len(set(slots)) == 4


async def test_zero_slot_trials(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "z1", 1)
    experiment_id = (await submit(api, config(0, trials=2)))["experiment"]["id"]
    await schedule(app)
    tasks = await tasks_of(api, experiment_id)
    assert [t["resources"] is not None for t in tasks] == [True, True]
    agent = (await api.get("/api/v1/agents/z1")).json()["agent"]
    assert len(agent["zeroSlotAllocations"]) == 2
    assert all("container" not in s for s in agent["slots"].values())


async def test_resource_pools_listing(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "rp1", 8)
    pools = (await api.get("/api/v1/resource-pools")).json()["resourcePools"]
    [default] = pools
    assert default["name"] == "default"
    assert (default["numAgents"], default["slotsAvailable"], default["slotsPerAgent"]) == (1, 8, 8)
    assert default["schedulerType"] == "SCHEDULER_TYPE_PRIORITY"
    assert default["details"]["priorityScheduler"]["defaultPriority"] == 42


async def test_agents_in_an_unknown_pool_are_refused(app: FastAPI, anon: httpx.AsyncClient) -> None:
    with pytest.raises(Exception, match="pool 'gpu' does not exist"):
        await register(app, "stray", 1, pool="gpu")


def test_pools_are_validated() -> None:
    with pytest.raises(ValueError, match="unique"):
        MasterSettings(
            resource_pools=[
                ResourcePoolSettings(pool_name="default"),
                ResourcePoolSettings(pool_name="default"),
            ]
        )


async def test_preemption_when_the_pool_enables_it(api: httpx.AsyncClient, app: FastAPI) -> None:
    settings: MasterSettings = app.state.settings
    pools = [
        ResourcePoolSettings(pool_name="default", scheduler=SchedulerSettings(preemption=True))
    ]
    preempting = create_app(settings.model_copy(update={"resource_pools": pools}))
    async with preempting.router.lifespan_context(preempting):
        await register(preempting, "pp1", 2)
        low = (await submit(api, config(2, name="low", priority=50)))["experiment"]["id"]
        await schedule(preempting)
        high = (await submit(api, config(2, name="high", priority=10)))["experiment"]["id"]
        stats = await schedule(preempting)
        assert stats.preempted == 1
        [victim] = await tasks_of(api, low)
        assert victim["preemptRequested"] and victim["resources"] is not None
        # The victim checkpoints and exits; it is requeued without counting a restart.
        await release(preempting, victim["allocationId"], ReleaseOutcome.PREEMPTED)
        await schedule(preempting)
        assert placed_on((await tasks_of(api, high))[0]) == {"pp1": [0, 1]}
        [requeued] = await tasks_of(api, low)
        assert requeued["state"] == "STATE_PENDING"
        trial = (await api.get(f"/api/v1/experiments/{low}/trials")).json()["trials"][0]
        assert (trial["state"], trial["restarts"]) == ("STATE_QUEUED", 0)


async def test_preemption_is_off_by_default(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "np1", 2)
    low = (await submit(api, config(2, priority=50)))["experiment"]["id"]
    await schedule(app)
    await submit(api, config(2, priority=10))
    assert (await schedule(app)).preempted == 0
    assert (await tasks_of(api, low))[0]["preemptRequested"] is False


async def epoch(app: FastAPI) -> int:
    async with app.state.session_factory() as session:
        return await allocation_service.scheduler_epoch(session)


async def test_epoch_counts_committed_scheduling_changes(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    start = await epoch(app)
    experiment_id = (await submit(api, config(1)))["experiment"]["id"]
    assert await epoch(app) == start + 1  # one commit, one bump
    await schedule(app)  # a pass writes reasons, which is no news for the next pass
    assert await epoch(app) == start + 1
    await register(app, "e1", 1)
    assert await epoch(app) == start + 2
    await api.post(f"/api/v1/experiments/{experiment_id}/pause")
    assert await epoch(app) == start + 3
    rejected = await api.post("/api/v1/experiments", json={"config": "bogus: 1"})
    assert rejected.status_code == 400
    assert await epoch(app) == start + 3  # a rolled-back request bumps nothing


async def test_the_loop_skips_passes_when_nothing_changed(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    loop = scheduler.SchedulerLoop(app.state.session_factory, app.state.settings)
    await loop.run_once()  # the first iteration always passes
    assert loop.passes == 1
    await loop.run_once()
    await loop.run_once()
    assert loop.passes == 1  # nothing committed since: one small read each
    await register(app, "s1", 1)  # a change from anywhere (another master, an agent)
    await submit(api, config(1))
    await loop.run_once()
    assert loop.passes == 2
    assert loop.last is not None and loop.last.placed == 1
    loop.wake()  # an explicit wake always passes
    await loop.run_once()
    assert loop.passes == 3


async def test_a_kill_during_a_pass_waits_for_it_and_stops_what_it_placed(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill sent while a pass runs must not act on what it read before the pass committed:
    it waits for the pass, then sees the trial placed and asks it to stop."""
    await register(app, "c1", 1)
    experiment_id = (await submit(api, config(1)))["experiment"]["id"]
    load_agents = scheduler.load_agent_states
    kill: asyncio.Task[httpx.Response] | None = None

    async def load_then_kill(session: AsyncSession, **kwargs: bool) -> object:
        nonlocal kill
        loaded = await load_agents(session, **kwargs)
        kill = asyncio.create_task(api.post(f"/api/v1/experiments/{experiment_id}/kill"))
        await asyncio.sleep(0.3)
        assert not kill.done(), "the kill went ahead while the pass held the scheduler"
        return loaded

    # The pass has read the queue when it loads the agents.
    monkeypatch.setattr(scheduler, "load_agent_states", load_then_kill)
    assert (await schedule(app)).placed == 1
    monkeypatch.undo()
    assert kill is not None
    assert (await kill).status_code == 200
    assert await trial_states(api, experiment_id) == ["STATE_STOPPING_KILLED"]
    [task] = await tasks_of(api, experiment_id)
    assert task["state"] == "STATE_TERMINATING" and task["preemptRequested"]
    await release(app, task["allocationId"], ReleaseOutcome.KILLED)
    assert await trial_states(api, experiment_id) == ["STATE_CANCELED"]
    assert (await api.get("/api/v1/agents/c1")).json()["agent"]["containers"] == {}


async def test_a_disable_during_a_pass_stops_what_the_pass_placed(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    app: FastAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await register(app, "q1", 1)
    experiment_id = (await submit(api, config(1)))["experiment"]["id"]
    load_agents = scheduler.load_agent_states
    disable: asyncio.Task[httpx.Response] | None = None

    async def load_then_disable(session: AsyncSession, **kwargs: bool) -> object:
        nonlocal disable
        loaded = await load_agents(session, **kwargs)
        disable = asyncio.create_task(admin.post("/api/v1/agents/q1/disable", json={}))
        await asyncio.sleep(0.3)
        return loaded

    monkeypatch.setattr(scheduler, "load_agent_states", load_then_disable)
    await schedule(app)
    monkeypatch.undo()
    assert disable is not None and (await disable).status_code == 200
    [task] = await tasks_of(api, experiment_id)
    # Placed by the pass that ran first, then asked to stop by the disable that waited.
    assert task["resources"] is not None and task["preemptRequested"] is True


async def test_trials_say_why_they_wait(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "t1", 2)
    experiment_id = (await submit(api, config(2, trials=2)))["experiment"]["id"]
    await schedule(app)
    trials = (await api.get(f"/api/v1/experiments/{experiment_id}/trials")).json()["trials"]
    placed, waiting = trials
    assert placed["pendingReason"] is None
    assert waiting["pendingReason"]["code"] == "WAITING_FOR_SLOTS"
    assert "2 free slots" in waiting["pendingReason"]["message"]
    single = (await api.get(f"/api/v1/trials/{waiting['id']}")).json()["trial"]
    assert single["pendingReason"] == waiting["pendingReason"]


async def test_a_paused_experiment_completes_when_its_last_trial_does(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "pc1", 1)
    experiment_id = (await submit(api, config(1)))["experiment"]["id"]
    await schedule(app)
    [task] = await tasks_of(api, experiment_id)
    await api.post(f"/api/v1/experiments/{experiment_id}/pause")
    await release(app, task["allocationId"], ReleaseOutcome.COMPLETED)
    experiment = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
    assert experiment["state"] == "STATE_COMPLETED"


async def test_only_held_allocations_can_be_released(api: httpx.AsyncClient, app: FastAPI) -> None:
    experiment_id = (await submit(api, config(1)))["experiment"]["id"]
    [task] = await tasks_of(api, experiment_id)  # pending: no agent yet
    with pytest.raises(Conflict, match="only an allocation holding resources"):
        await release(app, task["allocationId"], ReleaseOutcome.COMPLETED)
    assert await trial_states(api, experiment_id) == ["STATE_QUEUED"]
    assert (await tasks_of(api, experiment_id))[0]["state"] == "STATE_PENDING"


async def test_every_scheduling_change_moves_the_epoch(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, app: FastAPI
) -> None:
    """What the loop relies on to notice changes from any process, without a wake."""
    await register(app, "ep1", 1)
    created = (await submit(api, config(1)))["experiment"]
    await schedule(app)
    [task] = await tasks_of(api, created["id"])
    loop = scheduler.SchedulerLoop(app.state.session_factory, app.state.settings)
    await loop.run_once()
    changes = [
        lambda: admin.post("/api/v1/agents/ep1/disable", json={"drain": True}),
        lambda: admin.post("/api/v1/agents/ep1/enable"),
        lambda: api.post(
            "/api/v1/job-queues", json={"updates": [{"jobId": created["jobId"], "priority": 7}]}
        ),
        lambda: release(app, task["allocationId"], ReleaseOutcome.AGENT_LOST),
    ]
    for change in changes:
        before, passes = await epoch(app), loop.passes
        await change()
        assert await epoch(app) > before
        await loop.run_once()
        assert loop.passes == passes + 1


async def test_max_slots_caps_what_an_experiment_holds_and_says_why(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """resources.max_slots 4 on a 16-trial search over 16 slots: four run, the rest wait with
    a reason naming the cap, another experiment gets the free slots; a trial that ends lets
    exactly one more start; raising the cap takes effect at the next pass."""
    await register(app, "m1", 8)
    await register(app, "m2", 8)
    capped = await submit(api, config(1, "capped", trials=16, extra=", max_slots: 4"))
    capped_id = capped["experiment"]["id"]
    other_id = (await submit(api, config(2, "other")))["experiment"]["id"]

    async def held() -> list[dict[str, Any]]:
        return [t for t in await tasks_of(api, capped_id) if t["resources"]]

    await schedule(app)
    running = await held()
    assert len(running) == 4
    waiting = [t for t in await tasks_of(api, capped_id) if not t["resources"]]
    assert {t["pendingReason"]["code"] for t in waiting} == {"AT_MAX_SLOTS"}
    assert waiting[0]["pendingReason"]["message"] == (
        f"job {capped_id} holds 4 slots of its resources.max_slots 4; this one needs 1 more, "
        "so it waits for one of them to end"
    )
    [other] = await tasks_of(api, other_id)
    assert other["resources"], other

    await release(app, running[0]["allocationId"], ReleaseOutcome.COMPLETED)
    await schedule(app)
    assert len(await held()) == 4

    # Below one trial's slots: refused, naming the field, the cap unchanged.
    path = f"/api/v1/experiments/{capped_id}"
    refused = await api.patch(path, json={"resources": {"maxSlots": 0}})
    assert refused.status_code == 400, refused.text
    assert "resources.max_slots: 0 is below resources.slots_per_trial (1)" in refused.text
    await schedule(app)
    assert len(await held()) == 4

    raised = await api.patch(path, json={"resources": {"maxSlots": 6}})
    assert raised.status_code == 200, raised.text
    await schedule(app)
    assert len(await held()) == 6


async def test_a_config_with_max_slots_below_a_trials_slots_is_refused(
    api: httpx.AsyncClient,
) -> None:
    reply = await api.post(
        "/api/v1/experiments", json={"config": config(4, "gang", extra=", max_slots: 2")}
    )
    assert reply.status_code == 400, reply.text
    assert "resources.max_slots" in reply.text and "below resources.slots_per_trial (4)" in (
        reply.text
    )
    listed = (await api.get("/api/v1/experiments", params={"name": "gang"})).json()
    assert listed["experiments"] == []


async def test_a_job_moved_to_another_pool_waits_and_runs_there(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """`det job update --resource-pool` (Determined's UpdateJobQueue): queued trials wait in
    the new pool at once; a running one is asked to checkpoint and stop, as a preemption,
    and queues in the new pool; its weight changes in the same request."""
    pools = [ResourcePoolSettings(pool_name="default"), ResourcePoolSettings(pool_name="gpu")]
    settings = app.state.settings
    app.state.settings = settings.model_copy(update={"resource_pools": pools})
    try:
        await register(app, "cpu-1", 2)
        await register(app, "gpu-1", 2, pool="gpu")
        experiment = (await submit(api, config(2, trials=2)))["experiment"]
        await schedule(app)
        running, queued = await tasks_of(api, experiment["id"])
        assert placed_on(running) == {"cpu-1": [0, 1]} and queued["resources"] is None

        move = {"jobId": experiment["jobId"], "resourcePool": "gpu", "weight": 2.5}
        assert (await api.post("/api/v1/job-queues", json={"updates": [move]})).status_code == 200
        stored = (await api.get(f"/api/v1/experiments/{experiment['id']}")).json()["experiment"]
        assert stored["resourcePool"] == "gpu"
        resources = stored["config"]["resources"]
        assert (resources["resource_pool"], resources["weight"]) == ("gpu", 2.5)
        running, queued = await tasks_of(api, experiment["id"])
        assert running["preemptRequested"] is True and placed_on(running) == {"cpu-1": [0, 1]}
        await schedule(app)
        running, queued = await tasks_of(api, experiment["id"])
        assert placed_on(queued) == {"gpu-1": [0, 1]}, queued
        # The running trial stops as asked and queues in the new pool, no restart counted.
        await release(app, running["allocationId"], ReleaseOutcome.PREEMPTED)
        await schedule(app)
        requeued = [t for t in await tasks_of(api, experiment["id"]) if t["resources"] is None]
        assert [t["resourcePool"] for t in requeued] == ["gpu"], requeued
        trials = (await api.get(f"/api/v1/experiments/{experiment['id']}/trials")).json()["trials"]
        assert [t["restarts"] for t in trials] == [0, 0]
    finally:
        app.state.settings = settings


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"resourcePool": "nowhere"}, "updates[0].resourcePool: pool 'nowhere' does not exist"),
        ({"weight": 0}, "updates[0].weight: 0.0 must be greater than 0"),
        ({"weight": float("inf")}, "updates.0.weight: Input should be a finite number"),
        ({"aheadOf": "x"}, "updates[0]: aheadOf and behindOf are not supported"),
        ({}, "nothing to change"),
        ({"priority": 5, "resourcePool": "nowhere"}, "pool 'nowhere' does not exist"),
    ],
)
async def test_a_refused_job_update_changes_nothing(
    api: httpx.AsyncClient, app: FastAPI, change: dict[str, Any], problem: str
) -> None:
    experiment = (await submit(api, config(1)))["experiment"]
    update = {"updates": [{"jobId": experiment["jobId"], **change}]}
    # json.dumps, not httpx's json=: a client may send Infinity, which httpx refuses to.
    reply = await api.post(
        "/api/v1/job-queues",
        content=json.dumps(update),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 400, reply.text
    assert problem in reply.json()["message"], reply.text
    stored = (await api.get(f"/api/v1/experiments/{experiment['id']}")).json()["experiment"]
    assert stored["resourcePool"] == "default"
    assert stored["config"]["resources"]["priority"] == 42
    assert stored["config"]["resources"].get("weight", 1) == 1
