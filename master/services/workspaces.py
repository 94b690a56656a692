"""Workspaces and projects, as Determined's REST API serves them: the built-in
"Uncategorized" workspace and project that hold what names none, and the ones users make.

Every experiment is in a project and every project in a workspace. Names are checked here
and made unique by the database as well (workspace names across the cluster, project names
within their workspace), so two racing creates end in one 409, never two rows. Who may
change what is checked by the caller (master.services.access) before these run; what the
built-in ones refuse is checked here, since nobody may change them."""

from __future__ import annotations

import logging
import re
import secrets
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import roles
from master.db.models import (
    ExperimentModel,
    ExperimentState,
    ProjectModel,
    TaskModel,
    TemplateModel,
    UserModel,
    WorkspaceModel,
    WorkspacePinModel,
)
from master.errors import AlreadyExists, Conflict, InvalidArgument, NotFound
from master.services import access, allocations, checkpoint_gc

log = logging.getLogger(__name__)

DEFAULT_WORKSPACE = "Uncategorized"  # Determined's name for the default workspace (id 1)
DEFAULT_PROJECT = "Uncategorized"
MAX_NAME_CHARS = 255
MAX_DESCRIPTION_CHARS = 10_000
MAX_KEY_CHARS = 5  # Determined's limit on a project key
_KEY_ATTEMPTS = 8
# How many ids a refusal names before it says "and N more".
_NAMED_IDS = 10
_ENDED_STATES = [
    str(s) for s in (ExperimentState.COMPLETED, ExperimentState.CANCELED, ExperimentState.ERROR)
]
_INACTIVE_STATES = [*_ENDED_STATES, str(ExperimentState.DELETING)]


# -- names ------------------------------------------------------------------------------


def checked_name(value: object, field: str) -> str:
    """A workspace's or project's name as given, or a 400 naming the field."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field}: must be a string")
    if not value.strip():
        raise InvalidArgument(f"{field}: the name is empty")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidArgument(
            f"{field}: the name is {len(value)} characters long; at most {MAX_NAME_CHARS}"
        )
    if value != value.strip():
        raise InvalidArgument(f"{field}: the name {value!r} starts or ends with spaces")
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise InvalidArgument(
                f"{field}: the name holds a control character (U+{ord(char):04X})"
            )
    return value


def checked_description(value: object, field: str = "description") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{field}: must be a string")
    if len(value) > MAX_DESCRIPTION_CHARS:
        raise InvalidArgument(
            f"{field}: {len(value)} characters long; at most {MAX_DESCRIPTION_CHARS}"
        )
    if "\x00" in value:
        raise InvalidArgument(f"{field}: holds a NUL character")
    return value


def checked_key(value: object, field: str = "key") -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9]{1,5}", value):
        raise InvalidArgument(
            f"{field}: {value!r} is not a project key; use 1-{MAX_KEY_CHARS} letters or digits"
        )
    return value.upper()


async def project_key(session: AsyncSession, name: str, scatter: bool = False) -> str:
    """A free key from the name's first letters and digits, numbered from 2 when taken
    (migration 0018 uses the same rule for the projects it found). `scatter`: a random
    number instead, for a create that lost the next number to racing ones more than once."""
    stem = re.sub(r"[^A-Z0-9]", "", name.upper())[:MAX_KEY_CHARS] or "PROJ"
    taken = set(
        (
            await session.scalars(select(ProjectModel.key).where(ProjectModel.key.like(f"{stem}%")))
        ).all()
    )
    key, n = stem, 1
    while key in taken:
        n = 2 + secrets.randbelow(1_000_000) if scatter else n + 1
        key = f"{stem}{n}"
    return key


def _ids(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:_NAMED_IDS])
    return shown + (f" and {len(ids) - _NAMED_IDS} more" if len(ids) > _NAMED_IDS else "")


# -- the built-in ones ------------------------------------------------------------------


async def ensure_defaults(session: AsyncSession) -> None:
    ws = await session.scalar(
        select(WorkspaceModel).where(WorkspaceModel.name == DEFAULT_WORKSPACE)
    )
    if ws is None:
        ws = WorkspaceModel(name=DEFAULT_WORKSPACE, immutable=True)
        session.add(ws)
        await session.flush()
    project = await session.scalar(
        select(ProjectModel).where(
            ProjectModel.workspace_id == ws.id, ProjectModel.name == DEFAULT_PROJECT
        )
    )
    if project is None:
        session.add(
            ProjectModel(
                name=DEFAULT_PROJECT,
                workspace_id=ws.id,
                immutable=True,
                key=await project_key(session, DEFAULT_PROJECT),
            )
        )
        await session.flush()


async def default_workspace(session: AsyncSession) -> WorkspaceModel:
    ws = await session.scalar(
        select(WorkspaceModel).where(WorkspaceModel.name == DEFAULT_WORKSPACE)
    )
    if ws is None:
        raise NotFound("the default workspace is missing; restart the master to recreate it")
    return ws


async def resolve_workspace(session: AsyncSession, workspace_id: int | None) -> WorkspaceModel:
    """Determined's client sends workspaceId 0 (or nothing) for the default workspace."""
    if not workspace_id:
        return await default_workspace(session)
    ws = await get_workspace(session, workspace_id)
    if ws.deleting:
        raise InvalidArgument(f"workspaceId: workspace {ws.name!r} ({ws.id}) is being deleted")
    return ws


