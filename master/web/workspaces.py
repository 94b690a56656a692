"""Workspaces and their projects: where experiments are kept. Read-only pages; a project
links to the experiments list filtered to it. Changes go through `det workspace`,
`det project` and the API."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from master.api.deps import ObjectId, SessionDep
from master.services import workspaces
from master.web.common import PagingDep, WebRoute, WebSessionDep, page_links, page_response
from resolute.storage import mask_secrets

router = APIRouter(route_class=WebRoute)


@router.get("/ui/workspaces")
async def workspaces_page(
    request: Request,
    session: SessionDep,
    web: WebSessionDep,
    paged: PagingDep,
    archived: bool = False,
) -> Response:
    views, total = await workspaces.list_workspaces(
        session,
        web.user_id,
        offset=paged.offset,
        limit=paged.per_page,
        archived=None if archived else False,
        sort_by="SORT_BY_NAME",
    )
    params = {"archived": "true" if archived else ""}
    context = {
        "nav": "workspaces",
        "rows": views,
        "archived": archived,
        "pager": page_links("/ui/workspaces", paged, total, len(views), params),
    }
    return page_response(request, "workspaces.html", context, web=web)


@router.get("/ui/workspaces/{workspace_id}")
async def workspace_page(
    request: Request,
    workspace_id: ObjectId,
    session: SessionDep,
    web: WebSessionDep,
    paged: PagingDep,
    archived: bool = False,
) -> Response:
    workspace = await workspaces.describe_workspace(session, workspace_id, web.user_id)
    projects, total = await workspaces.list_projects(
        session,
        workspace_id=workspace_id,
        offset=paged.offset,
        limit=paged.per_page,
        archived=None if archived else False,
        sort_by="SORT_BY_NAME",
    )
    params = {"archived": "true" if archived else ""}
    stored = workspace.workspace.checkpoint_storage
    context = {
        "nav": "workspaces",
        "workspace": workspace,
        "storage": mask_secrets(stored) if stored else None,  # never a secret on a page
        "rows": projects,
        "archived": archived,
        "pager": page_links(f"/ui/workspaces/{workspace_id}", paged, total, len(projects), params),
    }
    return page_response(request, "workspace.html", context, web=web)
