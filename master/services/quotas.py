"""Slot quotas per workspace and resource pool (docs/quotas.md): the master config's
(`resource_pools[].quotas`) overlaid by those set through the API (`workspace_quotas`),
checked here when set, and the slots each workspace holds now, for showing them.

The scheduler reads `effective_quotas` when it loads its view; a change made here asks
for that load (allocations.request_scheduling), so it applies at the next pass."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import and_, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.text import unstorable
from master.db.models import (
    MAX_INT,
    AgentModel,
    AllocationModel,
    AllocationSlotModel,
    ExperimentModel,
    ProjectModel,
    SlotModel,
    TaskModel,
    WorkspaceModel,
    WorkspaceQuotaModel,
    utcnow,
)
from master.errors import InvalidArgument, NotFound
from master.services.allocations import HELD_STATES, request_scheduling
from master.services.pool_bindings import known_pool, refuse_unusable
from master.services.workspaces import get_workspace
from master.settings import MasterSettings

log = logging.getLogger(__name__)

API = "api"
MASTER_CONFIG = "master config"

# (workspace name, pool) of config quotas already warned about: once per process each, as
# the scheduler reads them at every load of its view.
_warned_unknown: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class EffectiveQuota:
    workspace_id: int
    workspace_name: str
    pool: str
    nominal_slots: int
    borrowing_limit: int | None  # None: may borrow any idle slot
    lending_limit: int | None  # None: lends all of its nominal it leaves idle
    source: str  # API or MASTER_CONFIG


@dataclass(frozen=True)
class QuotaUsage:
    """A quota and the slots its workspace holds in its pool now."""

    quota: EffectiveQuota
    held_slots: int

    @property
    def borrowed_slots(self) -> int:
        return max(0, self.held_slots - self.quota.nominal_slots)


@dataclass(frozen=True)
class PoolShare:
    """A workspace in one pool where it has a quota in force or holds slots: what the
    dashboard's workspace pages and the metrics' quota gauges show."""

    pool: str
    workspace_id: int
    workspace_name: str
    quota: EffectiveQuota | None  # None: no quota there
    held_slots: int

    @property
    def borrowed(self) -> int:
        """Held above the nominal; without a quota, all it holds (the scheduler may
        reclaim it)."""
        nominal = self.quota.nominal_slots if self.quota else 0
        return max(0, self.held_slots - nominal)


@dataclass(frozen=True)
class _Fields:
    """The names a request gives the three numbers, for its refusals."""

    nominal: str = "nominalSlots"
    borrowing: str = "borrowingLimit"
    lending: str = "lendingLimit"
    pool: str = "pool"


# -- reading ----------------------------------------------------------------------------


async def effective_quotas(session: AsyncSession, settings: MasterSettings) -> list[EffectiveQuota]:
    """Every quota in force, by pool then workspace id: the config's, each replaced by a
    row the API set for the same workspace and pool. A config quota for a workspace that
    does not exist is left out (warned about once); a quota for a pool the config no longer
    has is kept (the scheduler ignores it). Two statements, plain rows: the scheduler calls
    this at every load of its view."""
    configured = [(pool.pool_name, q) for pool in settings.resource_pools for q in pool.quotas]
    found: dict[tuple[int, str], EffectiveQuota] = {}
    if configured:
        names = sorted({q.workspace for _, q in configured})
        ids = dict(
            (
                await session.execute(
                    select(WorkspaceModel.name, WorkspaceModel.id).where(
                        WorkspaceModel.name.in_(names)
                    )
                )
            ).all()
        )
        for pool_name, q in configured:
            workspace_id = ids.get(q.workspace)
            if workspace_id is None:
                if (q.workspace, pool_name) not in _warned_unknown:
                    _warned_unknown.add((q.workspace, pool_name))
                    log.warning(
                        "master config: quota for workspace %r in pool %s ignored: no "
                        "workspace has that name",
                        q.workspace,
                        pool_name,
                    )
                continue
            found[(workspace_id, pool_name)] = EffectiveQuota(
                workspace_id=workspace_id,
                workspace_name=q.workspace,
                pool=pool_name,
                nominal_slots=q.nominal_slots,
                borrowing_limit=q.borrowing_limit,
                lending_limit=q.lending_limit,
                source=MASTER_CONFIG,
            )
    rows = await session.execute(
        select(
            WorkspaceQuotaModel.workspace_id,
            WorkspaceModel.name,
            WorkspaceQuotaModel.resource_pool,
            WorkspaceQuotaModel.nominal_slots,
            WorkspaceQuotaModel.borrowing_limit,
            WorkspaceQuotaModel.lending_limit,
        ).join(WorkspaceModel, WorkspaceModel.id == WorkspaceQuotaModel.workspace_id)
    )
    for workspace_id, name, pool_name, nominal, borrowing, lending in rows.all():
        found[(workspace_id, pool_name)] = EffectiveQuota(
            workspace_id=workspace_id,
            workspace_name=name,
            pool=pool_name,
            nominal_slots=nominal,
            borrowing_limit=borrowing,
            lending_limit=lending,
            source=API,
        )
    return [found[key] for key in sorted(found, key=lambda k: (k[1], k[0]))]


async def held_slots_by_workspace(session: AsyncSession) -> dict[tuple[int, str], int]:
    """Slots held now, by (workspace id, pool): an experiment's workspace is its project's,
    a task's its own."""
    workspace_id = func.coalesce(ProjectModel.workspace_id, TaskModel.workspace_id)
    query = (
        select(workspace_id, AllocationModel.resource_pool, func.count())
        .select_from(AllocationSlotModel)
        .join(AllocationModel, AllocationModel.id == AllocationSlotModel.allocation_id)
        .outerjoin(ExperimentModel, ExperimentModel.id == AllocationModel.experiment_id)
        .outerjoin(ProjectModel, ProjectModel.id == ExperimentModel.project_id)
        .outerjoin(TaskModel, TaskModel.id == AllocationModel.task_id)
        .where(AllocationModel.state.in_(HELD_STATES))
        .group_by(workspace_id, AllocationModel.resource_pool)
    )
    return {
        (ws, pool): int(count)
        for ws, pool, count in (await session.execute(query)).all()
        if ws is not None
    }


