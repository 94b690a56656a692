"""Workspaces and their projects: where experiments are kept, and each workspace's slot
quotas with the slots it holds and borrows (docs/quotas.md). Read-only pages; a project
links to the experiments list filtered to it. Changes go through `det workspace`,
`det project` and the API."""

from __future__ import annotations

from collections import defaultdict

from fastapi import APIRouter, Request, Response

from master.api.deps import ObjectId, SessionDep, SettingsDep
from master.services import access, quotas, roles, workspaces
from master.web.common import PagingDep, WebRoute, WebSessionDep, page_links, page_response
from resolute.storage import mask_secrets

router = APIRouter(route_class=WebRoute)


def summary(share: quotas.PoolShare) -> str:
    """One line for the workspaces list: "6 slots in gpu, holds 8 (2 borrowed)"."""
    q = share.quota
    quota = f"{q.nominal_slots} slot{'' if q.nominal_slots == 1 else 's'}" if q else "no quota"
    borrowed = f" ({share.borrowed} borrowed)" if q and share.borrowed else ""
    return f"{quota} in {share.pool}, holds {share.held_slots}{borrowed}"


@router.get("/ui/workspaces")
async def workspaces_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
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
        readable=await access.readable(session, web.actor, "workspaces"),
    )
    summaries: dict[int, list[str]] = defaultdict(list)
    for share in await quotas.pool_shares(session, settings, [v.workspace.id for v in views]):
        summaries[share.workspace_id].append(summary(share))
    params = {"archived": "true" if archived else ""}
    context = {
        "nav": "workspaces",
        "rows": views,
        "summaries": summaries,
        "archived": archived,
        "pager": page_links("/ui/workspaces", paged, total, len(views), params),
    }
    return page_response(request, "workspaces.html", context, web=web)


@router.get("/ui/workspaces/{workspace_id}")
async def workspace_page(
    request: Request,
    workspace_id: ObjectId,
    session: SessionDep,
    settings: SettingsDep,
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
        readable=await access.readable(session, web.actor, "projects"),
    )
    params = {"archived": "true" if archived else ""}
    stored = workspace.workspace.checkpoint_storage
    context = {
        "nav": "workspaces",
        "workspace": workspace,
        "storage": mask_secrets(stored) if stored else None,  # never a secret on a page
        "shares": await quotas.pool_shares(session, settings, [workspace_id]),
        "members": await roles.members_of_workspace(session, workspace_id),
        "rows": projects,
        "archived": archived,
        "pager": page_links(f"/ui/workspaces/{workspace_id}", paged, total, len(projects), params),
    }
    return page_response(request, "workspace.html", context, web=web)
