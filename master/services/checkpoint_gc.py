"""Checkpoint deletion: retention applied as trials and experiments end, deletes a user
asks for, `det experiment delete`, and the loop that removes the files from the store.

Deciding and deleting are apart. A decision marks checkpoints DELETING in the caller's
transaction (so a crash between the two forgets nothing); `CheckpointDeleter` then removes
their files outside any transaction, and records the outcome: DELETED, or the store's error
as the reason and a retry after a backoff (1 s, 2 s, 4 s... at most 5 minutes), for as long
as it takes: a checkpoint is never left stuck. PARTIALLY_DELETED says some files are gone
and the rest will follow.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.core.retention import CheckpointFacts, Retention, retry_delay_s, to_delete
from master.db.models import (
    CheckpointModel,
    ExperimentModel,
    ExperimentState,
    TrialMetricModel,
    TrialModel,
    TrialState,
    utcnow,
)
from master.db.session import session_scope
from master.errors import Conflict, InvalidArgument, NotFound
from master.services import registered_checkpoints, states
from master.services.loops import Loop
from resolute.storage import StorageError, from_config, one_line

log = logging.getLogger(__name__)

ACTIVE = "COMPLETED"  # Determined's name for a checkpoint that is stored and usable
DELETING = "DELETING"
DELETED = "DELETED"
PARTIALLY_DELETED = "PARTIALLY_DELETED"
BEING_DELETED = (DELETING, PARTIALLY_DELETED)
# What `det checkpoint list` and the dashboard call each state.
SHOWN = {
    ACTIVE: "ACTIVE",
    DELETING: DELETING,
    DELETED: DELETED,
    PARTIALLY_DELETED: "PARTIALLY_DELETED",
}
# Determined's checkpointv1State has no DELETING: while files are being removed the
# checkpoint is partly gone, which is what the official client is told.
WIRE_STATE = {
    ACTIVE: "STATE_COMPLETED",
    DELETING: "STATE_PARTIALLY_DELETED",
    DELETED: "STATE_DELETED",
    PARTIALLY_DELETED: "STATE_PARTIALLY_DELETED",
}
DELETES_PER_PASS = 16


# --- decisions (in the caller's transaction) -------------------------------------------------


def retention_of(config: Mapping[str, Any]) -> Retention:
    storage = config.get("checkpoint_storage") or {}
    return Retention(
        save_experiment_best=int(storage.get("save_experiment_best") or 0),
        save_trial_best=int(storage.get("save_trial_best", 1) or 0),
        save_trial_latest=int(storage.get("save_trial_latest", 1) or 0),
    )


def mark_deleting(checkpoints: Iterable[CheckpointModel], reason: str) -> int:
    now = utcnow()
    count = 0
    for checkpoint in checkpoints:
        if checkpoint.state != ACTIVE:
            continue  # already on its way, or gone
        checkpoint.state = DELETING
        checkpoint.state_reason = reason
        checkpoint.delete_attempts = 0
        checkpoint.delete_next_at = now
        count += 1
    return count


async def apply_retention(session: AsyncSession, experiment: ExperimentModel) -> int:
    """Mark for deletion what the experiment's retention settings no longer keep, among
    the checkpoints of its trials that have ended. Returns how many."""
    retention = retention_of(experiment.config)
    rows, doomed = await _doomed(session, experiment, retention)
    reason = (
        f"retention: not among save_experiment_best={retention.save_experiment_best}, "
        f"save_trial_best={retention.save_trial_best} or "
        f"save_trial_latest={retention.save_trial_latest}"
    )
    marked = mark_deleting([c for c in rows if c.uuid in doomed], reason)
    if marked:
        log.info("experiment %d: %d checkpoints to delete (%s)", experiment.id, marked, reason)
    return marked


async def preview_retention(
    session: AsyncSession, experiment: ExperimentModel, retention: Retention
) -> list[CheckpointModel]:
    """What `retention` would delete now, were it the experiment's (nothing is changed):
    `det experiment set gc-policy` shows this before asking."""
    rows, doomed = await _doomed(session, experiment, retention)
    return [c for c in rows if c.uuid in doomed]


async def _doomed(
    session: AsyncSession, experiment: ExperimentModel, retention: Retention
) -> tuple[list[CheckpointModel], set[str]]:
    """The experiment's stored checkpoints, and those `retention` does not keep among the
    ones of ended trials."""
    rows = list(
        (
            await session.scalars(
                select(CheckpointModel).where(
                    CheckpointModel.experiment_id == experiment.id,
                    CheckpointModel.state == ACTIVE,
                )
            )
        ).all()
    )
    if not rows:
        return rows, set()
    trial_states = (
        await session.execute(
            select(TrialModel.id, TrialModel.state).where(TrialModel.experiment_id == experiment.id)
        )
    ).all()
    ended = {tid for tid, state in trial_states if TrialState(state).is_terminal}
    if not any(c.trial_id in ended for c in rows):
        return rows, set()
    facts = await _facts(session, experiment, rows)
    keep = await _warm_starts(session, [c.uuid for c in rows])
    # A model version's checkpoint is the user's choice to keep, whatever the settings say.
    keep |= set(await registered_checkpoints.holders(session, [c.uuid for c in rows]))
    return rows, set(to_delete(facts, retention, ended_trials=ended, keep=keep))


async def _facts(
    session: AsyncSession, experiment: ExperimentModel, rows: Sequence[CheckpointModel]
) -> list[CheckpointFacts]:
    searcher = experiment.config.get("searcher") or {}
    metric_name = searcher.get("metric")
    sign = 1.0 if searcher.get("smaller_is_better", True) else -1.0
    validations = (
        await session.execute(
            select(
                TrialMetricModel.id,
                TrialMetricModel.trial_id,
                TrialMetricModel.steps_completed,
                TrialMetricModel.metrics,
            ).where(
                TrialMetricModel.trial_id.in_({c.trial_id for c in rows}),
                TrialMetricModel.group_name == "validation",
            )
        )
    ).all()
    at_step: dict[tuple[int, int], tuple[float | None, int]] = {}
    for vid, trial_id, steps, metrics in validations:
        value = (metrics or {}).get(metric_name) if metric_name else None
        number = (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )
        if number is not None and not math.isfinite(number):
            number = None
        at_step[(trial_id, steps)] = (None if number is None else sign * number, vid)
    facts = []
    for c in rows:
        metric, order = at_step.get((c.trial_id, c.steps_completed), (None, 0))
        facts.append(CheckpointFacts(c.uuid, c.trial_id, c.steps_completed, metric, order))
    return facts


async def _warm_starts(session: AsyncSession, uuids: Collection[str]) -> set[str]:
    """Those of `uuids` another experiment starts from (searcher.source_checkpoint_uuid)."""
    source = ExperimentModel.config["searcher"]["source_checkpoint_uuid"].as_string()
    found = await session.scalars(
        select(source).where(
            source.in_(list(uuids)), ExperimentModel.state != ExperimentState.DELETING
        )
    )
    return {u for u in found if u}


async def delete_checkpoints(session: AsyncSession, uuids: Sequence[str], actor: str) -> int:
    """`det checkpoint delete`: every uuid must exist, and none may be what a trial that
    has not ended would resume from; then all are marked, or none."""
    if not uuids:
        raise InvalidArgument("checkpointUuids: give at least one checkpoint uuid")
    rows = {
        c.uuid: c
        for c in (
            await session.scalars(select(CheckpointModel).where(CheckpointModel.uuid.in_(uuids)))
        ).all()
    }
    missing = [u for u in uuids if u not in rows]
    if missing:
        raise NotFound(f"checkpointUuids: no checkpoint {', '.join(missing)}")
    held = await registered_checkpoints.holders(session, uuids)
    if held:
        raise Conflict(
            "checkpointUuids: "
            + "; ".join(
                f"{uuid} is {registered_checkpoints.describe_holders(held[uuid])}" for uuid in held
            )
            + "; delete those model versions first"
        )
    for uuid in uuids:
        checkpoint = rows[uuid]
        trial = await session.get(TrialModel, checkpoint.trial_id)
        if trial is None or TrialState(trial.state).is_terminal or checkpoint.state != ACTIVE:
            continue
        latest = await session.scalar(
            select(func.max(CheckpointModel.steps_completed)).where(
                CheckpointModel.trial_id == trial.id, CheckpointModel.state == ACTIVE
            )
        )
        if latest == checkpoint.steps_completed:
            raise InvalidArgument(
                f"checkpointUuids: {uuid} is the latest checkpoint of trial {trial.id}, which "
                f"is {trial.state} and would resume from it; kill the trial first"
            )
    return mark_deleting([rows[u] for u in uuids], f"deleted by {actor}")


async def delete_experiment(session: AsyncSession, experiment: ExperimentModel, actor: str) -> None:
    """`det experiment delete`: only an ended experiment; its checkpoints are deleted from
    the store, then its rows (trials, metrics, logs of its trials) go."""
    current = ExperimentState(experiment.state)
    if current == ExperimentState.DELETING:
        return
    if not current.is_terminal:
        raise InvalidArgument(
            f"experiment {experiment.id} is {current}; kill it or wait for it to end before "
            "deleting it"
        )
    rows = list(
        (
            await session.scalars(
                select(CheckpointModel).where(CheckpointModel.experiment_id == experiment.id)
            )
        ).all()
    )
    held = await registered_checkpoints.holders(session, [c.uuid for c in rows])
    if held:
        uuid = next(iter(held))
        raise Conflict(
            f"experiment {experiment.id}: its checkpoint {uuid} is "
            f"{registered_checkpoints.describe_holders(held[uuid])}"
            + (f" (and {len(held) - 1} more checkpoints are registered)" if len(held) > 1 else "")
            + "; delete those model versions before the experiment"
        )
    states.set_experiment_state(session, experiment, ExperimentState.DELETING, f"by {actor}")
    mark_deleting(rows, f"experiment {experiment.id} deleted by {actor}")


# --- the deleter ----------------------------------------------------------------------------


def _delete_files(storage: Mapping[str, Any], uuid: str) -> tuple[str | None, int]:
    """Delete one checkpoint's files; (error, files left). Runs in a worker thread."""
    try:
        store = from_config(storage)
    except (ValueError, StorageError) as exc:
        return one_line(exc), -1
    try:
        store.delete(uuid)
        return None, 0
    except StorageError as exc:
        try:
            left = len(store.list(uuid))
        except StorageError:
            left = -1
        return str(exc), left


