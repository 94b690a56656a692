"""Determined's trial source infos: a trial reports the checkpoint or model version it used
(`core_context.experimental.report_task_using_checkpoint|model_version`), and the SDK
reads those trials' metrics back from the checkpoint or the version."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, Query

from master.api.deps import CurrentActor, CurrentUser, ObjectId, SessionDep
from master.db.models import TrialMetricModel
from master.schemas.experiments import MetricsReportOut
from master.schemas.registry import (
    SourceMetrics,
    TrialSourceInfoReply,
    TrialSourceInfoReport,
)
from master.services import trial_sources

router = APIRouter(prefix="/api/v1", tags=["Models"])


def _reports(rows: Sequence[TrialMetricModel]) -> SourceMetrics:
    return SourceMetrics(metrics=[MetricsReportOut.of(r) for r in rows])


@router.post("/trial-source-info")
async def report_trial_source(
    body: TrialSourceInfoReport, session: SessionDep, user: CurrentUser
) -> TrialSourceInfoReply:
    info = body.trial_source_info
    row = await trial_sources.report(
        session,
        user,
        trial_id=info.trial_id,
        checkpoint_uuid=info.checkpoint_uuid,
        kind_name=info.trial_source_info_type,
        model_id=info.model_id,
        model_version=info.model_version,
    )
    return TrialSourceInfoReply(trial_id=row.trial_id, checkpoint_uuid=row.checkpoint_uuid)


@router.get("/checkpoints/{checkpoint_uuid}/metrics")
async def checkpoint_metrics(
    checkpoint_uuid: str,
    session: SessionDep,
    actor: CurrentActor,
    kind: str | None = Query(None, alias="trialSourceInfoType"),
    group: str | None = Query(None, alias="metricGroup"),
) -> SourceMetrics:
    rows = await trial_sources.checkpoint_metrics(session, actor, checkpoint_uuid, kind, group)
    return _reports(rows)


@router.get("/models/{model_name}/versions/{version}/metrics")
async def version_metrics(
    model_name: str,
    version: ObjectId,
    session: SessionDep,
    actor: CurrentActor,
    kind: str | None = Query(None, alias="trialSourceInfoType"),
    group: str | None = Query(None, alias="metricGroup"),
) -> SourceMetrics:
    rows = await trial_sources.version_metrics(session, actor, model_name, version, kind, group)
    return _reports(rows)
