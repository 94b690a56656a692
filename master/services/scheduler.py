"""The scheduling pass: take the queue and the agents, ask the placement core, write it all.

One pass is one transaction: every placement, pending reason and preemption request of
the pass commits together or not at all, so no trial ever holds part of its gang, and the
(agent, slot) primary key of allocation_slots makes a slot given twice fail the commit.
The loop's passes read the queue and the agents from its in-memory view
(master.core.cluster_view), which the commits keep exact and which is loaded from the
database whenever it may not be: after a master restart or a takeover the first pass loads
everything.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

from sqlalchemy import Table, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.core import cluster_view, fair_share, placement
from master.core.cluster_view import PendingEntry
from master.db.models import (
    AgentModel,
    AllocationModel,
    AllocationSlotModel,
    AllocationState,
    ExperimentModel,
    ProjectModel,
    SlotModel,
    TaskModel,
    TrialState,
    utcnow,
)
from master.db.session import is_outage, session_scope
from master.services import quotas, states, usage
from master.services.allocations import (
    HELD_STATES,
    hold_scheduler_for_pass,
    on_outcome,
    scheduler_epoch,
    watch_commits,
)
from master.services.loops import Loop
from master.services.prometheus import PASS_BUCKETS_S, Histogram
from master.settings import MasterSettings, ResourcePoolSettings

log = logging.getLogger(__name__)

# The pass reads and writes through the tables, not the ORM: at 10,000 queued trials the
# ORM's per-row bookkeeping costs more than the placement itself.
_AGENTS = cast(Table, AgentModel.__table__)
_SLOTS = cast(Table, SlotModel.__table__)
_ALLOCATIONS = cast(Table, AllocationModel.__table__)
_HELD = cast(Table, AllocationSlotModel.__table__)
_EXPERIMENTS = cast(Table, ExperimentModel.__table__)
_TASKS = cast(Table, TaskModel.__table__)
_PROJECTS = cast(Table, ProjectModel.__table__)

SCHEDULER_LOCK_ID = 0x7265736F6C7363  # one scheduler at a time across masters on Postgres
_CHUNK = 5000  # ids per statement, as in master.services.states
NO_SUCH_POOL = "NO_SUCH_POOL"


class StaleSnapshot(Exception):
    """Something the pass planned on changed under it; the pass is rolled back and rerun."""


@dataclass
class PassStats:
    pending: int = 0
    placed: int = 0
    preempted: int = 0
    reasons_written: int = 0
    seconds: float = 0.0
    core_seconds: float = 0.0
    skipped: bool = False
    epoch: int = 0
    loaded_view: bool = False  # the in-memory view was loaded from the database first
    by_pool: dict[str, int] = field(default_factory=dict)


def policy_of(pool: ResourcePoolSettings) -> placement.PoolPolicy:
    return placement.PoolPolicy(
        name=pool.pool_name,
        fitting=placement.FittingPolicy(pool.scheduler.fitting_policy),
        preemption=pool.scheduler.preemption,
        max_zero_slot_per_agent=pool.max_aux_containers_per_agent,
    )


def _job_of(experiment_id: int | None, task_id: int | None) -> int:
    """The placement core's job key: an experiment's id; a task is a job of its own, kept
    apart from every experiment by a negative key."""
    return experiment_id if experiment_id is not None else -(task_id or 0)


def _task_label(task_type: str | None, task_uuid: str | None) -> str:
    return f"{task_type.lower()} {task_uuid}" if task_type and task_uuid else ""


async def load_agent_states(
    session: AsyncSession, pool: str | None = None, *, with_usage: bool = True
) -> dict[str, list[placement.AgentState]]:
    """Agents by pool, with the slots their allocations hold (unless with_usage is False,
    enough for feasibility, which pictures every agent idle)."""
    conn = await session.connection()
    agent_query = select(
        _AGENTS.c.id,
        _AGENTS.c.resource_pool,
        _AGENTS.c.enabled,
        _AGENTS.c.draining,
        _AGENTS.c.connected,
    )
    if pool is not None:
        agent_query = agent_query.where(_AGENTS.c.resource_pool == pool)
    agents = (await conn.execute(agent_query)).all()
    slot_query = select(_SLOTS.c.agent_id, _SLOTS.c.slot_id).where(_SLOTS.c.enabled)
    if pool is not None:
        slot_query = slot_query.where(
            _SLOTS.c.agent_id.in_(select(_AGENTS.c.id).where(_AGENTS.c.resource_pool == pool))
        )
    slot_ids: dict[str, list[int]] = defaultdict(list)
    for agent_id, slot_id in (await conn.execute(slot_query)).all():
        slot_ids[agent_id].append(slot_id)
    used: dict[str, set[int]] = defaultdict(set)
    zero_used: dict[str, int] = defaultdict(int)
    if with_usage:
        for agent_id, slot_id in (
            await conn.execute(select(_HELD.c.agent_id, _HELD.c.slot_id))
        ).all():
            used[agent_id].add(slot_id)
        for (zero_agent,) in (
            await conn.execute(
                select(_ALLOCATIONS.c.zero_slot_agent_id).where(
                    _ALLOCATIONS.c.zero_slot_agent_id.is_not(None),
                    _ALLOCATIONS.c.state.in_(HELD_STATES),
                )
            )
        ).all():
            zero_used[zero_agent] += 1
    by_pool: dict[str, list[placement.AgentState]] = defaultdict(list)
    for agent_id, agent_pool, enabled, draining, connected in agents:
        by_pool[agent_pool].append(
            placement.AgentState(
                id=agent_id,
                slot_ids=tuple(sorted(slot_ids[agent_id])),
                used_slot_ids=frozenset(used[agent_id]),
                enabled=enabled,
                draining=draining,
                connected=connected,
                zero_slot_used=zero_used[agent_id],
            )
        )
    return by_pool


async def _load_pending(session: AsyncSession) -> list[PendingEntry]:
    conn = await session.connection()
    a = _ALLOCATIONS.c
    query = (
        select(
            a.id,
            a.trial_id,
            a.experiment_id,
            a.task_id,
            a.slots_needed,
            a.single_node,
            a.resource_pool,
            a.registered_at,
            a.pending_code,
            a.pending_reason,
            a.blocking_job,
            func.coalesce(_EXPERIMENTS.c.priority, _TASKS.c.priority),
            _TASKS.c.type,
            _TASKS.c.uuid,
            _EXPERIMENTS.c.config["resources"]["max_slots"].as_integer(),
            _EXPERIMENTS.c.project_id,
            _TASKS.c.workspace_id,
            func.coalesce(_EXPERIMENTS.c.owner_id, _TASKS.c.owner_id),
            _EXPERIMENTS.c.config["resources"]["weight"].as_float(),
        )
        .select_from(_ALLOCATIONS)
        .outerjoin(_EXPERIMENTS, _EXPERIMENTS.c.id == a.experiment_id)
        .outerjoin(_TASKS, _TASKS.c.id == a.task_id)
        .where(a.state == AllocationState.PENDING)
    )
    return [
        PendingEntry(
            id=r[0],
            trial_id=r[1],
            job_id=_job_of(r[2], r[3]),
            slots=r[4],
            single_node=r[5],
            pool=r[6],
            priority=r[11],
            order=(r[7].timestamp(), r[1] or 0),
            reason=(r[8], r[9], r[10]),
            label=_task_label(r[12], r[13]),
            max_slots=r[14],
            project_id=r[15],
            workspace_id=r[16] or 0,
            user_id=r[17] or 0,
            weight=r[18] or 1.0,
        )
        for r in (await conn.execute(query)).all()
    ]


async def _load_held(session: AsyncSession) -> list[cluster_view.HeldEntry]:
    """Placed allocations (ASSIGNED to TERMINATING) and what they hold."""
    conn = await session.connection()
    a = _ALLOCATIONS.c
    query = (
        select(
            a.id,
            a.experiment_id,
            a.task_id,
            a.resource_pool,
            a.registered_at,
            a.trial_id,
            a.zero_slot_agent_id,
            a.preempt_requested,
            func.coalesce(_EXPERIMENTS.c.priority, _TASKS.c.priority),
            func.coalesce(_PROJECTS.c.workspace_id, _TASKS.c.workspace_id),
            func.coalesce(_EXPERIMENTS.c.owner_id, _TASKS.c.owner_id),
            a.assigned_at,
        )
        .select_from(_ALLOCATIONS)
        .outerjoin(_EXPERIMENTS, _EXPERIMENTS.c.id == a.experiment_id)
        .outerjoin(_PROJECTS, _PROJECTS.c.id == _EXPERIMENTS.c.project_id)
        .outerjoin(_TASKS, _TASKS.c.id == a.task_id)
        .where(a.state.in_(HELD_STATES))
    )
    rows = (await conn.execute(query)).all()
    held: dict[str, dict[str, list[int]]] = {}
    for agent_id, slot_id, allocation_id in (
        await conn.execute(select(_HELD.c.agent_id, _HELD.c.slot_id, _HELD.c.allocation_id))
    ).all():
        held.setdefault(allocation_id, {}).setdefault(agent_id, []).append(slot_id)
    entries: list[cluster_view.HeldEntry] = []
    for (
        allocation_id,
        experiment_id,
        task_id,
        pool,
        registered,
        trial_id,
        zero_agent,
        stopping,
        priority,
        workspace_id,
        user_id,
        assigned_at,
    ) in rows:
        slots = held.get(allocation_id, {})
        running = placement.Running(
            id=allocation_id,
            job_id=_job_of(experiment_id, task_id),
            priority=priority,
            order=(registered.timestamp(), trial_id or 0),
            slots=tuple((agent, tuple(sorted(ids))) for agent, ids in sorted(slots.items())),
            zero_slot_agent=zero_agent,
            # Already asked to stop: its slots count as coming free. A task is never
            # preempted: it cannot resume, so stopping it would lose the user's work.
            preemptible=task_id is None,
            stopping=stopping,
            workspace_id=workspace_id or 0,
            started=(assigned_at or registered).timestamp(),
        )
        entries.append(cluster_view.HeldEntry(running, pool, user_id or 0, running.started))
    return entries


async def _try_lock(session: AsyncSession) -> bool:
    if session.get_bind().dialect.name != "postgresql":
        return True  # SQLite serialises writers; one master owns an embedded database
    got = await session.scalar(
        text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": SCHEDULER_LOCK_ID}
    )
    return bool(got)


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


@contextmanager
def _gc_paused() -> Iterator[None]:
    """A pass builds tens of thousands of short-lived objects and no cycles; a collection
    in the middle of it walks the whole heap and tripled the pass's p99 in the benchmark.
    Reference counting frees everything; the collector resumes when the pass ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def run_pass(
    session: AsyncSession,
    settings: MasterSettings,
    view: cluster_view.ClusterView | None = None,
) -> PassStats:
    """One scheduling pass in the caller's transaction (the caller commits). With `view`
    (the scheduler loop's), the pass reads the queue, the agents and what is held from it,
    loading it first only when it is not exact at the epoch the pass locked; without, it
    reads them from the database."""
    with _gc_paused():
        return await _run_pass(session, settings, view)