async def resolve_project(session: AsyncSession, project_id: int | None) -> ProjectModel:
    if not project_id:
        # One statement: every submit without a project comes here.
        project = await session.scalar(
            select(ProjectModel)
            .join(WorkspaceModel, WorkspaceModel.id == ProjectModel.workspace_id)
            .where(WorkspaceModel.name == DEFAULT_WORKSPACE, ProjectModel.name == DEFAULT_PROJECT)
        )
        if project is None:
            raise NotFound("the default project is missing; restart the master to recreate it")
        return project
    return await get_project(session, project_id)


async def project_for_experiment(
    session: AsyncSession,
    project_id: int | None,
    workspace_name: str | None,
    project_name: str | None,
    hidden: Callable[[str, int], Awaitable[bool]],
) -> ProjectModel:
    """Where a new experiment goes: the request's projectId, else the config's
    `workspace:`/`project:` names, else the built-in project. Unknown ids or names are a
    400 naming them, and so are those the submitter may not read (`hidden`); so is a
    project (or workspace) that is archived, as in Determined."""
    by_names: ProjectModel | None = None
    if workspace_name is not None and project_name is not None:
        ws = await session.scalar(
            select(WorkspaceModel).where(WorkspaceModel.name == workspace_name)
        )
        if ws is None or await hidden("workspace_id", ws.id):
            raise InvalidArgument(f"workspace: workspace {workspace_name!r} does not exist")
        by_names = await session.scalar(
            select(ProjectModel).where(
                ProjectModel.workspace_id == ws.id, ProjectModel.name == project_name
            )
        )
        if by_names is None or await hidden("project_id", by_names.id):
            raise InvalidArgument(
                f"project: project {project_name!r} does not exist in workspace {workspace_name!r}"
            )
    if project_id:
        project = await session.get(ProjectModel, project_id)
        if project is None or await hidden("project_id", project.id):
            raise InvalidArgument(f"projectId: project {project_id} does not exist")
        if by_names is not None and by_names.id != project.id:
            raise InvalidArgument(
                f"projectId: project {project_id} is not the config's project {project_name!r} "
                f"in workspace {workspace_name!r} (project {by_names.id}); name one place"
            )
    elif by_names is not None:
        project = by_names
    else:
        project = await resolve_project(session, None)
    await _refuse_archived_destination(session, project, "projectId" if project_id else "project")
    return project


async def _refuse_archived_destination(
    session: AsyncSession, project: ProjectModel, field: str
) -> None:
    if project.deleting:
        raise InvalidArgument(f"{field}: project {project.name!r} ({project.id}) is being deleted")
    if project.archived:
        raise InvalidArgument(
            f"{field}: project {project.name!r} ({project.id}) is archived; unarchive it to "
            "add experiments"
        )
    ws = await get_workspace(session, project.workspace_id)
    if ws.deleting or ws.archived:
        state = "being deleted" if ws.deleting else "archived"
        raise InvalidArgument(
            f"{field}: workspace {ws.name!r} ({ws.id}) of project {project.name!r} is {state}"
        )


def _refuse_deleting(thing: WorkspaceModel | ProjectModel, kind: str) -> None:
    if thing.deleting:
        raise Conflict(f"{kind} {thing.name!r} ({thing.id}) is being deleted")


# -- workspaces -------------------------------------------------------------------------


