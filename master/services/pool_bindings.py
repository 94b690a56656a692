"""Resource pools bound to workspaces (Determined's `det resource-pool bindings`), and the
pool a submit goes to: its config's, else its workspace's default, else the master's.

A pool bound to any workspace takes work only from the workspaces bound to it; a pool
bound to none is shared by all. Bindings are checked where work enters a pool (a submit,
`det job update --resource-pool`), never by the scheduler's pass, which reads no binding:
work already queued or running in a pool keeps its place when the pool's bindings change.

Pools are the master config's (`resource_pools`); agents cannot join any other. A binding
names a pool by name, so it outlives the pool's removal from the config and can still be
unbound then."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.text import unstorable
from master.db.models import (
    AllocationModel,
    AllocationState,
    ExperimentModel,
    PoolBindingModel,
    ProjectModel,
    TaskModel,
    TrialModel,
    WorkspaceModel,
)
from master.errors import Conflict, InvalidArgument, MasterError, NotFound
from master.services import access
from master.services.workspaces import get_workspace
from master.settings import MasterSettings, ResourcePoolSettings

log = logging.getLogger(__name__)


# Each workspace a request names is looked up on its own: a bound on the work one costs.
MAX_WORKSPACES_PER_REQUEST = 1_000


def _pool_names(settings: MasterSettings) -> str:
    return ", ".join(p.pool_name for p in settings.resource_pools)


def _checked_pool_name(name: object, field: str) -> str:
    if not isinstance(name, str):
        raise InvalidArgument(f"{field}: must be a string")
    if not name:
        raise InvalidArgument(f"{field}: the pool name is empty")
    if unstorable(name):
        raise InvalidArgument(f"{field}: the pool name holds a NUL or a lone surrogate")
    return name


def known_pool(
    settings: MasterSettings,
    name: object,
    field: str,
    missing: type[MasterError] = InvalidArgument,
) -> ResourcePoolSettings:
    """The config's pool of that name, or an error (a 400; a 404 for a route's own pool)
    naming it and the pools there are."""
    pool = settings.pool(_checked_pool_name(name, field))
    if pool is None:
        raise missing(f"{field}: pool {name!r} does not exist; pools: {_pool_names(settings)}")
    return pool


async def _workspaces_named(
    session: AsyncSession, ids: Sequence[int] | None, names: Sequence[object] | None
) -> list[WorkspaceModel]:
    """The workspaces a request names by id and by name, each once; an unknown one is a 400
    naming it. Determined's client sends names; its API takes either or both."""
    given = len(ids or ()) + len(names or ())
    if given > MAX_WORKSPACES_PER_REQUEST:
        raise InvalidArgument(
            f"workspaceIds, workspaceNames: {given} workspaces in one request; at most "
            f"{MAX_WORKSPACES_PER_REQUEST}"
        )
    found: dict[int, WorkspaceModel] = {}
    for workspace_id in ids or ():
        ws = await session.get(WorkspaceModel, workspace_id)
        if ws is None:
            raise InvalidArgument(f"workspaceIds: workspace {workspace_id} does not exist")
        found[ws.id] = ws
    for name in names or ():
        if not isinstance(name, str) or unstorable(name):
            raise InvalidArgument(f"workspaceNames: {name!r} is not a workspace name")
        ws = await session.scalar(select(WorkspaceModel).where(WorkspaceModel.name == name))
        if ws is None:
            raise InvalidArgument(f"workspaceNames: workspace {name!r} does not exist")
        found[ws.id] = ws
    return sorted(found.values(), key=lambda w: w.id)


def _refuse_no_workspaces(workspaces: Sequence[WorkspaceModel]) -> None:
    if not workspaces:
        raise InvalidArgument("workspaceIds, workspaceNames: name at least one workspace")


def _refuse_master_default(settings: MasterSettings, pool: ResourcePoolSettings) -> None:
    # Determined's rule: the pool that takes what names none must stay open to everyone
    # (resolute has one master default; Determined's aux default falls back to it too).
    if pool.pool_name == settings.default_compute_pool:
        raise InvalidArgument(
            f"resourcePoolName: pool {pool.pool_name!r} is the master's default pool "
            "(default_compute_pool); it cannot be bound to workspaces"
        )


async def _bound_ids(session: AsyncSession, pool_name: str) -> set[int]:
    return set(
        await session.scalars(
            select(PoolBindingModel.workspace_id).where(PoolBindingModel.pool_name == pool_name)
        )
    )


async def _add(session: AsyncSession, pool_name: str, workspaces: Sequence[WorkspaceModel]) -> None:
    bound = await _bound_ids(session, pool_name)
    for ws in workspaces:
        if ws.deleting:
            raise Conflict(f"workspaceNames: workspace {ws.name!r} ({ws.id}) is being deleted")
        if ws.id not in bound:
            session.add(PoolBindingModel(pool_name=pool_name, workspace_id=ws.id))
    await session.flush()