async def load_view(
    session: AsyncSession,
    view: cluster_view.ClusterView,
    epoch: int,
    settings: MasterSettings,
) -> None:
    """Fill `view` from the database, as of `epoch` (under the scheduler's lock)."""
    pending = await _load_pending(session)
    agents = await load_agent_states(session, with_usage=False)
    held = await _load_held(session)
    conn = await session.connection()
    project_workspace = dict(
        (await conn.execute(select(_PROJECTS.c.id, _PROJECTS.c.workspace_id))).all()
    )
    newest_job = await conn.scalar(select(func.max(_EXPERIMENTS.c.id))) or 0
    # The usage the fair order reads: the users', and the queued and running jobs'.
    jobs = {p.job_id for p in pending} | {h.running.job_id for h in held}
    view.load(
        epoch,
        pending,
        (
            cluster_view.AgentEntry(
                a.id,
                pool,
                a.slot_ids,
                enabled=a.enabled,
                draining=a.draining,
                connected=a.connected,
            )
            for pool, pool_agents in agents.items()
            for a in pool_agents
        ),
        held,
        quotas=await load_quotas(session, settings),
        project_workspace=project_workspace,
        stored_usage=await usage.load_stored(session, jobs),
        ended=await usage.load_unaccounted(session),
        usage_jobs=jobs,
        newest_job=newest_job,
    )


