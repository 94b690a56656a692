"""Agents and their slots: registration, liveness flags, enable/disable/drain, listings.

The agent protocol (gRPC) calls these same functions; tests and the benchmark register
simulated agents through them too, so nothing bypasses the scheduler's view of the world.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import AgentModel, AllocationModel, AllocationSlotModel, SlotModel, utcnow
from master.errors import InvalidArgument, NotFound
from master.services.allocations import HELD_STATES, WAKE_HUB, hold_scheduler
from master.settings import MasterSettings

log = logging.getLogger(__name__)

DEVICE_TYPES = ("cpu", "cuda", "rocm")


@dataclass(frozen=True)
class Device:
    slot_id: int
    type: str = "cpu"
    brand: str = ""
    uuid: str = ""
    memory_bytes: int | None = None


@dataclass(frozen=True)
class AgentRegistration:
    id: str
    resource_pool: str
    devices: tuple[Device, ...]
    addresses: tuple[str, ...] = ()
    version: str = ""
    hostname: str = ""


@dataclass
class AgentView:
    agent: AgentModel
    slots: list[SlotModel]
    # slot id -> allocation id holding it
    holders: dict[int, str] = field(default_factory=dict)
    zero_slot_allocations: list[str] = field(default_factory=list)


def _check(registration: AgentRegistration, settings: MasterSettings) -> None:
    if not registration.id or "/" in registration.id or len(registration.id) > 256:
        raise InvalidArgument("agent id: must be 1-256 characters without '/'")
    if settings.pool(registration.resource_pool) is None:
        names = ", ".join(p.pool_name for p in settings.resource_pools)
        raise InvalidArgument(
            f"resource_pool: pool {registration.resource_pool!r} does not exist; pools: {names}"
        )
    ids = [d.slot_id for d in registration.devices]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("devices: slot ids must be unique")
    for device in registration.devices:
        if device.type not in DEVICE_TYPES:
            raise InvalidArgument(
                f"devices: type {device.type!r} is not one of {', '.join(DEVICE_TYPES)}"
            )
        if device.slot_id < 0:
            raise InvalidArgument("devices: slot ids must be >= 0")


async def register_agent(
    session: AsyncSession, settings: MasterSettings, registration: AgentRegistration
) -> AgentModel:
    """Create the agent or refresh it after a reconnect; its slots follow the devices sent."""
    _check(registration, settings)
    await hold_scheduler(session)
    agent = await session.get(AgentModel, registration.id)
    now = utcnow()
    if agent is None:
        agent = AgentModel(id=registration.id, registered_at=now)
        session.add(agent)
        log.info("agent %s registered in pool %s", registration.id, registration.resource_pool)
    elif agent.resource_pool != registration.resource_pool:
        raise InvalidArgument(
            f"agent {registration.id} belongs to pool {agent.resource_pool!r}; it cannot "
            f"rejoin as {registration.resource_pool!r} (remove it first)"
        )
    agent.resource_pool = registration.resource_pool
    agent.connected = True
    agent.version = registration.version
    agent.hostname = registration.hostname
    agent.addresses = list(registration.addresses)
    agent.last_seen_at = now
    await session.flush()
    existing = {
        s.slot_id: s
        for s in (
            await session.scalars(select(SlotModel).where(SlotModel.agent_id == agent.id))
        ).all()
    }
    wanted = {d.slot_id: d for d in registration.devices}
    for slot_id, slot in existing.items():
        if slot_id not in wanted:
            await session.delete(slot)
    for slot_id, device in wanted.items():
        slot = existing.get(slot_id) or SlotModel(agent_id=agent.id, slot_id=slot_id, enabled=True)
        session.add(slot)
        slot.device_type = device.type
        slot.brand = device.brand
        slot.uuid = device.uuid
        slot.memory_bytes = device.memory_bytes
    await session.flush()
    return agent


async def get_agent(session: AsyncSession, agent_id: str) -> AgentModel:
    agent = await session.get(AgentModel, agent_id)
    if agent is None:
        raise NotFound(f"agent {agent_id} not found")
    return agent


async def set_connected(session: AsyncSession, agent_id: str, connected: bool) -> None:
    agent = await get_agent(session, agent_id)
    if agent.connected != connected:
        await hold_scheduler(session)
        await session.refresh(agent)
        agent.connected = connected
        log.info("agent %s %s", agent_id, "connected" if connected else "disconnected")
    agent.last_seen_at = utcnow()


async def enable_agent(session: AsyncSession, agent_id: str) -> AgentModel:
    await hold_scheduler(session)
    agent = await get_agent(session, agent_id)
    agent.enabled, agent.draining = True, False
    log.info("agent %s enabled", agent_id)
    return agent


async def disable_agent(session: AsyncSession, agent_id: str, *, drain: bool) -> AgentModel:
    """Disabled agents take nothing new. With drain, running trials finish where they are;
    without, they are asked to stop (checkpoint and exit) and are requeued elsewhere."""
    await hold_scheduler(session)
    agent = await get_agent(session, agent_id)
    agent.enabled, agent.draining = False, drain
    if not drain:
        session.info[WAKE_HUB] = True
        held = select(AllocationSlotModel.allocation_id).where(
            AllocationSlotModel.agent_id == agent_id
        )
        await session.execute(
            update(AllocationModel)
            .where(
                or_(AllocationModel.id.in_(held), AllocationModel.zero_slot_agent_id == agent_id),
                AllocationModel.state.in_(HELD_STATES),
            )
            .values(preempt_requested=True)
            .execution_options(synchronize_session=False)
        )
    log.info("agent %s disabled%s", agent_id, " (draining)" if drain else "")
    return agent


async def revoke_agent(session: AsyncSession, agent_id: str, actor: str) -> AgentModel:
    """The agent's credential is void and its id refused from now on (a stolen or retired
    node). It takes no new work; what it runs is fenced once its stream is closed."""
    await hold_scheduler(session)
    agent = await get_agent(session, agent_id)
    if agent.revoked_at is None:
        agent.revoked_at = utcnow()
    agent.credential_hash = None
    agent.enabled, agent.draining = False, False
    log.warning("agent %s revoked by %s", agent_id, actor)
    return agent


async def remove_agent(session: AsyncSession, agent_id: str) -> None:
    await hold_scheduler(session)
    agent = await get_agent(session, agent_id)
    held = await session.scalar(
        select(AllocationSlotModel.allocation_id).where(AllocationSlotModel.agent_id == agent_id)
    )
    if held is not None:
        raise InvalidArgument(f"agent {agent_id} still runs allocation {held}; drain it first")
    await session.execute(delete(SlotModel).where(SlotModel.agent_id == agent_id))
    await session.delete(agent)


async def list_agents(session: AsyncSession, agent_id: str | None = None) -> list[AgentView]:
    agent_query = select(AgentModel).order_by(AgentModel.id)
    slot_query = select(SlotModel).order_by(SlotModel.agent_id, SlotModel.slot_id)
    held_query = select(AllocationSlotModel)
    zero_query = select(AllocationModel.id, AllocationModel.zero_slot_agent_id).where(
        AllocationModel.zero_slot_agent_id.is_not(None), AllocationModel.state.in_(HELD_STATES)
    )
    if agent_id is not None:
        agent_query = agent_query.where(AgentModel.id == agent_id)
        slot_query = slot_query.where(SlotModel.agent_id == agent_id)
        held_query = held_query.where(AllocationSlotModel.agent_id == agent_id)
        zero_query = zero_query.where(AllocationModel.zero_slot_agent_id == agent_id)
    views = {a.id: AgentView(a, []) for a in (await session.scalars(agent_query)).all()}
    # Each statement sees what was committed when it ran (Postgres, READ COMMITTED): an
    # agent that registered after the first one is left for the next listing, not a 500.
    for slot in (await session.scalars(slot_query)).all():
        if slot.agent_id in views:
            views[slot.agent_id].slots.append(slot)
    for held in (await session.scalars(held_query)).all():
        if held.agent_id in views:
            views[held.agent_id].holders[held.slot_id] = held.allocation_id
    for allocation_id, zero_agent in (await session.execute(zero_query)).all():
        if zero_agent in views:
            views[zero_agent].zero_slot_allocations.append(allocation_id)
    return list(views.values())