@dataclass
class WorkspaceView:
    workspace: WorkspaceModel
    username: str
    num_projects: int
    num_experiments: int
    pinned_at: datetime | None


async def get_workspace(session: AsyncSession, workspace_id: int) -> WorkspaceModel:
    ws = await session.get(WorkspaceModel, workspace_id)
    if ws is None:
        raise NotFound(f"workspace {workspace_id} not found")
    return ws


_WORKSPACE_SORTS = {
    "SORT_BY_UNSPECIFIED": WorkspaceModel.id,
    "SORT_BY_ID": WorkspaceModel.id,
    "SORT_BY_NAME": WorkspaceModel.name,
}


async def list_workspaces(
    session: AsyncSession,
    viewer_id: int,
    *,
    offset: int = 0,
    limit: int = 0,
    name: str | None = None,
    name_case_sensitive: str | None = None,
    archived: bool | None = None,
    pinned: bool | None = None,
    user_ids: Sequence[int] = (),
    usernames: Sequence[str] = (),
    sort_by: str = "SORT_BY_ID",
    descending: bool = False,
    workspace_id: int | None = None,
    readable: ColumnElement[bool] | None = None,
) -> tuple[list[WorkspaceView], int]:
    """A page of workspaces with their counts and the viewer's pins, and how many match.
    `name` matches whole names without regard to case, `name_case_sensitive` exactly (what
    Determined's client looks workspaces up by)."""
    column = _WORKSPACE_SORTS.get(sort_by)
    if column is None:
        raise InvalidArgument(f"sortBy: {sort_by!r} is not one of {', '.join(_WORKSPACE_SORTS)}")
    pin = (
        select(WorkspacePinModel.pinned_at)
        .where(
            WorkspacePinModel.workspace_id == WorkspaceModel.id,
            WorkspacePinModel.user_id == viewer_id,
        )
        .scalar_subquery()
    )
    conditions: list[ColumnElement[bool]] = [] if readable is None else [readable]
    if workspace_id is not None:
        conditions.append(WorkspaceModel.id == workspace_id)
    if name:
        conditions.append(func.lower(WorkspaceModel.name) == name.lower())
    if name_case_sensitive:
        conditions.append(WorkspaceModel.name == name_case_sensitive)
    if archived is not None:
        conditions.append(WorkspaceModel.archived == archived)
    if pinned is not None:
        conditions.append(pin.is_not(None) if pinned else pin.is_(None))
    if user_ids:
        conditions.append(WorkspaceModel.user_id.in_(list(user_ids)))
    if usernames:
        conditions.append(
            WorkspaceModel.user_id.in_(
                select(UserModel.id).where(UserModel.username.in_(list(usernames)))
            )
        )
    total = (
        await session.scalar(select(func.count()).select_from(WorkspaceModel).where(*conditions))
        or 0
    )
    projects = (
        select(func.count())
        .select_from(ProjectModel)
        .where(ProjectModel.workspace_id == WorkspaceModel.id)
        .scalar_subquery()
    )
    experiments = (
        select(func.count())
        .select_from(ExperimentModel)
        .join(ProjectModel, ExperimentModel.project_id == ProjectModel.id)
        .where(ProjectModel.workspace_id == WorkspaceModel.id)
        .scalar_subquery()
    )
    query = (
        select(WorkspaceModel, UserModel.username, projects, experiments, pin)
        .outerjoin(UserModel, UserModel.id == WorkspaceModel.user_id)
        .where(*conditions)
        .order_by(column.desc() if descending else column, WorkspaceModel.id)
        .offset(offset)
    )
    if limit > 0:
        query = query.limit(limit)
    rows = (await session.execute(query)).all()
    return [
        WorkspaceView(ws, username or "", n_projects or 0, n_experiments or 0, pinned_at)
        for ws, username, n_projects, n_experiments, pinned_at in rows
    ], total


async def describe_workspace(
    session: AsyncSession, workspace_id: int, viewer_id: int
) -> WorkspaceView:
    views, _ = await list_workspaces(session, viewer_id, workspace_id=workspace_id)
    if not views:
        raise NotFound(f"workspace {workspace_id} not found")
    return views[0]


