from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from master.core import launch
from master.db.models import MAX_INT, TrialMetricModel, TrialModel
from master.schemas.common import DbInt, Pagination, UtcTime, WireInput, WireModel
from master.services.allocations import task_id
from master.services.experiments import ExperimentView, PendingReason
from master.services.trial_reports import TrialSummary, metrics_workload
from resolute.storage import mask_config


class ExperimentCreate(WireInput):
    config: Any = None
    template: str | None = None
    model_definition: list[Any] | None = None
    activate: bool | None = True
    validate_only: bool | None = False
    project_id: DbInt | None = None
    parent_id: DbInt | None = None
    unmanaged: bool | None = None


class ExperimentPatchBody(WireInput):
    """Determined's v1PatchExperiment. Its client sends back what it read (id, name,
    description, notes, labels) with the labels changed; values are checked by the service."""

    id: DbInt | None = None
    name: str | None = None
    description: str | None = None
    notes: str | None = None
    labels: Any = None
    resources: PatchResources | None = None
    checkpoint_storage: PatchCheckpointStorage | None = None


class PatchResources(WireInput):
    """Determined's PatchExperimentPatchResources (`det experiment set priority|weight|
    max-slots`): each as the config's `resources` key of the same name, checked as it is."""

    max_slots: int | None = Field(default=None, ge=0, le=MAX_INT)
    weight: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    priority: int | None = Field(default=None, ge=1, le=99)


class PatchCheckpointStorage(WireInput):
    """Determined's PatchExperimentPatchCheckpointStorage (`det experiment set gc-policy`):
    the retention settings, applied at once to the checkpoints of ended trials."""

    save_experiment_best: int | None = Field(default=None, ge=0, le=MAX_INT)
    save_trial_best: int | None = Field(default=None, ge=0, le=MAX_INT)
    save_trial_latest: int | None = Field(default=None, ge=0, le=MAX_INT)


class ContinueExperimentBody(WireInput):
    """Determined's v1ContinueExperimentRequest (`det experiment continue`)."""

    id: DbInt
    override_config: str | None = None


class ContinueExperimentResponse(WireModel):
    experiment: Experiment
    warnings: list[str] = Field(default_factory=list)


class LabelList(WireModel):
    """Determined's v1PutExperimentLabelResponse, v1DeleteExperimentLabelResponse and
    v1GetExperimentLabelsResponse."""

    labels: list[str]


class PreviewSearchRequest(WireInput):
    """Determined's v1PreviewHPSearchRequest: the experiment config, as an object."""

    config: Any = None


class Experiment(WireModel):
    """Determined's v1Experiment; the first block is what the official client requires."""

    id: int
    name: str
    archived: bool
    config: dict[str, Any]
    original_config: str
    job_id: str
    num_trials: int
    project_id: int
    project_owner_id: int
    searcher_type: str
    start_time: datetime
    state: str
    username: str
    # Optional in Determined, sent for completeness.
    description: str
    end_time: datetime | None
    progress: float | None
    resource_pool: str
    user_id: int
    display_name: str
    notes: str = ""
    forked_from: int | None = None
    labels: list[str]
    # Optional in Determined's v1Experiment; `det e list --show_project` prints the names.
    workspace_id: int = 0
    workspace_name: str = ""
    project_name: str = ""
    # resolute additions (ignored by the official client).
    template_name: str | None
    experiment_seed: int
    best_validation_metric: float | None = None
    # How the entrypoint is launched (master.core.launch.choose_layout): the layout, what
    # it means in processes, and why it was chosen.
    launch_layout: str = launch.PER_SLOT
    launch_layout_summary: str = ""
    launch_reason: str = ""

    @classmethod
    def of(cls, view: ExperimentView) -> Experiment:
        row = view.experiment
        return cls(
            id=row.id,
            name=row.name,
            archived=row.archived,
            config=mask_config(row.config),
            original_config=row.original_config,
            job_id=row.job_id,
            num_trials=view.num_trials,
            project_id=row.project_id,
            # Its project's owner; the built-in project has none, so it is the experiment's.
            project_owner_id=view.project_owner_id or row.owner_id,
            workspace_id=view.workspace_id,
            workspace_name=view.workspace_name,
            project_name=view.project_name,
            searcher_type=row.searcher_type,
            start_time=row.start_time,
            state=f"STATE_{row.state}",
            username=view.username,
            description=row.description,
            end_time=row.end_time,
            progress=row.progress,
            resource_pool=row.resource_pool,
            user_id=row.owner_id,
            display_name=view.username,
            labels=list(row.labels),
            forked_from=row.parent_id,
            template_name=row.template_name,
            experiment_seed=row.experiment_seed,
            launch_layout=launch.stored_layout(row.config),
            launch_layout_summary=launch.layout_summary(launch.stored_layout(row.config)),
            launch_reason=row.launch_reason,
        )


