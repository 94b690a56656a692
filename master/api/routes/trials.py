"""What trial code reports and reads back: metrics, checkpoints, progress, preemption.

Shapes follow Determined's Core API (det-wire-contract.md §5), so its harness works too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import MAX_INT, CurrentUser, ObjectId, PreemptionDep, SessionDep
from master.db.models import AllocationState, CheckpointModel, ExperimentModel, TrialModel
from master.errors import InvalidArgument, NotFound
from master.schemas.common import Pagination
from master.schemas.experiments import (
    AcceleratorDataReport,
    Alert,
    BestMetric,
    Checkpoint,
    CheckpointIn,
    CheckpointList,
    CheckpointResponse,
    DeleteCheckpoints,
    EarlyExit,
    Empty,
    MetricRow,
    MetricRows,
    MetricsReport,
    PreemptionSignal,
    ProgressReport,
    RunMetadata,
    RunMetadataIn,
    RunnerMetadata,
    RunStart,
    WorkloadList,
)
from master.services import (
    access,
    allocations,
    checkpoint_download,
    checkpoint_gc,
    experiments,
    search,
    trial_reports,
)
from master.services.access import Actor
from resolute.storage import without_secrets

router = APIRouter(prefix="/api/v1", tags=["Trials"])
_Row = TypeVar("_Row", TrialModel, ExperimentModel)

# The harness asks with 60 s and gives up after 70 s; longer holds would outlive it.
MAX_PREEMPTION_WAIT_S = 60


@router.post("/trials/{trial_id}/metrics")
async def report_metrics(
    trial_id: ObjectId,
    body: MetricsReport,
    session: SessionDep,
    user: CurrentUser,
    signals: PreemptionDep,
) -> Empty:
    if body.metrics.trial_id != trial_id:
        raise InvalidArgument(
            f"metrics.trialId: {body.metrics.trial_id} does not match trial {trial_id} of the path"
        )
    trial = await trial_reports.report_metrics(
        session,
        user,
        trial_id,
        group=body.group,
        steps_completed=body.metrics.steps_completed,
        trial_run_id=body.metrics.trial_run_id,
        values=body.metrics.metrics.avg_metrics,
        report_time=body.metrics.report_time,
    )
    if body.group == trial_reports.VALIDATION and body.metrics.steps_completed is not None:
        stopped = await search.on_validation(
            session, trial, body.metrics.metrics.avg_metrics, body.metrics.steps_completed
        )
        await trial_reports.record_best_metric(session, trial, body.metrics.metrics.avg_metrics)
        if stopped:
            # Told now, not at the hub's next tick: every batch after the decision is waste.
            await session.commit()
            for allocation_id in stopped:
                signals.raise_signal(allocation_id)
    return Empty()


@router.get("/trials/{trial_id}/metrics")
async def read_metrics(
    trial_id: ObjectId,
    session: SessionDep,
    _user: CurrentUser,
    group: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
) -> MetricRows:
    """A trial's reported metrics by step (resolute addition): one row per group and step."""
    await experiments.get_trial(session, trial_id)
    rows = await trial_reports.metric_rows(session, trial_id, group)
    return MetricRows(
        metrics=[
            MetricRow(
                group=r.group_name,
                steps_completed=r.steps_completed,
                trial_run_id=r.trial_run_id,
                report_time=r.report_time,
                metrics=r.metrics,
            )
            for r in rows
        ]
    )


@router.get("/trials/{trial_id}/workloads")
async def list_workloads(
    trial_id: ObjectId,
    session: SessionDep,
    _user: CurrentUser,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every workload"),
) -> WorkloadList:
    await experiments.get_trial(session, trial_id)
    everything = await trial_reports.workloads(session, trial_id)
    page = everything[offset : offset + limit] if limit else everything[offset:]
    return WorkloadList(
        workloads=page, pagination=Pagination.of(offset, limit, len(page), len(everything))
    )


