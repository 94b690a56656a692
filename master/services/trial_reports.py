"""What running trials report: metrics, checkpoints, progress; and the views built on them
(workloads, best validation, the checkpoint a new run resumes from)."""

from __future__ import annotations

import json
import logging
import math
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import thinning
from master.core.asha import ASHA_SEARCHERS
from master.db.models import (
    MAX_INT,
    AllocationModel,
    CheckpointModel,
    ExperimentModel,
    TrialMetricModel,
    TrialModel,
    TrialState,
    UserModel,
    utcnow,
)
from master.errors import Conflict, InvalidArgument, NotFound, PermissionDenied
from master.services import access, auth, logs, webhooks
from resolute.storage import checkpoint_location

log = logging.getLogger(__name__)

MAX_METRICS_PER_REPORT = 1000
MAX_GROUP_LENGTH = 64  # the column's size
# JSON has no NaN or infinity; Determined's harness sends them as these strings.
_NON_FINITE = {"NaN", "Infinity", "-Infinity"}
TRAINING = "training"
VALIDATION = "validation"


# -- checks shared by every report ---------------------------------------------------------


async def trial_for_report(
    session: AsyncSession, trial_id: int, user: UserModel, what: str = "report"
) -> TrialModel:
    """The trial, if this user may report for it: its experiment's owner (whose session
    the ranks' token is) or an admin; and if the reporting run has not ended, a check
    held until the report commits (auth.confirm_token_live)."""
    await auth.confirm_token_live(session, what)
    access.require_token_for_trial(session.info.get(access.TOKEN_TRIAL_ID), trial_id)
    trial = await session.get(TrialModel, trial_id)
    if trial is None:
        raise NotFound(f"trial {trial_id} not found")
    experiment = await session.get(ExperimentModel, trial.experiment_id)
    assert experiment is not None  # foreign key
    if not user.admin and experiment.owner_id != user.id:
        # Checked only here: the ranks' own reports (the hot path) are their owner's.
        if await access.hidden(session, access.Actor.of(user), "trial_id", str(trial_id)):
            raise NotFound(f"trial {trial_id} not found")
        raise PermissionDenied(
            f"trial {trial_id} belongs to another user's experiment; only its owner reports"
        )
    return trial


def _check_int(value: int, path: str) -> int:
    if not 0 <= value <= MAX_INT:
        raise InvalidArgument(f"{path}: {value} is not between 0 and {MAX_INT}")
    return value


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float, at any depth, as Determined's strings: JSON has
    no NaN, so Postgres refuses it and SQLite would read it back as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite_json(item) for item in value]
    return value