async def _log_stranded(session: AsyncSession, pool_name: str) -> None:
    """Queued work keeps its place when bindings change; say how much of it the new
    bindings would now refuse, so an admin can move it (`det job update`)."""
    bound = await _bound_ids(session, pool_name)
    if not bound:
        return
    queued = (
        AllocationModel.state == AllocationState.PENDING,
        AllocationModel.resource_pool == pool_name,
    )
    of_trials = (
        select(ProjectModel.workspace_id)
        .join(ExperimentModel, ExperimentModel.project_id == ProjectModel.id)
        .join(TrialModel, TrialModel.experiment_id == ExperimentModel.id)
        .join(AllocationModel, AllocationModel.trial_id == TrialModel.id)
        .where(*queued)
    )
    of_tasks = (
        select(TaskModel.workspace_id)
        .join(AllocationModel, AllocationModel.task_id == TaskModel.id)
        .where(*queued)
    )
    workspaces = set(await session.scalars(of_trials)) | set(await session.scalars(of_tasks))
    outside = sorted(workspaces - bound)
    if outside:
        log.info(
            "pool %s: queued work of workspaces %s stays queued there though they are no "
            "longer bound to it",
            pool_name,
            ", ".join(str(i) for i in outside),
        )


async def bind_workspaces(
    session: AsyncSession,
    settings: MasterSettings,
    actor: access.Actor,
    pool_name: object,
    ids: Sequence[int] | None,
    names: Sequence[object] | None,
) -> None:
    """Binds the workspaces to the pool; ones bound already stay bound."""
    access.require_admin(actor, "binding resource pools to workspaces")
    pool = known_pool(settings, pool_name, "resourcePoolName", NotFound)
    _refuse_master_default(settings, pool)
    workspaces = await _workspaces_named(session, ids, names)
    _refuse_no_workspaces(workspaces)
    await _add(session, pool.pool_name, workspaces)
    await _log_stranded(session, pool.pool_name)
    log.info(
        "pool %s bound to workspaces %s by %s",
        pool.pool_name,
        ", ".join(w.name for w in workspaces),
        actor.username,
    )


async def unbind_workspaces(
    session: AsyncSession,
    settings: MasterSettings,
    actor: access.Actor,
    pool_name: object,
    ids: Sequence[int] | None,
    names: Sequence[object] | None,
) -> None:
    """Unbinds the workspaces from the pool; a workspace that is not bound to it is a 400
    naming it. The pool need not be in the config any more."""
    access.require_admin(actor, "unbinding resource pools from workspaces")
    name = _checked_pool_name(pool_name, "resourcePoolName")
    workspaces = await _workspaces_named(session, ids, names)
    _refuse_no_workspaces(workspaces)
    bound = await _bound_ids(session, name)
    if not bound and settings.pool(name) is None:
        raise NotFound(
            f"resourcePoolName: pool {name!r} does not exist; pools: {_pool_names(settings)}"
        )
    for ws in workspaces:
        if ws.id not in bound:
            raise InvalidArgument(
                f"workspaceNames: workspace {ws.name!r} ({ws.id}) is not bound to pool {name!r}"
            )
    await session.execute(
        delete(PoolBindingModel).where(
            PoolBindingModel.pool_name == name,
            PoolBindingModel.workspace_id.in_([w.id for w in workspaces]),
        )
    )
    await session.flush()
    await _log_stranded(session, name)
    log.info(
        "pool %s unbound from workspaces %s by %s",
        name,
        ", ".join(w.name for w in workspaces),
        actor.username,
    )


async def replace_bindings(
    session: AsyncSession,
    settings: MasterSettings,
    actor: access.Actor,
    pool_name: object,
    ids: Sequence[int] | None,
    names: Sequence[object] | None,
) -> None:
    """The pool's workspaces become exactly these; none leaves the pool shared by all."""
    access.require_admin(actor, "replacing a resource pool's workspace bindings")
    pool = known_pool(settings, pool_name, "resourcePoolName", NotFound)
    _refuse_master_default(settings, pool)
    workspaces = await _workspaces_named(session, ids, names)
    await session.execute(
        delete(PoolBindingModel).where(PoolBindingModel.pool_name == pool.pool_name)
    )
    await _add(session, pool.pool_name, workspaces)
    await _log_stranded(session, pool.pool_name)
    log.info(
        "pool %s bindings replaced by workspaces [%s] by %s",
        pool.pool_name,
        ", ".join(w.name for w in workspaces),
        actor.username,
    )


