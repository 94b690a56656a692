"""Workspaces' slot quotas on the wire: ours (`/api/v1/workspaces/{id}/quotas`,
`/api/v1/quotas`) and Determined's resource-quota messages."""

from __future__ import annotations

from typing import Any

from master.schemas.common import WireInput, WireModel
from master.services.quotas import QuotaUsage


class QuotaSet(WireInput):
    """PUT /api/v1/workspaces/{id}/quotas/{pool}. Numbers are checked by the service, so
    that a string or a boolean is refused naming its field; null limits mean none."""

    nominal_slots: Any = None
    borrowing_limit: Any = None
    lending_limit: Any = None


class Quota(WireModel):
    workspace_id: int
    workspace_name: str
    resource_pool: str
    nominal_slots: int
    borrowing_limit: int | None  # null: may borrow any idle slot
    lending_limit: int | None  # null: lends all of its nominal it leaves idle
    source: str  # "api" or "master config"
    held_slots: int
    borrowed_slots: int

    @classmethod
    def of(cls, usage: QuotaUsage) -> Quota:
        q = usage.quota
        return cls(
            workspace_id=q.workspace_id,
            workspace_name=q.workspace_name,
            resource_pool=q.pool,
            nominal_slots=q.nominal_slots,
            borrowing_limit=q.borrowing_limit,
            lending_limit=q.lending_limit,
            source=q.source,
            held_slots=usage.held_slots,
            borrowed_slots=usage.borrowed_slots,
        )


class QuotaList(WireModel):
    quotas: list[Quota]


class QuotaResponse(WireModel):
    quota: Quota


class SetResourceQuotas(WireInput):
    """v1SetResourceQuotasRequest (`det workspace resource-quota set`)."""

    id: Any = None
    cluster_quota_pairs: Any = None


class KubernetesResourceQuotas(WireModel):
    """v1GetKubernetesResourceQuotasResponse: the workspace's nominal quota in each pool,
    keyed by the pool's name."""

    resource_quotas: dict[str, float]
