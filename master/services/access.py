"""Who may do what: admins everything, users their own experiments, templates and jobs, a
run's task token only its own trial's routes, and a user holding a role in a workspace
(master.core.roles, `det rbac assign-role`) what the role's permissions give there: an
Editor changes anyone's experiments in it, a WorkspaceAdmin the workspace and its projects.

Reading (security.authz.type): with `rbac`, the default, a user sees what is in the
workspaces they own or hold a viewing role in, the shared built-in workspace and their own
work; anything else answers 404 exactly as if it did not exist (check_sight, for the path;
Sight, for lists). With `basic` (Determined's open-source rule) anyone signed in reads
everything. Changing something is refused (403) naming the owner and the permission, so a
refused user knows whom to ask. The checks are called by the API routes and the dashboard's
forms alike, before the service that changes anything. The owner's and the admin's cases
are decided without reading roles.
"""

from __future__ import annotations

import secrets
import uuid as uuidlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import ColumnElement, Select, literal, or_, select, true
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import QueryableAttribute

from master.core import roles
from master.core.text import unstorable
from master.db.models import (
    MAX_INT,
    AccessStateModel,
    AllocationModel,
    CheckpointModel,
    ExperimentModel,
    ModelModel,
    ProjectModel,
    RoleAssignmentModel,
    TaskModel,
    TemplateModel,
    TrialModel,
    UserGroupMemberModel,
    UserModel,
    WebhookModel,
    WorkspaceModel,
)
from master.errors import NotFound, PermissionDenied

# session.info keys set by auth.user_for_token: the token's kind and, for a task token,
# the one trial it serves.
TOKEN_KIND = "token_kind"
TOKEN_TRIAL_ID = "token_trial_id"
TASK = "task"
# session.info key set for each request (deps.get_session): True where every signed-in user
# reads everything (security.authz.type basic). Absent: workspaces are kept apart.
OPEN_READING = "open_reading"
# session.info keys: the access generation the request's token check read (ACCESS_GENERATION,
# auth.user_for_token; None where the database has no access_state row) and the master's
# SightCache (SHARED_SIGHTS, deps.get_session).
ACCESS_GENERATION = "access_generation"
SHARED_SIGHTS = "shared_sights"

# Routes without an object in their path that a run's ranks call (Determined's harness
# and the resolute library): what they report names its trial in the body, and the
# route checks it (trial_reports.trial_for_report).
_TASK_ROUTES_WITHOUT_SCOPE = {
    ("GET", "/api/v1/me"),
    ("GET", "/api/v1/master"),
    ("POST", "/api/v1/checkpoints"),
    ("POST", "/api/v1/runs/start"),
    ("POST", "/api/v1/webhooks/custom"),
    ("POST", "/api/v1/auth/logout"),
    # Batch inference: the trial says which checkpoint or model version it used.
    ("POST", "/api/v1/trial-source-info"),
}
# Path parameters that name something a task token may reach when it is its own trial's.
_SCOPED_PARAMETERS = ("trial_id", "run_id", "experiment_id", "allocation_id", "task_id")


@dataclass(frozen=True)
class Actor:
    """The signed-in user, as plain values (a refused form rolls back and expires rows)."""

    user_id: int
    username: str
    admin: bool

    @classmethod
    def of(cls, user: UserModel) -> Actor:
        return cls(user_id=user.id, username=user.username, admin=user.admin)


_GRANTS = "role_grants"  # session.info: users' grants, read once per request


def assigned_to(user_id: int) -> Select[int, int | None, int | None, int | None]:
    """The role assignments a user holds, directly or through their groups: role id,
    workspace id, and the user's or the group's id, in the order they were made."""
    groups = select(UserGroupMemberModel.group_id).where(UserGroupMemberModel.user_id == user_id)
    return (
        select(
            RoleAssignmentModel.role_id,
            RoleAssignmentModel.workspace_id,
            RoleAssignmentModel.user_id,
            RoleAssignmentModel.group_id,
        )
        .where(
            or_(RoleAssignmentModel.user_id == user_id, RoleAssignmentModel.group_id.in_(groups))
        )
        .order_by(RoleAssignmentModel.id)
    )


async def grants_of(session: AsyncSession, user_id: int) -> list[roles.Grant]:
    """The roles a user holds, directly or through their groups (not ClusterAdmin, which is
    the admin flag: callers check it first). Read once per request."""
    cached: dict[int, list[roles.Grant]] = session.info.setdefault(_GRANTS, {})
    if user_id not in cached:
        rows = await session.execute(assigned_to(user_id))
        cached[user_id] = [roles.Grant(role_id, ws) for role_id, ws, _, _ in rows.all()]
    return cached[user_id]