async def quota_usage(
    session: AsyncSession, settings: MasterSettings, workspace_id: int | None = None
) -> list[QuotaUsage]:
    """The quotas in force (one workspace's, or every one's) with the slots held under
    each. An unknown workspace is a 404."""
    if workspace_id is not None:
        await get_workspace(session, workspace_id)
    quotas = [
        q
        for q in await effective_quotas(session, settings)
        if workspace_id is None or q.workspace_id == workspace_id
    ]
    held = await held_slots_by_workspace(session) if quotas else {}
    return [QuotaUsage(q, held.get((q.workspace_id, q.pool), 0)) for q in quotas]


async def pool_shares(
    session: AsyncSession,
    settings: MasterSettings,
    workspace_ids: Collection[int] | None = None,
) -> list[PoolShare]:
    """Every quota in force (as `GET /api/v1/quotas` shows them) and every workspace
    holding slots, quota or not, with what it holds: these workspaces' only, or every
    one's. By pool, then workspace name; a workspace deleted meanwhile has no name and is
    left out. A few plain selects."""
    wanted = None if workspace_ids is None else set(workspace_ids)
    in_force = {
        (q.workspace_id, q.pool): q
        for q in await effective_quotas(session, settings)
        if wanted is None or q.workspace_id in wanted
    }
    held = {
        key: n
        for key, n in (await held_slots_by_workspace(session)).items()
        if wanted is None or key[0] in wanted
    }
    names = {q.workspace_id: q.workspace_name for q in in_force.values()}
    unnamed = {ws for ws, _ in held} - names.keys()
    if unnamed:
        names.update(
            (
                await session.execute(
                    select(WorkspaceModel.id, WorkspaceModel.name).where(
                        WorkspaceModel.id.in_(sorted(unnamed))
                    )
                )
            ).all()
        )
    shares = [
        PoolShare(pool, ws, names[ws], in_force.get((ws, pool)), held.get((ws, pool), 0))
        for ws, pool in in_force.keys() | held.keys()
        if ws in names
    ]
    return sorted(shares, key=lambda s: (s.pool, s.workspace_name))


async def pool_slots(session: AsyncSession, pool_name: str) -> tuple[int, int]:
    """How many agents are registered in the pool (connected or not, not revoked) and how
    many enabled slots they have: the most any quota there may name."""
    agents = await session.execute(
        select(func.count(func.distinct(AgentModel.id)), func.count(SlotModel.slot_id))
        .select_from(AgentModel)
        .outerjoin(SlotModel, and_(SlotModel.agent_id == AgentModel.id, SlotModel.enabled))
        .where(AgentModel.resource_pool == pool_name, AgentModel.revoked_at.is_(None))
    )
    count, slots = agents.one()
    return int(count or 0), int(slots or 0)


