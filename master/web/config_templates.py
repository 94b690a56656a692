"""Config templates: list, view, create, edit and delete, validated by the template service
exactly as the API validates them; each problem is shown beside the field it concerns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import MAX_INT, SessionDep
from master.core import roles
from master.core.expconf import parse_yaml
from master.errors import AlreadyExists, InvalidArgument, MasterError, NotFound
from master.services import access, templates
from master.services.configs import config_errors_as_invalid_argument
from master.web.common import (
    Form,
    PagingDep,
    WebRoute,
    WebSession,
    WebSessionDep,
    checked_form,
    page_links,
    page_response,
    parse_int,
    redirect,
    to_yaml,
)
from resolute.storage import mask_config

router = APIRouter(route_class=WebRoute)

# Template names start with a letter or digit, so no template can be called "_new".
NEW_PATH = "/ui/templates/_new"
NOTICES = {"deleted": "Template deleted.", "saved": "Template saved."}
EXAMPLE = """\
description: shared settings
resources:
  slots_per_trial: 1
"""


@dataclass
class FieldErrors:
    """Problems by form field: `name`, `workspace`, or `config` with one line per config path."""

    name: str | None = None
    workspace: str | None = None
    config: list[dict[str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.name or self.workspace or self.config)


def _config_problems(exc: MasterError) -> list[dict[str, str]]:
    if exc.details:
        return [
            {"path": str(d.get("path") or "(document)"), "message": str(d.get("message", ""))}
            for d in exc.details
        ]
    return [{"path": "(document)", "message": exc.message}]


def _parse(text: str) -> dict[str, Any]:
    with config_errors_as_invalid_argument("template config"):
        return parse_yaml(text)


@router.get("/ui/templates")
async def templates_page(
    request: Request,
    session: SessionDep,
    web: WebSessionDep,
    paged: PagingDep,
    name: Annotated[str, Query(max_length=256)] = "",
    workspace: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
    notice: str = "",
) -> Response:
    rows, total = await templates.list_templates(
        session,
        offset=paged.offset,
        limit=paged.per_page,
        name=name.strip() or None,
        workspace_ids=[workspace] if workspace else None,
        readable=await access.readable(session, web.actor, "templates"),
    )
    params = {"name": name, "workspace": str(workspace) if workspace else ""}
    context = {
        "nav": "templates",
        "rows": rows,
        "name": name,
        "workspace": workspace or 0,
        "workspaces": await _workspace_names(session, web.actor),
        "notice": NOTICES.get(notice),
        "pager": page_links("/ui/templates", paged, total, len(rows), params),
    }
    return page_response(request, "templates.html", context, web=web)


async def _workspace_names(session: AsyncSession, actor: access.Actor) -> dict[int, str]:
    """The workspaces the user may see, by id, for the page's choices and names."""
    seen = await access.sight(session, actor, roles.VIEW_WORKSPACE)
    names = await templates.workspace_names(session)
    return {ws: name for ws, name in names.items() if seen.sees(ws)}


async def _form_page(
    request: Request,
    session: SessionDep,
    web: WebSession,
    *,
    creating: bool,
    name: str,
    text: str,
    workspace_id: int = 0,
    errors: FieldErrors | None = None,
    notice: str | None = None,
) -> Response:
    context = {
        "nav": "templates",
        "creating": creating,
        "name": name,
        "text": text,
        "workspace_id": workspace_id,
        "workspaces": await _workspace_names(session, web.actor),
        "errors": errors or FieldErrors(),
        "notice": notice,
        "action": NEW_PATH if creating else f"/ui/templates/{quote(name, safe='')}",
    }
    return page_response(request, "template_form.html", context, web=web)


@router.get(NEW_PATH)
async def new_template_page(
    request: Request,
    session: SessionDep,
    web: WebSessionDep,
    workspace: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
) -> Response:
    return await _form_page(
        request, session, web, creating=True, name="", text=EXAMPLE, workspace_id=workspace
    )


