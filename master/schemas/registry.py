"""The model registry on the wire: Determined's v1Model and v1ModelVersion and their requests."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from master.schemas.common import DbInt, Pagination, WireInput, WireModel
from master.schemas.experiments import Checkpoint, MetricsReportOut

# Metadata and labels are checked by the service (master.services.model_registry), so a
# value of the wrong type is refused with a message that names the field, not a 422.


class RegistryModel(WireModel):
    """Determined's v1Model: every key its client indexes is always sent."""

    id: int
    name: str
    description: str
    notes: str
    labels: list[str]
    metadata: dict[str, Any]
    archived: bool
    creation_time: datetime
    last_updated_time: datetime
    num_versions: int
    user_id: int
    username: str
    workspace_id: int


class ModelVersion(WireModel):
    """Determined's v1ModelVersion, with its checkpoint rendered as GET /checkpoints/{uuid}
    renders it."""

    id: int
    version: int
    model: RegistryModel
    checkpoint: Checkpoint
    name: str
    comment: str
    notes: str
    labels: list[str]
    metadata: dict[str, Any]
    creation_time: datetime
    last_updated_time: datetime
    user_id: int
    username: str


class ModelCreate(WireInput):
    name: Any = None
    description: Any = None
    notes: Any = None
    labels: Any = None
    metadata: Any = None
    workspace_id: DbInt | None = None
    workspace_name: str | None = None


class ModelPatch(WireInput):
    name: Any = None
    description: Any = None
    notes: Any = None
    labels: Any = None
    metadata: Any = None
    workspace_id: DbInt | None = None
    workspace_name: str | None = None


class ModelMove(WireInput):
    """Determined's MoveModelRequest."""

    destination_workspace_id: DbInt
    model_name: str | None = None


class ModelVersionCreate(WireInput):
    checkpoint_uuid: Any = None
    model_name: str | None = None
    name: Any = None
    comment: Any = None
    notes: Any = None
    labels: Any = None
    metadata: Any = None


class ModelVersionPatch(WireInput):
    # Determined's v1PatchModelVersion may carry the whole checkpoint; only its uuid counts.
    checkpoint: dict[str, Any] | None = None
    name: Any = None
    comment: Any = None
    notes: Any = None
    labels: Any = None
    metadata: Any = None


class ModelResponse(WireModel):
    model: RegistryModel


class ModelList(WireModel):
    models: list[RegistryModel]
    pagination: Pagination


class ModelVersionResponse(WireModel):
    model_version: ModelVersion


class ModelVersionList(WireModel):
    model: RegistryModel
    model_versions: list[ModelVersion] = Field(default_factory=list)
    pagination: Pagination


class ModelLabels(WireModel):
    labels: list[str]


class TrialSourceInfo(WireInput):
    """Determined's v1TrialSourceInfo: a trial that used a checkpoint (and the model
    version holding it, if it names one)."""

    trial_id: DbInt
    checkpoint_uuid: str
    trial_source_info_type: str
    model_id: DbInt | None = None
    model_version: DbInt | None = None


class TrialSourceInfoReport(WireInput):
    trial_source_info: TrialSourceInfo


class TrialSourceInfoReply(WireModel):
    trial_id: int
    checkpoint_uuid: str


class SourceMetrics(WireModel):
    metrics: list[MetricsReportOut]
