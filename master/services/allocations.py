"""Allocations: a trial's place in the queue and, once scheduled, the slots it holds.

Everything here leaves the commit to the caller. Functions that give the scheduler new
work call `request_scheduling`, which wakes the loop once the transaction has committed.
What follows an allocation's end (the trial's next state, the searcher, the task) is in
master.services.release, above the modules this one serves.
"""

from __future__ import annotations

import enum
import logging
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Engine, Table, event, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from master.core import cluster_view
from master.db.models import (
    AllocationModel,
    AllocationState,
    ExperimentModel,
    ExperimentState,
    SchedulerStateModel,
    TrialModel,
    TrialState,
    utcnow,
)
from master.errors import NotFound

log = logging.getLogger(__name__)

WAKE_SCHEDULER = "wake_scheduler"
# Set on a transaction that asks running ranks to stop: once it commits, the agent hub
# passes the stop on at once instead of on its next tick.
WAKE_HUB = "wake_hub"
HELD_STATES = (
    AllocationState.ASSIGNED,
    AllocationState.PULLING,
    AllocationState.STARTING,
    AllocationState.RUNNING,
    AllocationState.TERMINATING,
)
FIRST_PENDING_CODE = "WAITING_FOR_SCHEDULER"
FIRST_PENDING_REASON = "submitted; waiting for the next scheduling pass"


class ReleaseOutcome(enum.StrEnum):
    COMPLETED = "completed"  # every rank exited 0
    FAILED = "failed"  # user code failed: counts against max_restarts
    PREEMPTED = "preempted"  # asked to stop by the scheduler or a pause
    AGENT_LOST = "agent_lost"  # transient system error: requeue without counting a restart
    KILLED = "killed"  # stopped on request
    # could not start, and no restart can help (no interpreter, no `determined` package):
    # the trial ends in ERROR at once, with the reason
    UNRUNNABLE = "unrunnable"


# What a transaction changed for the scheduler, for the leader's in-memory view
# (master.core.cluster_view): the changes it described, or Unknown among them.
_CHANGES = "scheduler_changes"
_EPOCH_BUMPED = "scheduler_epoch_bumped"  # the epoch this transaction's bump wrote
_UNKNOWN = cluster_view.Unknown()
# The view each engine's commits are told about (the scheduler loop registers its own).
_VIEWS: weakref.WeakKeyDictionary[Engine, cluster_view.ClusterView] = weakref.WeakKeyDictionary()


def request_scheduling(session: AsyncSession) -> None:
    """Mark the transaction as a change for the scheduler whose details it does not give:
    its commit bumps the epoch (seen by every master), wakes this master's loop, and makes
    the in-memory view load afresh before the next pass."""
    note_change(session, _UNKNOWN)


def note_change(session: AsyncSession, change: cluster_view.Change) -> None:
    """A change for the scheduler, described: its commit bumps the epoch and wakes the
    loop, and the view applies `change` instead of loading everything again. A transaction
    must describe every such change it makes, or call request_scheduling."""
    session.info[WAKE_SCHEDULER] = True
    session.info.setdefault(_CHANGES, []).append(change)


def watch_commits(engine: AsyncEngine, view: cluster_view.ClusterView) -> None:
    """Tell `view` of every committed change to the scheduling state made through `engine`."""
    _VIEWS[engine.sync_engine] = view


def _view_of(session: Session) -> cluster_view.ClusterView | None:
    bind = session.get_bind()
    return _VIEWS.get(bind) if isinstance(bind, Engine) else None


def current_view(session: AsyncSession) -> cluster_view.ClusterView | None:
    """The in-memory view this session's engine keeps, if it is loaded: as of the last
    commit told to it, so good for what is said at submit time, not for decisions (a pass
    decides under the lock, from a view exact at the epoch it locked)."""
    view = _view_of(session.sync_session)
    return view if view is not None and view.epoch is not None else None


_BUMP_EPOCH = (
    update(SchedulerStateModel)
    .where(SchedulerStateModel.id == 1)
    .values(epoch=SchedulerStateModel.epoch + 1)
    .returning(SchedulerStateModel.epoch)
)


@event.listens_for(Session, "before_commit")
def _bump_scheduler_epoch(session: Session) -> None:
    if session.info.get(WAKE_SCHEDULER) and _EPOCH_BUMPED not in session.info:
        session.info[_EPOCH_BUMPED] = session.execute(_BUMP_EPOCH).scalar()


_ON_OUTCOME = "scheduler_view_on_outcome"


def on_outcome(
    session: AsyncSession, committed: Callable[[], None], rolled_back: Callable[[], None]
) -> None:
    """Run `committed` right after this transaction commits, before any later commit is
    told to the view (the event runs in the same step as the commit, with no await between),
    or `rolled_back` if it does not commit."""
    session.info.setdefault(_ON_OUTCOME, []).append((committed, rolled_back))