async def load_quotas(
    session: AsyncSession, settings: MasterSettings
) -> dict[str, dict[int, fair_share.Quota]]:
    """Every configured pool's quotas by workspace id (the master config's, replaced by the
    API's for the same workspace and pool)."""
    by_pool: dict[str, dict[int, fair_share.Quota]] = defaultdict(dict)
    for q in await quotas.effective_quotas(session, settings):
        if settings.pool(q.pool) is not None:
            by_pool[q.pool][q.workspace_id] = fair_share.Quota(
                q.workspace_name, q.nominal_slots, q.borrowing_limit, q.lending_limit
            )
    return dict(by_pool)


async def _run_pass(
    session: AsyncSession, settings: MasterSettings, view: cluster_view.ClusterView | None
) -> PassStats:
    started = time.perf_counter()
    stats = PassStats()
    if not await _try_lock(session):
        stats.skipped = True
        return stats
    # Lock first (see allocations.hold_scheduler): what this pass reads cannot change
    # under it, and the epoch recorded is the one its plan is based on.
    stats.epoch = await hold_scheduler_for_pass(session)
    if view is None:
        view = cluster_view.ClusterView()
    if not view.exact_at(stats.epoch):
        await load_view(session, view, stats.epoch, settings)
        stats.loaded_view = True
    missing = view.jobs_without_usage()
    if missing:  # back in the queue since the load (det experiment continue, say)
        view.add_stored(await usage.load_stored(session, missing, users=False), missing)
    pending = list(view.pending.values())
    stats.pending = len(pending)
    if not pending:
        # Nothing to place, explain or preempt for (preemption only ever makes room for
        # pending work): the pass after a release or a kill on a drained queue ends here.
        stats.seconds = time.perf_counter() - started
        return stats
    agents = view.agent_states()
    # Running work matters to the core only for preemption and quotas; without them, the
    # slots it holds (in the agents' used slots) are all the pass needs.
    preempting = any(p.scheduler.preemption for p in settings.resource_pools)
    running = view.running_by_pool() if preempting or view.quotas else {}

    requests_by_pool: dict[str, list[placement.Request]] = defaultdict(list)
    for row in pending:
        requests_by_pool[row.pool].append(row.request(view.workspace_of(row)))
    # What the jobs with a resources.max_slots hold already (across pools: a job's cap is
    # its own, wherever its allocations run).
    capped_jobs = {row.job_id for row in pending if row.max_slots is not None}
    held_slots = view.held_slots(capped_jobs) if capped_jobs else {}
    assigned_at = utcnow()
    now = assigned_at.timestamp()  # the view records what the rows say: the same instant
    decay = fair_share.Decay(settings.fair_share.half_life_s(), settings.fair_share.start_charge_s)
    assignments: list[placement.Assignment] = []
    new_reasons: dict[str, tuple[str, str, int | None]] = {}
    preempt: list[str] = []
    core_started = time.perf_counter()
    for pool_name, requests in requests_by_pool.items():
        pool = settings.pool(pool_name)
        if pool is None:
            message = f"pool {pool_name} is not configured on this master"
            for request in requests:
                new_reasons[request.id] = (NO_SUCH_POOL, message, None)
            continue
        plan = placement.schedule(
            policy_of(pool),
            agents.get(pool_name, []),
            requests,
            running.get(pool_name, []),
            held_slots,
            view.quotas.get(pool_name),
            view.share_of(pool_name, now, decay),
        )
        assignments.extend(plan.assignments)
        preempt.extend(plan.preempt)
        for item in plan.pending:
            new_reasons[item.request_id] = (str(item.code), item.message, item.blocking_job)
        stats.by_pool[pool_name] = len(plan.assignments)
    stats.core_seconds = time.perf_counter() - core_started

    by_id = {row.id: row for row in pending}
    await _write_assignments(session, assignments, by_id, assigned_at)
    stats.placed = len(assignments)
    stats.reasons_written = await _write_reasons(session, new_reasons, by_id)
    # Applied as the pass commits (allocations.on_outcome): a change committed right
    # after it, to what it placed, finds it in the view.
    on_outcome(
        session,
        lambda: view.placed(assignments, new_reasons, preempt, now),
        view.invalidate,
    )
    if preempt:
        await session.execute(
            update(AllocationModel)
            .where(AllocationModel.id.in_(preempt))
            .values(preempt_requested=True)
            .execution_options(synchronize_session=False)
        )
        stats.preempted = len(preempt)
        log.info("preempting allocations %s", ", ".join(sorted(preempt)))
    stats.seconds = time.perf_counter() - started
    if stats.placed or stats.preempted:
        log.info(
            "scheduling pass: %d placed, %d preempted, %d still pending (%.1f ms)",
            stats.placed,
            stats.preempted,
            stats.pending - stats.placed,
            stats.seconds * 1000,
        )
    return stats


