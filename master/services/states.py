"""The only place experiment and trial states change: checks, timestamps, audit row, log line."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import Table, insert, update
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import (
    ExperimentModel,
    ExperimentState,
    StateChangeModel,
    TrialModel,
    TrialState,
    utcnow,
)
from master.errors import Conflict
from master.services import webhooks

log = logging.getLogger(__name__)

E = ExperimentState
T = TrialState

_EXPERIMENT_TRANSITIONS: dict[ExperimentState, frozenset[ExperimentState]] = {
    E.ACTIVE: frozenset(
        {
            E.PAUSED,
            E.STOPPING_COMPLETED,
            E.STOPPING_CANCELED,
            E.STOPPING_KILLED,
            E.STOPPING_ERROR,
            E.COMPLETED,
            E.CANCELED,
            E.ERROR,
        }
    ),
    # A paused experiment completes when its last running trial finishes.
    E.PAUSED: frozenset(
        {
            E.ACTIVE,
            E.STOPPING_CANCELED,
            E.STOPPING_KILLED,
            E.STOPPING_ERROR,
            E.COMPLETED,
            E.CANCELED,
            E.ERROR,
        }
    ),
    E.STOPPING_COMPLETED: frozenset({E.COMPLETED, E.STOPPING_KILLED, E.ERROR}),
    E.STOPPING_CANCELED: frozenset({E.CANCELED, E.STOPPING_KILLED, E.ERROR}),
    E.STOPPING_KILLED: frozenset({E.CANCELED, E.ERROR}),
    E.STOPPING_ERROR: frozenset({E.ERROR}),
    # ACTIVE again: continued (master.services.continuation).
    E.COMPLETED: frozenset({E.DELETING, E.ACTIVE}),
    E.CANCELED: frozenset({E.DELETING, E.ACTIVE}),
    E.ERROR: frozenset({E.DELETING, E.ACTIVE}),
    E.DELETING: frozenset(),  # its rows are removed once its checkpoints are gone
}

_STOPPING_TRIAL = frozenset({T.STOPPING_CANCELED, T.STOPPING_KILLED, T.STOPPING_COMPLETED})
_TRIAL_TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    T.QUEUED: frozenset({T.PAUSED, T.PULLING, T.STARTING, T.RUNNING, T.CANCELED, T.ERROR}),
    T.PAUSED: frozenset({T.QUEUED, T.CANCELED, T.ERROR}),
    # A process may exit before RUNNING is reported, hence COMPLETED and PAUSED from these.
    T.PULLING: frozenset(
        {T.STARTING, T.RUNNING, T.QUEUED, T.PAUSED, T.COMPLETED, T.ERROR} | _STOPPING_TRIAL
    ),
    T.STARTING: frozenset(
        {T.RUNNING, T.QUEUED, T.PAUSED, T.COMPLETED, T.ERROR, T.STOPPING_ERROR} | _STOPPING_TRIAL
    ),
    T.RUNNING: frozenset(
        {T.QUEUED, T.PAUSED, T.COMPLETED, T.ERROR, T.STOPPING_ERROR} | _STOPPING_TRIAL
    ),
    T.STOPPING_CANCELED: frozenset({T.CANCELED, T.PAUSED, T.STOPPING_KILLED, T.ERROR}),
    T.STOPPING_KILLED: frozenset({T.CANCELED, T.ERROR}),
    T.STOPPING_COMPLETED: frozenset({T.COMPLETED, T.STOPPING_KILLED, T.ERROR}),
    T.STOPPING_ERROR: frozenset({T.ERROR}),
    # QUEUED again: its experiment was continued (a new run, from its latest checkpoint).
    T.COMPLETED: frozenset({T.QUEUED}),
    T.CANCELED: frozenset({T.QUEUED}),
    T.ERROR: frozenset({T.QUEUED}),
}


def _record(
    session: AsyncSession, entity: str, entity_id: int, old: str | None, new: str, reason: str
) -> None:
    session.add(
        StateChangeModel(
            entity=entity, entity_id=entity_id, from_state=old, to_state=new, reason=reason
        )
    )


async def record_created(session: AsyncSession, created: Sequence[tuple[str, int, str]]) -> None:
    """New rows of any entities, as (entity, id, state): one statement for them all."""
    at = utcnow()
    await _insert_rows(
        session, [(entity, i, None, state, "created", at) for entity, i, state in created]
    )


async def _insert_changes(
    session: AsyncSession,
    entity: str,
    entity_ids: Sequence[int],
    old: str | None,
    new: str,
    reason: str,
    at: datetime,
) -> None:
    """One transition of many rows, recorded in one statement."""
    await _insert_rows(session, [(entity, i, old, new, reason, at) for i in entity_ids])


async def _insert_rows(
    session: AsyncSession, rows: Sequence[tuple[str, int, str | None, str, str, datetime]]
) -> None:
    """State changes as (entity, id, from, to, reason, at), in one statement."""
    if not rows:
        return
    await session.execute(
        insert(cast(Table, StateChangeModel.__table__)),
        [
            {
                "entity": entity,
                "entity_id": entity_id,
                "from_state": old,
                "to_state": new,
                "reason": reason,
                "at": at,
            }
            for entity, entity_id, old, new, reason, at in rows
        ],
    )


def set_experiment_state(
    session: AsyncSession, experiment: ExperimentModel, new: ExperimentState, reason: str
) -> None:
    """Leaves the commit to the caller's transaction."""
    old = ExperimentState(experiment.state)
    if old == new:
        return
    if new not in _EXPERIMENT_TRANSITIONS[old]:
        raise Conflict(f"experiment {experiment.id} is {old}; it cannot become {new}")
    experiment.state = new
    if new.is_terminal and not old.is_terminal:
        experiment.end_time = utcnow()
    _record(session, "experiment", experiment.id, old, new, reason)
    # In this transaction: webhooks hear of the change if and only if it commits.
    webhooks.record_state_change(session, experiment.id, new)
    log.info("experiment %s: %s -> %s (%s)", experiment.id, old, new, reason)


