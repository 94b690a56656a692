"""Experiments: config merge and validation, seeds, trial creation and lifecycle actions."""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import yaml
from sqlalchemy import ColumnElement, Select, Table, bindparam, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.core import asha, images, launch, placement
from master.core.errors import ConfigError
from master.core.expconf import (
    DEEPSPEED_LAUNCHER,
    config_warnings,
    effective_dict,
    entrypoint_modules,
    parse_yaml,
    validate_config,
)
from master.core.merge import merge_template
from master.core.searcher import TrialPlan, count_trials, plan_trials
from master.core.seeds import MAX_EXPERIMENT_SEED
from master.core.text import unstorable
from master.db.models import (
    MAX_INT,
    AllocationModel,
    AllocationState,
    ExperimentModel,
    ExperimentState,
    ModelDefinitionModel,
    ProjectModel,
    TrialMetricModel,
    TrialModel,
    TrialState,
    UserModel,
    WorkspaceModel,
    utcnow,
)
from master.errors import Conflict, InvalidArgument, NotFound
from master.services import (
    access,
    allocations,
    bind_mounts,
    checkpoint_gc,
    labels,
    pool_bindings,
    release,
    search,
    states,
    trial_reports,
    workspaces,
)
from master.services.configs import config_errors_as_invalid_argument
from master.services.model_definitions import (
    PackedModelDefinition,
    pack_model_definition,
    read_text_file,
)
from master.services.scheduler import load_agent_states, policy_of
from master.services.templates import get_template, refuse_hidden_secrets
from master.settings import MasterSettings, ResourcePoolSettings
from resolute.storage import keep_hidden_secrets, mask_config

log = logging.getLogger(__name__)


@dataclass
class ExperimentRequest:
    config: Any  # YAML text (what Determined's client sends) or an already-parsed mapping
    template: str | None = None
    model_definition: Any = None
    activate: bool = True
    validate_only: bool = False
    project_id: int | None = None
    # A fork: the experiment it is made from, whose model definition it takes unless the
    # request brings its own (Determined's web UI forks with the config alone).
    parent_id: int | None = None


@dataclass
class PreparedExperiment:
    """Everything derived from a request before anything is written."""

    original_config: str
    effective_config: dict[str, Any]
    template_config: dict[str, Any] | None
    seed: int
    warnings: list[str]
    launch_warnings: list[str]
    model_definition: PackedModelDefinition
    trial_count: int
    resource_pool: str
    priority: int
    launch_reason: str
    project: ProjectModel
    workspace: WorkspaceModel


@dataclass
class ExperimentView:
    experiment: ExperimentModel
    username: str
    num_trials: int
    warnings: list[str] = field(default_factory=list)
    # Where it is kept: its project's name and owner, its workspace.
    project_name: str = ""
    project_owner_id: int | None = None
    workspace_id: int = 0
    workspace_name: str = ""


def _shown_text(original: str, submitted: dict[str, Any]) -> str:
    """The submitted text as it is stored and shown: where it holds a storage secret, the
    config dumped again with the secret masked (its comments are lost then)."""
    masked = mask_config(submitted)
    return original if masked == submitted else yaml.safe_dump(masked, sort_keys=False)