async def _write_assignments(
    session: AsyncSession,
    assignments: list[placement.Assignment],
    by_id: dict[str, PendingEntry],
    now: datetime,
) -> None:
    if not assignments:
        return
    slot_rows = [
        {"agent_id": agent_id, "slot_id": slot_id, "allocation_id": a.request_id}
        for a in assignments
        for agent_id, slot_ids in a.slots
        for slot_id in slot_ids
    ]
    zero_slot = {a.request_id: a.slots[0][0] for a in assignments if by_id[a.request_id].slots == 0}
    ids = [a.request_id for a in assignments]
    updated: set[str] = set()
    for chunk in _chunks(ids):
        result = await session.execute(
            update(AllocationModel)
            .where(
                AllocationModel.id.in_(chunk),
                AllocationModel.state == AllocationState.PENDING,
            )
            .values(
                state=AllocationState.ASSIGNED,
                assigned_at=now,
                pending_code="",
                pending_reason="",
                blocking_job=None,
            )
            .returning(AllocationModel.id)
            .execution_options(synchronize_session=False)
        )
        updated.update(result.scalars().all())
    if len(updated) != len(ids):
        # A kill or pause committed after this pass read the queue.
        raise StaleSnapshot(f"{len(ids) - len(updated)} planned allocations left the queue")
    for allocation_id, agent_id in zero_slot.items():
        await session.execute(
            update(AllocationModel)
            .where(AllocationModel.id == allocation_id)
            .values(zero_slot_agent_id=agent_id)
            .execution_options(synchronize_session=False)
        )
    if slot_rows:
        await session.execute(insert(_HELD), slot_rows)
    await states.set_trial_states(
        session,
        [trial_id for i in ids if (trial_id := by_id[i].trial_id) is not None],
        TrialState.QUEUED,
        TrialState.STARTING,
        "resources assigned by the scheduler",
    )