def forget_grants(session: AsyncSession) -> None:
    """After a change of assignments, the next check reads them again (and this request
    no longer trusts the generation it read before its change)."""
    session.info.pop(_GRANTS, None)
    session.info.pop(_SIGHTS, None)
    session.info.pop(ACCESS_GENERATION, None)


async def may(
    session: AsyncSession, actor: Actor, permission: int, workspace_id: int | None
) -> bool:
    """Whether the actor holds `permission` in the workspace (admins hold every one)."""
    if actor.admin:
        return True
    return roles.holds(await grants_of(session, actor.user_id), permission, workspace_id)


async def may_anywhere(session: AsyncSession, actor: Actor, permission: int) -> bool:
    if actor.admin:
        return True
    return roles.holds_anywhere(await grants_of(session, actor.user_id), permission)


# --- reading ------------------------------------------------------------------------------

_SIGHTS = "sights"  # session.info: each permission's Sight for the request's user


@dataclass(frozen=True)
class Sight:
    """What one user may read of one kind of thing: everything, or what is in the listed
    workspaces, and their own."""

    everything: bool
    workspace_ids: frozenset[int] = frozenset()
    user_id: int | None = None

    def sees(self, workspace_id: int | None, owner_id: int | None = None) -> bool:
        return (
            self.everything
            or workspace_id in self.workspace_ids
            or (owner_id is not None and owner_id == self.user_id)
        )

    def clause(
        self, workspace: QueryableAttribute[Any], owner: QueryableAttribute[Any] | None = None
    ) -> ColumnElement[bool]:
        """The SQL condition of sees() for a list's query."""
        if self.everything:
            return true()
        seen = workspace.in_(sorted(self.workspace_ids))
        return seen if owner is None else or_(seen, owner == self.user_id)


EVERYTHING = Sight(everything=True)


async def ensure_access_state(session: AsyncSession) -> None:
    """The generation's row (migration 0031 makes it; without it nothing is cached), from a
    random start as there: a value a master's cache knew never comes back with other data."""
    if await session.get(AccessStateModel, 1) is None:
        session.add(AccessStateModel(id=1, generation=secrets.randbelow(2**62)))
        await session.flush()


class SightCache:
    """Each user's Sights across requests, valid for one access generation (access_state,
    which triggers change with every write to roles, groups and workspaces' owners): a
    user's list needs no statement of its own but the token check, which reads the
    generation with the token. One per master process."""

    def __init__(self) -> None:
        self._generation: int | None = None
        self._sights: dict[tuple[int, int], Sight] = {}

    def get(self, generation: int, user_id: int, permission: int) -> Sight | None:
        if generation != self._generation:
            return None
        return self._sights.get((user_id, permission))

    def put(self, generation: int, user_id: int, permission: int, found: Sight) -> None:
        """`found` was read after `generation` was: if the generation has moved on since,
        the next request's differs and finds nothing stored under it."""
        if generation != self._generation:
            self._generation, self._sights = generation, {}
        self._sights[user_id, permission] = found


def reads_everything(session: AsyncSession, actor: Actor) -> bool:
    return actor.admin or bool(session.info.get(OPEN_READING))


async def sight(session: AsyncSession, actor: Actor, permission: int) -> Sight:
    """Where the actor reads what `permission` (a VIEW_ one) covers: everywhere for admins,
    under open reading and for a cluster-wide grant; else the workspaces where a role gives
    it, the ones the actor owns, and the built-in one everyone shares. Once per request."""
    if reads_everything(session, actor):
        return EVERYTHING
    cached: dict[tuple[int, int], Sight] = session.info.setdefault(_SIGHTS, {})
    if (actor.user_id, permission) in cached:
        return cached[actor.user_id, permission]
    shared: SightCache | None = session.info.get(SHARED_SIGHTS)
    generation: int | None = session.info.get(ACCESS_GENERATION)
    found = None
    if shared is not None and generation is not None:
        found = shared.get(generation, actor.user_id, permission)
    if found is None:
        grants, own = await _grants_and_own_workspaces(session, actor.user_id)
        if roles.holds(grants, permission, None):
            found = EVERYTHING
        else:
            ids = own | roles.workspaces_giving(grants, permission)
            found = Sight(everything=False, workspace_ids=frozenset(ids), user_id=actor.user_id)
        if shared is not None and generation is not None:
            shared.put(generation, actor.user_id, permission, found)
    cached[actor.user_id, permission] = found
    return found


_OWN_WORKSPACES = "own_workspaces"  # session.info: the user's workspaces and the shared one
_OWN = 0  # no role has this id: the rows of _grants_and_own_workspaces that are not grants