class CheckpointDeleter(Loop):
    """Removes the files of checkpoints marked DELETING, a few at a time, and ends the
    deletion of experiments whose checkpoints are all gone."""

    name = "checkpoint-gc"

    def __init__(
        self,
        factory: async_sessionmaker[AsyncSession],
        interval: float = 1.0,
        after_pass: Callable[[AsyncSession], Awaitable[None]] | None = None,
        pending: Callable[[AsyncSession], Awaitable[bool]] | None = None,
    ) -> None:
        """`after_pass` runs in each working pass's transaction once experiments are
        removed (what waits on them: projects and workspaces being deleted); `pending`
        says whether it has work when no checkpoint or experiment has."""
        super().__init__(interval)
        self.factory = factory
        self.after_pass = after_pass
        self.pending = pending

    async def run_once(self) -> None:
        async with session_scope(self.factory) as session:
            due = (
                await session.execute(
                    select(
                        CheckpointModel.uuid,
                        CheckpointModel.delete_attempts,
                        CheckpointModel.resources,
                        ExperimentModel.config["checkpoint_storage"],
                        CheckpointModel.state_reason,
                    )
                    .join(ExperimentModel, ExperimentModel.id == CheckpointModel.experiment_id)
                    .where(
                        CheckpointModel.state.in_(BEING_DELETED),
                        CheckpointModel.delete_next_at <= utcnow(),
                    )
                    .order_by(CheckpointModel.delete_next_at)
                    .limit(DELETES_PER_PASS)
                )
            ).all()
            ending = await session.scalar(
                select(func.count()).where(ExperimentModel.state == ExperimentState.DELETING)
            )
            if due:
                kept = await _keep_registered(session, [row[0] for row in due])
                due = [row for row in due if row[0] not in kept]
            if not due and not ending and self.pending is not None:
                ending = await self.pending(session)
        if not due and not ending:
            return  # the usual idle second: one read, no second transaction
        outcomes = await asyncio.gather(
            *(
                asyncio.to_thread(_delete_files, storage or {}, uuid)
                for uuid, _, _, storage, _ in due
            )
        )
        async with session_scope(self.factory) as session:
            for (uuid, attempts, resources, _, reason), (error, left) in zip(
                due, outcomes, strict=True
            ):
                await _record_outcome(
                    session,
                    uuid,
                    attempts + 1,
                    len(resources or {}),
                    error,
                    left,
                    deletion_cause(reason or ""),
                )
            await _finish_deleted_experiments(session)
            if self.after_pass is not None:
                await self.after_pass(session)