class CreateExperimentResponse(WireModel):
    experiment: Experiment | None
    config: dict[str, Any]
    # Determined's enum list (LAUNCH_WARNING_*); our own sentences go in warning_messages.
    warnings: list[str] = Field(default_factory=list)
    warning_messages: list[str] = Field(default_factory=list)


class ExperimentResponse(WireModel):
    experiment: Experiment
    job_summary: dict[str, Any] | None = None


class ExperimentList(WireModel):
    experiments: list[Experiment]
    pagination: Pagination


class Trial(WireModel):
    """Determined's trialv1Trial; the first block is what the official client requires."""

    id: int
    experiment_id: int
    hparams: dict[str, Any]
    restarts: int
    start_time: datetime
    state: str
    total_batches_processed: int
    end_time: datetime | None
    request_id: str
    seed: int
    task_id: str
    runner_state: str
    latest_training: dict[str, Any] | None
    latest_validation: dict[str, Any] | None
    best_validation: dict[str, Any] | None
    # resolute additions: why a queued trial waits, from the scheduler's last pass; the
    # checkpoint the next run would resume from; what the trial said of its progress; why
    # it ended, where the state alone does not say (an early exit, an unrunnable start).
    pending_reason: dict[str, Any] | None = None
    latest_checkpoint_uuid: str | None = None
    progress: float | None = None
    end_reason: str = ""
    # ASHA searchers: its bracket, the rungs it entered (with the metric at each), the
    # rung the searcher stopped it at.
    searcher: dict[str, Any] | None = None

    @classmethod
    def of(
        cls,
        row: TrialModel,
        reason: PendingReason | None = None,
        summary: TrialSummary | None = None,
        searcher: dict[str, Any] | None = None,
    ) -> Trial:
        summary = summary or TrialSummary()

        def workload(metrics: TrialMetricModel | None) -> dict[str, Any] | None:
            return None if metrics is None else metrics_workload(metrics)

        return cls(
            pending_reason=None
            if reason is None
            else {
                "code": reason.code,
                "message": reason.message,
                "blockingJob": reason.blocking_job,
            },
            id=row.id,
            experiment_id=row.experiment_id,
            hparams=row.hparams,
            restarts=row.restarts,
            start_time=row.start_time,
            state=f"STATE_{row.state}",
            total_batches_processed=row.total_batches_processed,
            end_time=row.end_time,
            request_id=row.request_id,
            seed=row.seed,
            task_id=task_id(row),
            runner_state=row.runner_state,
            latest_training=workload(summary.latest_training),
            latest_validation=workload(summary.latest_validation),
            best_validation=workload(summary.best_validation),
            latest_checkpoint_uuid=summary.latest_checkpoint,
            progress=row.progress,
            end_reason=row.end_reason,
            searcher=searcher,
        )


class TrialList(WireModel):
    trials: list[Trial]
    pagination: Pagination


class TrialResponse(WireModel):
    trial: Trial


class WorkloadList(WireModel):
    workloads: list[dict[str, Any]]
    pagination: Pagination


class MetricValues(WireInput):
    avg_metrics: dict[str, Any]
    batch_metrics: list[Any] | None = None


class TrialMetrics(WireInput):
    trial_id: DbInt
    trial_run_id: DbInt
    # Null from the profiler (system metrics), which reports no step.
    steps_completed: DbInt | None = None
    metrics: MetricValues
    report_time: UtcTime | None = None


class MetricsReport(WireInput):
    """POST /api/v1/trials/{id}/metrics, as Determined's harness sends it."""

    group: str
    metrics: TrialMetrics