async def prepare_experiment(
    session: AsyncSession, request: ExperimentRequest, settings: MasterSettings, actor: access.Actor
) -> PreparedExperiment:
    """Parse, merge, validate, seed and pack; raises a 4xx error naming the path on bad input.
    What it names that `actor` may not read (parent, template, project, source checkpoint)
    is refused as if it did not exist."""
    if isinstance(request.config, str):
        original = request.config
        with config_errors_as_invalid_argument("config"):
            user_raw = parse_yaml(original)
    elif isinstance(request.config, dict):
        user_raw = request.config
        original = yaml.safe_dump(user_raw, sort_keys=False)
    else:
        raise InvalidArgument("config: must be the YAML text of an experiment config")
    parent = await _parent_of(session, request.parent_id, actor)
    if isinstance(user_raw, dict):  # otherwise refused by validate_config below
        if parent is not None:
            # A fork's config is the parent's as shown, secrets masked: each takes the
            # parent's value again.
            user_raw = keep_hidden_secrets(user_raw, parent.config)
        refuse_hidden_secrets(user_raw, "config")
        original = _shown_text(original, user_raw)

    with config_errors_as_invalid_argument("config"):
        # Checked alone first so an unknown key is reported at the user's own path.
        validate_config(user_raw, complete=False)

    template_config: dict[str, Any] | None = None
    merged = user_raw
    if request.template:
        await access.check_readable(session, actor, "template_name", request.template)
        template_config = (await get_template(session, request.template)).config
        merged = merge_template(template_config, user_raw)

    # Where it goes decides its default storage; the names were checked with the config.
    project = await workspaces.project_for_experiment(
        session,
        request.project_id,
        _text_or_none(merged, "workspace"),
        _text_or_none(merged, "project"),
        lambda kind, found: access.hidden(session, actor, kind, str(found)),
    )
    workspace = await workspaces.get_workspace(session, project.workspace_id)
    await access.require_experiment_creator(session, actor, workspace, project)
    if merged.get("checkpoint_storage") is None:
        # As Determined does, the workspace's storage (else the master's) goes into the
        # stored config, so the experiment keeps saying where its checkpoints are if the
        # default changes.
        storage = workspace.checkpoint_storage or settings.default_checkpoint_storage()
        merged = {**merged, "checkpoint_storage": dict(storage)}
    with config_errors_as_invalid_argument(
        "experiment config" + (" after the template merge" if template_config is not None else "")
    ):
        cfg = validate_config(merged, complete=True)
        effective = effective_dict(cfg)
        warnings = config_warnings(cfg)
        reproducibility = effective.setdefault("reproducibility", {})
        if reproducibility.get("experiment_seed") is None:
            # Determined uses the Unix time; a random draw cannot collide for two submits
            # in the same second.
            reproducibility["experiment_seed"] = secrets.randbelow(MAX_EXPERIMENT_SEED + 1)
        seed = int(reproducibility["experiment_seed"])
        trial_count = count_trials(effective["searcher"], effective.get("hyperparameters") or {})
    effective["labels"] = labels.checked_labels(effective.get("labels") or [], "labels")
    await trial_reports.check_source_checkpoint(
        session,
        effective["searcher"],
        lambda uuid: access.hidden(session, actor, "uuid", uuid),
    )
    resources = effective.setdefault("resources", {})
    pool = await pool_bindings.choose_pool(
        session,
        settings,
        workspace,
        resources.get("resource_pool"),
        int(resources.get("slots_per_trial", 1)),
    )
    defaults = settings.container_defaults(pool.pool_name)
    effective = images.with_default_image(effective, defaults.image, defaults.force_pull_image)
    if pool.require_image:
        problem = images.required_image_problem(effective, pool.pool_name)
        if problem:
            raise InvalidArgument(problem)
    # Written into the stored config, as Determined does, so it says where the trials ran.
    resources["resource_pool"] = pool.pool_name
    if resources.get("priority") is None:
        resources["priority"] = pool.scheduler.default_priority
    await refuse_multi_agent_deepspeed(session, pool, effective)
    capacity_problem = await capacity_problem_now(
        session,
        pool,
        int(resources.get("slots_per_trial", 1)),
        bool(resources.get("is_single_node", False)),
    )
    launch_warnings = []
    if capacity_problem is not None:
        warnings.append(f"the trials of this experiment cannot run yet: {capacity_problem.message}")
        # Determined's client prints this enum; it says the pool is too small as it is.
        launch_warnings.append("LAUNCH_WARNING_CURRENT_SLOTS_EXCEEDED")
    if trial_count > settings.max_trials_per_experiment:
        raise InvalidArgument(
            f"searcher: this search would create {trial_count} trials; the master allows at most "
            f"{settings.max_trials_per_experiment} (DET_MASTER_MAX_TRIALS_PER_EXPERIMENT)"
        )
    if parent is not None and not request.model_definition:
        packed = await parents_model_definition(session, parent.id)
    else:
        packed = pack_model_definition(
            request.model_definition, settings.max_model_definition_bytes
        )
    layout = choose_launch_layout(effective, packed)
    effective["launch_layout"] = layout.layout
    with config_errors_as_invalid_argument("experiment config"):
        await bind_mounts.check_bind_mounts(session, pool.pool_name, effective, packed.archive)
    return PreparedExperiment(
        original_config=original,
        effective_config=effective,
        template_config=template_config,
        seed=seed,
        warnings=warnings,
        launch_warnings=launch_warnings,
        model_definition=packed,
        trial_count=trial_count,
        resource_pool=pool.pool_name,
        priority=int(resources["priority"]),
        launch_reason=layout.reason,
        project=project,
        workspace=workspace,
    )


def _text_or_none(config: Any, key: str) -> str | None:
    value = config.get(key) if isinstance(config, dict) else None
    return value if isinstance(value, str) else None


async def _parent_of(
    session: AsyncSession, parent_id: int | None, actor: access.Actor
) -> ExperimentModel | None:
    if parent_id is None:
        return None
    parent = await session.get(ExperimentModel, parent_id)
    if parent is None or await access.hidden(session, actor, "experiment_id", str(parent_id)):
        raise InvalidArgument(f"parentId: experiment {parent_id} not found")
    return parent


async def parents_model_definition(session: AsyncSession, parent_id: int) -> PackedModelDefinition:
    found = (
        await session.scalars(
            select(ModelDefinitionModel).where(ModelDefinitionModel.experiment_id == parent_id)
        )
    ).one()  # stored with every experiment
    return PackedModelDefinition(found.archive, found.size_bytes, found.file_count)


def choose_launch_layout(
    effective: dict[str, Any], packed: PackedModelDefinition
) -> launch.LayoutChoice:
    """Resolve `launch_layout: auto` from the entrypoint and its script (stored, so the
    decision never changes under a running experiment)."""
    try:
        script = launch.entry_script(launch.entrypoint_argv(effective))
    except launch.LaunchError as exc:
        raise InvalidArgument(str(exc)) from None
    source = read_text_file(packed.archive, script) if script else None
    return launch.choose_layout(effective, source)


async def refuse_multi_agent_deepspeed(
    session: AsyncSession, pool: ResourcePoolSettings, effective: dict[str, Any]
) -> None:
    """determined.launch.deepspeed reaches the ranks on other agents over ssh, which
    bare-process agents do not run: refuse a trial that fits on none of the pool's known
    agents. With no agents known, accept (they may join later)."""
    if DEEPSPEED_LAUNCHER not in entrypoint_modules(effective.get("entrypoint")):
        return
    slots = int(effective["resources"].get("slots_per_trial", 1))
    by_pool = await load_agent_states(session, pool.pool_name, with_usage=False)
    agents = by_pool.get(pool.pool_name, [])
    if not agents:
        return
    largest = max(len(agent.slot_ids) for agent in agents)
    if slots <= largest:
        return
    message = (
        f"{slots} slots per trial fit on no agent of resource pool {pool.pool_name} (the "
        f"largest has {largest}), and {DEEPSPEED_LAUNCHER} across agents needs sshd between "
        "containers, which bare-process agents do not run; use at most "
        f"{largest} slots per trial, or determined.launch.torch_distributed"
    )
    raise InvalidArgument(
        f"resources.slots_per_trial: {message}",
        [{"path": "resources.slots_per_trial", "message": message}],
    )


