"""Workspaces and projects, as Determined's REST API serves them (`det workspace ...`,
`det project ...`, `det experiment move`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from master.api.deps import MAX_INT, CurrentActor, CurrentUser, ObjectId, SessionDep, SettingsDep
from master.core import roles
from master.errors import InvalidArgument
from master.schemas.common import Pagination
from master.schemas.workspaces import (
    DeleteResponse,
    ExperimentMove,
    PoolBindings,
    PoolsAvailableToWorkspace,
    Project,
    ProjectCreate,
    ProjectList,
    ProjectMove,
    ProjectPatch,
    ProjectResponse,
    Workspace,
    WorkspaceCreate,
    WorkspaceCreated,
    WorkspaceList,
    WorkspacePatch,
    WorkspaceResponse,
    WorkspacesBoundToPool,
)
from master.services import (
    access,
    experiments,
    pool_bindings,
    quotas,
    workspace_storage,
    workspaces,
)

router = APIRouter(prefix="/api/v1", tags=["Workspaces"])

ORDER_BY = ("ORDER_BY_UNSPECIFIED", "ORDER_BY_ASC", "ORDER_BY_DESC")
# Determined's workspace settings that resolute does not apply yet: refused when given,
# rather than stored and silently ignored.
_NOT_YET = {
    "agentUserGroup": "agent users per workspace",
    "clusterNamespaceMeta": "Kubernetes namespaces",
}


def _descending(order_by: str) -> bool:
    if order_by not in ORDER_BY:
        raise InvalidArgument(f"orderBy: {order_by!r} is not one of {', '.join(ORDER_BY)}")
    return order_by == "ORDER_BY_DESC"


def _refuse_unsupported(body: WorkspaceCreate | WorkspacePatch) -> None:
    given = body.model_dump(by_alias=True, exclude_none=True)
    for key, what in _NOT_YET.items():
        if key in given:
            raise InvalidArgument(f"{key}: {what} are not supported by this master yet")


# -- workspaces -------------------------------------------------------------------------


@router.get("/workspaces")
async def list_workspaces(
    session: SessionDep,
    user: CurrentUser,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every workspace"),
    name: str | None = None,
    name_case_sensitive: Annotated[str | None, Query(alias="nameCaseSensitive")] = None,
    archived: bool | None = None,
    pinned: bool | None = None,
    user_ids: Annotated[list[int], Query(alias="userIds")] = [],  # noqa: B006 - FastAPI copies
    users: Annotated[list[str], Query()] = [],  # noqa: B006
    sort_by: Annotated[str, Query(alias="sortBy")] = "SORT_BY_ID",
    order_by: Annotated[str, Query(alias="orderBy")] = "ORDER_BY_ASC",
) -> WorkspaceList:
    views, total = await workspaces.list_workspaces(
        session,
        user.id,
        offset=offset,
        limit=limit,
        name=name,
        name_case_sensitive=name_case_sensitive,
        archived=archived,
        pinned=pinned,
        user_ids=user_ids,
        usernames=users,
        sort_by=sort_by,
        descending=_descending(order_by),
        readable=await access.readable(session, access.Actor.of(user), "workspaces"),
    )
    return WorkspaceList(
        workspaces=[Workspace.of(v) for v in views],
        pagination=Pagination.of(offset, limit, len(views), total),
    )


@router.get("/workspaces/{workspace_id}")
async def get_workspace(
    workspace_id: ObjectId, session: SessionDep, user: CurrentUser
) -> WorkspaceResponse:
    view = await workspaces.describe_workspace(session, workspace_id, user.id)
    return WorkspaceResponse(workspace=Workspace.of(view))


@router.post("/workspaces")
async def create_workspace(
    body: WorkspaceCreate, session: SessionDep, settings: SettingsDep, actor: CurrentActor
) -> WorkspaceCreated:
    _refuse_unsupported(body)
    ws = await workspaces.create_workspace(session, body.name, actor.user_id)
    if body.checkpoint_storage_config is not None:
        await workspace_storage.set_storage(session, ws.id, body.checkpoint_storage_config)
    await pool_bindings.set_default_pools(
        session,
        settings,
        actor,
        ws.id,
        pool_bindings.DefaultPools(body.default_compute_pool, body.default_aux_pool),
    )
    if body.cluster_quota_pairs is not None:
        # `det workspace create --resource-quota N`: N slots in its default compute pool.
        access.require_admin(actor, "setting workspace quotas")
        await quotas.set_default_pool_quota(
            session, settings, ws.id, None, body.cluster_quota_pairs
        )
    view = await workspaces.describe_workspace(session, ws.id, actor.user_id)
    return WorkspaceCreated(workspace=Workspace.of(view))


@router.patch("/workspaces/{workspace_id}")
async def patch_workspace(
    workspace_id: ObjectId,
    body: WorkspacePatch,
    session: SessionDep,
    settings: SettingsDep,
    actor: CurrentActor,
) -> WorkspaceResponse:
    _refuse_unsupported(body)
    await access.require_workspace_owner(session, actor, workspace_id, "edit it")
    if body.name is not None:
        await workspaces.rename_workspace(session, workspace_id, body.name)
    if body.checkpoint_storage_config is not None:
        await workspace_storage.set_storage(session, workspace_id, body.checkpoint_storage_config)
    # Determined's client sends the *ResourcePool keys; "" in the older ones means unset.
    compute, compute_field = body.default_compute_resource_pool, "defaultComputeResourcePool"
    if compute is None and body.default_compute_pool:
        compute, compute_field = body.default_compute_pool, "defaultComputePool"
    aux, aux_field = body.default_aux_resource_pool, "defaultAuxResourcePool"
    if aux is None and body.default_aux_pool:
        aux, aux_field = body.default_aux_pool, "defaultAuxPool"
    await pool_bindings.set_default_pools(
        session,
        settings,
        actor,
        workspace_id,
        pool_bindings.DefaultPools(compute, aux),
        (compute_field, aux_field),
    )
    view = await workspaces.describe_workspace(session, workspace_id, actor.user_id)
    return WorkspaceResponse(workspace=Workspace.of(view))


@router.post("/workspaces/{workspace_id}/archive")
async def archive_workspace(
    workspace_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    await access.require_workspace_owner(session, actor, workspace_id, "archive it")
    await workspaces.set_workspace_archived(session, workspace_id, True)
    return {}


@router.post("/workspaces/{workspace_id}/unarchive")
async def unarchive_workspace(
    workspace_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    await access.require_workspace_owner(session, actor, workspace_id, "unarchive it")
    await workspaces.set_workspace_archived(session, workspace_id, False)
    return {}


@router.post("/workspaces/{workspace_id}/pin")
async def pin_workspace(
    workspace_id: ObjectId, session: SessionDep, user: CurrentUser
) -> dict[str, Any]:
    await workspaces.set_workspace_pinned(session, workspace_id, user.id, True)
    return {}


@router.post("/workspaces/{workspace_id}/unpin")
async def unpin_workspace(
    workspace_id: ObjectId, session: SessionDep, user: CurrentUser
) -> dict[str, Any]:
    await workspaces.set_workspace_pinned(session, workspace_id, user.id, False)
    return {}


@router.delete("/workspaces/{workspace_id}")
async def delete_workspace(
    workspace_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> DeleteResponse:
    await access.require_workspace_owner(
        session, actor, workspace_id, "delete it", roles.DELETE_WORKSPACE
    )
    completed = await workspaces.delete_workspace(session, workspace_id, actor.username)
    return DeleteResponse(completed=completed)


# -- resource pool bindings -------------------------------------------------------------


@router.post("/resource-pools/{pool_name}/workspace-bindings")
async def bind_pool(
    pool_name: str,
    body: PoolBindings,
    session: SessionDep,
    settings: SettingsDep,
    actor: CurrentActor,
) -> dict[str, Any]:
    _refuse_other_pool(pool_name, body)
    await pool_bindings.bind_workspaces(
        session, settings, actor, pool_name, body.workspace_ids, body.workspace_names
    )
    return {}


@router.delete("/resource-pools/{pool_name}/workspace-bindings")
async def unbind_pool(
    pool_name: str,
    body: PoolBindings,
    session: SessionDep,
    settings: SettingsDep,
    actor: CurrentActor,
) -> dict[str, Any]:
    _refuse_other_pool(pool_name, body)
    await pool_bindings.unbind_workspaces(
        session, settings, actor, pool_name, body.workspace_ids, body.workspace_names
    )
    return {}


@router.put("/resource-pools/{pool_name}/workspace-bindings")
async def replace_pool_bindings(
    pool_name: str,
    body: PoolBindings,
    session: SessionDep,
    settings: SettingsDep,
    actor: CurrentActor,
) -> dict[str, Any]:
    _refuse_other_pool(pool_name, body)
    await pool_bindings.replace_bindings(
        session, settings, actor, pool_name, body.workspace_ids, body.workspace_names
    )
    return {}


@router.get("/resource-pools/{pool_name}/workspace-bindings")
async def list_pool_bindings(
    pool_name: str,
    session: SessionDep,
    settings: SettingsDep,
    _user: CurrentUser,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every binding"),
) -> WorkspacesBoundToPool:
    ids, total = await pool_bindings.workspaces_bound_to(
        session, settings, pool_name, offset, limit
    )
    return WorkspacesBoundToPool(
        workspace_ids=ids, pagination=Pagination.of(offset, limit, len(ids), total)
    )


@router.get("/workspaces/{workspace_id}/available-resource-pools")
async def list_available_pools(
    workspace_id: ObjectId,
    session: SessionDep,
    settings: SettingsDep,
    _user: CurrentUser,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every pool"),
) -> PoolsAvailableToWorkspace:
    names = await pool_bindings.pools_available_to(session, settings, workspace_id)
    page = names[offset : offset + limit] if limit > 0 else names[offset:]
    return PoolsAvailableToWorkspace(
        resource_pools=page, pagination=Pagination.of(offset, limit, len(page), len(names))
    )


def _refuse_other_pool(pool_name: str, body: PoolBindings) -> None:
    if body.resource_pool_name not in (None, "", pool_name):
        raise InvalidArgument(
            f"resourcePoolName: the body names pool {body.resource_pool_name!r}, the path "
            f"pool {pool_name!r}"
        )


# -- projects ---------------------------------------------------------------------------


@router.get("/workspaces/{workspace_id}/projects")
async def list_workspace_projects(
    workspace_id: ObjectId,
    session: SessionDep,
    actor: CurrentActor,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every project"),
    name: str | None = None,
    archived: bool | None = None,
    user_ids: Annotated[list[int], Query(alias="userIds")] = [],  # noqa: B006
    users: Annotated[list[str], Query()] = [],  # noqa: B006
    sort_by: Annotated[str, Query(alias="sortBy")] = "SORT_BY_ID",
    order_by: Annotated[str, Query(alias="orderBy")] = "ORDER_BY_ASC",
) -> ProjectList:
    """Determined's client asks for workspace 0 to mean every workspace."""
    views, total = await workspaces.list_projects(
        session,
        workspace_id=workspace_id,
        offset=offset,
        limit=limit,
        name=name,
        archived=archived,
        user_ids=user_ids,
        usernames=users,
        sort_by=sort_by,
        descending=_descending(order_by),
        readable=await access.readable(session, actor, "projects"),
    )
    return ProjectList(
        projects=[Project.of(v) for v in views],
        pagination=Pagination.of(offset, limit, len(views), total),
    )


