"""The model registry on Determined's routes (`det model ...`, the SDK's Model and ModelVersion).

`{model_name}` is a model's name or numeric id: Determined's client sends either.
"""

from __future__ import annotations

from fastapi import APIRouter, Query
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import MAX_INT, CurrentActor, CurrentUser, ObjectId, SessionDep
from master.api.routes.trials import checkpoint_views
from master.schemas.common import DbInt, Pagination
from master.schemas.experiments import Empty
from master.schemas.registry import (
    ModelCreate,
    ModelLabels,
    ModelList,
    ModelMove,
    ModelPatch,
    ModelResponse,
    ModelVersion,
    ModelVersionCreate,
    ModelVersionList,
    ModelVersionPatch,
    ModelVersionResponse,
    RegistryModel,
)
from master.services import access, model_registry
from master.services.model_registry import ModelFilter, ModelView, VersionView

router = APIRouter(prefix="/api/v1", tags=["Models"])


def model_reply(view: ModelView) -> RegistryModel:
    row = view.row
    return RegistryModel(
        id=row.id,
        name=row.name,
        description=row.description,
        notes=row.notes,
        labels=list(row.labels or []),
        metadata=dict(row.metadata_ or {}),
        archived=row.archived,
        creation_time=row.creation_time,
        last_updated_time=row.last_updated_time,
        num_versions=view.num_versions,
        user_id=row.owner_id or 0,
        username=view.username,
        workspace_id=row.workspace_id,
    )


async def version_replies(session: AsyncSession, views: list[VersionView]) -> list[ModelVersion]:
    checkpoints = await checkpoint_views(session, [v.checkpoint for v in views])
    return [
        ModelVersion(
            id=v.row.id,
            version=v.row.version,
            model=model_reply(v.model),
            checkpoint=checkpoint,
            name=v.row.name,
            comment=v.row.comment,
            notes=v.row.notes,
            labels=list(v.row.labels or []),
            metadata=dict(v.row.metadata_ or {}),
            creation_time=v.row.creation_time,
            last_updated_time=v.row.last_updated_time,
            user_id=v.row.owner_id or 0,
            username=v.username,
        )
        for v, checkpoint in zip(views, checkpoints, strict=True)
    ]


@router.get("/models")
async def list_models(
    session: SessionDep,
    actor: CurrentActor,
    archived: bool | None = None,
    name: str | None = None,
    description: str | None = None,
    id: int | None = Query(None, ge=0, le=MAX_INT),
    labels: list[str] | None = Query(None),
    users: list[str] | None = Query(None),
    user_ids: list[DbInt] | None = Query(None, alias="userIds"),
    workspace_ids: list[DbInt] | None = Query(None, alias="workspaceIds"),
    workspace_names: list[str] | None = Query(None, alias="workspaceNames"),
    sort_by: str = Query("SORT_BY_UNSPECIFIED", alias="sortBy"),
    order_by: str = Query("ORDER_BY_UNSPECIFIED", alias="orderBy"),
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every model"),
) -> ModelList:
    filters = ModelFilter(
        archived=archived,
        name=name,
        description=description,
        model_id=id,
        labels=labels or (),
        users=users or (),
        user_ids=user_ids or (),
        workspace_ids=workspace_ids or (),
        workspace_names=workspace_names or (),
    )
    page, total = await model_registry.list_models(
        session,
        filters,
        sort_by=sort_by,
        order_by=order_by,
        offset=offset,
        limit=limit,
        readable=await access.readable(session, actor, "models"),
    )
    return ModelList(
        models=[model_reply(v) for v in page],
        pagination=Pagination.of(offset, limit, len(page), total),
    )


@router.post("/models")
async def create_model(
    body: ModelCreate, session: SessionDep, actor: CurrentActor
) -> ModelResponse:
    view = await model_registry.create_model(
        session,
        actor,
        name=body.name,
        description=body.description,
        notes=body.notes,
        labels=body.labels,
        metadata=body.metadata,
        workspace_id=body.workspace_id,
        workspace_name=body.workspace_name,
    )
    return ModelResponse(model=model_reply(view))