async def capacity_problem_now(
    session: AsyncSession, pool: ResourcePoolSettings, slots: int, single_node: bool
) -> placement.Pending | None:
    """Why a trial cannot fit the pool as it is now, said at submit time (Determined only
    logs this at debug level). The trial is still queued: agents may join later. Read from
    the scheduler's in-memory view when it is loaded, else from the database."""
    view = allocations.current_view(session)
    if view is not None:
        agents = view.idle_agent_states(pool.pool_name)
    else:
        by_pool = await load_agent_states(session, pool.pool_name, with_usage=False)
        agents = by_pool.get(pool.pool_name, [])
    return placement.feasibility(policy_of(pool), agents, slots, single_node)


@dataclass
class NewExperiment:
    """An experiment ready to store: its row (every column but the id) and its trials."""

    row: dict[str, Any]
    model_definition: PackedModelDefinition
    plans: list[tuple[int | None, TrialPlan]]
    username: str
    warnings: list[str]
    template: str | None


async def create_experiment(
    session: AsyncSession,
    request: ExperimentRequest,
    owner: UserModel,
    settings: MasterSettings,
) -> tuple[ExperimentView | None, PreparedExperiment]:
    """Store the experiment and its planned trials; nothing is stored with validate_only."""
    prepared = await prepare_experiment(session, request, settings, access.Actor.of(owner))
    if request.validate_only:
        return None, prepared
    project, workspace = prepared.project, prepared.workspace
    [view] = await store_experiments(
        session, [new_experiment(request, prepared, owner, project.id)]
    )
    view.project_name, view.project_owner_id = project.name, project.user_id
    view.workspace_id, view.workspace_name = workspace.id, workspace.name
    return view, prepared


def new_experiment(
    request: ExperimentRequest, prepared: PreparedExperiment, owner: UserModel, project_id: int
) -> NewExperiment:
    """The rows of a prepared experiment, with its trials planned (no I/O)."""
    effective = prepared.effective_config
    searcher_state: dict[str, Any] | None = None
    try:
        if asha.is_asha(effective["searcher"]):
            # ASHA creates its first trials now and the rest as trials close.
            initial = search.initial_trials(effective, prepared.seed)
            plans: list[tuple[int | None, TrialPlan]] = list(initial.plans)
            searcher_state = initial.searcher_state
        else:
            plans = [
                (None, plan)
                for plan in plan_trials(
                    effective["searcher"], effective.get("hyperparameters") or {}, prepared.seed
                )
            ]
    except ConfigError as exc:  # count_trials accepted it, so this is a core bug
        raise InvalidArgument(f"invalid experiment config: {exc}") from exc
    row = {
        "name": effective.get("name") or "",
        "description": effective.get("description") or "",
        "state": ExperimentState.ACTIVE if request.activate else ExperimentState.PAUSED,
        "config": effective,
        "original_config": prepared.original_config,
        "template_name": request.template,
        "template_config": prepared.template_config,
        "experiment_seed": prepared.seed,
        "searcher_type": effective["searcher"]["name"],
        "resource_pool": prepared.resource_pool,
        "priority": prepared.priority,
        "owner_id": owner.id,
        "project_id": project_id,
        "job_id": str(uuid.uuid4()),
        "archived": False,
        "progress": None,
        "end_time": None,
        "launch_reason": prepared.launch_reason,
        "searcher_state": searcher_state,
        "labels": effective["labels"],
        "parent_id": request.parent_id,
    }
    return NewExperiment(
        row=row,
        model_definition=prepared.model_definition,
        plans=plans,
        username=owner.username,
        warnings=prepared.warnings,
        template=request.template,
    )


async def store_experiments(
    session: AsyncSession, news: Sequence[NewExperiment]
) -> list[ExperimentView]:
    """Store experiments, their model definitions, trials and queued allocations with a few
    statements for them all, whatever their number (Core, not the ORM's per-object work)."""
    if not news:
        return []
    now = utcnow()
    table = cast(Table, ExperimentModel.__table__)
    rows = [new.row | {"start_time": now} for new in news]
    ids = (
        await session.scalars(
            insert(table).returning(table.c.id, sort_by_parameter_order=True), rows
        )
    ).all()
    experiments = [ExperimentModel(id=i, **row) for i, row in zip(ids, rows, strict=True)]
    unnamed = [e for e in experiments if not e.name]
    for experiment in unnamed:
        experiment.name = f"Experiment {experiment.id}"
        experiment.config = {**experiment.config, "name": experiment.name}
    if unnamed:
        await session.execute(
            update(table)
            .where(table.c.id == bindparam("b_id"))
            .values(name=bindparam("b_name"), config=bindparam("b_config")),
            [{"b_id": e.id, "b_name": e.name, "b_config": e.config} for e in unnamed],
        )
    await session.execute(
        insert(cast(Table, ModelDefinitionModel.__table__)),
        [
            {
                "experiment_id": experiment.id,
                "archive": new.model_definition.archive,
                "size_bytes": new.model_definition.size_bytes,
                "file_count": new.model_definition.file_count,
            }
            for experiment, new in zip(experiments, news, strict=True)
        ],
    )
    created = [("experiment", e.id, e.state) for e in experiments]
    trial_ids = await search.add_trials_of(
        session, [(e, new.plans) for e, new in zip(experiments, news, strict=True)], created
    )
    views = []
    for experiment, new, trials in zip(experiments, news, trial_ids, strict=True):
        log.info(
            "created experiment %s (%s trials, seed %s, template %s) for %s",
            experiment.id,
            len(trials),
            experiment.experiment_seed,
            new.template or "-",
            new.username,
        )
        views.append(ExperimentView(experiment, new.username, len(trials), new.warnings))
    return views


def _trial_count() -> Any:
    """The number of trials, per row (one index lookup on trials by experiment)."""
    return (
        select(func.count())
        .where(TrialModel.experiment_id == ExperimentModel.id)
        .correlate(ExperimentModel)
        .scalar_subquery()
    )