async def _grants_and_own_workspaces(
    session: AsyncSession, user_id: int
) -> tuple[list[roles.Grant], set[int]]:
    """The user's grants (as grants_of) and the workspaces they created or everyone shares:
    one statement for both, since every list under rbac needs them."""
    owned: dict[int, set[int]] = session.info.setdefault(_OWN_WORKSPACES, {})
    if user_id in owned and user_id in session.info.get(_GRANTS, {}):
        return session.info[_GRANTS][user_id], owned[user_id]
    assigned = (
        assigned_to(user_id)
        .order_by(None)
        .with_only_columns(RoleAssignmentModel.role_id, RoleAssignmentModel.workspace_id)
    )
    workspaces = select(literal(_OWN), WorkspaceModel.id).where(
        or_(WorkspaceModel.user_id == user_id, WorkspaceModel.immutable)
    )
    rows = (await session.execute(assigned.union_all(workspaces))).all()
    grants = [roles.Grant(role_id, ws) for role_id, ws in rows if role_id != _OWN]
    own = {ws for role_id, ws in rows if role_id == _OWN and ws is not None}
    session.info.setdefault(_GRANTS, {})[user_id] = grants
    owned[user_id] = own
    return grants, own


async def sees(
    session: AsyncSession,
    actor: Actor,
    permission: int,
    workspace_id: int | None,
    owner_id: int | None = None,
) -> bool:
    if reads_everything(session, actor):
        return True
    return (await sight(session, actor, permission)).sees(workspace_id, owner_id)


Listed = Literal[
    "experiments", "tasks", "allocations", "templates", "models", "workspaces", "projects"
]


async def readable(
    session: AsyncSession, actor: Actor, kind: Listed, project_id: int | None = None
) -> ColumnElement[bool]:
    """The condition a list's rows of `kind` meet when the actor may read them (the
    allocations' query joins experiments and tasks). `project_id`: the list is of that
    project's experiments only."""
    if reads_everything(session, actor):
        return true()
    if kind in ("experiments", "allocations"):
        seen = await sight(session, actor, roles.VIEW_EXPERIMENT_METADATA)
        if kind == "experiments" and project_id is not None:
            project = await session.get(ProjectModel, project_id)
            if project is not None and seen.sees(project.workspace_id):
                return true()  # every experiment in it: no test per row
        projects = select(ProjectModel.id).where(seen.clause(ProjectModel.workspace_id))
        in_project = ExperimentModel.project_id.expression
        owned_by = ExperimentModel.owner_id.expression
        if session.get_bind().dialect.name == "sqlite":
            # SQLite takes an OR of two indexed columns as a MULTI-INDEX OR, then sorts all
            # it found for the page (5x the time for 50 of 10,000); as expressions they are
            # read from a covering index: the count's from ix_experiments_project_id_owner_id,
            # and the page walks ix_experiments_id_project_id_owner_id in id order until its
            # LIMIT, reading only the rows it keeps (the table's rows, configs and all,
            # cost 1.6x as much to test).
            in_project, owned_by = in_project + 0, owned_by + 0
        experiments = or_(in_project.in_(projects), owned_by == actor.user_id)
        if kind == "experiments":
            return experiments
        return or_(experiments, await readable(session, actor, "tasks"))
    permission, workspace, owner = {
        "tasks": (roles.VIEW_NSC, TaskModel.workspace_id, TaskModel.owner_id),
        "templates": (roles.VIEW_TEMPLATES, TemplateModel.workspace_id, TemplateModel.owner_id),
        "models": (roles.VIEW_MODEL_REGISTRY, ModelModel.workspace_id, ModelModel.owner_id),
        "workspaces": (roles.VIEW_WORKSPACE, WorkspaceModel.id, WorkspaceModel.user_id),
        "projects": (roles.VIEW_PROJECT, ProjectModel.workspace_id, ProjectModel.user_id),
    }[kind]
    return (await sight(session, actor, permission)).clause(workspace, owner)


@dataclass(frozen=True)
class _Located:
    permission: int
    workspace_id: int | None
    owner_id: int | None


_ROUTE_INT = TypeAdapter(int)


def _as_id(value: str) -> int | None:
    """A path's id as the int the route will take (FastAPI parses it with pydantic, which
    takes "7.0", "+7" and "007" for 7), or None for one it will refuse itself."""
    try:
        number = _ROUTE_INT.validate_python(value)
    except ValidationError:
        return None
    return number if 0 <= number <= MAX_INT else None