class MetricRow(WireModel):
    group: str
    steps_completed: int
    trial_run_id: int
    report_time: datetime
    metrics: dict[str, Any]


class MetricRows(WireModel):
    metrics: list[MetricRow]


class ProgressReport(WireInput):
    progress: float
    is_raw: bool | None = Field(default=None, alias="is_raw")


class RunnerMetadata(WireInput):
    state: str = ""


class RunStart(WireInput):
    run_id: DbInt | None = None
    checkpoint_storage: dict[str, Any] | None = None


class RunMetadataIn(WireInput):
    """TrainContext.set_metadata: `runId` is the trial id."""

    run_id: DbInt | None = None
    metadata: dict[str, Any]


class RunMetadata(WireModel):
    metadata: dict[str, Any]


class CheckpointTraining(WireInput):
    """The harness's training block; only trialId is read, the rest is allowed and ignored."""

    model_config = ConfigDict(extra="allow")

    trial_id: Annotated[DbInt, Field(strict=True)] | None = None


class CheckpointIn(WireInput):
    """POST /api/v1/checkpoints: the checkpoint itself, as the harness reports it."""

    uuid: str
    state: str = "STATE_COMPLETED"
    metadata: dict[str, Any] = Field(default_factory=dict)
    resources: dict[str, Any] = Field(default_factory=dict)
    training: CheckpointTraining | None = None
    task_id: str | None = None
    allocation_id: str | None = None
    report_time: UtcTime | None = None
    storage_id: int | None = None
    experiment_config: dict[str, Any] | None = None


class Checkpoint(WireModel):
    uuid: str
    task_id: str
    allocation_id: str
    report_time: datetime
    state: str
    resources: dict[str, Any]
    metadata: dict[str, Any]
    training: dict[str, Any]
    storage_id: int | None = None
    # resolute additions.
    trial_id: int
    experiment_id: int
    steps_completed: int
    storage_path: str
    # ACTIVE, DELETING, DELETED or PARTIALLY_DELETED, and why it is being deleted or what
    # the store last said (`state` is Determined's, which has no DELETING).
    storage_state: str = "ACTIVE"
    state_reason: str = ""


class DeleteCheckpoints(WireInput):
    checkpoint_uuids: list[str] = Field(max_length=10_000)


class CheckpointResponse(WireModel):
    checkpoint: Checkpoint


class CheckpointList(WireModel):
    checkpoints: list[Checkpoint]
    pagination: Pagination


class EarlyExit(WireInput):
    """POST /api/v1/trials/{id}/early_exit: Determined's v1TrialEarlyExit."""

    reason: str


class AlertData(WireInput):
    title: str | None = None
    description: str | None = None
    level: str | None = None


class Alert(WireInput):
    """POST /api/v1/webhooks/custom, as the harness's Context.alert() sends it."""

    data: AlertData
    experiment_id: DbInt
    trial_id: DbInt | None = None


class AcceleratorDataReport(WireInput):
    """POST /api/v1/allocations/{id}/acceleratorData, from Determined's prep_container."""

    allocation_id: str | None = None
    accelerator_data: dict[str, Any]


class PreemptionSignal(WireModel):
    preempt: bool


class BestMetric(WireModel):
    metric: float


class Empty(WireModel):
    pass


class ModelDefinition(WireModel):
    """GET /api/v1/experiments/{id}/model_def: Determined's v1GetModelDefResponse."""

    b64_tgz: str


class MetricsReportOut(WireModel):
    """One report in GET /api/v1/trials/metrics/trial_metrics: Determined's v1MetricsReport,
    whose `metrics` nest the values under validation_metrics (the validation group) or
    avg_metrics (any other group), as the official SDK reads them."""

    id: int
    trial_id: int
    trial_run_id: int
    total_batches: int
    end_time: datetime
    group: str
    archived: bool = False
    metrics: dict[str, Any]

    @classmethod
    def of(cls, row: TrialMetricModel) -> MetricsReportOut:
        key = "validation_metrics" if row.group_name == "validation" else "avg_metrics"
        return cls(
            id=row.id,
            trial_id=row.trial_id,
            trial_run_id=row.trial_run_id,
            total_batches=row.steps_completed,
            end_time=row.report_time,
            group=row.group_name,
            metrics={key: row.metrics},
        )