async def _refuse_clashing_workspace(
    session: AsyncSession, name: str, field: str, except_id: int | None = None
) -> None:
    existing = await session.scalar(select(WorkspaceModel.id).where(WorkspaceModel.name == name))
    if existing is not None and existing != except_id:
        raise AlreadyExists(f"{field}: a workspace named {name!r} already exists ({existing})")


def _refuse_built_in_workspace(ws: WorkspaceModel, what: str) -> None:
    if ws.immutable:
        raise InvalidArgument(
            f"workspace {ws.name!r} ({ws.id}) is built in: it holds what names no workspace, "
            f"and nobody may {what} it"
        )


async def create_workspace(session: AsyncSession, name: object, owner_id: int) -> WorkspaceModel:
    checked = checked_name(name, "name")
    await _refuse_clashing_workspace(session, checked, "name")
    ws = WorkspaceModel(name=checked, user_id=owner_id)
    session.add(ws)
    await session.flush()
    # The master config names quotas' workspaces: one may be this one.
    allocations.request_scheduling(session)
    log.info("created workspace %s (%d)", checked, ws.id)
    return ws


async def rename_workspace(session: AsyncSession, workspace_id: int, name: object) -> None:
    ws = await get_workspace(session, workspace_id)
    checked = checked_name(name, "name")
    if checked == ws.name:
        return
    _refuse_built_in_workspace(ws, "rename")
    _refuse_deleting(ws, "workspace")
    await _refuse_clashing_workspace(session, checked, "name", ws.id)
    log.info("renamed workspace %d from %s to %s", ws.id, ws.name, checked)
    ws.name = checked
    await session.flush()
    allocations.request_scheduling(session)  # quotas in the master config go by name


async def set_workspace_archived(session: AsyncSession, workspace_id: int, archived: bool) -> None:
    ws = await get_workspace(session, workspace_id)
    _refuse_built_in_workspace(ws, "archive" if archived else "unarchive")
    _refuse_deleting(ws, "workspace")
    ws.archived = archived
    log.info("%s workspace %s (%d)", "archived" if archived else "unarchived", ws.name, ws.id)
    await session.flush()


async def set_workspace_pinned(
    session: AsyncSession, workspace_id: int, user_id: int, pinned: bool
) -> None:
    """A pin is the user's own; pinning twice or unpinning what is not pinned is no error."""
    await get_workspace(session, workspace_id)
    existing = await session.get(WorkspacePinModel, (workspace_id, user_id))
    if pinned and existing is None:
        session.add(WorkspacePinModel(workspace_id=workspace_id, user_id=user_id))
    elif not pinned and existing is not None:
        await session.delete(existing)
    await session.flush()


async def _start_deleting_experiments(
    session: AsyncSession, project_ids: Sequence[int], where: str, actor: str
) -> int:
    """Starts the deletion of every experiment in these projects (checkpoints first, as
    `det experiment delete` does) and returns how many are left to go; refused, with
    nothing changed, while any of them is active."""
    experiments = (
        await session.scalars(
            select(ExperimentModel)
            .where(ExperimentModel.project_id.in_(list(project_ids)))
            .order_by(ExperimentModel.id)
        )
    ).all()
    active = [e.id for e in experiments if str(e.state) not in _INACTIVE_STATES]
    if active:
        raise Conflict(
            f"{where} holds active experiments ({_ids(active)}); kill them or let them end, "
            "or move them to another project (det experiment move), then delete it"
        )
    for experiment in experiments:
        await checkpoint_gc.delete_experiment(session, experiment, actor)
    return len(experiments)


async def delete_workspace(session: AsyncSession, workspace_id: int, actor: str) -> bool:
    """Deletes the workspace with its projects, their experiments, its ended tasks and its
    templates; refused while any experiment of it is active or any task of it runs.
    True when it is gone now; False when its experiments' checkpoints go first, and it
    goes after them (finish_deletions)."""
    ws = await get_workspace(session, workspace_id)
    _refuse_built_in_workspace(ws, "delete")
    live = (
        await session.execute(
            select(TaskModel.type, TaskModel.uuid)
            .where(TaskModel.workspace_id == ws.id, TaskModel.ended_at.is_(None))
            .order_by(TaskModel.id)
        )
    ).all()
    if live:
        named = ", ".join(f"{kind} {uuid}" for kind, uuid in live[:_NAMED_IDS])
        more = f" and {len(live) - _NAMED_IDS} more" if len(live) > _NAMED_IDS else ""
        raise Conflict(f"workspace {ws.name!r} has running tasks ({named}{more}); kill them first")
    projects = (
        await session.scalars(select(ProjectModel).where(ProjectModel.workspace_id == ws.id))
    ).all()
    left = await _start_deleting_experiments(
        session, [p.id for p in projects], f"workspace {ws.name!r}", actor
    )
    ws.deleting = True
    for project in projects:
        project.deleting = True
    await session.flush()
    log.info("deleting workspace %s (%d): %d experiments first", ws.name, ws.id, left)
    await finish_deletions(session)
    return await session.get(WorkspaceModel, workspace_id) is None