def _as_uuid(value: str) -> str | None:
    """A checkpoint's uuid as the routes look it up (any spelling uuid.UUID takes, stored
    lowercase), or None for what is not one."""
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        return None


_EXPERIMENT_PLACE = select(ProjectModel.workspace_id, ExperimentModel.owner_id).join(
    ProjectModel, ProjectModel.id == ExperimentModel.project_id
)


async def _experiment_place(session: AsyncSession, experiment_id: int | None) -> _Located | None:
    if experiment_id is None:
        return None
    place = _EXPERIMENT_PLACE.where(ExperimentModel.id == experiment_id)
    return await _located(session, roles.VIEW_EXPERIMENT_METADATA, place)


async def _trial_place(session: AsyncSession, value: str) -> _Located | None:
    trial_id = _as_id(value)
    if trial_id is None:
        return None
    experiment_id = await session.scalar(
        select(TrialModel.experiment_id).where(TrialModel.id == trial_id)
    )
    return await _experiment_place(session, experiment_id)


async def _task_place(session: AsyncSession, task: TaskModel | None) -> _Located | None:
    if task is None:
        return None
    return _Located(roles.VIEW_NSC, task.workspace_id, task.owner_id)


async def _task_id_place(session: AsyncSession, value: str) -> _Located | None:
    """A task id is a trial's ("<experiment id>.<request id>") or a command's uuid."""
    if unstorable(value):  # nothing has such an id; Postgres would refuse to look
        return None
    experiment, dot, request_id = value.partition(".")
    # logs.get_task_target's rule for a trial's task id.
    if dot and experiment.isascii() and experiment.isdigit() and len(experiment) <= 10:
        experiment_id = await session.scalar(
            select(TrialModel.experiment_id).where(
                TrialModel.experiment_id == int(experiment), TrialModel.request_id == request_id
            )
        )
        if experiment_id is not None:
            return await _experiment_place(session, experiment_id)
    task = await session.scalar(select(TaskModel).where(TaskModel.uuid == value))
    return await _task_place(session, task)


async def _allocation_place(session: AsyncSession, value: str) -> _Located | None:
    if unstorable(value):
        return None
    row = (
        await session.execute(
            select(AllocationModel.experiment_id, AllocationModel.task_id).where(
                AllocationModel.id == value
            )
        )
    ).first()
    if row is None:
        return None
    experiment_id, task_id = row
    if experiment_id is not None:
        return await _experiment_place(session, experiment_id)
    return await _task_place(session, await session.get(TaskModel, task_id) if task_id else None)


async def _checkpoint_place(session: AsyncSession, value: str) -> _Located | None:
    uuid = _as_uuid(value)
    if uuid is None:
        return None
    experiment_id = await session.scalar(
        select(CheckpointModel.experiment_id).where(CheckpointModel.uuid == uuid)
    )
    return await _experiment_place(session, experiment_id)


_KEPT = "kept_for_the_request"  # session.info


def _keep(session: AsyncSession, row: object) -> None:
    """Holds a row a check loaded until the request ends: the session's identity map holds
    rows weakly, and the route's own lookup of it then needs no statement."""
    session.info.setdefault(_KEPT, []).append(row)


async def _located(
    session: AsyncSession, permission: int, place: Select[int | None, int | None]
) -> _Located | None:
    """The first row of `place` (a workspace id and an owner id), or None."""
    row = (await session.execute(place)).first()
    return None if row is None else _Located(permission, *row)


async def _workspace_place(session: AsyncSession, value: str) -> _Located | None:
    workspace_id = _as_id(value)
    if workspace_id is None:
        return None
    # The row, not two columns: the route that follows finds it in the session's identity map.
    workspace = await session.get(WorkspaceModel, workspace_id)
    if workspace is None:
        return None
    _keep(session, workspace)
    return _Located(roles.VIEW_WORKSPACE, workspace.id, workspace.user_id)


async def _project_place(session: AsyncSession, value: str) -> _Located | None:
    project_id = _as_id(value)
    if project_id is None:
        return None
    project = await session.get(ProjectModel, project_id)  # as _workspace_place
    if project is None:
        return None
    _keep(session, project)
    return _Located(roles.VIEW_PROJECT, project.workspace_id, project.user_id)


async def _model_place(session: AsyncSession, value: str) -> _Located | None:
    """A model by name, else by numeric id (model_registry.find_model's order)."""
    if unstorable(value):
        return None
    place = select(ModelModel.workspace_id, ModelModel.owner_id)
    found = await _located(
        session, roles.VIEW_MODEL_REGISTRY, place.where(ModelModel.name == value)
    )
    # find_model's rule for an id: ASCII digits, any number of leading zeros.
    if found is None and value.isascii() and value.isdigit() and int(value) <= MAX_INT:
        by_id = place.where(ModelModel.id == int(value))
        found = await _located(session, roles.VIEW_MODEL_REGISTRY, by_id)
    return found