@router.post("/workspaces/{workspace_id}/projects")
async def create_project(
    workspace_id: ObjectId, body: ProjectCreate, session: SessionDep, user: CurrentUser
) -> ProjectResponse:
    if body.workspace_id not in (None, 0, workspace_id):
        raise InvalidArgument(
            f"workspaceId: the body names workspace {body.workspace_id}, the path "
            f"workspace {workspace_id}"
        )
    workspace = await workspaces.get_workspace(session, workspace_id)
    what = f"add projects to workspace {workspace.name!r}"
    await access.require_creator(
        session, access.Actor.of(user), workspace, roles.CREATE_PROJECT, what
    )
    project = await workspaces.create_project(
        session, workspace_id, user.id, body.name, body.description, body.key
    )
    return ProjectResponse(
        project=Project.of(await workspaces.describe_project(session, project.id))
    )


@router.get("/projects/{project_id}")
async def get_project(
    project_id: ObjectId, session: SessionDep, _user: CurrentUser
) -> ProjectResponse:
    return ProjectResponse(
        project=Project.of(await workspaces.describe_project(session, project_id))
    )


@router.patch("/projects/{project_id}")
async def patch_project(
    project_id: ObjectId, body: ProjectPatch, session: SessionDep, actor: CurrentActor
) -> ProjectResponse:
    await access.require_project_owner(session, actor, project_id, "edit it")
    await workspaces.edit_project(session, project_id, body.name, body.description, body.key)
    return ProjectResponse(
        project=Project.of(await workspaces.describe_project(session, project_id))
    )