async def finish_deletions(session: AsyncSession) -> None:
    """Removes the projects being deleted whose experiments are gone, then the workspaces
    being deleted whose projects are gone (with their ended tasks and templates). Called
    where a deletion starts and after each pass of the checkpoint deleter, which removes
    the experiments."""
    has_experiments = (
        select(ExperimentModel.id).where(ExperimentModel.project_id == ProjectModel.id).exists()
    )
    done = (
        await session.scalars(
            select(ProjectModel.id).where(ProjectModel.deleting, ~has_experiments)
        )
    ).all()
    if done:
        await session.execute(delete(ProjectModel).where(ProjectModel.id.in_(list(done))))
        log.info("deleted projects %s", ", ".join(str(i) for i in done))
    has_projects = (
        select(ProjectModel.id).where(ProjectModel.workspace_id == WorkspaceModel.id).exists()
    )
    has_live_tasks = (
        select(TaskModel.id)
        .where(TaskModel.workspace_id == WorkspaceModel.id, TaskModel.ended_at.is_(None))
        .exists()
    )
    for ws_id in (
        await session.scalars(
            select(WorkspaceModel.id).where(WorkspaceModel.deleting, ~has_projects, ~has_live_tasks)
        )
    ).all():
        await session.execute(delete(TaskModel).where(TaskModel.workspace_id == ws_id))
        await session.execute(delete(TemplateModel).where(TemplateModel.workspace_id == ws_id))
        await session.execute(delete(WorkspaceModel).where(WorkspaceModel.id == ws_id))
        # Its quotas went with it (ON DELETE CASCADE): the scheduler's view must drop them.
        allocations.request_scheduling(session)
        log.info("deleted workspace %d", ws_id)
    # Rows deleted by statement: the identity map must not hand them out again.
    session.expire_all()


async def deletions_pending(session: AsyncSession) -> bool:
    found = await session.scalar(
        select(ProjectModel.id).where(ProjectModel.deleting).limit(1)
    ) or await session.scalar(select(WorkspaceModel.id).where(WorkspaceModel.deleting).limit(1))
    return found is not None


# -- projects ---------------------------------------------------------------------------


@dataclass
class ProjectView:
    project: ProjectModel
    username: str
    workspace_name: str
    num_experiments: int
    num_active_experiments: int
    last_experiment_started_at: datetime | None


async def get_project(session: AsyncSession, project_id: int) -> ProjectModel:
    project = await session.get(ProjectModel, project_id)
    if project is None:
        raise NotFound(f"project {project_id} not found")
    return project


_PROJECT_SORTS = {
    "SORT_BY_UNSPECIFIED": ProjectModel.id,
    "SORT_BY_ID": ProjectModel.id,
    "SORT_BY_NAME": ProjectModel.name,
    "SORT_BY_DESCRIPTION": ProjectModel.description,
    "SORT_BY_CREATION_TIME": ProjectModel.created_at,
}