def _views_query() -> Select[ExperimentModel, str, int, str, int | None, int, str]:
    return (
        select(
            ExperimentModel,
            UserModel.username,
            _trial_count(),
            ProjectModel.name,
            ProjectModel.user_id,
            WorkspaceModel.id,
            WorkspaceModel.name,
        )
        .join(UserModel, ExperimentModel.owner_id == UserModel.id)
        .join(ProjectModel, ExperimentModel.project_id == ProjectModel.id)
        .join(WorkspaceModel, ProjectModel.workspace_id == WorkspaceModel.id)
    )


def _view(row: Any) -> ExperimentView:
    experiment, username, trials, project, project_owner, ws_id, ws_name = row
    return ExperimentView(
        experiment,
        username,
        trials,
        project_name=project,
        project_owner_id=project_owner,
        workspace_id=ws_id,
        workspace_name=ws_name,
    )


async def get_experiment(session: AsyncSession, experiment_id: int) -> ExperimentView:
    row = (await session.execute(_views_query().where(ExperimentModel.id == experiment_id))).first()
    if row is None:
        raise NotFound(f"experiment {experiment_id} not found")
    return _view(row)


# Determined's names, and SORT_BY_SEARCHER_TYPE of ours (the dashboard's searcher column).
_SORT_COLUMNS: dict[str, Any] = {
    "SORT_BY_ID": ExperimentModel.id,
    "SORT_BY_START_TIME": ExperimentModel.start_time,
    "SORT_BY_NAME": ExperimentModel.name,
    "SORT_BY_STATE": ExperimentModel.state,
    "SORT_BY_SEARCHER_TYPE": ExperimentModel.searcher_type,
    "SORT_BY_NUM_TRIALS": _trial_count(),
    "SORT_BY_SEARCHER_METRIC_VAL": ExperimentModel.best_metric,
}
_NULLABLE_SORTS = ("SORT_BY_SEARCHER_METRIC_VAL",)
MAX_TEXT_FILTER = 256


def matches_text(text: str) -> Any:
    """Name or description containing `text` (case-insensitive), or the id it spells."""
    condition = ExperimentModel.name.icontains(text, autoescape=True) | (
        ExperimentModel.description.icontains(text, autoescape=True)
    )
    if text.isascii() and text.isdigit() and int(text) <= MAX_INT:
        condition = condition | (ExperimentModel.id == int(text))
    return condition


async def list_experiments(
    session: AsyncSession,
    *,
    offset: int,
    limit: int,
    archived: bool | None = None,
    usernames: Sequence[str] = (),
    states_filter: Sequence[ExperimentState] = (),
    name: str | None = None,
    text: str | None = None,
    searchers: Sequence[str] = (),
    with_labels: Sequence[str] = (),
    sort_by: str = "SORT_BY_ID",
    descending: bool = False,
    project_id: int | None = None,
    readable: ColumnElement[bool] | None = None,
) -> tuple[list[ExperimentView], int]:
    """A page of experiments and how many match. Experiments without a value of the sort
    column (no best metric yet) come last in either order. `with_labels`: those carrying
    every one of these labels, as Determined's `labels` filter. `readable`: the rows the
    caller may read (access.readable)."""
    column = _SORT_COLUMNS.get(sort_by)
    if column is None:
        raise InvalidArgument(f"sortBy: {sort_by!r} is not one of {', '.join(_SORT_COLUMNS)}")
    if text is not None and len(text) > MAX_TEXT_FILTER:
        raise InvalidArgument(f"text: at most {MAX_TEXT_FILTER} characters")
    conditions = [] if readable is None else [readable]
    if project_id:  # Determined's client sends 0 for "any project"
        await workspaces.get_project(session, project_id)  # 404 naming an unknown one
        conditions.append(ExperimentModel.project_id == project_id)
    if archived is not None:
        conditions.append(ExperimentModel.archived == archived)
    if usernames:
        conditions.append(UserModel.username.in_(list(usernames)))
    if states_filter:
        conditions.append(ExperimentModel.state.in_([str(s) for s in states_filter]))
    if name:
        conditions.append(ExperimentModel.name.contains(name, autoescape=True))
    if text:
        conditions.append(matches_text(text))
    if searchers:
        conditions.append(ExperimentModel.searcher_type.in_(list(searchers)))
    for label in dict.fromkeys(with_labels):
        conditions.append(labels.has_label(session, labels.checked_label(label, "labels")))
    # Counted without the trial counts: only the page's rows need them.
    total = (
        await session.scalar(
            select(func.count())
            .select_from(ExperimentModel)
            .join(UserModel, ExperimentModel.owner_id == UserModel.id)
            .where(*conditions)
        )
        or 0
    )
    order = column.desc() if descending else column.asc()
    if sort_by in _NULLABLE_SORTS:
        # Only there: NULLS LAST on a column without NULLs keeps Postgres off its index.
        order = order.nulls_last()
    query = (
        _views_query()
        .where(*conditions)
        .order_by(order, ExperimentModel.id.desc() if descending else ExperimentModel.id)
        .offset(offset)
    )
    if limit > 0:
        query = query.limit(limit)
    rows = (await session.execute(query)).all()
    return [_view(r) for r in rows], total


async def move_experiment(
    session: AsyncSession, actor: access.Actor, experiment_id: int, project_id: int
) -> None:
    """Moves the experiment, running or not, to another open project, one the actor may
    add experiments to; one that has not ended must be in a pool the destination's
    workspace may use, else a move would be a way into a pool bound to other workspaces."""
    experiment = await session.get(ExperimentModel, experiment_id)
    if experiment is None:
        raise NotFound(f"experiment {experiment_id} not found")
    destination = await session.get(ProjectModel, project_id)
    if destination is not None:
        if await access.hidden(session, actor, "project_id", str(project_id)):
            # As for one that does not exist (move_experiment_project's words).
            raise InvalidArgument(f"destinationProjectId: project {project_id} does not exist")
        workspace = await workspaces.get_workspace(session, destination.workspace_id)
        await access.require_experiment_creator(session, actor, workspace, destination)
    if destination is not None and not ExperimentState(experiment.state).is_terminal:
        # Checked before the move, which logs it (an unknown project is its refusal).
        workspace = await workspaces.get_workspace(session, destination.workspace_id)
        await pool_bindings.refuse_unusable(
            session, experiment.resource_pool, workspace, "destinationProjectId"
        )
    await workspaces.move_experiment_project(session, experiment, project_id)


