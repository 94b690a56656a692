"""Workspaces' slot quotas (`det workspace quota`, docs/quotas.md), and Determined's
`det workspace resource-quota set`. Admins change them; every signed-in user reads them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from master.api.deps import CurrentActor, CurrentUser, ObjectId, SessionDep, SettingsDep
from master.core import roles
from master.schemas.quotas import (
    KubernetesResourceQuotas,
    Quota,
    QuotaList,
    QuotaResponse,
    QuotaSet,
    SetResourceQuotas,
)
from master.services import access, quotas

router = APIRouter(prefix="/api/v1", tags=["Quotas"])


@router.get("/quotas")
async def list_quotas(session: SessionDep, settings: SettingsDep, actor: CurrentActor) -> QuotaList:
    """Every quota of the workspaces the caller may read."""
    seen = await access.sight(session, actor, roles.VIEW_WORKSPACE)
    usage = await quotas.quota_usage(session, settings)
    return QuotaList(quotas=[Quota.of(u) for u in usage if seen.sees(u.quota.workspace_id)])


@router.get("/workspaces/{workspace_id}/quotas")
async def workspace_quotas(
    workspace_id: ObjectId, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> QuotaList:
    usage = await quotas.quota_usage(session, settings, workspace_id)
    return QuotaList(quotas=[Quota.of(u) for u in usage])


@router.put("/workspaces/{workspace_id}/quotas/{pool}")
async def set_quota(
    workspace_id: ObjectId,
    pool: str,
    body: QuotaSet,
    session: SessionDep,
    settings: SettingsDep,
    actor: CurrentActor,
) -> QuotaResponse:
    access.require_admin(actor, "setting workspace quotas")
    usage = await quotas.set_quota(
        session,
        settings,
        workspace_id,
        pool,
        body.nominal_slots,
        body.borrowing_limit,
        body.lending_limit,
    )
    return QuotaResponse(quota=Quota.of(usage))


@router.delete("/workspaces/{workspace_id}/quotas/{pool}")
async def unset_quota(
    workspace_id: ObjectId,
    pool: str,
    session: SessionDep,
    settings: SettingsDep,
    actor: CurrentActor,
) -> dict[str, Any]:
    access.require_admin(actor, "unsetting workspace quotas")
    await quotas.unset_quota(session, settings, workspace_id, pool)
    return {}


# -- Determined's -----------------------------------------------------------------------


@router.post("/workspaces/{workspace_id}/set-resource-quota")
async def set_resource_quota(
    workspace_id: ObjectId,
    body: SetResourceQuotas,
    session: SessionDep,
    settings: SettingsDep,
    actor: CurrentActor,
) -> dict[str, Any]:
    access.require_admin(actor, "setting workspace quotas")
    await quotas.set_default_pool_quota(
        session, settings, workspace_id, body.id, body.cluster_quota_pairs
    )
    return {}


@router.get("/workspaces/{workspace_id}/get-k8s-resource-quotas")
async def get_resource_quotas(
    workspace_id: ObjectId, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> KubernetesResourceQuotas:
    usage = await quotas.quota_usage(session, settings, workspace_id)
    return KubernetesResourceQuotas(
        resource_quotas={u.quota.pool: float(u.quota.nominal_slots) for u in usage}
    )