@router.get("/model/labels")
async def model_labels(session: SessionDep, actor: CurrentActor) -> ModelLabels:
    readable = await access.readable(session, actor, "models")
    return ModelLabels(labels=await model_registry.labels_in_use(session, readable))


@router.get("/models/{model_name}")
async def get_model(model_name: str, session: SessionDep, _user: CurrentUser) -> ModelResponse:
    return ModelResponse(model=model_reply(await model_registry.get_model(session, model_name)))


@router.patch("/models/{model_name}")
async def patch_model(
    model_name: str, body: ModelPatch, session: SessionDep, actor: CurrentActor
) -> ModelResponse:
    view = await model_registry.patch_model(
        session, actor, model_name, body.model_dump(exclude_none=True)
    )
    return ModelResponse(model=model_reply(view))


@router.post("/models/{model_name}/move")
async def move_model(
    model_name: str, body: ModelMove, session: SessionDep, actor: CurrentActor
) -> Empty:
    """Determined's MoveModel (the web UI's "move to workspace"; `det model move` patches
    workspaceName instead)."""
    await model_registry.move_model(session, actor, model_name, body.destination_workspace_id)
    return Empty()


@router.post("/models/{model_name}/archive")
async def archive_model(model_name: str, session: SessionDep, actor: CurrentActor) -> Empty:
    await model_registry.set_archived(session, actor, model_name, True)
    return Empty()


@router.post("/models/{model_name}/unarchive")
async def unarchive_model(model_name: str, session: SessionDep, actor: CurrentActor) -> Empty:
    await model_registry.set_archived(session, actor, model_name, False)
    return Empty()


@router.delete("/models/{model_name}")
async def delete_model(model_name: str, session: SessionDep, actor: CurrentActor) -> Empty:
    await model_registry.delete_model(session, actor, model_name)
    return Empty()


@router.get("/models/{model_name}/versions")
async def list_versions(
    model_name: str,
    session: SessionDep,
    _user: CurrentUser,
    sort_by: str = Query("SORT_BY_UNSPECIFIED", alias="sortBy"),
    order_by: str = Query("ORDER_BY_UNSPECIFIED", alias="orderBy"),
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every version"),
) -> ModelVersionList:
    model, views, total = await model_registry.list_versions(
        session, model_name, sort_by=sort_by, order_by=order_by, offset=offset, limit=limit
    )
    return ModelVersionList(
        model=model_reply(model),
        model_versions=await version_replies(session, views),
        pagination=Pagination.of(offset, limit, len(views), total),
    )


@router.post("/models/{model_name}/versions")
async def register_version(
    model_name: str, body: ModelVersionCreate, session: SessionDep, actor: CurrentActor
) -> ModelVersionResponse:
    view = await model_registry.register_version(
        session,
        actor,
        model_name,
        checkpoint_uuid=body.checkpoint_uuid,
        name=body.name,
        comment=body.comment,
        notes=body.notes,
        labels=body.labels,
        metadata=body.metadata,
    )
    return ModelVersionResponse(model_version=(await version_replies(session, [view]))[0])


@router.get("/models/{model_name}/versions/{version}")
async def get_version(
    model_name: str, version: ObjectId, session: SessionDep, _user: CurrentUser
) -> ModelVersionResponse:
    view = await model_registry.get_version(session, model_name, version)
    return ModelVersionResponse(model_version=(await version_replies(session, [view]))[0])


@router.patch("/models/{model_name}/versions/{version}")
async def patch_version(
    model_name: str,
    version: ObjectId,
    body: ModelVersionPatch,
    session: SessionDep,
    actor: CurrentActor,
) -> ModelVersionResponse:
    view = await model_registry.patch_version(
        session, actor, model_name, version, body.model_dump(exclude_none=True)
    )
    return ModelVersionResponse(model_version=(await version_replies(session, [view]))[0])


@router.delete("/models/{model_name}/versions/{version}")
async def delete_version(
    model_name: str, version: ObjectId, session: SessionDep, actor: CurrentActor
) -> Empty:
    await model_registry.delete_version(session, actor, model_name, version)
    return Empty()