@router.post("/trials/{trial_id}/progress")
async def report_progress(
    trial_id: ObjectId, body: ProgressReport, session: SessionDep, user: CurrentUser
) -> Empty:
    await trial_reports.report_progress(session, user, trial_id, body.progress)
    return Empty()


@router.post("/trials/{trial_id}/runner/metadata")
async def report_runner_state(
    trial_id: ObjectId, session: SessionDep, user: CurrentUser, body: RunnerMetadata | None = None
) -> Empty:
    state = body.state if body is not None else ""
    await trial_reports.report_runner_state(session, user, trial_id, state)
    return Empty()


@router.post("/trials/{trial_id}/early_exit")
async def report_early_exit(
    trial_id: ObjectId, body: EarlyExit, session: SessionDep, user: CurrentUser
) -> Empty:
    """The harness on det.InvalidHP, from every rank: the same reason again is a 200."""
    await trial_reports.report_early_exit(session, user, trial_id, body.reason)
    return Empty()


@router.post("/webhooks/custom")
async def report_alert(body: Alert, session: SessionDep, user: CurrentUser) -> Empty:
    """Context.alert(): a line of the trial's logs."""
    await trial_reports.report_alert(
        session,
        user,
        trial_reports.AlertReport(
            experiment_id=body.experiment_id,
            trial_id=body.trial_id,
            title=body.data.title or "",
            description=body.data.description or "",
            level=body.data.level or "LOG_LEVEL_UNSPECIFIED",
        ),
    )
    return Empty()


@router.post("/runs/{run_id}/metadata")
async def set_run_metadata(
    run_id: ObjectId, body: RunMetadataIn, session: SessionDep, user: CurrentUser
) -> RunMetadata:
    """TrainContext.set_metadata (a run is a trial here): merged into what is there."""
    if body.run_id is not None and body.run_id != run_id:
        raise InvalidArgument(f"runId: {body.run_id} does not match run {run_id} of the path")
    merged = await trial_reports.set_run_metadata(session, user, run_id, body.metadata)
    return RunMetadata(metadata=merged)


@router.get("/runs/{run_id}/metadata")
async def get_run_metadata(
    run_id: ObjectId, session: SessionDep, _user: CurrentUser
) -> RunMetadata:
    return RunMetadata(metadata=await trial_reports.run_metadata(session, run_id))


@router.post("/runs/start")
async def start_run(body: RunStart, session: SessionDep, user: CurrentUser) -> Empty:
    """The harness announces itself here; resolute needs nothing from it but a known trial."""
    if body.run_id is None:
        raise InvalidArgument("runId: required")
    await trial_reports.trial_for_report(session, body.run_id, user, "run start")
    return Empty()


# -- checkpoints ---------------------------------------------------------------------------


async def checkpoint_views(session: AsyncSession, rows: list[CheckpointModel]) -> list[Checkpoint]:
    """Checkpoints as Determined's v1Checkpoint (also inside a model version's reply)."""
    metrics = await trial_reports.checkpoint_metrics(session, rows)
    # Three queries for any number of checkpoints: their trials, experiments and metrics.
    trials = await _by_id(session, TrialModel, {row.trial_id for row in rows})
    experiment_rows = await _by_id(session, ExperimentModel, {row.experiment_id for row in rows})
    metric_names = {
        eid: trial_reports.searcher_metric(e.config)[0] for eid, e in experiment_rows.items()
    }
    views = []
    for row in rows:
        experiment = experiment_rows[row.experiment_id]
        metric = metric_names[row.experiment_id]
        at_step = metrics.get((row.trial_id, row.steps_completed), {})
        validation = at_step.get(trial_reports.VALIDATION, {})
        views.append(
            Checkpoint(
                uuid=row.uuid,
                task_id=row.task_id,
                allocation_id=row.allocation_id,
                report_time=row.report_time,
                state=checkpoint_gc.WIRE_STATE.get(row.state, f"STATE_{row.state}"),
                storage_state=checkpoint_gc.SHOWN.get(row.state, row.state),
                state_reason=row.state_reason,
                resources=row.resources,
                metadata=row.metadata_,
                training={
                    "trialId": row.trial_id,
                    "experimentId": row.experiment_id,
                    # The official client reads searcher.metric from here, and downloads
                    # with this storage: without its secrets, Determined's SDK uses the
                    # user's own credentials or falls back to the master's download.
                    "experimentConfig": without_secrets(experiment.config),
                    "hparams": trials[row.trial_id].hparams,
                    "trainingMetrics": {"avgMetrics": at_step.get(trial_reports.TRAINING, {})},
                    "validationMetrics": {"avgMetrics": validation},
                    "searcherMetric": trial_reports.numeric(validation.get(metric))
                    if metric
                    else None,
                },
                trial_id=row.trial_id,
                experiment_id=row.experiment_id,
                steps_completed=row.steps_completed,
                storage_path=row.storage_path,
            )
        )
    return views