async def _keep_registered(session: AsyncSession, uuids: Sequence[str]) -> set[str]:
    """Those of `uuids` a model version holds, back to COMPLETED before any file goes. Only
    a registration that raced the decision to delete (both committed) leaves one here."""
    held = await registered_checkpoints.holders(session, uuids)
    for uuid, versions in held.items():
        revived = await session.execute(
            update(CheckpointModel)
            .where(CheckpointModel.uuid == uuid, CheckpointModel.state == DELETING)
            .values(
                state=ACTIVE,
                state_reason=f"kept: {registered_checkpoints.describe_holders(versions)}",
                delete_next_at=None,
            )
        )
        if getattr(revived, "rowcount", 0):
            log.warning("checkpoint %s kept, not deleted: it is registered", uuid)
    return set(held)


# A failed attempt's reason keeps why the checkpoint is being deleted in front of it, so
# that a deleted checkpoint still says why it went (retention, a user, its experiment).
_ATTEMPT = " | attempt "


def deletion_cause(reason: str) -> str:
    return reason.split(_ATTEMPT, 1)[0]


async def _record_outcome(
    session: AsyncSession,
    uuid: str,
    attempt: int,
    files: int,
    error: str | None,
    left: int,
    cause: str,
) -> None:
    still = CheckpointModel.state.in_(BEING_DELETED)  # a concurrent change wins
    if error is None:
        await session.execute(
            update(CheckpointModel)
            .where(CheckpointModel.uuid == uuid, still)
            .values(state=DELETED, state_reason=cause, delete_attempts=attempt, delete_next_at=None)
        )
        log.info("checkpoint %s deleted (attempt %d)", uuid, attempt)
        return
    delay = retry_delay_s(attempt)
    partly = 0 <= left < files
    state = PARTIALLY_DELETED if partly else DELETING
    gone = f"; {files - left} of {files} files deleted" if partly else ""
    note = f"attempt {attempt} failed: {error}{gone}; retrying in {delay:g} s"
    reason = f"{cause}{_ATTEMPT}{note[len('attempt ') :]}" if cause else note
    await session.execute(
        update(CheckpointModel)
        .where(CheckpointModel.uuid == uuid, still)
        .values(
            state=state,
            state_reason=reason,
            delete_attempts=attempt,
            delete_next_at=utcnow() + timedelta(seconds=delay),
        )
    )
    if attempt == 1 or attempt % 10 == 0:
        log.warning("checkpoint %s: %s", uuid, reason)


async def _finish_deleted_experiments(session: AsyncSession) -> None:
    deleting = (
        await session.scalars(
            select(ExperimentModel.id).where(ExperimentModel.state == ExperimentState.DELETING)
        )
    ).all()
    for experiment_id in deleting:
        left = await session.scalar(
            select(func.count()).where(
                CheckpointModel.experiment_id == experiment_id, CheckpointModel.state != DELETED
            )
        )
        if left:
            continue
        await session.execute(delete(ExperimentModel).where(ExperimentModel.id == experiment_id))
        log.info("experiment %d deleted with its checkpoints", experiment_id)