# -- checking ---------------------------------------------------------------------------


def checked_slots(value: object, field: str, *, unlimited: bool) -> int | None:
    """A whole number of slots, 0 or more; None (no limit) where `unlimited` allows it."""
    if value is None:
        if unlimited:
            return None
        raise InvalidArgument(f"{field}: required; a whole number of slots, 0 or more")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"{field}: {value!r} is not a whole number of slots ({type(value).__name__}); "
            "give an integer, 0 or more" + (", or null for no limit" if unlimited else "")
        )
    if value < 0:
        raise InvalidArgument(f"{field}: {value} is negative; give 0 or more slots")
    if value > MAX_INT:
        raise InvalidArgument(f"{field}: {value} is above {MAX_INT}")
    return value


async def _writable_workspace(session: AsyncSession, workspace_id: int) -> WorkspaceModel:
    ws = await get_workspace(session, workspace_id)
    if ws.deleting or ws.archived:
        state = "being deleted" if ws.deleting else "archived; unarchive it first"
        raise InvalidArgument(f"workspaceId: workspace {ws.name!r} ({ws.id}) is {state}")
    return ws


async def _refuse_above_pool(
    session: AsyncSession, pool_name: str, given: list[tuple[str, int | None]]
) -> None:
    """Each number at most the pool's enabled slots; a pool without agents takes only 0."""
    named = [(field, value) for field, value in given if value]
    if not named:
        return
    agents, slots = await pool_slots(session, pool_name)
    if agents == 0:
        field, value = named[0]
        raise InvalidArgument(
            f"{field}: {value} slot{'s' if value != 1 else ''} in pool {pool_name!r}, which "
            "has no agents yet; set quotas there once its agents have registered"
        )
    for field, value in named:
        if value is not None and value > slots:
            raise InvalidArgument(
                f"{field}: {value} is above the size of pool {pool_name!r}: {slots} enabled "
                f"slots on its {agents} registered agent{'s' if agents != 1 else ''}"
            )


# -- changing ---------------------------------------------------------------------------


async def set_quota(
    session: AsyncSession,
    settings: MasterSettings,
    workspace_id: int,
    pool: object,
    nominal_slots: object,
    borrowing_limit: object,
    lending_limit: object,
) -> QuotaUsage:
    """Sets the workspace's quota in the pool through the API, replacing the config's
    there if any; returns it with the slots the workspace holds there. The caller has
    checked that the actor is an admin."""
    quota = await _set(
        session,
        settings,
        workspace_id,
        pool,
        (nominal_slots, borrowing_limit, lending_limit),
        _Fields(),
    )
    held = await held_slots_by_workspace(session)
    return QuotaUsage(quota, held.get((quota.workspace_id, quota.pool), 0))


async def _set(
    session: AsyncSession,
    settings: MasterSettings,
    workspace_id: int,
    pool: object,
    numbers: tuple[object, object, object],
    fields: _Fields,
) -> EffectiveQuota:
    ws = await _writable_workspace(session, workspace_id)
    pool_name = known_pool(settings, pool, fields.pool).pool_name
    await refuse_unusable(session, pool_name, ws, fields.pool)
    nominal = checked_slots(numbers[0], fields.nominal, unlimited=False)
    borrowing = checked_slots(numbers[1], fields.borrowing, unlimited=True)
    lending = checked_slots(numbers[2], fields.lending, unlimited=True)
    assert nominal is not None  # checked_slots refuses None when not unlimited
    if lending is not None and lending > nominal:
        raise InvalidArgument(
            f"{fields.lending}: {lending} is above {fields.nominal} {nominal}; a workspace "
            "lends only slots of its own quota"
        )
    await _refuse_above_pool(
        session,
        pool_name,
        [(fields.nominal, nominal), (fields.borrowing, borrowing), (fields.lending, lending)],
    )
    row = await session.get(WorkspaceQuotaModel, (ws.id, pool_name))
    if row is None:
        row = WorkspaceQuotaModel(workspace_id=ws.id, resource_pool=pool_name)
        session.add(row)
    row.nominal_slots = nominal
    row.borrowing_limit = borrowing
    row.lending_limit = lending
    row.updated_at = utcnow()
    await session.flush()
    request_scheduling(session)
    log.info(
        "workspace %s (%d) quota in pool %s: nominal %d, borrowing limit %s, lending limit %s",
        ws.name,
        ws.id,
        pool_name,
        nominal,
        "none" if borrowing is None else borrowing,
        "none" if lending is None else lending,
    )
    return EffectiveQuota(ws.id, ws.name, pool_name, nominal, borrowing, lending, API)


