"""Config templates, as Determined's REST API serves them (`det tpl ...`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from master.api.deps import MAX_INT, CurrentActor, CurrentUser, SessionDep
from master.core import roles
from master.errors import InvalidArgument, NotFound
from master.schemas.common import DbInt, Pagination
from master.schemas.experiments import Empty
from master.schemas.templates import (
    Template,
    TemplateCreate,
    TemplateList,
    TemplateRename,
    TemplateResponse,
)
from master.services import access, templates
from master.services.access import Actor

router = APIRouter(prefix="/api/v1", tags=["Templates"])

ORDER_BY = ("ORDER_BY_UNSPECIFIED", "ORDER_BY_ASC", "ORDER_BY_DESC")
SORT_BY = ("SORT_BY_UNSPECIFIED", "SORT_BY_NAME")  # as in Determined, only by name


@router.get("/templates")
async def list_templates(
    session: SessionDep,
    actor: CurrentActor,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every template"),
    name: str | None = None,
    workspace_ids: Annotated[list[DbInt] | None, Query(alias="workspaceIds")] = None,
    order_by: Annotated[str, Query(alias="orderBy")] = "ORDER_BY_UNSPECIFIED",
    sort_by: Annotated[str, Query(alias="sortBy")] = "SORT_BY_UNSPECIFIED",
) -> TemplateList:
    if order_by not in ORDER_BY:
        raise InvalidArgument(f"orderBy: {order_by!r} is not one of {', '.join(ORDER_BY)}")
    if sort_by not in SORT_BY:
        raise InvalidArgument(f"sortBy: {sort_by!r} is not one of {', '.join(SORT_BY)}")
    rows, total = await templates.list_templates(
        session,
        offset=offset,
        limit=limit,
        name=name,
        workspace_ids=workspace_ids,
        descending=order_by == "ORDER_BY_DESC",
        readable=await access.readable(session, actor, "templates"),
    )
    return TemplateList(
        templates=[Template.of(r) for r in rows],
        pagination=Pagination.of(offset, limit, len(rows), total),
    )


@router.get("/templates/{name}")
async def get_template(name: str, session: SessionDep, _user: CurrentUser) -> TemplateResponse:
    return TemplateResponse(template=Template.of(await templates.get_template(session, name)))


def _body_name(path_name: str, body: TemplateCreate) -> None:
    if body.name not in (None, "", path_name):
        raise InvalidArgument(f"name: the body says {body.name!r} but the path says {path_name!r}")


async def _refuse_hidden(session: SessionDep, actor: Actor, workspace_id: int | None) -> None:
    if workspace_id and await access.hidden(session, actor, "workspace_id", str(workspace_id)):
        raise NotFound(f"workspaceId: workspace {workspace_id} not found")


async def _check_workspace(
    session: SessionDep, actor: Actor, workspace_id: int | None, now_in: int | None = None
) -> None:
    """A workspace the caller may not see is named as templates.template_workspace names
    one that does not exist; one they see takes templates from its owner and whoever
    holds CREATE_TEMPLATES there (an Editor). `now_in`: the workspace a replaced template
    is in already, which it stays in without that permission."""
    if not workspace_id:
        return  # the built-in workspace, open to all
    await _refuse_hidden(session, actor, workspace_id)
    if workspace_id == now_in:
        return
    workspace = await templates.template_workspace(session, workspace_id)
    what = f"put templates in workspace {workspace.name!r}"
    await access.require_creator(session, actor, workspace, roles.CREATE_TEMPLATES, what)


@router.post("/templates/{name}")
async def create_template(
    name: str, body: TemplateCreate, session: SessionDep, user: CurrentUser
) -> TemplateResponse:
    _body_name(name, body)
    await _check_workspace(session, Actor.of(user), body.workspace_id)
    row = await templates.create_template(session, name, body.config, body.workspace_id, user.id)
    return TemplateResponse(template=Template.of(row))


@router.put("/templates/{name}")
async def put_template(
    name: str, body: TemplateCreate, session: SessionDep, user: CurrentUser
) -> TemplateResponse:
    _body_name(name, body)
    await _refuse_hidden(session, Actor.of(user), body.workspace_id)  # before naming its owner
    now_in = None
    if await templates.template_exists(session, name):
        await access.require_template_owner(session, Actor.of(user), name, "replace it")
        now_in = (await templates.get_template(session, name)).workspace_id
    await _check_workspace(session, Actor.of(user), body.workspace_id, now_in)
    row = await templates.put_template(session, name, body.config, body.workspace_id, user.id)
    return TemplateResponse(template=Template.of(row))


@router.patch("/templates/{name}")
async def patch_template_config(
    name: str, session: SessionDep, user: CurrentUser, config: Any = Body(None)
) -> TemplateResponse:
    """Determined's PATCH takes the bare config as the body and replaces the stored one."""
    await access.require_template_owner(session, Actor.of(user), name, "change it")
    row = await templates.replace_template_config(session, name, config)
    return TemplateResponse(template=Template.of(row))


@router.patch("/template/rename")
async def rename_template(
    body: TemplateRename, session: SessionDep, user: CurrentUser
) -> TemplateResponse:
    await access.require_template_owner(session, Actor.of(user), body.old_name, "rename it")
    row = await templates.rename_template(session, body.old_name, body.new_name)
    return TemplateResponse(template=Template.of(row))


@router.delete("/templates/{name}")
async def delete_template(name: str, session: SessionDep, user: CurrentUser) -> Empty:
    await access.require_template_owner(
        session, Actor.of(user), name, "delete it", roles.DELETE_TEMPLATES
    )
    await templates.delete_template(session, name)
    return Empty()
