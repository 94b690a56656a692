"""Which checkpoint (or model version) a trial used, and the metrics of the trials that
used one: Determined's trial source infos, behind `core_context.experimental.
report_task_using_checkpoint|model_version` and the SDK's `Checkpoint.get_metrics()` and
`ModelVersion.iter_metrics()` (a batch-inference trial's metrics, found from the model)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import (
    ExperimentModel,
    ModelVersionModel,
    TrialMetricModel,
    TrialModel,
    TrialSourceModel,
    UserModel,
)
from master.errors import InvalidArgument, NotFound
from master.services import access, model_registry, trial_reports

_PREFIX = "TRIAL_SOURCE_INFO_TYPE_"
KINDS = ("INFERENCE", "FINE_TUNING")


def kind_of(value: str | None, field: str, *, required: bool) -> str | None:
    """INFERENCE or FINE_TUNING from Determined's enum name; None for "any" where allowed."""
    if value in (None, "", f"{_PREFIX}UNSPECIFIED") and not required:
        return None
    kind = (value or "").removeprefix(_PREFIX)
    if kind not in KINDS:
        names = ", ".join(f"{_PREFIX}{k}" for k in KINDS)
        raise InvalidArgument(f"{field}: {value!r} is not one of {names}")
    return kind


async def report(
    session: AsyncSession,
    user: UserModel,
    *,
    trial_id: int,
    checkpoint_uuid: str,
    kind_name: str,
    model_id: int | None,
    model_version: int | None,
) -> TrialSourceModel:
    """Record that `trial_id` used the checkpoint (and the version); the same report twice
    is recorded once."""
    field = "trialSourceInfo"
    kind = kind_of(kind_name, f"{field}.trialSourceInfoType", required=True)
    if (model_id is None) != (model_version is None):
        raise InvalidArgument(f"{field}.modelVersion: give modelId and modelVersion together")
    trial = await trial_reports.trial_for_report(session, trial_id, user, "report its source")
    # What its owner may not read is named as missing (master.services.access).
    actor = access.Actor.of(user)
    try:
        checkpoint = await trial_reports.get_checkpoint(session, checkpoint_uuid)
        if await access.hidden(session, actor, "uuid", checkpoint.uuid):
            raise NotFound(f"checkpoint {checkpoint_uuid} not found")
    except NotFound as exc:
        raise NotFound(f"{field}.checkpointUuid: {exc}") from None
    version_id = None
    if model_id is not None and model_version is not None:
        version = await session.scalar(
            select(ModelVersionModel).where(
                ModelVersionModel.model_id == model_id, ModelVersionModel.version == model_version
            )
        )
        if version is None or await access.hidden(session, actor, "model_name", str(model_id)):
            raise NotFound(f"{field}.modelVersion: model {model_id} has no version {model_version}")
        if version.checkpoint_uuid != checkpoint.uuid:
            raise InvalidArgument(
                f"{field}.checkpointUuid: version {model_version} of model {model_id} holds "
                f"checkpoint {version.checkpoint_uuid}, not {checkpoint.uuid}"
            )
        version_id = version.id
    same = (
        TrialSourceModel.model_version_id.is_(None)
        if version_id is None
        else TrialSourceModel.model_version_id == version_id
    )
    existing = await session.scalar(
        select(TrialSourceModel).where(
            TrialSourceModel.trial_id == trial.id,
            TrialSourceModel.checkpoint_uuid == checkpoint.uuid,
            TrialSourceModel.kind == kind,
            same,
        )
    )
    if existing is not None:
        return existing
    row = TrialSourceModel(
        trial_id=trial.id, checkpoint_uuid=checkpoint.uuid, model_version_id=version_id, kind=kind
    )
    session.add(row)
    await session.flush()
    return row


async def _metrics_of_trials_using(
    session: AsyncSession,
    used: ColumnElement[bool],
    kind: str | None,
    group: str | None,
    readable: ColumnElement[bool],
) -> Sequence[TrialMetricModel]:
    """Of the trials the caller may read (`readable`, on their experiments)."""
    users = (
        select(TrialSourceModel.trial_id)
        .join(TrialModel, TrialModel.id == TrialSourceModel.trial_id)
        .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        .where(used, readable)
    )
    if kind is not None:
        users = users.where(TrialSourceModel.kind == kind)
    query = select(TrialMetricModel).where(TrialMetricModel.trial_id.in_(users))
    if group:
        query = query.where(TrialMetricModel.group_name == group)
    query = query.order_by(
        TrialMetricModel.trial_id, TrialMetricModel.group_name, TrialMetricModel.steps_completed
    )
    return (await session.scalars(query)).all()


async def checkpoint_metrics(
    session: AsyncSession,
    actor: access.Actor,
    uuid: str,
    kind_name: str | None,
    group: str | None,
) -> Sequence[TrialMetricModel]:
    """The reports of every trial that used the checkpoint."""
    kind = kind_of(kind_name, "trialSourceInfoType", required=False)
    checkpoint = await trial_reports.get_checkpoint(session, uuid)
    used = TrialSourceModel.checkpoint_uuid == checkpoint.uuid
    readable = await access.readable(session, actor, "experiments")
    return await _metrics_of_trials_using(session, used, kind, group, readable)


async def version_metrics(
    session: AsyncSession,
    actor: access.Actor,
    model: str,
    number: int,
    kind_name: str | None,
    group: str | None,
) -> Sequence[TrialMetricModel]:
    """The reports of every trial that reported using this model version."""
    kind = kind_of(kind_name, "trialSourceInfoType", required=False)
    version = (await model_registry.get_version(session, model, number)).row
    used = TrialSourceModel.model_version_id == version.id
    readable = await access.readable(session, actor, "experiments")
    return await _metrics_of_trials_using(session, used, kind, group, readable)