@event.listens_for(Session, "after_commit")
def _tell_the_view(session: Session) -> None:
    for committed, _ in session.info.pop(_ON_OUTCOME, ()):
        committed()
    epoch = session.info.pop(_EPOCH_BUMPED, None)
    changes = session.info.pop(_CHANGES, None)
    if epoch is None or changes is None:
        return
    view = _view_of(session)
    if view is not None:
        view.committed(int(epoch), changes)


@event.listens_for(Session, "after_rollback")
def _forget_changes(session: Session) -> None:
    for _, rolled_back in session.info.pop(_ON_OUTCOME, ()):
        rolled_back()
    session.info.pop(_EPOCH_BUMPED, None)
    session.info.pop(_CHANGES, None)


def forget_described_changes(session: AsyncSession) -> None:
    """Part of the transaction was rolled back (a savepoint): what it described may not
    have happened, so the view must load afresh."""
    if session.info.get(_CHANGES):
        session.info[_CHANGES].append(_UNKNOWN)


async def hold_scheduler(session: AsyncSession, *, described: bool = False) -> None:
    """Serialise this transaction with scheduling passes; call it before reading anything
    a pass may change (trial and allocation states, agents, priorities).

    It writes the scheduler_state row at once (bumping the epoch), so a pass in flight
    finishes and commits before this transaction reads, and a pass that starts later waits
    for this commit. Without it, a kill could read a trial as QUEUED while a pass placed it.
    `described`: the caller describes each change it makes (note_change); otherwise the
    in-memory view loads afresh after this commit.
    """
    if described:
        session.info[WAKE_SCHEDULER] = True
        session.info.setdefault(_CHANGES, [])
    else:
        request_scheduling(session)
    if _EPOCH_BUMPED not in session.info:
        session.info[_EPOCH_BUMPED] = await session.scalar(_BUMP_EPOCH)


async def hold_scheduler_for_pass(session: AsyncSession) -> int:
    """The pass's side of hold_scheduler: the same row lock, without a bump; the epoch."""
    epoch = await session.scalar(
        update(SchedulerStateModel)
        .where(SchedulerStateModel.id == 1)
        .values(epoch=SchedulerStateModel.epoch)
        .returning(SchedulerStateModel.epoch)
    )
    return int(epoch or 0)


async def ensure_scheduler_state(session: AsyncSession) -> None:
    if await session.get(SchedulerStateModel, 1) is None:
        session.add(SchedulerStateModel(id=1, epoch=0))
        await session.flush()
        # The epochs start again from 0: a view exact at a later one is of another database.
        view = _view_of(session.sync_session)
        if view is not None:
            view.invalidate()


async def scheduler_epoch(session: AsyncSession) -> int:
    epoch = await session.scalar(
        select(SchedulerStateModel.epoch).where(SchedulerStateModel.id == 1)
    )
    return int(epoch or 0)


def task_id(trial: TrialModel) -> str:
    """Determined's trial task ids are "<experiment id>.<request id>"."""
    return f"{trial.experiment_id}.{trial.request_id}"


def _pending_allocation(
    trial_id: int, run_id: int, experiment: ExperimentModel, registered_at: datetime
) -> dict[str, Any]:
    resources = experiment.config.get("resources") or {}
    return {
        "id": f"{trial_id}.{run_id}",
        "trial_id": trial_id,
        "experiment_id": experiment.id,
        "state": AllocationState.PENDING,
        "resource_pool": experiment.resource_pool,
        "slots_needed": int(resources.get("slots_per_trial", 1)),
        "single_node": bool(resources.get("is_single_node", False)),
        "registered_at": registered_at,
        "pending_code": FIRST_PENDING_CODE,
        "pending_reason": FIRST_PENDING_REASON,
    }


def _max_slots(experiment: ExperimentModel) -> int | None:
    value = (experiment.config.get("resources") or {}).get("max_slots")
    return None if value is None else int(value)


def _weight(experiment: ExperimentModel) -> float:
    value = (experiment.config.get("resources") or {}).get("weight")
    return 1.0 if value is None else float(value)


def _queued(
    row: dict[str, Any], priority: int, max_slots: int | None, experiment: ExperimentModel
) -> cluster_view.PendingEntry:
    """What the in-memory view holds of a new pending allocation (as the pass loads it)."""
    return cluster_view.PendingEntry(
        id=row["id"],
        trial_id=row["trial_id"],
        job_id=row["experiment_id"],
        slots=row["slots_needed"],
        single_node=row["single_node"],
        pool=row["resource_pool"],
        priority=priority,
        order=(row["registered_at"].timestamp(), row["trial_id"]),
        reason=(FIRST_PENDING_CODE, FIRST_PENDING_REASON, None),
        max_slots=max_slots,
        project_id=experiment.project_id,
        user_id=experiment.owner_id or 0,
        weight=_weight(experiment),
    )