async def list_projects(
    session: AsyncSession,
    *,
    workspace_id: int = 0,
    project_id: int | None = None,
    offset: int = 0,
    limit: int = 0,
    name: str | None = None,
    archived: bool | None = None,
    user_ids: Sequence[int] = (),
    usernames: Sequence[str] = (),
    sort_by: str = "SORT_BY_ID",
    descending: bool = False,
    readable: ColumnElement[bool] | None = None,
) -> tuple[list[ProjectView], int]:
    """A page of a workspace's projects (every workspace's for id 0, as Determined's
    client asks) with their counts, and how many match; `name` matches whole names."""
    column = _PROJECT_SORTS.get(sort_by)
    if column is None:
        raise InvalidArgument(f"sortBy: {sort_by!r} is not one of {', '.join(_PROJECT_SORTS)}")
    if workspace_id:
        await get_workspace(session, workspace_id)
    conditions: list[ColumnElement[bool]] = [] if readable is None else [readable]
    if workspace_id:
        conditions.append(ProjectModel.workspace_id == workspace_id)
    if project_id is not None:
        conditions.append(ProjectModel.id == project_id)
    if name:
        conditions.append(ProjectModel.name == name)
    if archived is not None:
        conditions.append(ProjectModel.archived == archived)
    if user_ids:
        conditions.append(ProjectModel.user_id.in_(list(user_ids)))
    if usernames:
        conditions.append(
            ProjectModel.user_id.in_(
                select(UserModel.id).where(UserModel.username.in_(list(usernames)))
            )
        )
    total = (
        await session.scalar(select(func.count()).select_from(ProjectModel).where(*conditions)) or 0
    )
    in_project = ExperimentModel.project_id == ProjectModel.id
    n_experiments = select(func.count()).where(in_project).scalar_subquery()
    n_active = (
        select(func.count())
        .where(in_project, ExperimentModel.state.not_in(_INACTIVE_STATES))
        .scalar_subquery()
    )
    last_started = select(func.max(ExperimentModel.start_time)).where(in_project).scalar_subquery()
    query = (
        select(
            ProjectModel,
            UserModel.username,
            WorkspaceModel.name,
            n_experiments,
            n_active,
            last_started,
        )
        .join(WorkspaceModel, WorkspaceModel.id == ProjectModel.workspace_id)
        .outerjoin(UserModel, UserModel.id == ProjectModel.user_id)
        .where(*conditions)
        .order_by(column.desc() if descending else column, ProjectModel.id)
        .offset(offset)
    )
    if limit > 0:
        query = query.limit(limit)
    rows = (await session.execute(query)).all()
    return [
        ProjectView(project, username or "", ws_name, n or 0, active or 0, started)
        for project, username, ws_name, n, active, started in rows
    ], total


async def describe_project(session: AsyncSession, project_id: int) -> ProjectView:
    views, _ = await list_projects(session, project_id=project_id)
    if not views:
        raise NotFound(f"project {project_id} not found")
    return views[0]


async def _refuse_clashing_project(
    session: AsyncSession, workspace_id: int, name: str, field: str, except_id: int | None = None
) -> None:
    existing = await session.scalar(
        select(ProjectModel.id).where(
            ProjectModel.workspace_id == workspace_id, ProjectModel.name == name
        )
    )
    if existing is not None and existing != except_id:
        ws = await get_workspace(session, workspace_id)
        raise AlreadyExists(
            f"{field}: workspace {ws.name!r} already has a project named {name!r} ({existing})"
        )


async def _refuse_clashing_key(
    session: AsyncSession, key: str, field: str, except_id: int | None = None
) -> None:
    existing = await session.scalar(select(ProjectModel.id).where(ProjectModel.key == key))
    if existing is not None and existing != except_id:
        raise AlreadyExists(f"{field}: project {existing} already has the key {key!r}")


def _refuse_built_in_project(project: ProjectModel, what: str) -> None:
    if project.immutable:
        raise InvalidArgument(
            f"project {project.name!r} ({project.id}) is built in: it holds what names no "
            f"project, and nobody may {what} it"
        )


async def create_project(
    session: AsyncSession,
    workspace_id: int,
    owner_id: int,
    name: object,
    description: object = None,
    key: object = None,
) -> ProjectModel:
    ws = await get_workspace(session, workspace_id)
    checked = checked_name(name, "name")
    text = "" if description is None else checked_description(description)
    _refuse_deleting(ws, "workspace")
    if ws.archived:
        raise InvalidArgument(
            f"workspaceId: workspace {ws.name!r} ({ws.id}) is archived; unarchive it to add "
            "projects"
        )
    given_key = None if key is None or key == "" else checked_key(key)
    for attempt in range(_KEY_ATTEMPTS):
        await _refuse_clashing_project(session, ws.id, checked, "name")
        if given_key is not None:
            await _refuse_clashing_key(session, given_key, "key")
        new_key = given_key or await project_key(session, checked, scatter=attempt >= 2)
        project = ProjectModel(
            name=checked, workspace_id=ws.id, user_id=owner_id, description=text, key=new_key
        )
        try:
            async with session.begin_nested():
                session.add(project)
                await session.flush()
        except IntegrityError:
            # Another create took the name or the key meanwhile: the checks above now say
            # which, or a made-up key is made again.
            continue
        log.info("created project %s (%d) in workspace %s", checked, project.id, ws.name)
        return project
    raise Conflict("name: projects were being created too fast to choose a key; retry")