def set_trial_state(session: AsyncSession, trial: TrialModel, new: TrialState, reason: str) -> None:
    """Leaves the commit to the caller's transaction."""
    old = TrialState(trial.state)
    if old == new:
        return
    if new not in _TRIAL_TRANSITIONS[old]:
        raise Conflict(f"trial {trial.id} is {old}; it cannot become {new}")
    trial.state = new
    if new.is_terminal:
        trial.end_time = utcnow()
    _record(session, "trial", trial.id, old, new, reason)
    log.info("trial %s: %s -> %s (%s)", trial.id, old, new, reason)


async def set_trial_states(
    session: AsyncSession, trial_ids: Sequence[int], old: TrialState, new: TrialState, reason: str
) -> None:
    """The bulk twin of set_trial_state for a scheduling pass: one transition for many trials.

    Only rows still in `old` change, so a trial killed meanwhile is left alone.
    """
    if new not in _TRIAL_TRANSITIONS[old]:
        raise Conflict(f"trials cannot go from {old} to {new}")
    now = utcnow()
    for start in range(0, len(trial_ids), _CHUNK):
        chunk = list(trial_ids[start : start + _CHUNK])
        values: dict[str, object] = {"state": new}
        if new.is_terminal:
            values["end_time"] = now
        await session.execute(
            update(TrialModel)
            .where(TrialModel.id.in_(chunk), TrialModel.state == old)
            .values(values)
            .execution_options(synchronize_session=False)
        )
        await _insert_changes(session, "trial", chunk, old, new, reason, now)
    if trial_ids:
        log.info("%d trials: %s -> %s (%s)", len(trial_ids), old, new, reason)


# Ids per statement: each is a bind parameter, and SQLite (>= 3.32) and asyncpg both
# allow 32,766; fewer, larger statements save round trips in a big pass.
_CHUNK = 5000