async def _by_id(session: SessionDep, model: type[_Row], ids: set[int]) -> dict[int, _Row]:
    if not ids:
        return {}
    return {row.id: row for row in await session.scalars(select(model).where(model.id.in_(ids)))}


CHECKPOINT_SORTS = (
    "SORT_BY_UNSPECIFIED",
    "SORT_BY_UUID",
    "SORT_BY_TRIAL_ID",
    "SORT_BY_BATCH_NUMBER",
    "SORT_BY_END_TIME",
    "SORT_BY_STATE",
    "SORT_BY_SEARCHER_METRIC",
)


def _sort_checkpoints(
    views: list[Checkpoint],
    sort_by: str,
    order_by: str,
    smaller_is_better: bool,
    sort_by_metric: str = "",
) -> list[Checkpoint]:
    if sort_by not in CHECKPOINT_SORTS:
        raise InvalidArgument(
            f"sortByAttr: {sort_by!r} is not one of {', '.join(CHECKPOINT_SORTS)}"
        )
    if order_by not in ("ORDER_BY_UNSPECIFIED", "ORDER_BY_ASC", "ORDER_BY_DESC"):
        raise InvalidArgument(
            f"orderBy: {order_by!r} is not one of ORDER_BY_UNSPECIFIED, ORDER_BY_ASC, ORDER_BY_DESC"
        )
    descending = order_by == "ORDER_BY_DESC"
    if sort_by_metric:
        # A validation metric by name (the SDK's top_checkpoint(sort_by="accuracy")); those
        # without it, or with a value that is not a number, go last.
        def value(view: Checkpoint) -> float | None:
            metrics = view.training.get("validationMetrics", {}).get("avgMetrics", {})
            return trial_reports.numeric(metrics.get(sort_by_metric))

        scored = [v for v in views if value(v) is not None]
        scored.sort(key=lambda v: float(value(v) or 0.0), reverse=descending)
        return scored + [v for v in views if value(v) is None]
    if sort_by == "SORT_BY_SEARCHER_METRIC":
        # Best first unless an order is asked for; checkpoints without the metric go last.
        if order_by == "ORDER_BY_UNSPECIFIED":
            descending = not smaller_is_better
        scored = [v for v in views if v.training.get("searcherMetric") is not None]
        unscored = [v for v in views if v.training.get("searcherMetric") is None]
        scored.sort(key=lambda v: float(v.training["searcherMetric"]), reverse=descending)
        return scored + unscored
    keys: dict[str, Any] = {
        "SORT_BY_UUID": lambda v: v.uuid,
        "SORT_BY_TRIAL_ID": lambda v: (v.trial_id, v.steps_completed),
        "SORT_BY_END_TIME": lambda v: v.report_time,
        "SORT_BY_STATE": lambda v: v.state,
    }
    key = keys.get(sort_by, lambda v: (v.trial_id, v.steps_completed))
    return sorted(views, key=key, reverse=descending)


