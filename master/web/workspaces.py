"""Workspaces and their projects: where experiments are kept, and each workspace's slot
quotas with the slots it holds and borrows (docs/quotas.md). Read-only pages; a project
links to the experiments list filtered to it. Changes go through `det workspace`,
`det project` and the API."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import ObjectId, SessionDep, SettingsDep
from master.services import quotas, workspaces
from master.settings import MasterSettings
from master.web.common import PagingDep, WebRoute, WebSessionDep, page_links, page_response
from resolute.storage import mask_secrets

router = APIRouter(route_class=WebRoute)


@dataclass(frozen=True)
class PoolShare:
    """A workspace in one pool where it has a quota or holds slots."""

    pool: str
    held: int
    quota: quotas.EffectiveQuota | None  # None: no quota there

    @property
    def borrowed(self) -> int:
        """Held above the nominal; without a quota, all it holds (the scheduler may
        reclaim it), as the metrics count it."""
        nominal = self.quota.nominal_slots if self.quota else 0
        return max(0, self.held - nominal)

    @property
    def summary(self) -> str:
        """One line for the workspaces list: "6 slots in gpu, holds 8 (2 borrowed)"."""
        q = self.quota
        quota = f"{q.nominal_slots} slot{'' if q.nominal_slots == 1 else 's'}" if q else "no quota"
        borrowed = f" ({self.borrowed} borrowed)" if q and self.borrowed else ""
        return f"{quota} in {self.pool}, holds {self.held}{borrowed}"


async def pool_shares(
    session: AsyncSession, settings: MasterSettings, workspace_ids: Collection[int]
) -> dict[int, list[PoolShare]]:
    """Each of these workspaces' quotas and held slots, by pool name; the quotas as
    `GET /api/v1/quotas` shows them."""
    wanted = set(workspace_ids)
    in_force = {
        (q.workspace_id, q.pool): q
        for q in await quotas.effective_quotas(session, settings)
        if q.workspace_id in wanted
    }
    held = {
        k: n for k, n in (await quotas.held_slots_by_workspace(session)).items() if k[0] in wanted
    }
    shares: dict[int, list[PoolShare]] = defaultdict(list)
    for key in sorted(in_force.keys() | held.keys(), key=lambda k: k[1]):
        shares[key[0]].append(PoolShare(key[1], held.get(key, 0), in_force.get(key)))
    return shares


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
    )
    params = {"archived": "true" if archived else ""}
    context = {
        "nav": "workspaces",
        "rows": views,
        "shares": await pool_shares(session, settings, [v.workspace.id for v in views]),
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
    )
    params = {"archived": "true" if archived else ""}
    stored = workspace.workspace.checkpoint_storage
    context = {
        "nav": "workspaces",
        "workspace": workspace,
        "storage": mask_secrets(stored) if stored else None,  # never a secret on a page
        "shares": (await pool_shares(session, settings, [workspace_id])).get(workspace_id, []),
        "rows": projects,
        "archived": archived,
        "pager": page_links(f"/ui/workspaces/{workspace_id}", paged, total, len(projects), params),
    }
    return page_response(request, "workspace.html", context, web=web)