async def _template_place(session: AsyncSession, value: str) -> _Located | None:
    if unstorable(value):
        return None
    place = select(TemplateModel.workspace_id, TemplateModel.owner_id)
    return await _located(session, roles.VIEW_TEMPLATES, place.where(TemplateModel.name == value))


async def _job_place(session: AsyncSession, value: str) -> _Located | None:
    if unstorable(value):
        return None
    experiment_id = await session.scalar(
        select(ExperimentModel.id).where(ExperimentModel.job_id == value)
    )
    return await _experiment_place(session, experiment_id)


async def _webhook_place(session: AsyncSession, value: str) -> _Located | None:
    """A workspace's webhook; one for every workspace is left to the route (admins')."""
    webhook_id = _as_id(value)
    workspace_id = (
        None
        if webhook_id is None
        else await session.scalar(
            select(WebhookModel.workspace_id).where(WebhookModel.id == webhook_id)
        )
    )
    return None if workspace_id is None else _Located(roles.VIEW_WEBHOOKS, workspace_id, None)


_Finder = Callable[[AsyncSession, str], Awaitable[_Located | None]]

# Path parameters naming something in a workspace: where to find it, and the words the
# routes use for one that does not exist (the same words for one the caller may not see).
_PLACES: dict[str, tuple[_Finder, Callable[[str], str]]] = {
    "experiment_id": (
        lambda s, v: _experiment_place(s, _as_id(v)),
        lambda v: f"experiment {v} not found",
    ),
    "trial_id": (_trial_place, lambda v: f"trial {v} not found"),
    "run_id": (_trial_place, lambda v: f"run {v} not found"),
    "task_id": (_task_id_place, lambda v: f"task {v} not found"),
    "allocation_id": (_allocation_place, lambda v: f"allocation {v} not found"),
    "uuid": (_checkpoint_place, lambda v: f"checkpoint {v} not found"),
    "checkpoint_uuid": (_checkpoint_place, lambda v: f"checkpoint {v} not found"),
    "workspace_id": (_workspace_place, lambda v: f"workspace {v} not found"),
    "project_id": (_project_place, lambda v: f"project {v} not found"),
    "model_name": (
        _model_place,
        lambda v: f"modelName: no model named {v!r} (nor with that id)",
    ),
    "identifier": (
        _model_place,
        lambda v: f"modelName: no model named {v!r} (nor with that id)",
    ),
    "job_id": (_job_place, lambda v: f"job {v} not found"),
    "webhook_id": (_webhook_place, lambda v: f"webhook {v} not found"),
    # The routes call it `name`, which names a template only on the template routes.
    "template_name": (_template_place, lambda v: f"template {v} not found"),
}


# Parameters the routes take as ints: their refusals name the int ("7" for "007").
_INT_PARAMETERS = {
    "experiment_id",
    "trial_id",
    "run_id",
    "workspace_id",
    "project_id",
    "webhook_id",
}


async def check_readable(session: AsyncSession, actor: Actor, parameter: str, value: str) -> None:
    """What a request names outside its path (a query's or a body's id), checked as
    check_sight checks the path: `parameter` is one of its path parameters' names."""
    if not reads_everything(session, actor):
        await _check_place(session, actor, parameter, value)


async def hidden(session: AsyncSession, actor: Actor, parameter: str, value: str) -> bool:
    """Whether the thing exists but the actor may not read it: the caller then answers in
    its own words for one that does not exist."""
    if reads_everything(session, actor):
        return False
    found = await _PLACES[parameter][0](session, value)
    return found is not None and not await sees(
        session, actor, found.permission, found.workspace_id, found.owner_id
    )


async def require_creator(
    session: AsyncSession,
    actor: Actor,
    workspace: WorkspaceModel,
    permission: int,
    what: str,
    owner_id: int | None = None,
) -> None:
    """Making something in a workspace (`what`: "add experiments to project 'p' of
    workspace 'w'", ...): anyone in the shared built-in workspace and under open reading
    (Determined's open-source rule); else the workspace's owner, `owner_id` (a project's),
    or whoever holds `permission` there."""
    if reads_everything(session, actor) or workspace.immutable:
        return
    if actor.user_id in (workspace.user_id, owner_id):
        return
    if await may(session, actor, permission, workspace.id):
        return
    raise PermissionDenied(
        f"user {actor.username} may not {what}; its owner or an admin may"
        + holders(permission, "there")
    )


