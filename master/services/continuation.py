"""`det experiment continue`: an ended experiment runs more, as Determined's ContinueExperiment.

A single-trial experiment takes an override config (a longer `searcher.max_length`, more
`max_restarts`...) merged over its own, and its trial runs again from its latest checkpoint,
whatever it ended as. A grid or random search takes no override: its trials that did not
complete (errored, killed) run again from their checkpoints; one whose every trial completed
has nothing to continue. ASHA's searcher decided which trials ran how far, so its experiments
are not continued (as in Determined). The trials keep their ids, hyperparameters and seeds;
each run is a new allocation, so no run is ever started twice.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.expconf import effective_dict, parse_yaml, validate_config
from master.core.merge import merge_template
from master.db.models import (
    ExperimentModel,
    ExperimentState,
    ModelDefinitionModel,
    TrialModel,
    TrialState,
)
from master.errors import Conflict, InvalidArgument, NotFound
from master.services import (
    allocations,
    bind_mounts,
    labels,
    pool_bindings,
    states,
    trial_reports,
    workspaces,
)
from master.services.configs import config_errors_as_invalid_argument
from master.services.templates import refuse_hidden_secrets

log = logging.getLogger(__name__)

CONTINUABLE_SEARCHERS = ("single", "grid", "random")


async def continue_experiment(
    session: AsyncSession, experiment_id: int, override_text: str | None, actor: str
) -> ExperimentModel:
    """Requeue what the experiment may run again, in one transaction; the experiment is
    ACTIVE again. Refused, changing nothing, unless it has ended."""
    # The scheduler's lock before the experiment's row, in the order kill and pause take them.
    await allocations.hold_scheduler(session)
    experiment = await session.scalar(
        select(ExperimentModel).where(ExperimentModel.id == experiment_id).with_for_update()
    )
    if experiment is None:
        raise NotFound(f"experiment {experiment_id} not found")
    searcher = experiment.config["searcher"]["name"]
    if searcher not in CONTINUABLE_SEARCHERS:
        raise InvalidArgument(
            f"searcher: an experiment searched by {searcher} cannot be continued; only "
            f"{', '.join(CONTINUABLE_SEARCHERS)} (fork it to search again)"
        )
    override = _override(override_text)
    if override and searcher != "single":
        raise InvalidArgument(
            f"overrideConfig: only a single-trial experiment takes an override config; "
            f"this one is searched by {searcher}"
        )
    state = ExperimentState(experiment.state)
    if not state.is_terminal:
        raise Conflict(
            f"experiment {experiment_id} is {state}: only an ended experiment can be continued"
        )
    trials = list(
        (
            await session.scalars(
                select(TrialModel)
                .where(TrialModel.experiment_id == experiment_id)
                .order_by(TrialModel.id)
            )
        ).all()
    )
    if searcher == "single":
        again = trials
    else:
        again = [t for t in trials if t.state != TrialState.COMPLETED]
    if not again:
        raise Conflict(
            f"experiment {experiment_id} completed every trial; there is nothing to continue "
            "(fork it to train more)"
        )
    # Its trials enter the pool again: a pool since bound to other workspaces refuses them,
    # as it would refuse a new submit (work already queued keeps its place).
    project = await workspaces.get_project(session, experiment.project_id)
    workspace = await workspaces.get_workspace(session, project.workspace_id)
    await pool_bindings.refuse_unusable(
        session, experiment.resource_pool, workspace, "resources.resource_pool"
    )
    if override:
        config = _merged_config(experiment.config, override)
        if "bind_mounts" in override:
            archive = await session.scalar(
                select(ModelDefinitionModel.archive).where(
                    ModelDefinitionModel.experiment_id == experiment.id
                )
            )
            with config_errors_as_invalid_argument("overrideConfig"):
                await bind_mounts.check_bind_mounts(
                    session, experiment.resource_pool, config, archive or b""
                )
        experiment.config = config
        if "labels" in override:
            checked = labels.checked_labels(override["labels"], "overrideConfig.labels")
            labels.set_labels(experiment, checked)
        experiment.name = experiment.config.get("name") or experiment.name
        experiment.description = experiment.config.get("description") or ""
    reason = f"continued by {actor}"
    states.set_experiment_state(session, experiment, ExperimentState.ACTIVE, reason)
    experiment.end_time = None
    for trial in again:
        states.set_trial_state(session, trial, TrialState.QUEUED, reason)
        trial.restarts = 0
        trial.end_time = None
        trial.end_reason = ""
        allocations.enqueue_trial(session, trial, experiment)
    await session.flush()
    await trial_reports.refresh_experiment_progress(session, experiment.id)
    log.info(
        "experiment %s continued by %s: trials %s queued again",
        experiment_id,
        actor,
        ", ".join(str(t.id) for t in again),
    )
    return experiment


def _override(text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    with config_errors_as_invalid_argument("overrideConfig"):
        override = parse_yaml(text)
    for key in ("workspace", "project"):
        if key in override:
            raise InvalidArgument(
                f"overrideConfig.{key}: a continue runs where the experiment is; "
                "move the experiment first"
            )
    refuse_hidden_secrets(override, "overrideConfig")
    return override


def _merged_config(active: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """The override over the experiment's config, checked whole; the searcher stays single."""
    merged = merge_template(active, override)
    with config_errors_as_invalid_argument("overrideConfig"):
        validate_config(override, complete=False)  # an unknown key named at its own path
    with config_errors_as_invalid_argument("the continued experiment's config"):
        effective = effective_dict(validate_config(merged, complete=True))
    if effective["searcher"]["name"] != "single":
        raise InvalidArgument(
            "overrideConfig.searcher.name: a single-trial experiment stays single when continued"
        )
    return effective
