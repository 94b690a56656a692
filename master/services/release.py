"""What follows the end of an allocation: its slots freed, and the trial moved on (done,
failed, requeued) with the searcher, retention and the experiment's state told, or the
task ended. It sits above the modules it calls back into (search, interactive,
trial_reports, checkpoint_gc), which queue and stop work through master.services.allocations.
"""

from __future__ import annotations

import logging

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import cluster_view
from master.core.asha import ASHA_SEARCHERS
from master.db.models import (
    AllocationSlotModel,
    AllocationState,
    ExperimentModel,
    ExperimentState,
    TrialModel,
    TrialState,
    utcnow,
)
from master.errors import Conflict
from master.services import (
    allocations,
    auth,
    checkpoint_gc,
    interactive,
    search,
    states,
    trial_reports,
)
from master.services.allocations import ReleaseOutcome
from resolute._env import max_length_batches

log = logging.getLogger(__name__)


async def release_allocation(
    session: AsyncSession,
    allocation_id: str,
    outcome: ReleaseOutcome,
    message: str = "",
    *,
    exit_code: int | None = None,
) -> None:
    """The allocation's processes have all exited: free its slots and move the trial (or
    end the task) on. `exit_code`: the first nonzero exit of its processes, or 0.

    Idempotent, because an agent may report the same exit again after a reconnect.
    """
    await allocations.hold_scheduler(session, described=True)
    allocation = await allocations.get_allocation(session, allocation_id)
    if allocation.state == AllocationState.TERMINATED:
        return
    if allocation.state not in allocations.HELD_STATES:
        raise Conflict(
            f"allocation {allocation_id} is {allocation.state}: only an allocation holding "
            "resources can be released"
        )
    await session.execute(
        delete(AllocationSlotModel).where(AllocationSlotModel.allocation_id == allocation_id)
    )
    allocation.state = AllocationState.TERMINATED
    allocation.ended_at = utcnow()
    allocations.note_change(
        session, cluster_view.Released(allocation_id, allocation.ended_at.timestamp())
    )
    if allocation.task_session_id is not None:
        await auth.revoke_session(session, allocation.task_session_id)
        allocation.task_session_id = None
    allocation.exit_reason = f"{outcome}: {message}" if message else str(outcome)
    if allocation.task_id is not None:
        await interactive.finish_task(session, allocation, outcome, message, exit_code)
        allocations.request_scheduling(session)
        log.info("allocation %s released: %s %s", allocation_id, outcome, message)
        return
    trial = await session.get(TrialModel, allocation.trial_id)
    experiment = await session.get(ExperimentModel, allocation.experiment_id)
    assert trial is not None and experiment is not None  # foreign keys guarantee both
    _move_trial_after_release(session, trial, experiment, outcome, message)
    await session.flush()
    if TrialState(trial.state).is_terminal:
        await close_trial(session, trial, experiment)
    else:
        await trial_reports.refresh_experiment_progress(session, experiment.id)
    log.info("allocation %s released: %s %s", allocation_id, outcome, message)


async def close_trial(
    session: AsyncSession, trial: TrialModel, experiment: ExperimentModel
) -> None:
    """What follows a trial's terminal state: the searcher told, retention applied, the
    experiment's progress and, when it was the last trial, its end."""
    await search.on_trial_closed(session, trial, experiment)
    await checkpoint_gc.apply_retention(session, experiment)
    await trial_reports.refresh_experiment_progress(session, experiment.id)
    await finish_experiment_if_done(session, experiment)


def _move_trial_after_release(
    session: AsyncSession,
    trial: TrialModel,
    experiment: ExperimentModel,
    outcome: ReleaseOutcome,
    message: str,
) -> None:
    current = TrialState(trial.state)
    reason = f"allocation ended: {outcome}" + (f" ({message})" if message else "")
    if current.is_terminal or current in (TrialState.QUEUED, TrialState.PAUSED):
        return
    if current in (TrialState.STOPPING_KILLED, TrialState.STOPPING_CANCELED):
        states.set_trial_state(session, trial, TrialState.CANCELED, reason)
    elif current == TrialState.STOPPING_COMPLETED or outcome == ReleaseOutcome.COMPLETED:
        if current != TrialState.STOPPING_COMPLETED and not trial.end_reason:
            trial.end_reason = short_of_length(trial, experiment)
        states.set_trial_state(session, trial, TrialState.COMPLETED, reason)
    elif outcome == ReleaseOutcome.KILLED:
        states.set_trial_state(session, trial, TrialState.CANCELED, reason)
    elif outcome == ReleaseOutcome.UNRUNNABLE:
        trial.end_reason = message
        states.set_trial_state(session, trial, TrialState.ERROR, reason)
    elif outcome == ReleaseOutcome.FAILED:
        trial.restarts += 1
        max_restarts = int(experiment.config.get("max_restarts", 5))
        if trial.restarts > max_restarts:
            trial.end_reason = f"{message}; max_restarts={max_restarts} used"
            states.set_trial_state(
                session, trial, TrialState.ERROR, f"{reason}; max_restarts={max_restarts} used"
            )
        else:
            _requeue(session, trial, experiment, reason)
    else:  # preempted or agent lost: transient, no restart counted
        _requeue(session, trial, experiment, reason)


def short_of_length(trial: TrialModel, experiment: ExperimentModel) -> str:
    """Why a trial that exited 0 is COMPLETED though it trained less than its searcher's
    length (a script that stops early, or one that never reads the length): said, so that
    a completed trial at 0 of 1,000 batches is not taken for a finished one. Empty when it
    reached the length, or when the length is not counted in batches. ASHA's trials are
    left to the searcher, which names the rung they reached."""
    if experiment.searcher_type in ASHA_SEARCHERS:
        return ""
    length = max_length_batches(experiment.config)
    done = trial.total_batches_processed
    if length is None or done >= length:
        return ""
    return (
        f"exited 0 after {done:,} of {length:,} batches (searcher.max_length): "
        "the script ended before the searcher's length"
    )


def _requeue(
    session: AsyncSession, trial: TrialModel, experiment: ExperimentModel, reason: str
) -> None:
    if ExperimentState(experiment.state) == ExperimentState.PAUSED:
        states.set_trial_state(session, trial, TrialState.PAUSED, reason)
        return
    states.set_trial_state(session, trial, TrialState.QUEUED, reason)
    allocations.enqueue_trial(session, trial, experiment)


async def finish_experiment_if_done(session: AsyncSession, experiment: ExperimentModel) -> None:
    """When every trial has ended, the experiment ends too."""
    current = ExperimentState(experiment.state)
    if current.is_terminal:
        return
    trial_states = (
        await session.scalars(
            select(TrialModel.state).where(TrialModel.experiment_id == experiment.id)
        )
    ).all()
    if not all(TrialState(s).is_terminal for s in trial_states):
        return
    if current in (ExperimentState.STOPPING_KILLED, ExperimentState.STOPPING_CANCELED):
        final = ExperimentState.CANCELED
    elif any(TrialState(s) == TrialState.COMPLETED for s in trial_states):
        final = ExperimentState.COMPLETED
    elif all(TrialState(s) == TrialState.CANCELED for s in trial_states):
        final = ExperimentState.CANCELED  # every trial killed one by one (det trial kill)
    else:
        final = ExperimentState.ERROR
    if final == ExperimentState.COMPLETED:
        experiment.progress = 1.0  # as Determined sets it when a search completes
    states.set_experiment_state(session, experiment, final, "every trial has ended")