async def require_experiment_creator(
    session: AsyncSession, actor: Actor, workspace: WorkspaceModel, project: ProjectModel
) -> None:
    """Adding an experiment to a project: its workspace's owner, the project's, or an
    Editor there (CREATE_EXPERIMENT); anyone in the built-in workspace."""
    what = f"add experiments to project {project.name!r} of workspace {workspace.name!r}"
    await require_creator(
        session, actor, workspace, roles.CREATE_EXPERIMENT, what, owner_id=project.user_id
    )


async def _check_place(session: AsyncSession, actor: Actor, parameter: str, value: str) -> None:
    find, missing = _PLACES[parameter]
    found = await find(session, value)
    if found is None:
        return  # the route answers for what does not exist
    if not await sees(session, actor, found.permission, found.workspace_id, found.owner_id):
        named = str(_as_id(value)) if parameter in _INT_PARAMETERS else value
        raise NotFound(missing(named))


async def check_sight(
    session: AsyncSession, actor: Actor, route: str, path_params: dict[str, str]
) -> None:
    """Everything a request's path names must be something the actor may read; one they
    may not answers 404 in the words the route uses for one that does not exist, so its
    existence is not told either."""
    if reads_everything(session, actor):
        return
    for name, value in path_params.items():
        if name == "name" and "/templates/" in route:
            name = "template_name"
        if name in _PLACES:
            await _check_place(session, actor, name, value)


def require_admin(actor: Actor, what: str) -> None:
    if not actor.admin:
        raise PermissionDenied(f"{what} is for admins; user {actor.username} is not one")


def require_group_manager(actor: Actor, what: str) -> None:
    """Creating, changing and deleting user groups: admins' alone until roles exist (the one
    check to replace then)."""
    require_admin(actor, what)


async def _owner_name(session: AsyncSession, owner_id: int | None) -> str:
    if owner_id is None:
        return "nobody (created before owners were recorded)"
    name = await session.scalar(select(UserModel.username).where(UserModel.id == owner_id))
    return name or f"user {owner_id}"


def holders(permission: int, where: str = "in its workspace") -> str:
    """Who else may, for refusals: the permission's wire name and the roles holding it."""
    names = [
        r.name
        for r in roles.ROLES.values()
        if permission in r.permission_ids and not r.cluster_only
    ]
    return f", or whoever holds {roles.PERMISSIONS[permission].enum} {where} ({', '.join(names)})"


async def require_experiment_owner(
    session: AsyncSession,
    actor: Actor,
    experiment_id: int,
    what: str,
    permission: int = roles.UPDATE_EXPERIMENT,
) -> None:
    found = (
        await session.execute(
            select(ExperimentModel.owner_id, ProjectModel.workspace_id)
            .outerjoin(ProjectModel, ProjectModel.id == ExperimentModel.project_id)
            .where(ExperimentModel.id == experiment_id)
        )
    ).first()
    if found is None:
        raise NotFound(f"experiment {experiment_id} not found")
    owner_id, workspace_id = found
    if actor.admin or owner_id == actor.user_id:
        return
    if await may(session, actor, permission, workspace_id):
        return
    if not await sees(session, actor, roles.VIEW_EXPERIMENT_METADATA, workspace_id, owner_id):
        raise NotFound(f"experiment {experiment_id} not found")
    owner = await _owner_name(session, owner_id)
    raise PermissionDenied(
        f"experiment {experiment_id} belongs to {owner}; only its owner or an admin may {what}"
        + holders(permission)
    )


async def require_allocation_owner(
    session: AsyncSession, actor: Actor, allocation: AllocationModel, what: str
) -> None:
    """A trial's allocation is its experiment's owner's; a task's, the task owner's."""
    if allocation.experiment_id is not None:
        await require_experiment_owner(session, actor, allocation.experiment_id, what)
        return
    found = (
        await session.execute(
            select(TaskModel.owner_id, TaskModel.workspace_id).where(
                TaskModel.id == allocation.task_id
            )
        )
    ).first()
    owner_id, workspace_id = found if found is not None else (None, None)
    label = f"allocation {allocation.id}"
    await require_task_owner(session, actor, owner_id, workspace_id, label, what)