async def edit_project(
    session: AsyncSession,
    project_id: int,
    name: object = None,
    description: object = None,
    key: object = None,
) -> None:
    project = await get_project(session, project_id)
    new_name = None if name is None else checked_name(name, "name")
    new_description = None if description is None else checked_description(description)
    new_key = None if key is None or key == "" else checked_key(key)
    if (new_name, new_description, new_key) == (None, None, None):
        return
    _refuse_built_in_project(project, "edit")
    _refuse_deleting(project, "project")
    if new_name is not None and new_name != project.name:
        await _refuse_clashing_project(session, project.workspace_id, new_name, "name", project.id)
        project.name = new_name
    if new_key is not None and new_key != project.key:
        await _refuse_clashing_key(session, new_key, "key", project.id)
        project.key = new_key
    if new_description is not None:
        project.description = new_description
    await session.flush()
    log.info("edited project %d", project.id)


async def set_project_archived(session: AsyncSession, project_id: int, archived: bool) -> None:
    project = await get_project(session, project_id)
    _refuse_built_in_project(project, "archive" if archived else "unarchive")
    _refuse_deleting(project, "project")
    if not archived:
        ws = await get_workspace(session, project.workspace_id)
        if ws.archived:
            raise InvalidArgument(
                f"project {project.name!r} is in the archived workspace {ws.name!r} ({ws.id}); "
                "unarchive the workspace first"
            )
    project.archived = archived
    await session.flush()
    log.info(
        "%s project %s (%d)", "archived" if archived else "unarchived", project.name, project_id
    )


async def move_project(
    session: AsyncSession, project_id: int, destination_id: int, actor: access.Actor
) -> None:
    project = await get_project(session, project_id)
    _refuse_built_in_project(project, "move")
    _refuse_deleting(project, "project")
    destination = await session.get(WorkspaceModel, destination_id)
    if destination is None:
        raise InvalidArgument(f"destinationWorkspaceId: workspace {destination_id} does not exist")
    if destination.id == project.workspace_id:
        return
    if destination.archived or destination.deleting:
        state = "being deleted" if destination.deleting else "archived"
        raise InvalidArgument(
            f"destinationWorkspaceId: workspace {destination.name!r} ({destination.id}) is {state}"
        )
    what = f"add projects to workspace {destination.name!r}"
    await access.require_creator(session, actor, destination, roles.CREATE_PROJECT, what)
    await _refuse_clashing_project(
        session, destination.id, project.name, "destinationWorkspaceId", project.id
    )
    project.workspace_id = destination.id
    await session.flush()
    # Its queued and running work now counts against the destination's quotas.
    allocations.request_scheduling(session)
    log.info("moved project %s (%d) to workspace %s", project.name, project.id, destination.name)


async def delete_project(session: AsyncSession, project_id: int, actor: str) -> bool:
    """Deletes the project with its experiments; refused while any of them is active. True
    when it is gone now; False when its experiments' checkpoints go first, and it goes
    after them (finish_deletions)."""
    project = await get_project(session, project_id)
    _refuse_built_in_project(project, "delete")
    left = await _start_deleting_experiments(
        session, [project.id], f"project {project.name!r}", actor
    )
    project.deleting = True
    await session.flush()
    log.info("deleting project %s (%d): %d experiments first", project.name, project.id, left)
    await finish_deletions(session)
    return await session.get(ProjectModel, project_id) is None


async def move_experiment_project(
    session: AsyncSession, experiment: ExperimentModel, destination_id: int
) -> ProjectModel:
    """Moves an experiment (running or not) to another project, which must exist and be
    open for new experiments."""
    destination = await session.get(ProjectModel, destination_id)
    if destination is None:
        raise InvalidArgument(f"destinationProjectId: project {destination_id} does not exist")
    if destination.id != experiment.project_id:
        await _refuse_archived_destination(session, destination, "destinationProjectId")
        experiment.project_id = destination.id
        await session.flush()
        allocations.request_scheduling(session)  # its work counts in another workspace
        log.info(
            "moved experiment %d to project %s (%d)",
            experiment.id,
            destination.name,
            destination.id,
        )
    return destination