async def _checkpoint_list(
    session: SessionDep,
    rows: list[CheckpointModel],
    *,
    offset: int = 0,
    limit: int = 0,
    sort_by: str = "SORT_BY_UNSPECIFIED",
    order_by: str = "ORDER_BY_UNSPECIFIED",
    smaller_is_better: bool = True,
    sort_by_metric: str = "",
    states: tuple[str, ...] = (),
) -> CheckpointList:
    views = await checkpoint_views(session, rows)
    if states:
        views = [v for v in views if v.state in states]
    views = _sort_checkpoints(views, sort_by, order_by, smaller_is_better, sort_by_metric)
    page = views[offset : offset + limit] if limit else views[offset:]
    return CheckpointList(
        checkpoints=page, pagination=Pagination.of(offset, limit, len(page), len(views))
    )


@router.post("/checkpoints")
async def report_checkpoint(body: CheckpointIn, session: SessionDep, user: CurrentUser) -> Empty:
    await trial_reports.report_checkpoint(
        session,
        user,
        trial_reports.CheckpointReport(
            uuid=body.uuid,
            state=body.state,
            metadata=body.metadata,
            resources=body.resources,
            allocation_id=body.allocation_id or "",
            task_id=body.task_id or "",
            trial_id=body.training.trial_id if body.training else None,
            report_time=body.report_time,
        ),
    )
    return Empty()


@router.get("/checkpoints/{uuid}", response_model=CheckpointResponse)
async def get_checkpoint(
    uuid: str, request: Request, session: SessionDep, user: CurrentUser
) -> Response | CheckpointResponse:
    """The checkpoint; with `Accept: application/gzip`, its files as a tar.gz streamed
    from the store (Determined's download through the master)."""
    if "application/gzip" in request.headers.get("accept", ""):
        return await download_checkpoint(uuid, session, user)
    row = await trial_reports.get_checkpoint(session, uuid)
    return CheckpointResponse(checkpoint=(await checkpoint_views(session, [row]))[0])


# Determined's SDK downloads through the master at /checkpoints/{uuid}, outside /api/v1.
download_router = APIRouter(tags=["Checkpoints"])


