"""Quotas and the fair order through the master's API and its scheduling passes (agents
registered without processes: the placement and its reasons are what is tested here;
tests/e2e/test_quotas.py runs real agents)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.core import fair_share
from master.core.cluster_view import ClusterView
from master.db.session import session_scope
from master.services import scheduler, usage
from master.services.allocations import ReleaseOutcome
from tests.api.test_scheduling import register, release, schedule, tasks_of

QUOTA = "/api/v1/workspaces/{}/quotas/{}"

EXPERIMENT = """\
name: {name}
entrypoint: python3 train.py
workspace: {workspace}
project: p
resources: {{slots_per_trial: {slots}{extra}}}
searcher: {{name: random, metric: loss, max_length: 10, max_trials: {trials}}}
"""


async def workspace(api: httpx.AsyncClient, name: str) -> int:
    reply = await api.post("/api/v1/workspaces", json={"name": name})
    assert reply.status_code == 200, reply.text
    ws: int = reply.json()["workspace"]["id"]
    reply = await api.post(f"/api/v1/workspaces/{ws}/projects", json={"name": "p"})
    assert reply.status_code == 200, reply.text
    return ws


async def set_quota(admin: httpx.AsyncClient, ws: int, **body: int | None) -> None:
    reply = await admin.put(QUOTA.format(ws, "default"), json=body)
    assert reply.status_code == 200, reply.text


async def submit(
    api: httpx.AsyncClient, ws: str, trials: int, slots: int = 1, extra: str = "", name: str = "e"
) -> int:
    text = EXPERIMENT.format(name=name, workspace=ws, slots=slots, extra=extra, trials=trials)
    reply = await api.post("/api/v1/experiments", json={"config": text, "activate": True})
    assert reply.status_code == 200, reply.text
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


def placed(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in tasks if t["resources"]]


def waiting(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in tasks if not t["resources"]]


async def test_a_borrowing_limit_of_zero_leaves_slots_idle_and_a_change_applies_next_pass(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "q-1", 4)
    await register(app, "q-2", 4)
    vision, nlp = await workspace(api, "vision"), await workspace(api, "nlp")
    await set_quota(admin, vision, nominalSlots=6, borrowingLimit=0)
    await set_quota(admin, nlp, nominalSlots=2)
    experiment = await submit(api, "vision", trials=10)
    assert (await schedule(app)).placed == 6
    tasks = await tasks_of(api, experiment)
    assert len(placed(tasks)) == 6
    for task in waiting(tasks):
        assert task["pendingReason"]["code"] == "QUOTA_BORROWING_LIMIT"
        assert task["pendingReason"]["message"] == (
            "workspace vision holds 6 of its 6-slot quota in pool default; 2 idle slots are "
            "lent to no one because its borrowing limit is 0"
        )
    # The limit lifted: the next pass lends vision the idle 2, no restart.
    await set_quota(admin, vision, nominalSlots=6, borrowingLimit=None)
    assert (await schedule(app)).placed == 2
    assert len(placed(await tasks_of(api, experiment))) == 8


async def test_a_gang_is_admitted_whole_when_its_quota_and_an_agent_allow(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "g-1", 4)
    await register(app, "g-2", 4)
    vision = await workspace(api, "vision")
    await set_quota(admin, vision, nominalSlots=6, borrowingLimit=0)
    small = await submit(api, "vision", trials=3, name="small")
    assert (await schedule(app)).placed == 3
    gang = await submit(api, "vision", trials=1, slots=4, name="gang")
    await schedule(app)
    [task] = await tasks_of(api, gang)
    # 3 + 4 > 6: not admitted, though an agent is idle; nothing is half placed.
    assert not task["resources"]
    assert task["pendingReason"]["code"] == "QUOTA_BORROWING_LIMIT"
    await release(
        app, placed(await tasks_of(api, small))[0]["allocationId"], ReleaseOutcome.COMPLETED
    )
    await schedule(app)
    [task] = await tasks_of(api, gang)
    # 2 + 4 = 6: admitted whole, on the idle agent.
    assert [
        len(r["agentDevices"][a]["devices"]) for r in task["resources"] for a in r["agentDevices"]
    ] == [4]


async def test_weights_1_and_3_share_a_contended_workspace_1_to_3(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """Two experiments of one user, weights 1 and 3, on 4 slots: as trials end and others
    start, their running slots settle at 1 and 3 (within one trial)."""
    await register(app, "w-1", 4)
    await workspace(api, "team")
    light = await submit(api, "team", trials=16, extra=", weight: 1", name="light")
    heavy = await submit(api, "team", trials=16, extra=", weight: 3", name="heavy")
    seen: list[tuple[int, int]] = []
    started: list[str] = []  # allocation ids in the order they were placed
    for _ in range(12):
        await schedule(app)
        running = {e: placed(await tasks_of(api, e)) for e in (light, heavy)}
        seen.append((len(running[light]), len(running[heavy])))
        started += sorted(
            t["allocationId"]
            for ts in running.values()
            for t in ts
            if t["allocationId"] not in started
        )
        # The trial that started first ends, so that every trial runs about as long (usage
        # counts slot-seconds: a trial left running longer would count more).
        live = {t["allocationId"] for ts in running.values() for t in ts}
        first = next(a for a in started if a in live)
        await release(app, first, ReleaseOutcome.COMPLETED)
    assert all(a + b == 4 for a, b in seen), seen
    assert all(abs(a - 1) <= 1 and abs(b - 3) <= 1 for a, b in seen), seen
    assert sum(b for _, b in seen) == pytest.approx(3 * sum(a for a, _ in seen), rel=0.35), seen


async def test_usage_survives_a_restart(api: httpx.AsyncClient, app: FastAPI) -> None:
    """The usage a new leader loads (stored rows) equals what the old one counted (ended
    allocations not yet accounted), and a pass after the restart orders by it."""
    await register(app, "u-1", 2)
    await workspace(api, "team")
    first = await submit(api, "team", trials=2, name="first")
    await schedule(app)
    for task in placed(await tasks_of(api, first)):
        await release(app, task["allocationId"], ReleaseOutcome.COMPLETED)
    settings = app.state.settings
    decay = fair_share.Decay(settings.fair_share.half_life_s(), settings.fair_share.start_charge_s)

    async def loaded() -> ClusterView:
        view = ClusterView()
        async with session_scope(app.state.session_factory) as session:
            epoch = await scheduler.scheduler_epoch(session)
            await scheduler.load_view(session, view, epoch, settings)
        return view

    before = await loaded()
    assert len(before.ended) == 2 and before.stored_usage == []
    now = time.time() + 1.0
    old_share = before.share_of("default", now, decay)
    assert old_share.job(first) > 2 * decay.start_charge_s * 0.99  # two 1-slot starts
    user = (before.ended[0].workspace_id, before.ended[0].user_id)

    # The leader accounts what ended; a restarted master (or a standby taking over) loads it.
    async with session_scope(app.state.session_factory) as session:
        assert await usage.account(session, settings) == 2
    after = await loaded()
    # The user's row; the job's is read only while the job is queued or running.
    assert after.ended == [] and [row.job_id for row in after.stored_usage] == [usage.USER_ROW]
    async with session_scope(app.state.session_factory) as session:
        after.add_stored(await usage.load_stored(session, [first], users=False), [first])
    new_share = after.share_of("default", now, decay)
    assert new_share.job(first) == pytest.approx(old_share.job(first), rel=1e-9)
    assert new_share.user(user) == pytest.approx(old_share.user(user), rel=1e-9)
    assert new_share.user(user) == pytest.approx(old_share.job(first), rel=1e-9)
    # Accounting again adds nothing twice.
    async with session_scope(app.state.session_factory) as session:
        assert await usage.account(session, settings) == 0
    again = await loaded()
    async with session_scope(app.state.session_factory) as session:
        again.add_stored(await usage.load_stored(session, [first], users=False), [first])
    assert again.share_of("default", now, decay).job(first) == pytest.approx(
        old_share.job(first), rel=1e-9
    )


async def test_a_continued_experiment_brings_its_usage_back_to_the_queue(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """A view loaded while an experiment was over holds no row of its; continued, it is
    queued again, and the next pass reads its usage (the view loads afresh after a continue;
    a job queued again by a change the view is told of reads its rows at the next pass:
    tests/unit/test_cluster_view.py)."""
    await register(app, "c-1", 1)
    await workspace(api, "team")
    first = await submit(api, "team", trials=1, name="first")
    await schedule(app)
    [task] = placed(await tasks_of(api, first))
    assert (await api.post(f"/api/v1/experiments/{first}/kill")).status_code == 200
    await release(app, task["allocationId"], ReleaseOutcome.KILLED)  # ended, not completed
    settings = app.state.settings
    async with session_scope(app.state.session_factory) as session:
        assert await usage.account(session, settings) == 1
    loop = scheduler.SchedulerLoop(app.state.session_factory, settings)
    loop.wake()
    await loop.run_once()  # loads the view: nothing queued, so no job's row
    assert first not in loop.view.usage_jobs
    reply = await api.post("/api/v1/experiments/continue", json={"id": first})
    assert reply.status_code == 200, reply.text
    loop.wake()
    await loop.run_once()
    assert first in loop.view.usage_jobs
    decay = fair_share.Decay(settings.fair_share.half_life_s(), settings.fair_share.start_charge_s)
    used = loop.view.share_of("default", time.time(), decay).job(first)
    # Its first run's start charge, and now its second's.
    assert used >= 2 * decay.start_charge_s * 0.99
