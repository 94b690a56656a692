"""Fair-share usage kept durable: what ended allocations used, decayed, by pool, workspace,
user and job (fair_share_usage), so the fair order survives a restart and a takeover.

The release of an allocation writes nothing here (it stays a short transaction): the leader
adds what ended since it last looked, every ACCOUNT_EVERY_S, in one transaction that holds
the scheduler's row (as a release does before it sets ended_at, so none is passed over) and
moves the watermark (scheduler_state.usage_accounted_until). Until then the scheduler's view
counts those allocations from the allocations table (load_unaccounted) and from the releases
it is told of, so an ended allocation's usage is counted once, never twice or not at all.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, delete, func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import cluster_view, fair_share
from master.core.cluster_view import Ended, StoredUsage
from master.db.models import (
    AllocationModel,
    AllocationState,
    ExperimentModel,
    FairShareUsageModel,
    ProjectModel,
    SchedulerStateModel,
    TaskModel,
    utcnow,
)
from master.services import allocations
from master.services.allocations import hold_scheduler_for_pass
from master.settings import MasterSettings

log = logging.getLogger(__name__)

ACCOUNT_EVERY_S = 60.0
# A row not added to for this many half-lives is deleted (it counts 2^-40 of what it was).
FORGET_AFTER_HALF_LIVES = 40
# The job_id of a user's row: the sum over their jobs (experiments are > 0, tasks < 0).
USER_ROW = cluster_view.USER_ROW

_USAGE = cast(Table, FairShareUsageModel.__table__)
_ALLOCATIONS = cast(Table, AllocationModel.__table__)
_EXPERIMENTS = cast(Table, ExperimentModel.__table__)
_PROJECTS = cast(Table, ProjectModel.__table__)
_TASKS = cast(Table, TaskModel.__table__)
_STATE = cast(Table, SchedulerStateModel.__table__)


async def load_stored(
    session: AsyncSession, jobs: Collection[int] | None = None, *, users: bool = True
) -> list[StoredUsage]:
    """Stored usage rows: every user's (job_id USER_ROW) with `users`, and those of `jobs`
    (None: every job's). A pass needs the users' and those of the jobs in its queue, not
    those of every job that ran in the last months."""
    conn = await session.connection()
    u = _USAGE.c
    query = select(u.resource_pool, u.workspace_id, u.user_id, u.job_id, u.slot_seconds, u.as_of)
    if jobs is not None:
        wanted = sorted(set(jobs) - {USER_ROW})
        found: list[Any] = []
        if users:
            found += (await conn.execute(query.where(u.job_id == USER_ROW))).all()
        for start in range(0, len(wanted), 5000):
            chunk = wanted[start : start + 5000]
            found += (await conn.execute(query.where(u.job_id.in_(chunk)))).all()
        rows: Any = found
    else:
        rows = (await conn.execute(query)).all()
    return [
        StoredUsage(pool, ws, user, job, value, as_of.timestamp())
        for pool, ws, user, job, value, as_of in rows
    ]


async def _watermark(session: AsyncSession) -> datetime | None:
    conn = await session.connection()
    return cast(
        "datetime | None",
        await conn.scalar(select(_STATE.c.usage_accounted_until).where(_STATE.c.id == 1)),
    )


async def _ended_between(
    session: AsyncSession, after: datetime | None, until: datetime | None
) -> list[Ended]:
    conn = await session.connection()
    a = _ALLOCATIONS.c
    query = (
        select(
            a.resource_pool,
            func.coalesce(_PROJECTS.c.workspace_id, _TASKS.c.workspace_id),
            func.coalesce(_EXPERIMENTS.c.owner_id, _TASKS.c.owner_id),
            a.experiment_id,
            a.task_id,
            a.slots_needed,
            a.assigned_at,
            a.ended_at,
        )
        .select_from(_ALLOCATIONS)
        .outerjoin(_EXPERIMENTS, _EXPERIMENTS.c.id == a.experiment_id)
        .outerjoin(_PROJECTS, _PROJECTS.c.id == _EXPERIMENTS.c.project_id)
        .outerjoin(_TASKS, _TASKS.c.id == a.task_id)
        .where(
            a.state == AllocationState.TERMINATED,
            a.ended_at.is_not(None),
            a.assigned_at.is_not(None),
            a.slots_needed > 0,
        )
    )
    if after is not None:
        query = query.where(a.ended_at > after)
    if until is not None:
        query = query.where(a.ended_at <= until)
    ended: list[Ended] = []
    for pool, ws, user, experiment_id, task_id, slots, assigned, end in (
        await conn.execute(query)
    ).all():
        job = experiment_id if experiment_id is not None else -(task_id or 0)
        ended.append(
            Ended(pool, ws or 0, user or 0, job, slots, assigned.timestamp(), end.timestamp())
        )
    return ended


async def load_unaccounted(session: AsyncSession) -> list[Ended]:
    """Ended allocations whose usage is not in fair_share_usage yet."""
    return await _ended_between(session, await _watermark(session), None)


async def account(session: AsyncSession, settings: MasterSettings) -> int:
    """Add the usage of allocations that ended since the watermark to fair_share_usage
    (the rows they add to decayed to the new watermark), forget rows long unused, and move
    the watermark; one transaction (the caller's), holding the scheduler's row. Returns how
    many allocations were added."""
    half_life = settings.fair_share.half_life_s()
    charge = settings.fair_share.start_charge_s
    # The scheduler's row first, as a release takes it before it sets ended_at: a release
    # still in flight commits before this reads, or sets its ended_at after `until`.
    await hold_scheduler_for_pass(session)
    after = await _watermark(session)
    until = utcnow()
    if after is not None and until <= after:
        return 0
    ended = await _ended_between(session, after, until)
    at = until.timestamp()
    added: dict[tuple[str, int, int, int], float] = defaultdict(float)
    for e in ended:
        used = fair_share.allocation_usage(e.slots, e.ended_at - e.started_at, half_life, charge)
        value = fair_share.decayed(used, at - e.ended_at, half_life)
        added[(e.pool, e.workspace_id, e.user_id, e.job_id)] += value
        added[(e.pool, e.workspace_id, e.user_id, USER_ROW)] += value
    conn = await session.connection()
    u = _USAGE.c
    # Rows that can only count for nothing any more (2^-40 of what they were) go.
    await conn.execute(
        delete(_USAGE).where(
            u.as_of < until - timedelta(seconds=FORGET_AFTER_HALF_LIVES * half_life)
        )
    )
    stored: dict[tuple[str, int, int, int], float] = {}
    for row in await load_stored(session, {key[3] for key in added}):
        key = (row.pool, row.workspace_id, row.user_id, row.job_id)
        if key in added:
            stored[key] = fair_share.decayed(row.slot_seconds, at - row.as_of, half_life)
    # Rows for what ended now: decayed to the watermark, with the new usage added (the
    # other rows keep their own as_of; readers decay each from there).
    changed = [
        {
            "resource_pool": key[0],
            "workspace_id": key[1],
            "user_id": key[2],
            "job_id": key[3],
            "slot_seconds": stored.get(key, 0.0) + value,
            "as_of": until,
        }
        for key, value in added.items()
    ]
    for keys in _batches(list(stored)):
        await conn.execute(
            delete(_USAGE).where(
                tuple_(u.resource_pool, u.workspace_id, u.user_id, u.job_id).in_(keys)
            )
        )
    if changed:
        await conn.execute(insert(_USAGE), changed)
    await conn.execute(update(_STATE).where(_STATE.c.id == 1).values(usage_accounted_until=until))
    if ended:
        # The view counts unaccounted allocations itself: it must load afresh, or it would
        # count these twice.
        allocations.request_scheduling(session)
    if ended:
        log.debug("fair-share usage: %d ended allocations accounted", len(ended))
    return len(ended)


def _batches(keys: list[tuple[str, int, int, int]]) -> list[list[tuple[str, int, int, int]]]:
    return [keys[i : i + 1000] for i in range(0, len(keys), 1000)]
