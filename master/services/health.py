"""Liveness, readiness and the metrics scrape: what a load balancer, Kubernetes probes and
Prometheus ask of a master."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.db.models import (
    AgentModel,
    AllocationModel,
    AllocationSlotModel,
    AllocationState,
    SlotModel,
)
from master.db.session import DatabaseHealth, is_outage
from master.services import counters, quotas
from master.services.access import EVERYTHING, Sight
from master.services.agent_link import AgentHub
from master.services.leadership import Leadership
from master.services.prometheus import Exposition
from master.services.scheduler import SchedulerLoop
from master.settings import MasterSettings


def readiness(health: DatabaseHealth, leadership: Leadership | None) -> tuple[bool, str]:
    """Ready to serve: the database answers (as the watch saw it within the last second),
    and, with standby masters, this one leads or knows the leader to send writes to."""
    if not health.reachable:
        return False, f"the database is unreachable ({health.last_error})"
    if leadership is not None and not leadership.leading and not leadership.leader_url:
        return False, "standing by, and no master leads yet"
    if leadership is not None and not leadership.leading:
        return True, f"standing by; the leader is {leadership.leader_url}"
    return True, "ready"


async def scrape(
    factory: async_sessionmaker[AsyncSession],
    *,
    hub: AgentHub,
    health: DatabaseHealth,
    scheduler: SchedulerLoop,
    settings: MasterSettings,
    seen: Sight = EVERYTHING,
) -> str:
    """Everything (per-workspace series only of the workspaces `seen` covers); during a
    database outage, what memory holds (resolute_database_up 0) rather than an error, so
    the scrape itself shows the outage."""
    out = Exposition()
    try:
        async with factory() as session:
            await _database_metrics(out, session)
            await _quota_metrics(out, session, settings, seen)
    except Exception as exc:
        if not is_outage(exc):
            raise
        health.failed(exc)
        out = Exposition()
    _memory_metrics(out, hub=hub, health=health, scheduler=scheduler)
    return out.text()


async def _database_metrics(out: Exposition, session: AsyncSession) -> None:
    live = AllocationModel.state != AllocationState.TERMINATED
    by_state = (
        await session.execute(
            select(AllocationModel.resource_pool, AllocationModel.state, func.count())
            .where(live)
            .group_by(AllocationModel.resource_pool, AllocationModel.state)
        )
    ).all()
    out.metric(
        "resolute_allocations",
        "gauge",
        "Allocations (trial runs) that have not ended, by pool and state.",
        (({"pool": pool, "state": str(state)}, n) for pool, state, n in by_state),
    )
    queued = (
        await session.execute(
            select(AllocationModel.resource_pool, AllocationModel.pending_code, func.count())
            .where(AllocationModel.state == AllocationState.PENDING)
            .group_by(AllocationModel.resource_pool, AllocationModel.pending_code)
        )
    ).all()
    out.metric(
        "resolute_queue",
        "gauge",
        "Allocations waiting for slots, by pool and the reason they wait.",
        (({"pool": pool, "reason": code or "NOT_YET_CONSIDERED"}, n) for pool, code, n in queued),
    )
    agents = (
        await session.execute(
            select(
                AgentModel.resource_pool, AgentModel.enabled, AgentModel.connected, func.count()
            ).group_by(AgentModel.resource_pool, AgentModel.enabled, AgentModel.connected)
        )
    ).all()
    agent_states: Counter[tuple[str, str]] = Counter()
    for pool, enabled, connected, n in agents:
        state = "disabled" if not enabled else "connected" if connected else "disconnected"
        agent_states[(pool, state)] += n
    out.metric(
        "resolute_agents",
        "gauge",
        "Agents by pool and state (connected, disconnected, disabled).",
        (({"pool": pool, "state": state}, n) for (pool, state), n in agent_states.items()),
    )
    usable = AgentModel.enabled & AgentModel.connected & SlotModel.enabled
    slots = (
        await session.execute(
            select(AgentModel.resource_pool, func.count())
            .join(SlotModel, SlotModel.agent_id == AgentModel.id)
            .where(usable)
            .group_by(AgentModel.resource_pool)
        )
    ).all()
    used = dict(
        (
            await session.execute(
                select(AgentModel.resource_pool, func.count())
                .join(AllocationSlotModel, AllocationSlotModel.agent_id == AgentModel.id)
                .group_by(AgentModel.resource_pool)
            )
        ).all()
    )
    out.metric(
        "resolute_slots",
        "gauge",
        "Slots of connected, enabled agents by pool: used (held by an allocation) or free.",
        (
            sample
            for pool, total in slots
            for sample in (
                ({"pool": pool, "state": "used"}, used.get(pool, 0)),
                ({"pool": pool, "state": "free"}, max(total - used.get(pool, 0), 0)),
            )
        ),
    )


async def _quota_metrics(
    out: Exposition, session: AsyncSession, settings: MasterSettings, seen: Sight
) -> None:
    """Each workspace's quota and the slots it holds, per pool (quotas.pool_shares): for
    every quota in force and every workspace holding slots, quota or not (without one, all
    it holds is borrowed: the scheduler may reclaim it). Only workspaces the scraper sees."""
    shares = [s for s in await quotas.pool_shares(session, settings) if seen.sees(s.workspace_id)]

    def labels(share: quotas.PoolShare) -> dict[str, str]:
        return {"workspace": share.workspace_name, "pool": share.pool}

    out.metric(
        "resolute_workspace_quota_nominal_slots",
        "gauge",
        "Slots a workspace is guaranteed in a pool (its nominal quota), by workspace and pool.",
        ((labels(s), s.quota.nominal_slots) for s in shares if s.quota),
    )
    out.metric(
        "resolute_workspace_held_slots",
        "gauge",
        "Slots a workspace's allocations hold now, by workspace and pool.",
        ((labels(s), s.held_slots) for s in shares),
    )
    out.metric(
        "resolute_workspace_borrowed_slots",
        "gauge",
        "Slots a workspace holds above its nominal quota (all it holds where it has none), "
        "by workspace and pool.",
        ((labels(s), s.borrowed) for s in shares),
    )


def _memory_metrics(
    out: Exposition, *, hub: AgentHub, health: DatabaseHealth, scheduler: SchedulerLoop
) -> None:
    out.histogram(
        "resolute_scheduler_pass_seconds",
        "Time of each scheduling pass that ran (not skipped), in seconds.",
        scheduler.pass_times,
    )
    out.histogram(
        "resolute_heartbeat_round_trip_seconds",
        "Agent heartbeat round trips as the agents measure them, in seconds.",
        hub.round_trips,
    )
    out.metric(
        "resolute_agent_heartbeat_round_trip_seconds",
        "gauge",
        "Each agent's latest heartbeat round trip, in seconds.",
        (({"agent": a}, s) for a, s in sorted(hub.last_round_trip_s.items())),
    )
    out.metric(
        "resolute_stale_reports_refused_total",
        "counter",
        "Reports refused because the run that sent them had ended, by what they reported.",
        (({"kind": kind}, n) for kind, n in sorted(counters.stale_reports.items())),
    )
    out.metric(
        "resolute_foreign_agent_messages_total",
        "counter",
        "Agent messages dropped because they named an allocation not placed on that agent.",
        (({"kind": kind}, n) for kind, n in sorted(counters.foreign_agent_messages.items())),
    )
    out.metric(
        "resolute_fenced_runs_total",
        "counter",
        "Runs whose ranks an agent's fence killed (no acknowledged heartbeat in time).",
        [({}, hub.fenced_runs)],
    )
    out.metric(
        "resolute_database_errors_total",
        "counter",
        "Errors that found the database unreachable.",
        [({}, health.errors)],
    )
    out.metric(
        "resolute_database_up",
        "gauge",
        "1 while the database answers, 0 during an outage.",
        [({}, 1 if health.reachable else 0)],
    )
    out.metric(
        "resolute_agent_message_backlog",
        "gauge",
        "Agent messages waiting for the database to come back.",
        [({}, len(hub.backlog))],
    )
    out.metric(
        "resolute_gpu_utilization_percent",
        "gauge",
        "Each GPU's utilisation in the agent's latest sample, in percent.",
        (
            ({"agent": agent, "gpu": str(gpu.index), "uuid": gpu.uuid}, gpu.gpu_util)
            for agent, reading in sorted(hub.latest_reading.items())
            for gpu in reading.gpus
        ),
    )
    out.metric(
        "resolute_agent_cpu_utilization_percent",
        "gauge",
        "Each agent's CPU utilisation in its latest sample, in percent of all cores.",
        (({"agent": a}, r.cpu_util_simple) for a, r in sorted(hub.latest_reading.items())),
    )