async def move_project(
    session: AsyncSession, project_id: int, destination_id: int, actor: access.Actor
) -> None:
    """Moves the project to another workspace, one the actor may add projects to (as
    workspaces.move_project checks). Its experiments that have not ended keep
    their pools, so each of those pools must be one the destination may use, as for
    move_experiment: else moving a project would be a way into a pool bound to others."""
    destination = await session.get(WorkspaceModel, destination_id)
    if destination is not None:  # else move_project's refusal names it
        pools = await session.scalars(
            select(ExperimentModel.resource_pool)
            .where(
                ExperimentModel.project_id == project_id,
                ExperimentModel.state.not_in([str(s) for s in ExperimentState if s.is_terminal]),
            )
            .distinct()
        )
        for pool in sorted(set(pools)):
            await pool_bindings.refuse_unusable(
                session, pool, destination, "destinationWorkspaceId"
            )
    await workspaces.move_project(session, project_id, destination_id, actor)


async def list_trials(
    session: AsyncSession, experiment_id: int, *, offset: int, limit: int
) -> tuple[list[TrialModel], int]:
    await get_experiment(session, experiment_id)  # 404 for an unknown experiment
    where = TrialModel.experiment_id == experiment_id
    total = await session.scalar(select(func.count()).select_from(TrialModel).where(where)) or 0
    query = select(TrialModel).where(where).order_by(TrialModel.id).offset(offset)
    if limit > 0:
        query = query.limit(limit)
    return list((await session.scalars(query)).all()), total


@dataclass(frozen=True)
class PendingReason:
    code: str
    message: str
    blocking_job: int | None


async def pending_reasons(
    session: AsyncSession, trial_ids: Sequence[int]
) -> dict[int, PendingReason]:
    """Why each of these trials waits: those in the queue (as the last pass said), and
    placed ones that cannot start (the agent link says why)."""
    if not trial_ids:
        return {}
    rows = await session.execute(
        select(
            AllocationModel.trial_id,
            AllocationModel.pending_code,
            AllocationModel.pending_reason,
            AllocationModel.blocking_job,
        ).where(
            AllocationModel.trial_id.in_(list(trial_ids)),
            or_(
                AllocationModel.state == AllocationState.PENDING,
                AllocationModel.state.in_(allocations.HELD_STATES)
                & (AllocationModel.pending_code != ""),
            ),
        )
    )
    return {
        trial_id: PendingReason(code, message, blocking)
        for trial_id, code, message, blocking in rows.all()
        if trial_id is not None
    }


async def get_trial(session: AsyncSession, trial_id: int) -> TrialModel:
    trial = await session.get(TrialModel, trial_id)
    if trial is None:
        raise NotFound(f"trial {trial_id} not found")
    return trial


async def trial_runs(session: AsyncSession, trial_id: int) -> list[AllocationModel]:
    """The trial's allocations, first run first: each restart is a new one, and its
    `exit_reason` says why the run before it ended."""
    query = (
        select(AllocationModel)
        .where(AllocationModel.trial_id == trial_id)
        .order_by(AllocationModel.registered_at, AllocationModel.id)
    )
    return list((await session.scalars(query)).all())


async def _trials_of(session: AsyncSession, experiment_id: int) -> list[TrialModel]:
    query = select(TrialModel).where(TrialModel.experiment_id == experiment_id)
    return list((await session.scalars(query.order_by(TrialModel.id))).all())


async def kill_experiment(session: AsyncSession, experiment_id: int, actor: str) -> None:
    """Stop every trial now. Killing a finished experiment changes nothing, as in Determined."""
    await allocations.hold_scheduler(session, described=True)
    view = await get_experiment(session, experiment_id)
    experiment = view.experiment
    if ExperimentState(experiment.state).is_terminal:
        return
    reason = f"killed by {actor}"
    stopping: list[int] = []
    queued: list[int] = []
    for trial in await _trials_of(session, experiment_id):
        trial_state = TrialState(trial.state)
        if trial_state.holds_resources:
            # Its processes must exit first; the allocation's end moves it to CANCELED.
            states.set_trial_state(session, trial, TrialState.STOPPING_KILLED, reason)
            stopping.append(trial.id)
        elif not trial_state.is_terminal:
            states.set_trial_state(session, trial, TrialState.CANCELED, reason)
            queued.append(trial.id)
    await allocations.cancel_pending(session, queued, reason)
    await allocations.ask_to_stop(session, stopping, terminate=True)
    target = ExperimentState.STOPPING_KILLED if stopping else ExperimentState.CANCELED
    states.set_experiment_state(session, experiment, target, reason)
    await session.flush()
    if not stopping:  # otherwise each trial's release applies it
        await checkpoint_gc.apply_retention(session, experiment)


async def kill_trial(session: AsyncSession, trial_id: int, actor: str) -> TrialModel:
    """Stop one trial now, as Determined's KillTrial; its experiment goes on with the others
    (an ASHA search counts it as the worst of its next rung and may start another). Killing
    an ended or stopping trial changes nothing."""
    await allocations.hold_scheduler(session, described=True)
    trial = await get_trial(session, trial_id)
    current = TrialState(trial.state)
    if current.is_terminal or current in (TrialState.STOPPING_KILLED, TrialState.STOPPING_CANCELED):
        return trial
    reason = f"trial killed by {actor}"
    if current.holds_resources:
        # Its processes must exit first; the allocation's end moves it to CANCELED and
        # tells the searcher and the experiment (master.services.release).
        states.set_trial_state(session, trial, TrialState.STOPPING_KILLED, reason)
        await allocations.ask_to_stop(session, [trial.id], terminate=True)
        await session.flush()
        return trial
    states.set_trial_state(session, trial, TrialState.CANCELED, reason)
    await allocations.cancel_pending(session, [trial.id], reason)
    await session.flush()
    experiment = (await get_experiment(session, trial.experiment_id)).experiment
    await release.close_trial(session, trial, experiment)
    return trial