def clean_metric_values(values: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Metric values as stored: JSON values, with non-finite floats as Determined's strings."""
    if len(values) > MAX_METRICS_PER_REPORT:
        raise InvalidArgument(
            f"{path}: {len(values)} metrics in one report; at most {MAX_METRICS_PER_REPORT}"
        )
    cleaned: dict[str, Any] = {}
    for name, value in values.items():
        if not name or len(name) > 256:
            raise InvalidArgument(f"{path}: metric names must have 1 to 256 characters")
        cleaned[name] = finite_json(value)
    return cleaned


def numeric(value: Any) -> float | None:
    """A metric value as a number, when it is one (bools, strings and integers too large
    for a float are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


# -- metrics -------------------------------------------------------------------------------


async def report_metrics(
    session: AsyncSession,
    user: UserModel,
    trial_id: int,
    *,
    group: str,
    steps_completed: int | None,
    trial_run_id: int,
    values: Mapping[str, Any],
    report_time: datetime | None,
) -> TrialModel:
    """Store one report and return the trial. Any group name is accepted (the profiler's
    are gpu, cpu...; users' may hold spaces, '%' or '/'). A report without a step (the
    profiler's) is stored at the trial's latest training step, where a later one of the
    same group replaces it."""
    if not 0 < len(group) <= MAX_GROUP_LENGTH or any(c < " " or c == "\x7f" for c in group):
        raise InvalidArgument(
            f"group: {group!r} must be 1 to {MAX_GROUP_LENGTH} characters, none a control "
            "character (training and validation are the usual groups)"
        )
    if steps_completed is None and group in (TRAINING, VALIDATION):
        raise InvalidArgument(f"metrics.stepsCompleted: required for {group} metrics")
    trial = await trial_for_report(session, trial_id, user, "metrics")
    if steps_completed is None:
        steps_completed = trial.total_batches_processed
    if trial_run_id != trial.run_id:
        raise InvalidArgument(
            f"metrics.trialRunId: run {trial_run_id} is not trial {trial_id}'s current run "
            f"{trial.run_id}; a process of an earlier run is still reporting"
        )
    ordinal = await _next_ordinal(session, trial_id, group)
    row = {
        "trial_id": trial_id,
        "group_name": group,
        "steps_completed": steps_completed,
        "trial_run_id": trial_run_id,
        "metrics": clean_metric_values(values, "metrics.metrics.avgMetrics"),
        "report_time": report_time or utcnow(),
        "ordinal": ordinal,
        "thinning_level": thinning.thinning_level(ordinal),
    }
    # One statement, so two reports of the same step racing each other cannot fail on the
    # unique key: the later one wins, as a rerun's report replaces the earlier run's.
    dialect = session.get_bind().dialect.name
    insert = (
        postgresql.insert(TrialMetricModel)
        if dialect == "postgresql"
        else sqlite.insert(TrialMetricModel)
    )
    statement = insert.values(**row)
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=["trial_id", "group_name", "steps_completed"],
            set_={
                "trial_run_id": statement.excluded.trial_run_id,
                "metrics": statement.excluded.metrics,
                "report_time": statement.excluded.report_time,
            },
        )
    )
    if group == TRAINING and steps_completed > trial.total_batches_processed:
        trial.total_batches_processed = steps_completed
    return trial


async def _next_ordinal(session: AsyncSession, trial_id: int, group: str) -> int:
    """One past the ordinal of the group's report of the highest step: reports come in step
    order, and a run resumed from a checkpoint deletes the later ones first, so this counts
    the reports kept. Two reports racing may share an ordinal, which only makes the thinned
    chart a little uneven. A replaced step keeps its first ordinal (the upsert leaves it)."""
    latest = await session.scalar(
        select(TrialMetricModel.ordinal)
        .where(TrialMetricModel.trial_id == trial_id, TrialMetricModel.group_name == group)
        .order_by(TrialMetricModel.steps_completed.desc())
        .limit(1)
    )
    return 0 if latest is None else min(latest + 1, MAX_INT)


async def record_best_metric(
    session: AsyncSession, trial: TrialModel, values: Mapping[str, Any]
) -> None:
    """Keep the experiment's best searcher metric if this validation report beats it.
    Called after the searcher has seen the report: an ASHA search takes the scheduler's lock
    before the experiment's (the order a release takes them in), and this UPDATE locks the
    experiment's row, so it must not come first (on Postgres that order deadlocks).

    One conditional UPDATE, so two trials reporting at once cannot overwrite a better value
    with a worse one whichever commits first. NaN and infinities never count. A report that
    replaces an earlier one of the same step (a rerun) cannot make the best worse: the best
    seen is kept, as Determined keeps a trial's best validation."""
    experiment = await session.get(ExperimentModel, trial.experiment_id)
    assert experiment is not None  # foreign key
    metric, smaller_is_better = searcher_metric(experiment.config)
    value = numeric(values.get(metric)) if metric else None
    if value is None or not math.isfinite(value):
        return
    column = ExperimentModel.best_metric
    beaten = column > value if smaller_is_better else column < value
    await session.execute(
        update(ExperimentModel)
        .where(ExperimentModel.id == experiment.id, column.is_(None) | beaten)
        .values(best_metric=value)
        # The loaded row may then hold an older best; nothing reads it in this request.
        .execution_options(synchronize_session=False)
    )


async def metric_rows(
    session: AsyncSession, trial_id: int, groups: Sequence[str] = ()
) -> list[TrialMetricModel]:
    query = select(TrialMetricModel).where(TrialMetricModel.trial_id == trial_id)
    if groups:
        query = query.where(TrialMetricModel.group_name.in_(list(groups)))
    query = query.order_by(TrialMetricModel.steps_completed, TrialMetricModel.group_name)
    return list((await session.scalars(query)).all())


# -- progress and runner state -------------------------------------------------------------


async def report_progress(
    session: AsyncSession, user: UserModel, trial_id: int, progress: float
) -> None:
    if not math.isfinite(progress) or not 0.0 <= progress <= 1.0:
        raise InvalidArgument(f"progress: {progress} is not a fraction between 0 and 1")
    trial = await trial_for_report(session, trial_id, user, "progress")
    trial.progress = progress
    await session.flush()
    await refresh_experiment_progress(session, trial.experiment_id)


async def refresh_experiment_progress(session: AsyncSession, experiment_id: int) -> None:
    """The experiment's progress: the mean of its trials', a completed trial counting 1."""
    rows = (
        await session.execute(
            select(TrialModel.state, TrialModel.progress).where(
                TrialModel.experiment_id == experiment_id
            )
        )
    ).all()
    experiment = await session.get(ExperimentModel, experiment_id)
    if experiment is None or not rows or experiment.searcher_type in ASHA_SEARCHERS:
        return  # an ASHA search's progress is the searcher's (services.search)
    done = [1.0 if s == TrialState.COMPLETED else (p or 0.0) for s, p in rows]
    experiment.progress = sum(done) / len(done)


async def report_runner_state(
    session: AsyncSession, user: UserModel, trial_id: int, state: str
) -> None:
    if len(state) > 256:
        raise InvalidArgument("state: at most 256 characters")
    trial = await trial_for_report(session, trial_id, user, "runner state")
    trial.runner_state = state


# -- early exit and alerts -----------------------------------------------------------------

# Determined's TrialEarlyExit reasons, and the end reason each gives the trial.
EARLY_EXIT_REASONS = {
    "EXITED_REASON_INVALID_HP": "the trial reported invalid hyperparameters (det.InvalidHP)",
    "EXITED_REASON_INIT_INVALID_HP": (
        "the trial reported invalid hyperparameters as it started (det.InvalidHP)"
    ),
    "EXITED_REASON_USER_REQUESTED_STOP": "the trial's code asked to stop early",
    "EXITED_REASON_UNSPECIFIED": "the trial exited early without saying why",
}
_EARLY_EXIT_SENTENCES = tuple(EARLY_EXIT_REASONS.values())


async def report_early_exit(
    session: AsyncSession, user: UserModel, trial_id: int, reason: str
) -> None:
    """The trial's code says its run ends early (the harness, on det.InvalidHP): kept as the
    trial's end reason; the ranks then exit 0 (see early_exit_reason).

    The first reason of a run is kept. Every rank reports it, and the 0.38.1 client raises
    on any error status (its "400 means already reported" branch is never reached), so the
    same reason again is answered 200 as Determined does; only another reason is a 400.
    """
    sentence = EARLY_EXIT_REASONS.get(reason)
    if sentence is None:
        raise InvalidArgument(f"reason: {reason!r} is not one of {', '.join(EARLY_EXIT_REASONS)}")
    trial = await trial_for_report(session, trial_id, user, "early exit")
    # One statement, so that of the ranks reporting together exactly one records it.
    recorded = await session.scalar(
        update(TrialModel)
        .where(TrialModel.id == trial.id, TrialModel.end_reason.not_in(_EARLY_EXIT_SENTENCES))
        .values(end_reason=sentence)
        .returning(TrialModel.id)
    )
    if recorded is not None:
        return
    kept = await session.scalar(select(TrialModel.end_reason).where(TrialModel.id == trial.id))
    if kept != sentence:
        raise InvalidArgument(
            f"reason: an early exit was already reported for trial {trial_id}'s run: {kept}"
        )


async def early_exit_reason(session: AsyncSession, trial: TrialModel) -> str | None:
    """Why the trial's current run ended itself early, when its code reported it with
    POST /api/v1/trials/{id}/early_exit; else None.

    For the agent hub, once every rank of the trial's allocation has exited 0: a reason
    means the trial ends COMPLETED with that reason (its end_reason already holds it), not
    a failure and never restarted, even if the ranks also acknowledged a preemption (as in
    Determined, where an InvalidHP trial is done and the searcher drops it). None means the
    usual rules apply. A non-zero exit is a failure whatever this says. The reason belongs
    to one run: start_run_from clears it when the next run starts.
    """
    # As committed: the report came in another transaction, maybe after `trial` was loaded.
    await session.refresh(trial, ["end_reason"])
    return trial.end_reason if trial.end_reason in _EARLY_EXIT_SENTENCES else None


# Determined's log levels, as the word a trial log line starts with.
ALERT_LEVELS = {
    "LOG_LEVEL_UNSPECIFIED": "INFO",
    "LOG_LEVEL_TRACE": "TRACE",
    "LOG_LEVEL_DEBUG": "DEBUG",
    "LOG_LEVEL_INFO": "INFO",
    "LOG_LEVEL_WARNING": "WARNING",
    "LOG_LEVEL_ERROR": "ERROR",
    "LOG_LEVEL_CRITICAL": "CRITICAL",
}


@dataclass
class AlertReport:
    experiment_id: int
    trial_id: int | None
    title: str
    description: str
    level: str


async def report_alert(session: AsyncSession, user: UserModel, alert: AlertReport) -> None:
    """Context.alert(): a line of the trial's logs, at its level, and an event for the
    experiment's CUSTOM webhooks (those its config names, as Determined's)."""
    word = ALERT_LEVELS.get(alert.level)
    if word is None:
        raise InvalidArgument(
            f"data.level: {alert.level!r} is not one of {', '.join(ALERT_LEVELS)}"
        )
    if alert.trial_id is None:
        raise InvalidArgument("trialId: required; an alert is kept in its trial's logs")
    trial = await trial_for_report(session, alert.trial_id, user, "alert")
    if trial.experiment_id != alert.experiment_id:
        raise InvalidArgument(
            f"experimentId: {alert.experiment_id} is not the experiment of trial {trial.id}"
        )
    text = ": ".join(part for part in ("alert", alert.title, alert.description) if part)
    webhooks.record_custom(
        session, trial.experiment_id, trial.id, alert.title, alert.description, word
    )
    allocation_id = await session.scalar(
        select(AllocationModel.id)
        .where(AllocationModel.trial_id == trial.id)
        .order_by(AllocationModel.registered_at.desc(), AllocationModel.id.desc())
        .limit(1)
    )
    line = logs.LogLine(
        allocation_id=allocation_id or "",
        rank=None,
        stdtype="stdout",
        timestamp=utcnow(),
        message=f"{word}: {text}\n",
    )
    if not await logs.append_logs(session, "", [line]):
        log.info("trial %d alert (%s): %s", trial.id, alert.level, text)


# -- checkpoints ---------------------------------------------------------------------------


@dataclass
class CheckpointReport:
    uuid: str
    state: str
    metadata: dict[str, Any]
    resources: dict[str, Any]
    allocation_id: str
    task_id: str
    trial_id: int | None
    report_time: datetime | None


async def report_checkpoint(
    session: AsyncSession, user: UserModel, report: CheckpointReport
) -> CheckpointModel:
    canonical = _stored_uuid(report.uuid)
    if canonical is None:
        raise InvalidArgument(f"uuid: {report.uuid!r} is not a UUID")
    if report.state not in ("STATE_COMPLETED", "COMPLETED"):
        raise InvalidArgument(
            f"state: {report.state!r}; only STATE_COMPLETED checkpoints can be reported"
        )
    steps = report.metadata.get("steps_completed")
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise InvalidArgument("metadata.steps_completed: required, an integer")
    _check_int(steps, "metadata.steps_completed")
    for path, size in report.resources.items():
        if not isinstance(size, str | int) or not (str(size).isascii() and str(size).isdigit()):
            raise InvalidArgument(f"resources.{path}: must be a size in bytes, got {size!r}")
    trial_id = report.trial_id
    if report.allocation_id:
        allocation = await session.get(AllocationModel, report.allocation_id)
        if allocation is None:
            raise NotFound(f"allocationId: allocation {report.allocation_id} not found")
        if trial_id is not None and trial_id != allocation.trial_id:
            raise InvalidArgument(
                f"training.trialId: {trial_id} is not the trial of allocation "
                f"{report.allocation_id}"
            )
        trial_id = allocation.trial_id
    if trial_id is None:
        raise InvalidArgument("allocationId: required (or training.trialId)")
    trial = await trial_for_report(session, trial_id, user, "checkpoint")
    existing = await session.get(CheckpointModel, canonical)
    if existing is not None:
        if existing.trial_id != trial.id or existing.steps_completed != steps:
            raise Conflict(f"checkpoint {canonical} was already reported by another trial/step")
        return existing  # the harness retries; the same report again changes nothing
    experiment = await session.get(ExperimentModel, trial.experiment_id)
    assert experiment is not None
    try:
        location = checkpoint_location(experiment.config.get("checkpoint_storage") or {}, canonical)
    except ValueError:  # refused at submit; an old row may still hold something else
        location = ""
    checkpoint = CheckpointModel(
        uuid=canonical,
        trial_id=trial.id,
        experiment_id=trial.experiment_id,
        task_id=report.task_id or "",
        allocation_id=report.allocation_id or "",
        trial_run_id=trial.run_id,
        steps_completed=steps,
        state="COMPLETED",
        resources={k: str(v) for k, v in report.resources.items()},
        metadata_=finite_json(report.metadata),
        storage_path=location,
        report_time=report.report_time or utcnow(),
    )
    session.add(checkpoint)
    await session.flush()
    return checkpoint


def _stored_uuid(uuid: str) -> str | None:
    """The canonical (lowercase) form checkpoints are stored under; None if not a UUID."""
    try:
        return str(uuidlib.UUID(uuid))
    except ValueError:
        return None


async def _checkpoint_by_uuid(session: AsyncSession, uuid: str) -> CheckpointModel | None:
    canonical = _stored_uuid(uuid)
    return await session.get(CheckpointModel, canonical) if canonical else None


async def get_checkpoint(session: AsyncSession, uuid: str) -> CheckpointModel:
    checkpoint = await _checkpoint_by_uuid(session, uuid)
    if checkpoint is None:
        raise NotFound(f"checkpoint {uuid} not found")
    return checkpoint


async def list_checkpoints(
    session: AsyncSession, *, trial_id: int | None = None, experiment_id: int | None = None
) -> list[CheckpointModel]:
    query = select(CheckpointModel)
    if trial_id is not None:
        query = query.where(CheckpointModel.trial_id == trial_id)
    if experiment_id is not None:
        query = query.where(CheckpointModel.experiment_id == experiment_id)
    query = query.order_by(
        CheckpointModel.trial_id, CheckpointModel.steps_completed, CheckpointModel.report_time
    )
    return list((await session.scalars(query)).all())


async def latest_checkpoint(session: AsyncSession, trial_id: int) -> CheckpointModel | None:
    return await session.scalar(
        select(CheckpointModel)
        .where(CheckpointModel.trial_id == trial_id, CheckpointModel.state == "COMPLETED")
        .order_by(CheckpointModel.steps_completed.desc(), CheckpointModel.report_time.desc())
        .limit(1)
    )


async def resume_point(
    session: AsyncSession, trial: TrialModel, experiment: ExperimentModel
) -> CheckpointModel | None:
    """The checkpoint a new run of the trial starts from: its own latest, else the
    searcher's source_checkpoint_uuid (a warm start), else none."""
    own = await latest_checkpoint(session, trial.id)
    if own is not None:
        return own
    source = (experiment.config.get("searcher") or {}).get("source_checkpoint_uuid")
    return await _checkpoint_by_uuid(session, str(source)) if source else None


async def start_run_from(
    session: AsyncSession, trial: TrialModel, checkpoint: CheckpointModel | None
) -> int:
    """A new run continues the timeline of its checkpoint: what an earlier run reported
    after it belongs to a timeline that was lost, and the steps count restarts there."""
    steps = checkpoint.steps_completed if checkpoint is not None else 0
    own = checkpoint is not None and checkpoint.trial_id == trial.id
    if trial.end_reason in _EARLY_EXIT_SENTENCES:
        trial.end_reason = ""  # an early exit belongs to the run that reported it
    await session.execute(
        delete(TrialMetricModel).where(
            TrialMetricModel.trial_id == trial.id,
            TrialMetricModel.steps_completed > (steps if own else -1),
        )
    )
    trial.total_batches_processed = steps
    return steps


async def check_source_checkpoint(
    session: AsyncSession,
    searcher: Mapping[str, Any],
    hidden: Callable[[str], Awaitable[bool]],
) -> None:
    """The checkpoint a search starts from exists and (`hidden` False) its submitter may
    read it."""
    source = searcher.get("source_checkpoint_uuid")
    if source and (
        await _checkpoint_by_uuid(session, str(source)) is None or await hidden(str(source))
    ):
        raise InvalidArgument(f"searcher.source_checkpoint_uuid: checkpoint {source} not found")
    trial_id = searcher.get("source_trial_id")
    if trial_id is not None:
        raise InvalidArgument(
            "searcher.source_trial_id: not supported; name the checkpoint with "
            "searcher.source_checkpoint_uuid"
        )


# -- summaries: workloads, best and latest -------------------------------------------------


def searcher_metric(config: Mapping[str, Any]) -> tuple[str | None, bool]:
    searcher = config.get("searcher") or {}
    return searcher.get("metric"), bool(searcher.get("smaller_is_better", True))


def metrics_workload(row: TrialMetricModel) -> dict[str, Any]:
    return {
        "metrics": {"avgMetrics": row.metrics, "batchMetrics": []},
        "numInputs": 0,
        "totalBatches": row.steps_completed,
        "endTime": row.report_time,
    }


def checkpoint_workload(checkpoint: CheckpointModel) -> dict[str, Any]:
    return {
        "uuid": checkpoint.uuid,
        "state": f"STATE_{checkpoint.state}",
        "totalBatches": checkpoint.steps_completed,
        "endTime": checkpoint.report_time,
        "resources": checkpoint.resources,
        "metadata": checkpoint.metadata_,
    }


async def workloads(session: AsyncSession, trial_id: int) -> list[dict[str, Any]]:
    """Determined's workloads: training, validation and checkpoint entries by step."""
    order = {TRAINING: 0, VALIDATION: 1}
    entries: list[tuple[int, int, dict[str, Any]]] = [
        (row.steps_completed, order[row.group_name], {row.group_name: metrics_workload(row)})
        for row in await metric_rows(session, trial_id, (TRAINING, VALIDATION))
    ]
    entries += [
        (c.steps_completed, 2, {"checkpoint": checkpoint_workload(c)})
        for c in await list_checkpoints(session, trial_id=trial_id)
    ]
    entries.sort(key=lambda e: (e[0], e[1]))
    return [entry for _, _, entry in entries]


@dataclass
class TrialSummary:
    latest_training: TrialMetricModel | None = None
    latest_validation: TrialMetricModel | None = None
    best_validation: TrialMetricModel | None = None
    latest_checkpoint: str | None = None


def best_of(
    rows: Sequence[TrialMetricModel], metric: str | None, smaller_is_better: bool
) -> TrialMetricModel | None:
    scored = [(numeric(r.metrics.get(metric)), r) for r in rows] if metric else []
    valid = [(value, r) for value, r in scored if value is not None and math.isfinite(value)]
    if not valid:
        return None
    pick = min if smaller_is_better else max
    return pick(valid, key=lambda pair: pair[0])[1]


async def trial_summaries(
    session: AsyncSession, trials: Sequence[TrialModel], config: Mapping[str, Any]
) -> dict[int, TrialSummary]:
    """Latest training and validation, best validation and latest checkpoint per trial,
    in three queries whatever the number of trials."""
    ids = [t.id for t in trials]
    summaries = {trial_id: TrialSummary() for trial_id in ids}
    if not ids:
        return summaries
    latest = (
        select(
            TrialMetricModel.trial_id,
            TrialMetricModel.group_name,
            func.max(TrialMetricModel.steps_completed).label("steps"),
        )
        .where(
            TrialMetricModel.trial_id.in_(ids),
            TrialMetricModel.group_name == TRAINING,
        )
        .group_by(TrialMetricModel.trial_id, TrialMetricModel.group_name)
        .subquery()
    )
    training = await session.scalars(
        select(TrialMetricModel).join(
            latest,
            (TrialMetricModel.trial_id == latest.c.trial_id)
            & (TrialMetricModel.group_name == latest.c.group_name)
            & (TrialMetricModel.steps_completed == latest.c.steps),
        )
    )
    for row in training:
        summaries[row.trial_id].latest_training = row
    validation: dict[int, list[TrialMetricModel]] = {}
    rows = await session.scalars(
        select(TrialMetricModel)
        .where(TrialMetricModel.trial_id.in_(ids), TrialMetricModel.group_name == VALIDATION)
        .order_by(TrialMetricModel.steps_completed)
    )
    for row in rows:
        validation.setdefault(row.trial_id, []).append(row)
    metric, smaller = searcher_metric(config)
    for trial_id, trial_rows in validation.items():
        summaries[trial_id].latest_validation = trial_rows[-1]
        summaries[trial_id].best_validation = best_of(trial_rows, metric, smaller)
    newest = (
        select(CheckpointModel.trial_id, func.max(CheckpointModel.steps_completed).label("steps"))
        .where(CheckpointModel.trial_id.in_(ids))
        .group_by(CheckpointModel.trial_id)
        .subquery()
    )
    checkpoints = await session.execute(
        select(CheckpointModel.trial_id, CheckpointModel.uuid)
        .join(
            newest,
            (CheckpointModel.trial_id == newest.c.trial_id)
            & (CheckpointModel.steps_completed == newest.c.steps),
        )
        .order_by(CheckpointModel.report_time)
    )
    for trial_id, uuid in checkpoints.all():
        summaries[trial_id].latest_checkpoint = uuid
    return summaries


async def best_validation_metric(
    session: AsyncSession, experiment: ExperimentModel
) -> float | None:
    """The searcher metric's best validation value over the experiment's trials."""
    metric, smaller = searcher_metric(experiment.config)
    if not metric:
        return None
    rows = (
        await session.scalars(
            select(TrialMetricModel)
            .join(TrialModel, TrialModel.id == TrialMetricModel.trial_id)
            .where(
                TrialModel.experiment_id == experiment.id,
                TrialMetricModel.group_name == VALIDATION,
            )
        )
    ).all()
    best = best_of(rows, metric, smaller)
    return numeric(best.metrics.get(metric)) if best is not None else None


async def checkpoint_metrics(
    session: AsyncSession, checkpoints: Sequence[CheckpointModel]
) -> dict[tuple[int, int], dict[str, dict[str, Any]]]:
    """The training and validation metrics reported at each checkpoint's step."""
    if not checkpoints:
        return {}
    trial_ids = {c.trial_id for c in checkpoints}
    steps = {c.steps_completed for c in checkpoints}
    rows = await session.scalars(
        select(TrialMetricModel).where(
            TrialMetricModel.trial_id.in_(trial_ids),
            TrialMetricModel.steps_completed.in_(steps),
            TrialMetricModel.group_name.in_((TRAINING, VALIDATION)),
        )
    )
    found: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        found.setdefault((row.trial_id, row.steps_completed), {})[row.group_name] = row.metrics
    return found


MAX_RUN_METADATA_BYTES = 1 << 20


async def set_run_metadata(
    session: AsyncSession, user: UserModel, trial_id: int, metadata: dict[str, Any]
) -> dict[str, Any]:
    """Merge what trial code sets (TrainContext.set_metadata) into the trial's metadata:
    mappings merge key by key, any other value replaces; returns the whole result, as
    Determined's PostRunMetadata does."""
    trial = await trial_for_report(session, trial_id, user, "run metadata")
    merged = _merge_metadata(dict(trial.run_metadata or {}), metadata)
    if len(json.dumps(merged)) > MAX_RUN_METADATA_BYTES:
        raise InvalidArgument(
            f"metadata: the run's metadata would exceed {MAX_RUN_METADATA_BYTES} bytes"
        )
    trial.run_metadata = merged
    return merged


async def run_metadata(session: AsyncSession, trial_id: int) -> dict[str, Any]:
    trial = await session.get(TrialModel, trial_id)
    if trial is None:
        raise NotFound(f"run {trial_id} not found")
    return dict(trial.run_metadata or {})


def _merge_metadata(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _merge_metadata(dict(base[key]), value)
        else:
            base[key] = value
    return base


async def validations_at(
    session: AsyncSession, points: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], dict[str, Any]]:
    """The validation metrics reported at each (trial id, steps completed) that has one."""
    wanted = set(points)
    if not wanted:
        return {}
    rows = await session.execute(
        select(
            TrialMetricModel.trial_id, TrialMetricModel.steps_completed, TrialMetricModel.metrics
        )
        .where(
            TrialMetricModel.trial_id.in_({trial_id for trial_id, _ in wanted}),
            TrialMetricModel.group_name == "validation",
        )
        .order_by(TrialMetricModel.id)
    )
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for trial_id, steps, metrics in rows:
        if (trial_id, steps) in wanted:
            found[(trial_id, steps)] = dict(metrics or {})
    return found