@router.post("/projects/{project_id}/archive")
async def archive_project(
    project_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    await access.require_project_owner(session, actor, project_id, "archive it")
    await workspaces.set_project_archived(session, project_id, True)
    return {}


@router.post("/projects/{project_id}/unarchive")
async def unarchive_project(
    project_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    await access.require_project_owner(session, actor, project_id, "unarchive it")
    await workspaces.set_project_archived(session, project_id, False)
    return {}


@router.post("/projects/{project_id}/move")
async def move_project(
    project_id: ObjectId, body: ProjectMove, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    if body.project_id not in (None, 0, project_id):
        raise InvalidArgument(
            f"projectId: the body names project {body.project_id}, the path project {project_id}"
        )
    if body.destination_workspace_id is None:
        raise InvalidArgument("destinationWorkspaceId: required")
    # Taking someone else's project out of its workspace is deleting it there (WorkspaceAdmin):
    # the destination may be a workspace of the mover's own.
    await access.require_project_owner(session, actor, project_id, "move it", roles.DELETE_PROJECT)
    destination = body.destination_workspace_id
    if await access.hidden(session, actor, "workspace_id", str(destination)):
        # As for one that does not exist (workspaces.move_project's words).
        raise InvalidArgument(f"destinationWorkspaceId: workspace {destination} does not exist")
    await experiments.move_project(session, project_id, destination, actor)
    return {}


@router.delete("/projects/{project_id}")
async def delete_project(
    project_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> DeleteResponse:
    await access.require_project_owner(
        session, actor, project_id, "delete it", roles.DELETE_PROJECT
    )
    completed = await workspaces.delete_project(session, project_id, actor.username)
    return DeleteResponse(completed=completed)


@router.post("/experiments/{experiment_id}/move")
async def move_experiment(
    experiment_id: ObjectId, body: ExperimentMove, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    if body.experiment_id not in (None, 0, experiment_id):
        raise InvalidArgument(
            f"experimentId: the body names experiment {body.experiment_id}, the path "
            f"experiment {experiment_id}"
        )
    if body.destination_project_id is None:
        raise InvalidArgument("destinationProjectId: required")
    await access.require_experiment_owner(
        session, actor, experiment_id, "move it", roles.DELETE_EXPERIMENT
    )
    await experiments.move_experiment(session, actor, experiment_id, body.destination_project_id)
    return {}