async def _pause_or_activate(
    session: AsyncSession,
    experiment_id: int,
    actor: str,
    *,
    target: ExperimentState,
    trials_from: TrialState,
    trials_to: TrialState,
) -> None:
    """Pause and activate mirror each other: the other one's state is the only valid start."""
    await allocations.hold_scheduler(session)
    experiment = (await get_experiment(session, experiment_id)).experiment
    current = ExperimentState(experiment.state)
    if current == target:
        return
    source = ExperimentState.ACTIVE if target == ExperimentState.PAUSED else ExperimentState.PAUSED
    verb = "paused" if target == ExperimentState.PAUSED else "activated"
    if current != source:
        raise Conflict(
            f"experiment {experiment_id} is {current}; only "
            f"{'an active' if source == ExperimentState.ACTIVE else 'a paused'} experiment "
            f"can be {verb}"
        )
    reason = f"{verb} by {actor}"
    states.set_experiment_state(session, experiment, target, reason)
    moved: list[int] = []
    running: list[int] = []
    for trial in await _trials_of(session, experiment_id):
        if TrialState(trial.state) == trials_from:
            states.set_trial_state(session, trial, trials_to, reason)
            moved.append(trial.id)
            if trials_to == TrialState.QUEUED:
                allocations.enqueue_trial(session, trial, experiment)
        elif TrialState(trial.state).holds_resources:
            running.append(trial.id)
    if target == ExperimentState.PAUSED:
        await allocations.cancel_pending(session, moved, reason)
        # Running trials checkpoint and stop; their release moves them to PAUSED.
        await allocations.ask_to_stop(session, running, terminate=False)
    await session.flush()


async def pause_experiment(session: AsyncSession, experiment_id: int, actor: str) -> None:
    await _pause_or_activate(
        session,
        experiment_id,
        actor,
        target=ExperimentState.PAUSED,
        trials_from=TrialState.QUEUED,
        trials_to=TrialState.PAUSED,
    )


async def activate_experiment(session: AsyncSession, experiment_id: int, actor: str) -> None:
    await _pause_or_activate(
        session,
        experiment_id,
        actor,
        target=ExperimentState.ACTIVE,
        trials_from=TrialState.PAUSED,
        trials_to=TrialState.QUEUED,
    )


async def get_experiment_by_job(session: AsyncSession, job_id: str) -> ExperimentModel:
    experiment = await session.scalar(
        select(ExperimentModel).where(ExperimentModel.job_id == job_id)
    )
    if experiment is None:
        raise NotFound(f"job {job_id} not found")
    return experiment


async def set_job_priority(
    session: AsyncSession, job_id: str, priority: int, actor: str
) -> ExperimentModel:
    """Takes effect at the next scheduling pass (queued trials move in the queue)."""
    if not 1 <= priority <= 99:
        raise InvalidArgument(f"priority: {priority} is not between 1 and 99")
    await allocations.hold_scheduler(session)
    experiment = await get_experiment_by_job(session, job_id)
    _refuse_final_priority(experiment, f"job {job_id}")
    _set_priority(experiment, priority)
    log.info("job %s (experiment %s) priority -> %s by %s", job_id, experiment.id, priority, actor)
    return experiment


@dataclass(frozen=True)
class JobUpdate:
    """One of Determined's QueueControl entries, as the wire gave it."""

    job_id: str
    priority: int | None = None
    weight: float | None = None
    resource_pool: str | None = None
    reorders: bool = False  # aheadOf or behindOf


async def update_jobs(
    session: AsyncSession,
    actor: access.Actor,
    updates: Sequence[JobUpdate],
    settings: MasterSettings,
) -> None:
    """`det job update`: each update's priority, weight and pool, checked before it is
    applied; the caller's transaction makes a refused request change nothing."""
    for index, change in enumerate(updates):
        where = f"updates[{index}]"
        if change.reorders:
            raise InvalidArgument(
                f"{where}: aheadOf and behindOf are not supported; order jobs by priority"
            )
        if change.priority is None and change.weight is None and change.resource_pool is None:
            raise InvalidArgument(f"{where}: job {change.job_id}: nothing to change")
        if change.weight is not None and not change.weight > 0:
            raise InvalidArgument(f"{where}.weight: {change.weight} must be greater than 0")
        # Before any experiment's row, in the order kill and pause take them (the weight's
        # change locks the row): else the two could deadlock on Postgres.
        await allocations.hold_scheduler(session)
        await access.require_job_owner(
            session, actor, change.job_id, "change its place in the queue"
        )
        if change.priority is not None:
            await set_job_priority(session, change.job_id, change.priority, actor.username)
        if change.weight is not None:
            await set_job_weight(session, change.job_id, change.weight, actor.username)
        if change.resource_pool is not None:
            await set_job_resource_pool(
                session,
                change.job_id,
                change.resource_pool,
                settings,
                actor.username,
                f"{where}.resourcePool",
            )


async def set_job_weight(session: AsyncSession, job_id: str, weight: float, actor: str) -> None:
    """Determined's `det job update --weight`: the experiment's resources.weight, as `det e
    set weight` sets it (stored; there is no fair share between jobs yet, which the
    submit's warning says)."""
    experiment = await get_experiment_by_job(session, job_id)
    await patch_experiment(
        session, experiment.id, ExperimentPatch(resources={"weight": weight}), actor
    )