def enqueue_trial(session: AsyncSession, trial: TrialModel, experiment: ExperimentModel) -> None:
    """A new PENDING allocation for a QUEUED trial."""
    trial.run_id += 1
    row = _pending_allocation(trial.id, trial.run_id, experiment, utcnow())
    session.add(AllocationModel(**row))
    entry = _queued(row, experiment.priority, _max_slots(experiment), experiment)
    note_change(session, cluster_view.Enqueued((entry,)))


async def enqueue_new_trials(
    session: AsyncSession, trial_ids: Sequence[int], experiment: ExperimentModel
) -> None:
    """enqueue_trial for trials just inserted with run_id 1: one statement for them all."""
    await enqueue_new_trials_of(session, [(trial_ids, experiment)])


async def enqueue_new_trials_of(
    session: AsyncSession, new: Sequence[tuple[Sequence[int], ExperimentModel]]
) -> None:
    """enqueue_new_trials for the trials of several experiments, in one statement."""
    now = utcnow()
    rows = [
        (
            _pending_allocation(i, 1, experiment, now),
            experiment.priority,
            _max_slots(experiment),
            experiment,
        )
        for trial_ids, experiment in new
        for i in trial_ids
    ]
    if not rows:
        return
    await session.execute(insert(cast(Table, AllocationModel.__table__)), [r for r, *_ in rows])
    note_change(session, cluster_view.Enqueued(tuple(_queued(*row) for row in rows)))


async def cancel_pending(session: AsyncSession, trial_ids: Sequence[int], reason: str) -> None:
    """Take trials out of the queue (pause, kill)."""
    if not trial_ids:
        return
    # The head of the queue may have left.
    note_change(session, cluster_view.Cancelled(frozenset(trial_ids)))
    await session.execute(
        update(AllocationModel)
        .where(
            AllocationModel.trial_id.in_(list(trial_ids)),
            AllocationModel.state == AllocationState.PENDING,
        )
        .values(state=AllocationState.TERMINATED, ended_at=utcnow(), exit_reason=reason)
        .execution_options(synchronize_session=False)
    )


async def held_allocations(
    session: AsyncSession, trial_ids: Sequence[int]
) -> list[AllocationModel]:
    if not trial_ids:
        return []
    query = select(AllocationModel).where(
        AllocationModel.trial_id.in_(list(trial_ids)), AllocationModel.state.in_(HELD_STATES)
    )
    return list((await session.scalars(query)).all())


async def ask_to_stop(
    session: AsyncSession, trial_ids: Sequence[int], *, terminate: bool
) -> list[str]:
    """Signal the holders: preemption (checkpoint and exit) or, with terminate, a kill.
    Returns the allocations asked."""
    held = await held_allocations(session, trial_ids)
    if held:
        note_change(session, cluster_view.StopAsked(frozenset(a.id for a in held)))
        session.info[WAKE_HUB] = True
    for allocation in held:
        allocation.preempt_requested = True
        if terminate:
            allocation.state = AllocationState.TERMINATING
    await session.flush()
    return [allocation.id for allocation in held]


async def get_allocation(session: AsyncSession, allocation_id: str) -> AllocationModel:
    # Fresh from the database: callers take the scheduler's lock first, and a copy cached
    # before it could say the allocation is still held when another release ended it.
    allocation = await session.get(AllocationModel, allocation_id, populate_existing=True)
    if allocation is None:
        raise NotFound(f"allocation {allocation_id} not found")
    return allocation


async def acknowledge_preemption(session: AsyncSession, allocation_id: str) -> None:
    """Trial code acknowledged the preemption signal: an exit 0 now means "stopped for
    preemption", not "finished". Stored, so a restarted master still knows it."""
    allocation = await get_allocation(session, allocation_id)
    allocation.preempt_acked = True


async def enqueue_orphaned_trials(session: AsyncSession) -> int:
    """Queued trials of active experiments with no live allocation get one.

    Run at start-up: it covers databases from before allocations existed and any crash
    between a trial becoming QUEUED and its allocation being written.
    """
    live = (
        select(AllocationModel.id)
        .where(
            AllocationModel.trial_id == TrialModel.id,
            AllocationModel.state != AllocationState.TERMINATED,
        )
        .exists()
    )
    rows = (
        await session.execute(
            select(TrialModel, ExperimentModel)
            .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
            .where(
                TrialModel.state == TrialState.QUEUED,
                ExperimentModel.state == ExperimentState.ACTIVE,
                ~live,
            )
        )
    ).all()
    for trial, experiment in rows:
        enqueue_trial(session, trial, experiment)
    if rows:
        log.info("queued %d trials that had no allocation", len(rows))
    await session.flush()
    return len(rows)