async def workspaces_bound_to(
    session: AsyncSession, settings: MasterSettings, pool_name: object, offset: int, limit: int
) -> tuple[list[int], int]:
    """A page of the ids of the workspaces bound to the pool, and how many there are. A pool
    gone from the config is listed while bindings to it remain."""
    name = _checked_pool_name(pool_name, "resourcePoolName")
    condition = PoolBindingModel.pool_name == name
    total = (
        await session.scalar(select(func.count()).select_from(PoolBindingModel).where(condition))
        or 0
    )
    if total == 0:
        known_pool(settings, name, "resourcePoolName", NotFound)
    query = (
        select(PoolBindingModel.workspace_id)
        .where(condition)
        .order_by(PoolBindingModel.workspace_id)
        .offset(offset)
    )
    if limit > 0:
        query = query.limit(limit)
    return list(await session.scalars(query)), total


async def pools_available_to(
    session: AsyncSession, settings: MasterSettings, workspace_id: int
) -> list[str]:
    """The config's pools the workspace may use, in the config's order: those bound to it
    and those bound to none."""
    await get_workspace(session, workspace_id)
    rows = (
        await session.execute(select(PoolBindingModel.pool_name, PoolBindingModel.workspace_id))
    ).all()
    bound: dict[str, set[int]] = {}
    for pool_name, ws_id in rows:
        bound.setdefault(pool_name, set()).add(ws_id)
    return [
        p.pool_name
        for p in settings.resource_pools
        if p.pool_name not in bound or workspace_id in bound[p.pool_name]
    ]


async def refuse_unusable(
    session: AsyncSession, pool_name: str, workspace: WorkspaceModel, field: str
) -> None:
    """A 400 naming the pool and the workspace when the pool is bound to others only."""
    bound = await _bound_ids(session, pool_name)
    if bound and workspace.id not in bound:
        raise InvalidArgument(
            f"{field}: pool {pool_name!r} is bound to other workspaces; workspace "
            f"{workspace.name!r} ({workspace.id}) may not use it (an admin binds it with "
            "`det resource-pool bindings add`)"
        )


async def choose_pool(
    session: AsyncSession,
    settings: MasterSettings,
    workspace: WorkspaceModel,
    named: str | None,
    slots: int,
) -> ResourcePoolSettings:
    """Where a submit goes: the pool its config names, else its workspace's default
    (the aux one for work that asks for no slots, as Determined does), else the master's
    default. Refused with a 4xx naming the pool and where it came from when the pool does
    not exist or the workspace may not use it."""
    if named:
        field, name = "resources.resource_pool", named
    elif slots == 0 and workspace.default_aux_pool:
        field = f"workspace {workspace.name!r} defaultAuxPool"
        name = workspace.default_aux_pool
    elif workspace.default_compute_pool:
        field = f"workspace {workspace.name!r} defaultComputePool"
        name = workspace.default_compute_pool
    else:
        field, name = "default_compute_pool", settings.default_compute_pool
    pool = known_pool(settings, name, field)
    await refuse_unusable(session, pool.pool_name, workspace, field)
    return pool


@dataclass(frozen=True)
class DefaultPools:
    """A request's defaults: None leaves one as it is, "" clears it."""

    compute: object = None
    aux: object = None


async def set_default_pools(
    session: AsyncSession,
    settings: MasterSettings,
    actor: access.Actor,
    workspace_id: int,
    pools: DefaultPools,
    fields: tuple[str, str] = ("defaultComputePool", "defaultAuxPool"),
) -> None:
    """Sets the workspace's default pools, each one it may use. The caller has checked that
    the actor may edit the workspace; the built-in one has no owner, so only admins."""
    if pools.compute is None and pools.aux is None:
        return
    ws = await get_workspace(session, workspace_id)
    if ws.immutable:
        access.require_admin(actor, f"setting the default pools of workspace {ws.name!r}")
    if ws.deleting:
        raise Conflict(f"workspace {ws.name!r} ({ws.id}) is being deleted")
    values: list[str | None] = []
    for value, field in zip((pools.compute, pools.aux), fields, strict=True):
        if value is None or value == "":
            values.append(value)
            continue
        pool = known_pool(settings, value, field)
        await refuse_unusable(session, pool.pool_name, ws, field)
        values.append(pool.pool_name)
    compute, aux = values
    if compute is not None:
        ws.default_compute_pool = compute or None
    if aux is not None:
        ws.default_aux_pool = aux or None
    await session.flush()
    log.info(
        "workspace %s (%d) default pools: compute %s, aux %s (by %s)",
        ws.name,
        ws.id,
        ws.default_compute_pool or "-",
        ws.default_aux_pool or "-",
        actor.username,
    )