async def set_job_resource_pool(
    session: AsyncSession,
    job_id: str,
    pool_name: str,
    settings: MasterSettings,
    actor: str,
    field: str = "resourcePool",
) -> ExperimentModel:
    """Determined's `det job update --resource-pool`: the job's queued trials wait in the new
    pool from the next pass, and its running ones are asked to stop (checkpoint and exit,
    as a preemption, so no restart is counted) and queue there, as Determined terminates
    them. Trials that start later (activated, continued, restarted) start there too."""
    pool = pool_bindings.known_pool(settings, pool_name, field)
    await allocations.hold_scheduler(session)
    experiment = await get_experiment_by_job(session, job_id)
    if ExperimentState(experiment.state).is_terminal:
        raise Conflict(f"job {job_id} has ended ({experiment.state}); its resource pool is final")
    if experiment.resource_pool == pool.pool_name:
        return experiment
    project = await workspaces.get_project(session, experiment.project_id)
    workspace = await workspaces.get_workspace(session, project.workspace_id)
    await pool_bindings.refuse_unusable(session, pool.pool_name, workspace, field)
    before = experiment.resource_pool
    experiment.resource_pool = pool.pool_name
    _set_config_keys(experiment, "resources", {"resource_pool": pool.pool_name})
    trial_ids = list(
        await session.scalars(
            select(TrialModel.id).where(TrialModel.experiment_id == experiment.id)
        )
    )
    await session.execute(
        update(AllocationModel)
        .where(
            AllocationModel.trial_id.in_(trial_ids),
            AllocationModel.state == AllocationState.PENDING,
        )
        .values(resource_pool=pool.pool_name)
        .execution_options(synchronize_session=False)
    )
    asked = await allocations.ask_to_stop(session, trial_ids, terminate=False)
    await session.flush()
    log.info(
        "job %s (experiment %s) moved from pool %s to %s by %s; %d running trials asked to stop",
        job_id,
        experiment.id,
        before,
        pool.pool_name,
        actor,
        len(asked),
    )
    return experiment


def _refuse_final_priority(experiment: ExperimentModel, what: str) -> None:
    if ExperimentState(experiment.state).is_terminal:
        raise Conflict(f"{what} has ended ({experiment.state}); its priority is final")


def _set_priority(experiment: ExperimentModel, priority: int) -> None:
    experiment.priority = priority
    _set_config_keys(experiment, "resources", {"priority": priority})


def _set_config_keys(experiment: ExperimentModel, section: str, values: dict[str, Any]) -> None:
    """The experiment's config with `values` set in its `section` (a new dict, so the JSON
    column sees the change)."""
    experiment.config = {
        **experiment.config,
        section: {**(experiment.config.get(section) or {}), **values},
    }


# -- changing an experiment's name, description and labels ----------------------------------

MAX_NAME_CHARS = 512  # as the config's name
MAX_DESCRIPTION_CHARS = 65536


@dataclass(frozen=True)
class ExperimentPatch:
    """Determined's PatchExperiment as far as resolute keeps it; None leaves a field as is.
    Values are as the request sent them, checked by patch_experiment (the route's schema
    has already checked the ranges of `resources` and `retention`)."""

    name: str | None = None
    description: str | None = None
    labels: Any = None
    # `resources` keys of the config: priority, weight, max_slots.
    resources: dict[str, Any] = field(default_factory=dict)
    # `checkpoint_storage` retention keys: save_experiment_best, save_trial_best, ...
    retention: dict[str, int] = field(default_factory=dict)


def _checked_text(value: str, where: str, limit: int, *, blank_ok: bool) -> str:
    if not blank_ok and not value.strip():
        raise InvalidArgument(f"{where}: must not be empty")
    if len(value) > limit:
        raise InvalidArgument(f"{where}: is {len(value)} characters long; at most {limit}")
    if unstorable(value):
        raise InvalidArgument(f"{where}: holds a NUL character or a lone surrogate")
    return value


async def experiment_for_update(session: AsyncSession, experiment_id: int) -> ExperimentModel:
    """The experiment's row, locked against a concurrent change on Postgres (SQLite has a
    single writer), so two label changes never lose one another."""
    experiment = await session.scalar(
        select(ExperimentModel).where(ExperimentModel.id == experiment_id).with_for_update()
    )
    if experiment is None:
        raise NotFound(f"experiment {experiment_id} not found")
    return experiment