async def unset_quota(
    session: AsyncSession, settings: MasterSettings, workspace_id: int, pool: object
) -> None:
    """Removes the quota the API set; the config's for the same workspace and pool, if
    any, applies again. A pool gone from the config can still be unset. The caller has
    checked that the actor is an admin."""
    ws = await get_workspace(session, workspace_id)
    if not isinstance(pool, str) or settings.pool(pool) is None:
        # Only a row naming it makes a pool the config lacks worth looking for; a name no
        # row can hold is refused as such.
        exists = (
            isinstance(pool, str)
            and bool(pool)
            and not unstorable(pool)
            and await session.get(WorkspaceQuotaModel, (ws.id, pool)) is not None
        )
        if not exists:
            known_pool(settings, pool, "pool", NotFound)
    result = await session.execute(
        delete(WorkspaceQuotaModel).where(
            WorkspaceQuotaModel.workspace_id == ws.id, WorkspaceQuotaModel.resource_pool == pool
        )
    )
    if not getattr(result, "rowcount", 0):
        configured = any(
            q.workspace == ws.name
            for p in settings.resource_pools
            if p.pool_name == pool
            for q in p.quotas
        )
        raise NotFound(
            f"pool: workspace {ws.name!r} ({ws.id}) has no quota set through the API in pool "
            f"{pool!r}"
            + ("; its quota there is the master config's, changed only there" if configured else "")
        )
    request_scheduling(session)
    log.info("workspace %s (%d) quota in pool %s unset", ws.name, ws.id, pool)


async def set_default_pool_quota(
    session: AsyncSession,
    settings: MasterSettings,
    workspace_id: int,
    body_id: object,
    cluster_quota_pairs: object,
) -> EffectiveQuota:
    """Determined's `det workspace resource-quota set`: the one number its request carries
    becomes the nominal quota in the workspace's default compute pool (else the master's),
    keeping the borrowing and lending limits in force there. Its cluster is this master,
    named or not."""
    if body_id is not None and body_id != workspace_id:
        raise InvalidArgument(f"id: the body names workspace {body_id!r}, the path {workspace_id}")
    field = "clusterQuotaPairs"
    if not isinstance(cluster_quota_pairs, dict) or not cluster_quota_pairs:
        raise InvalidArgument(f'{field}: give one quota, as {{"": slots}}')
    if len(cluster_quota_pairs) > 1:
        raise InvalidArgument(
            f"{field}: {len(cluster_quota_pairs)} clusters; this master is one cluster, "
            f"{settings.cluster_name!r}: give one quota"
        )
    [(cluster, value)] = cluster_quota_pairs.items()
    if cluster not in ("", settings.cluster_name):
        raise InvalidArgument(
            f"{field}: cluster {cluster!r} is not this master's; name none or "
            f"{settings.cluster_name!r}"
        )
    ws = await _writable_workspace(session, workspace_id)
    if ws.default_compute_pool:
        pool_field = f"workspace {ws.name!r} defaultComputePool"
        pool_name = ws.default_compute_pool
    else:
        pool_field, pool_name = "default_compute_pool", settings.default_compute_pool
    known_pool(settings, pool_name, pool_field)
    current = next(
        (
            q
            for q in await effective_quotas(session, settings)
            if q.workspace_id == ws.id and q.pool == pool_name
        ),
        None,
    )
    borrowing = current.borrowing_limit if current else None
    lending = current.lending_limit if current else None
    nominal = checked_slots(value, field, unlimited=False)
    if lending is not None and nominal is not None and nominal < lending:
        raise InvalidArgument(
            f"{field}: {nominal} is below the lending limit {lending} of workspace "
            f"{ws.name!r} in pool {pool_name!r}; lower it first (`det workspace quota set`)"
        )
    return await _set(
        session,
        settings,
        ws.id,
        pool_name,
        (nominal, borrowing, lending),
        _Fields(nominal=field, borrowing=field, lending=field, pool=pool_field),
    )
