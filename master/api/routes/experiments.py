"""Experiments and their trials, wire-compatible with Determined's official client."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.api.deps import MAX_INT, CurrentActor, CurrentUser, ObjectId, SessionDep, SettingsDep
from master.core import roles
from master.core.retention import Retention
from master.db.models import ExperimentState, TrialMetricModel
from master.errors import InvalidArgument
from master.schemas.common import Pagination, WireInput
from master.schemas.experiments import (
    ContinueExperimentBody,
    ContinueExperimentResponse,
    CreateExperimentResponse,
    Empty,
    Experiment,
    ExperimentCreate,
    ExperimentList,
    ExperimentPatchBody,
    ExperimentResponse,
    LabelList,
    MetricsReportOut,
    ModelDefinition,
    PreviewSearchRequest,
    Trial,
    TrialList,
    TrialResponse,
)
from master.services import (
    access,
    allocations,
    checkpoint_gc,
    continuation,
    experiments,
    labels,
    log_retention,
    search,
    trial_reports,
)
from master.services.access import Actor
from resolute.storage import mask_config

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1", tags=["Experiments"])
# Determined's client still calls a few routes of its older API, outside /api/v1.
legacy_router = APIRouter(tags=["Experiments"])

ORDER_BY = ("ORDER_BY_UNSPECIFIED", "ORDER_BY_ASC", "ORDER_BY_DESC")


def _parse_states(values: list[str]) -> list[ExperimentState]:
    parsed = []
    for value in values:
        try:
            parsed.append(ExperimentState(value.removeprefix("STATE_")))
        except ValueError:
            known = ", ".join(f"STATE_{s}" for s in ExperimentState)
            raise InvalidArgument(f"states: {value!r} is not one of {known}") from None
    return parsed


def _check_order(order_by: str) -> bool:
    if order_by not in ORDER_BY:
        raise InvalidArgument(f"orderBy: {order_by!r} is not one of {', '.join(ORDER_BY)}")
    return order_by == "ORDER_BY_DESC"


@router.post("/preview-hp-search")
async def preview_hp_search(body: PreviewSearchRequest, _user: CurrentUser) -> dict[str, Any]:
    """What `det preview-search` prints: the searcher with its defaults, and how many trials
    train how far."""
    return search.preview(body.config)


@router.post("/experiments")
async def create_experiment(
    body: ExperimentCreate, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> CreateExperimentResponse:
    if body.unmanaged:
        raise InvalidArgument("unmanaged: unmanaged experiments are not supported")
    request = experiments.ExperimentRequest(
        config=body.config,
        template=body.template or None,
        model_definition=body.model_definition,
        activate=body.activate is not False,
        validate_only=bool(body.validate_only),
        project_id=body.project_id,
        parent_id=body.parent_id,
    )
    view, prepared = await experiments.create_experiment(session, request, user, settings)
    return CreateExperimentResponse(
        experiment=Experiment.of(view) if view is not None else None,
        config=mask_config(
            view.experiment.config if view is not None else prepared.effective_config
        ),
        warnings=prepared.launch_warnings,
        warning_messages=prepared.warnings,
    )


@router.post("/experiments/continue")
async def continue_experiment(
    body: ContinueExperimentBody, session: SessionDep, user: CurrentUser
) -> ContinueExperimentResponse:
    """Determined's ContinueExperiment: an ended experiment's trials run again."""
    await access.require_experiment_owner(session, Actor.of(user), body.id, "continue it")
    await continuation.continue_experiment(session, body.id, body.override_config, user.username)
    view = await experiments.get_experiment(session, body.id)
    return ContinueExperimentResponse(experiment=Experiment.of(view))


@router.get("/experiments")
async def list_experiments(
    session: SessionDep,
    actor: CurrentActor,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every experiment"),
    archived: bool | None = None,
    users: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    states: Annotated[list[str], Query()] = [],  # noqa: B006
    name: str | None = None,
    with_labels: Annotated[list[str], Query(alias="labels")] = [],  # noqa: B006
    sort_by: Annotated[str, Query(alias="sortBy")] = "SORT_BY_ID",
    order_by: Annotated[str, Query(alias="orderBy")] = "ORDER_BY_ASC",
    project_id: Annotated[int | None, Query(alias="projectId", ge=0, le=MAX_INT)] = None,
) -> ExperimentList:
    if sort_by == "SORT_BY_UNSPECIFIED":
        sort_by = "SORT_BY_ID"
    if project_id:
        await access.check_readable(session, actor, "project_id", str(project_id))
    views, total = await experiments.list_experiments(
        session,
        offset=offset,
        limit=limit,
        archived=archived,
        usernames=users,
        states_filter=_parse_states(states),
        name=name,
        with_labels=with_labels,
        sort_by=sort_by,
        descending=_check_order(order_by),
        project_id=project_id,
        readable=await access.readable(session, actor, "experiments", project_id or None),
    )
    return ExperimentList(
        experiments=[Experiment.of(v) for v in views],
        pagination=Pagination.of(offset, limit, len(views), total),
    )


@router.get("/experiments/{experiment_id}")
async def get_experiment(
    experiment_id: ObjectId, session: SessionDep, _user: CurrentUser
) -> ExperimentResponse:
    view = await experiments.get_experiment(session, experiment_id)
    best = await trial_reports.best_validation_metric(session, view.experiment)
    return ExperimentResponse(
        experiment=Experiment.of(view).model_copy(update={"best_validation_metric": best})
    )


@router.patch("/experiments/{experiment_id}")
async def patch_experiment(
    experiment_id: ObjectId, body: ExperimentPatchBody, session: SessionDep, user: CurrentUser
) -> ExperimentResponse:
    """Determined's PatchExperiment: `det experiment label add|remove` sends the labels it
    read with one added or removed; the SDK's set_labels sends a new list; `det experiment
    set priority|weight|max-slots` send `resources`, `set gc-policy` `checkpointStorage`."""
    if body.id is not None and body.id != experiment_id:
        raise InvalidArgument(f"id: {body.id} is not the experiment in the path ({experiment_id})")
    if body.notes:
        raise InvalidArgument("notes: experiment notes are not kept by this master")
    await access.require_experiment_owner(session, Actor.of(user), experiment_id, "change it")
    patch = experiments.ExperimentPatch(
        name=body.name,
        description=body.description,
        labels=body.labels,
        resources=body.resources.model_dump(exclude_none=True) if body.resources else {},
        retention=(
            body.checkpoint_storage.model_dump(exclude_none=True) if body.checkpoint_storage else {}
        ),
    )
    view = await experiments.patch_experiment(session, experiment_id, patch, user.username)
    return ExperimentResponse(experiment=Experiment.of(view))


@router.put("/experiments/{experiment_id}/labels/{label:path}")
async def put_experiment_label(
    experiment_id: ObjectId, label: str, session: SessionDep, user: CurrentUser
) -> LabelList:
    """Determined's PutExperimentLabel (the SDK's add_label). `:path`, because the SDK
    leaves a `/` in a label unquoted."""
    await access.require_experiment_owner(session, Actor.of(user), experiment_id, "label it")
    return LabelList(
        labels=await experiments.add_label(session, experiment_id, label, user.username)
    )


@router.delete("/experiments/{experiment_id}/labels/{label:path}")
async def delete_experiment_label(
    experiment_id: ObjectId, label: str, session: SessionDep, user: CurrentUser
) -> LabelList:
    """Determined's DeleteExperimentLabel (the SDK's remove_label)."""
    await access.require_experiment_owner(session, Actor.of(user), experiment_id, "label it")
    return LabelList(
        labels=await experiments.remove_label(session, experiment_id, label, user.username)
    )


@router.get("/experiment/labels")
async def list_experiment_labels(
    session: SessionDep,
    actor: CurrentActor,
    project_id: Annotated[int | None, Query(alias="projectId", ge=0, le=MAX_INT)] = None,
) -> LabelList:
    """Every label in use, the most used first (Determined's GetExperimentLabels)."""
    readable = await access.readable(session, actor, "experiments")
    return LabelList(labels=await labels.label_counts(session, project_id, readable=readable))


@router.post("/experiments/{experiment_id}/archive")
async def archive_experiment(
    experiment_id: ObjectId, session: SessionDep, user: CurrentUser
) -> Empty:
    await access.require_experiment_owner(session, Actor.of(user), experiment_id, "archive it")
    await experiments.set_archived(session, experiment_id, True, user.username)
    return Empty()


@router.post("/experiments/{experiment_id}/unarchive")
async def unarchive_experiment(
    experiment_id: ObjectId, session: SessionDep, user: CurrentUser
) -> Empty:
    await access.require_experiment_owner(session, Actor.of(user), experiment_id, "unarchive it")
    await experiments.set_archived(session, experiment_id, False, user.username)
    return Empty()


class RetainLogsBody(WireInput):
    """Determined's PutExperimentRetainLogsRequest."""

    experiment_id: int | None = Field(default=None, ge=0, le=MAX_INT)
    num_days: int = Field(ge=-(2**31), le=MAX_INT)


@router.put("/experiments/{experiment_id}/retain_logs")
async def put_experiment_retain_logs(
    experiment_id: ObjectId, body: RetainLogsBody, session: SessionDep, user: CurrentUser
) -> Empty:
    """Determined's PutExperimentRetainLogs (`det experiment set log-retention`): its
    trials' logs are kept `numDays` after each ends; -1 keeps them forever."""
    if body.experiment_id is not None and body.experiment_id != experiment_id:
        raise InvalidArgument(
            f"experimentId: {body.experiment_id} is not the experiment in the path "
            f"({experiment_id})"
        )
    log_retention.checked_days(body.num_days)
    await access.require_experiment_owner(
        session, Actor.of(user), experiment_id, "change its log retention"
    )
    await log_retention.set_experiment_retention(
        session, experiment_id, body.num_days, user.username
    )
    return Empty()


RetentionQuery = Annotated[int | None, Query(ge=0, le=MAX_INT)]


@legacy_router.get("/experiments/{experiment_id}/preview_gc")
async def preview_gc(
    experiment_id: ObjectId,
    session: SessionDep,
    _user: CurrentUser,
    save_experiment_best: RetentionQuery = None,
    save_trial_best: RetentionQuery = None,
    save_trial_latest: RetentionQuery = None,
) -> dict[str, Any]:
    """What `det experiment set gc-policy` shows before it asks: the checkpoints the given
    retention settings would delete now (those not given stay as they are). In Determined's
    shape: Go field names, and a `step.validation` on those with a validation."""
    experiment = (await experiments.get_experiment(session, experiment_id)).experiment
    current = checkpoint_gc.retention_of(experiment.config)
    retention = Retention(
        save_experiment_best=_or(save_experiment_best, current.save_experiment_best),
        save_trial_best=_or(save_trial_best, current.save_trial_best),
        save_trial_latest=_or(save_trial_latest, current.save_trial_latest),
    )
    doomed = await checkpoint_gc.preview_retention(session, experiment, retention)
    validations = await trial_reports.validations_at(
        session, [(c.trial_id, c.steps_completed) for c in doomed]
    )
    checkpoints = []
    for c in doomed:
        metrics = validations.get((c.trial_id, c.steps_completed))
        entry: dict[str, Any] = {
            "TrialID": c.trial_id,
            "UUID": c.uuid,
            "StepsCompleted": c.steps_completed,
            "State": checkpoint_gc.WIRE_STATE.get(c.state, c.state).removeprefix("STATE_"),
            "ReportTime": c.report_time.isoformat().replace("+00:00", "Z"),
            "Resources": c.resources or {},
            "ValidationMetrics": metrics or {},
        }
        if metrics is not None:
            entry["step"] = {"validation": {"metrics": metrics}}
        checkpoints.append(entry)
    searcher = experiment.config.get("searcher") or {}
    return {"checkpoints": checkpoints, "metric_name": searcher.get("metric") or ""}


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


@router.post("/experiments/{experiment_id}/kill")
async def kill_experiment(experiment_id: ObjectId, session: SessionDep, user: CurrentUser) -> Empty:
    await access.require_experiment_owner(session, Actor.of(user), experiment_id, "kill it")
    await experiments.kill_experiment(session, experiment_id, user.username)
    return Empty()


@router.delete("/experiments/{experiment_id}")
async def delete_experiment(
    experiment_id: ObjectId, session: SessionDep, user: CurrentUser
) -> Empty:
    """Determined's delete: the experiment becomes DELETING, its checkpoints are deleted
    from the store, then the experiment is gone."""
    await access.require_experiment_owner(
        session, Actor.of(user), experiment_id, "delete it", roles.DELETE_EXPERIMENT
    )
    await allocations.hold_scheduler(session)
    experiment = (await experiments.get_experiment(session, experiment_id)).experiment
    await checkpoint_gc.delete_experiment(session, experiment, user.username)
    return Empty()


@router.post("/experiments/{experiment_id}/pause")
async def pause_experiment(
    experiment_id: ObjectId, session: SessionDep, user: CurrentUser
) -> Empty:
    await access.require_experiment_owner(session, Actor.of(user), experiment_id, "pause it")
    await experiments.pause_experiment(session, experiment_id, user.username)
    return Empty()


@router.post("/experiments/{experiment_id}/activate")
async def activate_experiment(
    experiment_id: ObjectId, session: SessionDep, user: CurrentUser
) -> Empty:
    await access.require_experiment_owner(session, Actor.of(user), experiment_id, "activate it")
    await experiments.activate_experiment(session, experiment_id, user.username)
    return Empty()


@router.get("/experiments/{experiment_id}/trials")
async def list_trials(
    experiment_id: ObjectId,
    session: SessionDep,
    _user: CurrentUser,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every trial"),
) -> TrialList:
    rows, total = await experiments.list_trials(session, experiment_id, offset=offset, limit=limit)
    reasons = await experiments.pending_reasons(session, [r.id for r in rows])
    experiment = (await experiments.get_experiment(session, experiment_id)).experiment
    summaries = await trial_reports.trial_summaries(session, rows, experiment.config)
    searches = await search.trial_search_views(session, experiment)
    return TrialList(
        trials=[Trial.of(r, reasons.get(r.id), summaries[r.id], searches.get(r.id)) for r in rows],
        pagination=Pagination.of(offset, limit, len(rows), total),
    )


@router.post("/trials/{trial_id}/kill")
async def kill_trial(trial_id: ObjectId, session: SessionDep, user: CurrentUser) -> Empty:
    """Determined's KillTrial (`det trial kill ID`): this trial only."""
    trial = await experiments.get_trial(session, trial_id)
    await access.require_experiment_owner(
        session, Actor.of(user), trial.experiment_id, "kill its trials"
    )
    await experiments.kill_trial(session, trial_id, user.username)
    return Empty()


@router.get("/trials/{trial_id}")
async def get_trial(trial_id: ObjectId, session: SessionDep, _user: CurrentUser) -> TrialResponse:
    trial = await experiments.get_trial(session, trial_id)
    reasons = await experiments.pending_reasons(session, [trial.id])
    experiment = (await experiments.get_experiment(session, trial.experiment_id)).experiment
    summaries = await trial_reports.trial_summaries(session, [trial], experiment.config)
    searches = await search.trial_search_views(session, experiment)
    return TrialResponse(
        trial=Trial.of(trial, reasons.get(trial.id), summaries[trial.id], searches.get(trial.id))
    )


# -- what Determined's Python SDK reads ------------------------------------------------------


@router.get("/experiments/{experiment_id}/model_def")
async def get_model_definition(
    experiment_id: ObjectId, session: SessionDep, _user: CurrentUser
) -> ModelDefinition:
    """The files the experiment was created with, a base64 tar.gz (Experiment.download_code)."""
    archive = await experiments.model_definition_archive(session, experiment_id)
    return ModelDefinition(b64_tgz=base64.b64encode(archive).decode("ascii"))


TrialIdQuery = Annotated[int, Field(ge=0, le=MAX_INT)]


@router.get("/trials/metrics/trial_metrics", response_class=StreamingResponse)
async def stream_trial_metrics(
    request: Request,
    session: SessionDep,
    actor: CurrentActor,
    group: Annotated[str, Query(min_length=1, max_length=256)],
    trial_ids: Annotated[list[TrialIdQuery], Query(alias="trialIds")] = [],  # noqa: B006
) -> StreamingResponse:
    """Determined's GetMetrics (Trial.iter_metrics): NDJSON lines {"result": {"metrics": [...]}}
    with every report of `group`, then new ones until all the trials have ended."""
    await experiments.check_trials_exist(
        session, trial_ids, await access.readable(session, actor, "experiments")
    )
    # The request's session ends before the body is sent: the stream reads with its own.
    factory: async_sessionmaker[AsyncSession] = request.app.state.session_factory
    batches = experiments.stream_trial_metrics(factory, trial_ids, group)
    return StreamingResponse(_metrics_ndjson(batches), media_type="application/json")


async def _metrics_ndjson(batches: AsyncIterator[list[TrialMetricModel]]) -> AsyncIterator[str]:
    try:
        async for rows in batches:
            reports = [MetricsReportOut.of(r).model_dump(mode="json", by_alias=True) for r in rows]
            yield json.dumps({"result": {"metrics": reports}}) + "\n"
    except Exception:
        # The 200 is already sent: grpc-gateway ends a failed stream with an error line.
        log.exception("metrics stream failed")
        error = {"grpcCode": 13, "httpCode": 500, "message": "internal error; see the master log"}
        yield json.dumps({"error": {**error, "details": []}}) + "\n"