async def patch_experiment(
    session: AsyncSession, experiment_id: int, patch: ExperimentPatch, actor: str
) -> ExperimentView:
    """Every field is checked before any is applied, so a refused patch changes nothing.
    Values the experiment has already pass as they are: Determined's client sends back
    what it read, and an old label or name must not block the change the user asked for."""
    if "priority" in patch.resources or "max_slots" in patch.resources:
        # Before the experiment's row, in the order kill and pause take them. Queued trials
        # move in the queue, or meet another cap: the scheduler reads it afresh after this
        # commit.
        await allocations.hold_scheduler(session)
    experiment = await experiment_for_update(session, experiment_id)
    name = description = new_labels = None
    if patch.name is not None and patch.name != experiment.name:
        name = _checked_text(patch.name, "name", MAX_NAME_CHARS, blank_ok=False)
    if patch.description is not None and patch.description != experiment.description:
        description = _checked_text(
            patch.description, "description", MAX_DESCRIPTION_CHARS, blank_ok=True
        )
    if patch.labels is not None:
        checked = labels.checked_labels(patch.labels, "labels", kept=experiment.labels)
        new_labels = checked if checked != experiment.labels else None
    resources = experiment.config.get("resources") or {}
    new_resources = {k: v for k, v in patch.resources.items() if resources.get(k) != v}
    storage = experiment.config.get("checkpoint_storage") or {}
    new_retention = {k: v for k, v in patch.retention.items() if storage.get(k) != v}
    if "priority" in new_resources:
        _refuse_final_priority(experiment, f"experiment {experiment_id}")
    if new_resources.get("max_slots") is not None:
        slots = int(resources.get("slots_per_trial", 1))
        if new_resources["max_slots"] < slots:
            raise InvalidArgument(
                f"resources.max_slots: {new_resources['max_slots']} is below "
                f"resources.slots_per_trial ({slots}): no trial could ever start"
            )
    changed = []
    if name is not None:
        experiment.name = name
        experiment.config = {**experiment.config, "name": name}
        changed.append("name")
    if description is not None:
        experiment.description = description
        experiment.config = {**experiment.config, "description": description}
        changed.append("description")
    if new_labels is not None:
        labels.set_labels(experiment, new_labels)
        changed.append("labels")
    if new_resources:
        if "priority" in new_resources:
            _set_priority(experiment, new_resources["priority"])
        _set_config_keys(experiment, "resources", new_resources)
        changed.extend(f"resources.{key}={value}" for key, value in new_resources.items())
    if new_retention:
        _set_config_keys(experiment, "checkpoint_storage", new_retention)
        changed.extend(f"checkpoint_storage.{key}={value}" for key, value in new_retention.items())
    if changed:
        await session.flush()
        log.info("experiment %s: %s changed by %s", experiment_id, ", ".join(changed), actor)
    if new_retention:
        # Applied at once, as Determined's gc-policy is: what the new settings no longer
        # keep, among the checkpoints of ended trials, is deleted now.
        await checkpoint_gc.apply_retention(session, experiment)
    return await get_experiment(session, experiment_id)


async def set_archived(
    session: AsyncSession, experiment_id: int, archived: bool, actor: str
) -> None:
    """Archive (or bring back) an ended experiment: archived ones leave the default lists.
    Archiving an archived one changes nothing."""
    experiment = await experiment_for_update(session, experiment_id)
    if experiment.archived == archived:
        return
    if archived and not ExperimentState(experiment.state).is_terminal:
        raise Conflict(
            f"experiment {experiment_id} is {experiment.state}: only an ended experiment "
            "can be archived (kill it or wait for it to end)"
        )
    experiment.archived = archived
    await session.flush()
    log.info(
        "experiment %s %s by %s", experiment_id, "archived" if archived else "unarchived", actor
    )


async def add_label(session: AsyncSession, experiment_id: int, label: str, actor: str) -> list[str]:
    """The experiment's labels after adding `label` (at the end; a label it has stays put)."""
    experiment = await experiment_for_update(session, experiment_id)
    new_labels = labels.with_label(experiment, label)
    if new_labels != experiment.labels:
        labels.set_labels(experiment, new_labels)
        log.info("experiment %s: label %r added by %s", experiment_id, label, actor)
    return new_labels


async def remove_label(
    session: AsyncSession, experiment_id: int, label: str, actor: str
) -> list[str]:
    """The experiment's labels after removing `label`; removing one it lacks changes nothing."""
    experiment = await experiment_for_update(session, experiment_id)
    new_labels = [kept for kept in experiment.labels if kept != label]
    if new_labels != experiment.labels:
        labels.set_labels(experiment, new_labels)
        log.info("experiment %s: label %r removed by %s", experiment_id, label, actor)
    return new_labels


# -- what Determined's Python SDK reads ------------------------------------------------------

METRICS_POLL_INTERVAL_S = 1.0
METRICS_BATCH = 1000


async def model_definition_archive(session: AsyncSession, experiment_id: int) -> bytes:
    """The experiment's files as the tar.gz it was created with (Experiment.download_code)."""
    await get_experiment(session, experiment_id)
    row = await session.get(ModelDefinitionModel, experiment_id)
    return row.archive if row is not None else b""


async def check_trials_exist(
    session: AsyncSession, trial_ids: Sequence[int], readable: ColumnElement[bool] | None = None
) -> None:
    """Each trial exists (and is of an experiment the caller may read: `readable`)."""
    if not trial_ids:
        raise InvalidArgument("trialIds: name at least one trial")
    query = select(TrialModel.id).where(TrialModel.id.in_(trial_ids))
    if readable is not None:
        query = query.join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id).where(
            readable
        )
    found = set((await session.scalars(query)).all())
    missing = sorted(set(trial_ids) - found)
    if missing:
        raise NotFound(f"trial {missing[0]} not found")


async def stream_trial_metrics(
    factory: async_sessionmaker[AsyncSession],
    trial_ids: Sequence[int],
    group: str,
    *,
    poll_interval: float = METRICS_POLL_INTERVAL_S,
    batch_size: int = METRICS_BATCH,
) -> AsyncIterator[list[TrialMetricModel]]:
    """The trials' reports of one group in the order they arrived, each batch read in a short
    session of its own; then, as Determined's GetMetrics does, new reports until every trial
    has ended and a read made after seeing that found nothing more. A report that replaces an
    earlier one of the same step (a rerun after a restart) keeps its place and is not resent."""
    last_id = 0
    finished = False
    while True:
        async with factory() as session:
            if not finished:  # read before the rows: a report stored before the end shows up
                trial_states = await session.scalars(
                    select(TrialModel.state).where(TrialModel.id.in_(trial_ids))
                )
                finished = all(TrialState(state).is_terminal for state in trial_states)
            rows = list(
                (
                    await session.scalars(
                        select(TrialMetricModel)
                        .where(
                            TrialMetricModel.trial_id.in_(trial_ids),
                            TrialMetricModel.group_name == group,
                            TrialMetricModel.id > last_id,
                        )
                        .order_by(TrialMetricModel.id)
                        .limit(batch_size)
                    )
                ).all()
            )
        if rows:
            yield rows
            last_id = rows[-1].id
        if len(rows) == batch_size:
            continue
        if finished:
            return
        await asyncio.sleep(poll_interval)
