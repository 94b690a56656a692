"""Workspaces' slot quotas: the master config's, replaced by the API's (placeholder: the
full service, with its validation, arrives with the quota routes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import WorkspaceModel, WorkspaceQuotaModel
from master.settings import MasterSettings

_QUOTAS = cast(Table, WorkspaceQuotaModel.__table__)
_WORKSPACES = cast(Table, WorkspaceModel.__table__)


@dataclass(frozen=True)
class EffectiveQuota:
    workspace_id: int
    workspace_name: str
    pool: str
    nominal_slots: int
    borrowing_limit: int | None
    lending_limit: int | None
    source: str  # "api" or "master config"


async def effective_quotas(session: AsyncSession, settings: MasterSettings) -> list[EffectiveQuota]:
    conn = await session.connection()
    names = dict((await conn.execute(select(_WORKSPACES.c.name, _WORKSPACES.c.id))).all())
    by_key: dict[tuple[int, str], EffectiveQuota] = {}
    for pool in settings.resource_pools:
        for q in pool.quotas:
            workspace_id = names.get(q.workspace)
            if workspace_id is None:
                continue
            by_key[(workspace_id, pool.pool_name)] = EffectiveQuota(
                workspace_id,
                q.workspace,
                pool.pool_name,
                q.nominal_slots,
                q.borrowing_limit,
                q.lending_limit,
                "master config",
            )
    ids = {v: k for k, v in names.items()}
    for row in (await conn.execute(select(_QUOTAS))).mappings():
        by_key[(row["workspace_id"], row["resource_pool"])] = EffectiveQuota(
            row["workspace_id"],
            ids.get(row["workspace_id"], ""),
            row["resource_pool"],
            row["nominal_slots"],
            row["borrowing_limit"],
            row["lending_limit"],
            "api",
        )
    return list(by_key.values())