async def require_task_owner(
    session: AsyncSession,
    actor: Actor,
    owner_id: int | None,
    workspace_id: int | None,
    label: str,
    what: str,
) -> None:
    """A command, notebook, shell or TensorBoard: its owner, an admin, or whoever holds
    UPDATE_NSC in its workspace (an Editor)."""
    if actor.admin or (owner_id is not None and owner_id == actor.user_id):
        return
    if workspace_id is not None and await may(session, actor, roles.UPDATE_NSC, workspace_id):
        return
    if not await sees(session, actor, roles.VIEW_NSC, workspace_id, owner_id):
        raise NotFound(f"{label} not found")
    raise PermissionDenied(
        f"{label} belongs to {await _owner_name(session, owner_id)}; only its owner or an "
        f"admin may {what}" + holders(roles.UPDATE_NSC)
    )


async def require_checkpoints_owner(
    session: AsyncSession, actor: Actor, uuids: list[str], what: str
) -> None:
    """Each checkpoint's experiment must be the actor's (or the actor an admin); unknown
    uuids are left to the service, which names them."""
    if actor.admin:
        return
    found = (
        await session.execute(
            select(CheckpointModel.uuid, CheckpointModel.experiment_id)
            .where(CheckpointModel.uuid.in_(uuids))
            .order_by(CheckpointModel.experiment_id, CheckpointModel.uuid)
        )
    ).all()
    # One the actor may not see is named as the service names a missing one.
    hidden_ones = [uuid for uuid, _ in found if await hidden(session, actor, "uuid", uuid)]
    if hidden_ones:
        raise NotFound(f"checkpointUuids: no checkpoint {', '.join(hidden_ones)}")
    for experiment_id in dict.fromkeys(experiment_id for _, experiment_id in found):
        await require_experiment_owner(session, actor, experiment_id, what)


async def require_job_owner(session: AsyncSession, actor: Actor, job_id: str, what: str) -> None:
    """A job is its experiment: its owner may reorder it, an admin anyone's."""
    experiment_id = await session.scalar(
        select(ExperimentModel.id).where(ExperimentModel.job_id == job_id)
    )
    if experiment_id is None or await hidden(session, actor, "job_id", job_id):
        raise NotFound(f"job {job_id} not found")
    await require_experiment_owner(session, actor, experiment_id, what)


async def require_template_owner(
    session: AsyncSession,
    actor: Actor,
    name: str,
    what: str,
    permission: int = roles.UPDATE_TEMPLATES,
) -> None:
    """A template without an owner (made before owners were recorded) is the admins'."""
    row = await session.scalar(select(TemplateModel).where(TemplateModel.name == name))
    if row is None:
        raise NotFound(f"template {name} not found")
    if actor.admin or (row.owner_id is not None and row.owner_id == actor.user_id):
        return
    if await may(session, actor, permission, row.workspace_id):
        return
    if not await sees(session, actor, roles.VIEW_TEMPLATES, row.workspace_id, row.owner_id):
        raise NotFound(f"template {name} not found")
    owner = await _owner_name(session, row.owner_id)
    raise PermissionDenied(
        f"template {name!r} belongs to {owner}; only its owner or an admin may {what}"
        + holders(permission)
    )


async def require_workspace_owner(
    session: AsyncSession,
    actor: Actor,
    workspace_id: int,
    what: str,
    permission: int = roles.UPDATE_WORKSPACE,
) -> None:
    """Its creator, its WorkspaceAdmins or an admin; the built-in workspace has no owner
    (and the service refuses changes to it for everyone)."""
    ws = await session.get(WorkspaceModel, workspace_id)
    if ws is None:
        raise NotFound(f"workspace {workspace_id} not found")
    if actor.admin or ws.immutable or (ws.user_id is not None and ws.user_id == actor.user_id):
        return
    if await may(session, actor, permission, workspace_id):
        return
    if not await sees(session, actor, roles.VIEW_WORKSPACE, workspace_id, ws.user_id):
        raise NotFound(f"workspace {workspace_id} not found")
    owner = await _owner_name(session, ws.user_id)
    raise PermissionDenied(
        f"workspace {ws.name!r} belongs to {owner}; only its owner or an admin may {what}"
        + holders(permission, "there")
    )


async def require_project_owner(
    session: AsyncSession,
    actor: Actor,
    project_id: int,
    what: str,
    permission: int = roles.UPDATE_PROJECT,
) -> None:
    """Its creator, its workspace's owner, a holder of the permission in its workspace, or
    an admin."""
    project = await session.get(ProjectModel, project_id)
    if project is None:
        raise NotFound(f"project {project_id} not found")
    if actor.admin or project.immutable or project.user_id == actor.user_id:
        return
    ws_owner = await session.scalar(
        select(WorkspaceModel.user_id).where(WorkspaceModel.id == project.workspace_id)
    )
    if ws_owner is not None and ws_owner == actor.user_id:
        return
    if await may(session, actor, permission, project.workspace_id):
        return
    if not await sees(session, actor, roles.VIEW_PROJECT, project.workspace_id, project.user_id):
        raise NotFound(f"project {project_id} not found")
    owner = await _owner_name(session, project.user_id)
    raise PermissionDenied(
        f"project {project.name!r} belongs to {owner}; only its owner, its workspace's owner "
        f"or an admin may {what}" + holders(permission)
    )