async def _write_reasons(
    session: AsyncSession,
    new_reasons: dict[str, tuple[str, str, int | None]],
    by_id: dict[str, PendingEntry],
) -> int:
    """Write only reasons that changed, one statement per distinct reason."""
    changed: dict[tuple[str, str, int | None], list[str]] = defaultdict(list)
    for allocation_id, reason in new_reasons.items():
        if by_id[allocation_id].reason != reason:
            changed[reason].append(allocation_id)
    for (code, message, blocking), ids in changed.items():
        for chunk in _chunks(ids):
            await session.execute(
                update(AllocationModel)
                .where(
                    AllocationModel.id.in_(chunk),
                    AllocationModel.state == AllocationState.PENDING,
                )
                .values(pending_code=code, pending_reason=message, blocking_job=blocking)
                .execution_options(synchronize_session=False)
            )
    return sum(len(ids) for ids in changed.values())


class SchedulerLoop(Loop):
    """Runs a pass when woken (a submit, a release, an agent change committed here) and
    checks at least every `scheduler_interval_s` whether any master committed a change
    since the last pass (the scheduler epoch); an unchanged cluster costs one small read.

    Its passes read the in-memory view (master.core.cluster_view), which this master's
    commits keep exact; a pass loads it from the database when they could not (a change
    not described, another master's commit), and every FULL_PASS_S as a safety net."""

    name = "scheduler"
    FULL_PASS_S = 10.0

    def __init__(self, factory: async_sessionmaker[AsyncSession], settings: MasterSettings) -> None:
        super().__init__(settings.scheduler_interval_s)
        self.factory = factory
        self.settings = settings
        self.last: PassStats | None = None
        self.passes = 0
        self.pass_times = Histogram(PASS_BUCKETS_S)  # for the metrics endpoint
        self._woken = True
        self._last_full = 0.0
        self._last_accounted = 0.0
        self.view = cluster_view.ClusterView()
        engine = factory.kw.get("bind")
        if engine is not None:
            watch_commits(engine, self.view)
        # Called once a pass that placed or preempted something has committed, so the
        # agent hub launches (or signals) at once rather than on its next tick.
        self.after_commit: Callable[[], None] = lambda: None
        # Clear while a pass runs: background senders (the webhook shipper) start no new
        # work on the event loop meanwhile, so a pass does not wait behind theirs.
        self.idle = asyncio.Event()
        self.idle.set()

    def wake(self) -> None:
        self._woken = True
        super().wake()

    async def run_once(self) -> None:
        if time.monotonic() - self._last_accounted >= usage.ACCOUNT_EVERY_S:
            self._last_accounted = time.monotonic()
            try:
                # Before the pass: its commit makes the view load the usage afresh.
                async with session_scope(self.factory) as session:
                    await usage.account(session, self.settings)
            except Exception as exc:
                if is_outage(exc):
                    raise  # the loop reports it, as for a pass
                # Usage only orders the queue: scheduling goes on, and the next try adds
                # what ended meanwhile too.
                log.exception("fair-share usage could not be accounted; trying again later")
        woken, self._woken = self._woken, False
        due = time.monotonic() - self._last_full >= self.FULL_PASS_S
        if not woken and not due and self.last is not None and not self.last.skipped:
            async with self.factory() as session:
                if await scheduler_epoch(session) == self.last.epoch:
                    return
        if due:
            self.view.invalidate()
        self.idle.clear()
        try:
            async with session_scope(self.factory) as session:
                self.last = await run_pass(session, self.settings, self.view)
        except StaleSnapshot as exc:
            self.view.invalidate()
            log.info("scheduling pass rolled back (%s); running again", exc)
            self.wake()
            return
        except BaseException:
            self.view.invalidate()  # the pass failed: what it read is in doubt
            raise
        finally:
            self.idle.set()
        self.passes += 1
        if self.last.placed or self.last.preempted:
            self.after_commit()
        if not self.last.skipped:
            self.pass_times.observe(self.last.seconds)
        if due:
            self._last_full = time.monotonic()