@download_router.get("/checkpoints/{uuid}", response_class=StreamingResponse)
async def download_checkpoint(uuid: str, session: SessionDep, _user: CurrentUser) -> Response:
    """The checkpoint's files as a tar.gz, streamed from its store a file at a time."""
    filename, stream = await checkpoint_download.checkpoint_archive(session, uuid)
    return StreamingResponse(
        stream,
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@router.delete("/checkpoints")
async def delete_checkpoints(
    body: DeleteCheckpoints, session: SessionDep, user: CurrentUser
) -> Empty:
    """Determined's DeleteCheckpoints: every uuid is marked DELETING (or none is); the
    files go in the background, retried until they are gone."""
    await access.require_checkpoints_owner(
        session, Actor.of(user), body.checkpoint_uuids, "delete its checkpoints"
    )
    await checkpoint_gc.delete_checkpoints(session, body.checkpoint_uuids, user.username)
    return Empty()


@dataclass(frozen=True)
class CheckpointQuery:
    offset: int = Query(0, ge=0, le=MAX_INT)
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every checkpoint")
    sort_by: str = Query("SORT_BY_UNSPECIFIED", alias="sortByAttr")
    order_by: str = Query("ORDER_BY_UNSPECIFIED", alias="orderBy")
    sort_by_metric: str = Query("", alias="sortByMetric", max_length=256)
    states: list[str] | None = Query(None, alias="states")  # noqa: RUF009 - a query


async def _checkpoint_page(
    session: SessionDep,
    experiment: ExperimentModel,
    rows: list[CheckpointModel],
    query: CheckpointQuery,
) -> CheckpointList:
    _, smaller_is_better = trial_reports.searcher_metric(experiment.config)
    return await _checkpoint_list(
        session,
        rows,
        offset=query.offset,
        limit=query.limit,
        sort_by=query.sort_by,
        order_by=query.order_by,
        smaller_is_better=smaller_is_better,
        sort_by_metric=query.sort_by_metric,
        states=tuple(query.states or ()),
    )


@router.get("/trials/{trial_id}/checkpoints")
async def trial_checkpoints(
    trial_id: ObjectId,
    session: SessionDep,
    _user: CurrentUser,
    query: Annotated[CheckpointQuery, Depends()],
) -> CheckpointList:
    trial = await experiments.get_trial(session, trial_id)
    experiment = (await experiments.get_experiment(session, trial.experiment_id)).experiment
    rows = await trial_reports.list_checkpoints(session, trial_id=trial_id)
    return await _checkpoint_page(session, experiment, rows, query)


@router.get("/experiments/{experiment_id}/checkpoints")
async def experiment_checkpoints(
    experiment_id: ObjectId,
    session: SessionDep,
    _user: CurrentUser,
    query: Annotated[CheckpointQuery, Depends()],
) -> CheckpointList:
    experiment = (await experiments.get_experiment(session, experiment_id)).experiment
    rows = await trial_reports.list_checkpoints(session, experiment_id=experiment_id)
    return await _checkpoint_page(session, experiment, rows, query)


@router.get("/experiments/{experiment_id}/searcher/best_searcher_validation_metric")
async def best_validation_metric(
    experiment_id: ObjectId, session: SessionDep, _user: CurrentUser
) -> BestMetric:
    experiment = (await experiments.get_experiment(session, experiment_id)).experiment
    best = await trial_reports.best_validation_metric(session, experiment)
    if best is None:
        raise NotFound(f"experiment {experiment_id} has no validation of its searcher metric yet")
    return BestMetric(metric=best)


# -- preemption ----------------------------------------------------------------------------


@router.get("/allocations/{allocation_id}/signals/preemption")
async def preemption_signal(
    allocation_id: str,
    session: SessionDep,
    _user: CurrentUser,
    signals: PreemptionDep,
    timeout_seconds: int = Query(0, ge=0, le=MAX_INT),
) -> PreemptionSignal:
    """Long-poll: true at once when the master wants the allocation to stop, else false
    after up to `timeout_seconds` (60 at most). Polling counts as the trial listening, so
    only those who may stop the experiment may poll: its owner (its ranks' token), an admin,
    or an Editor of its workspace."""
    allocation = await allocations.get_allocation(session, allocation_id)
    await access.require_allocation_owner(
        session, Actor.of(_user), allocation, "poll its preemption signal"
    )
    stop_wanted = allocation.preempt_requested or allocation.state in (
        AllocationState.TERMINATING,
        AllocationState.TERMINATED,
    )
    # The wait must not hold a database connection: end the transaction first.
    await session.commit()
    if stop_wanted or signals.is_raised(allocation_id):
        signals.told_at_once(allocation_id)
        return PreemptionSignal(preempt=True)
    wait = min(timeout_seconds, MAX_PREEMPTION_WAIT_S)
    return PreemptionSignal(preempt=await signals.wait(allocation_id, wait))


@router.post("/allocations/{allocation_id}/signals/ack_preemption")
async def ack_preemption(
    allocation_id: str,
    session: SessionDep,
    _user: CurrentUser,
    signals: PreemptionDep,
    _body: dict[str, Any] | None = None,
) -> Empty:
    # An acknowledgement turns the trial's exit 0 into "preempted, run again": its owner's.
    allocation = await allocations.get_allocation(session, allocation_id)
    await access.require_allocation_owner(
        session, Actor.of(_user), allocation, "acknowledge its preemption"
    )
    await allocations.acknowledge_preemption(session, allocation_id)
    signals.acknowledge(allocation_id)
    return Empty()


@router.post("/allocations/{allocation_id}/acceleratorData")
async def accelerator_data(
    allocation_id: str, _body: AcceleratorDataReport, session: SessionDep, _user: CurrentUser
) -> Empty:
    """Determined's prep_container reports the devices it sees; resolute's agents report
    theirs over the agent link, so this is only checked and acknowledged."""
    await allocations.get_allocation(session, allocation_id)
    return Empty()