def _form_workspace(form: Form) -> int:
    """The form's workspace; empty or 0 is the built-in one, as on the API."""
    if not form.get("workspace").strip():
        return 0
    return parse_int(form, "workspace", 0, MAX_INT)


@router.post(NEW_PATH)
async def create_template(request: Request, session: SessionDep, web: WebSessionDep) -> Response:
    form = await checked_form(request, web)
    name, text = form.get("name").strip(), form.get("config")
    errors = FieldErrors()
    workspace_id = 0
    try:
        templates.check_template_name(name)
    except InvalidArgument as exc:
        errors.name = exc.message
    try:
        workspace_id = _form_workspace(form)
        # Hidden first: the workspace's state would name it.
        if workspace_id and await access.hidden(
            session, web.actor, "workspace_id", str(workspace_id)
        ):
            raise NotFound(f"workspaceId: workspace {workspace_id} not found")
        workspace = await templates.template_workspace(session, workspace_id)
        what = f"put templates in workspace {workspace.name!r}"
        await access.require_creator(session, web.actor, workspace, roles.CREATE_TEMPLATES, what)
    except MasterError as exc:  # unknown (404), archived or being deleted (400), refused (403)
        errors.workspace = exc.message.removeprefix("workspaceId: ")
    config: dict[str, Any] | None = None
    try:
        config = _parse(text)
        templates.check_template_config(config)
    except InvalidArgument as exc:
        errors.config = _config_problems(exc)
    if not errors and config is not None:
        try:
            await templates.create_template(session, name, config, workspace_id, web.user_id)
        except AlreadyExists as exc:
            errors.name = exc.message
        except InvalidArgument as exc:
            errors.config = _config_problems(exc)
    if errors:
        await session.rollback()
        return await _form_page(
            request,
            session,
            web,
            creating=True,
            name=name,
            text=text,
            workspace_id=workspace_id,
            errors=errors,
        )
    return redirect(f"/ui/templates/{quote(name, safe='')}?notice=saved")


@router.get("/ui/templates/{name}")
async def template_page(
    request: Request, name: str, session: SessionDep, web: WebSessionDep, notice: str = ""
) -> Response:
    row = await templates.get_template(session, name)
    return await _form_page(
        request,
        session,
        web,
        creating=False,
        name=row.name,
        text=to_yaml(mask_config(row.config)),
        workspace_id=row.workspace_id,
        notice=NOTICES.get(notice),
    )


@router.post("/ui/templates/{name}")
async def edit_template(
    request: Request, name: str, session: SessionDep, web: WebSessionDep
) -> Response:
    form = await checked_form(request, web)
    # A 404 page for a template deleted meanwhile, a 403 page for another user's.
    await access.require_template_owner(session, web.actor, name, "change it")
    text = form.get("config")
    try:
        await templates.replace_template_config(session, name, _parse(text))
    except InvalidArgument as exc:
        await session.rollback()
        errors = FieldErrors(config=_config_problems(exc))
        workspace_id = (await templates.get_template(session, name)).workspace_id
        return await _form_page(
            request,
            session,
            web,
            creating=False,
            name=name,
            text=text,
            workspace_id=workspace_id,
            errors=errors,
        )
    return redirect(f"/ui/templates/{quote(name, safe='')}?notice=saved")


@router.get("/ui/templates/{name}/delete")
async def confirm_delete_page(
    request: Request, name: str, session: SessionDep, web: WebSessionDep
) -> Response:
    row = await templates.get_template(session, name)
    return page_response(
        request, "template_delete.html", {"nav": "templates", "name": row.name}, web=web
    )


@router.post("/ui/templates/{name}/delete")
async def delete_template(
    request: Request, name: str, session: SessionDep, web: WebSessionDep
) -> Response:
    await checked_form(request, web)
    await access.require_template_owner(
        session, web.actor, name, "delete it", roles.DELETE_TEMPLATES
    )
    await templates.delete_template(session, name)
    return redirect("/ui/templates?notice=deleted")