async def require_model_owner(
    session: AsyncSession,
    actor: Actor,
    name: str,
    owner_id: int | None,
    what: str,
    workspace_id: int | None = None,
    permission: int = roles.EDIT_MODEL_REGISTRY,
) -> None:
    """A registry model is its creator's; one whose creator is gone is the admins'. In its
    workspace, a holder of the permission may change it too."""
    if actor.admin or (owner_id is not None and owner_id == actor.user_id):
        return
    if workspace_id is not None and await may(session, actor, permission, workspace_id):
        return
    if not await sees(session, actor, roles.VIEW_MODEL_REGISTRY, workspace_id, owner_id):
        raise NotFound(f"modelName: no model named {name!r} (nor with that id)")
    owner = await _owner_name(session, owner_id)
    raise PermissionDenied(
        f"model {name!r} belongs to {owner}; only its owner or an admin may {what}"
        + holders(permission)
    )


def may_act_for_user(actor: Actor, user_id: int, what: str) -> None:
    """A user may manage their own account and tokens; an admin anyone's."""
    if not actor.admin and actor.user_id != user_id:
        raise PermissionDenied(f"only an admin may {what} of another user")


async def check_task_scope(
    session: AsyncSession,
    trial_id: int,
    user_id: int,
    method: str,
    route: str,
    path_params: dict[str, str],
) -> bool:
    """A run's token (DET_SESSION_TOKEN, the allocation token) opens only its own trial's
    routes: anything a rank's code can read, a rank of another user's trial must not.
    True where the route reads something not of its own trial or its owner's, which the
    caller then checks as the owner's reading (check_sight)."""
    refusal = PermissionDenied(
        f"this token belongs to the ranks of trial {trial_id}: it opens only that trial's "
        f"routes, not {method} {route}"
    )
    scoped = {k: v for k, v in path_params.items() if k in _SCOPED_PARAMETERS}
    if not scoped:
        if (method, route) in _TASK_ROUTES_WITHOUT_SCOPE:
            return False
        if method == "GET" and (route == "/api/v1/models" or route.startswith("/api/v1/models/")):
            # Batch inference reads the model version it serves (`client.get_model(...)`
            # with the run's token): what its owner may read (check_sight, after this).
            return True
        if method == "GET" and route in ("/api/v1/checkpoints/{uuid}", "/checkpoints/{uuid}"):
            # Restoring reads a checkpoint by uuid, maybe another experiment's: one of the
            # same owner's (source_checkpoint_uuid), never another user's files.
            uuid = _as_uuid(path_params.get("uuid", ""))  # as the route spells it
            owner = await session.scalar(
                select(ExperimentModel.owner_id)
                .join(CheckpointModel, CheckpointModel.experiment_id == ExperimentModel.id)
                .where(CheckpointModel.uuid == uuid)
            )
            if owner is not None and owner != user_id:
                raise refusal
            return False  # the owner's own
        raise refusal
    trial = await session.get(TrialModel, trial_id)
    if trial is None:
        raise refusal
    if method != "GET" and not scoped.keys() & {"trial_id", "run_id", "allocation_id"}:
        # The experiment's own routes it may read, never change: a rank cannot pause, kill
        # or delete the experiment, and with it the other trials.
        raise refusal
    for name, value in scoped.items():
        if name in ("trial_id", "run_id") and value != str(trial.id):
            raise refusal
        if name == "experiment_id" and value != str(trial.experiment_id):
            raise refusal
        # Determined's trial task ids are "<experiment id>.<request id>" (allocations.task_id,
        # not imported: allocations imports auth, which imports this module).
        if name == "task_id" and value != f"{trial.experiment_id}.{trial.request_id}":
            raise refusal
        if name == "allocation_id":
            owner = await session.scalar(
                select(AllocationModel.trial_id).where(AllocationModel.id == value)
            )
            if owner != trial.id:
                raise refusal
    return False  # its own trial, its owner's


def require_token_for_trial(token_trial_id: int | None, trial_id: int) -> None:
    """A report names its trial in the body: a task token reports only for its own."""
    if token_trial_id is not None and token_trial_id != trial_id:
        raise PermissionDenied(
            f"this token belongs to the ranks of trial {token_trial_id}; it cannot report "
            f"for trial {trial_id}"
        )
