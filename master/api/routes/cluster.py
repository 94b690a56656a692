"""Agents, slots, tasks, job queues and resource pools (`det agent|slot|task|job ...`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Body, Query, Request
from sqlalchemy import select

from master.api.deps import (
    MAX_INT,
    CurrentActor,
    CurrentUser,
    SessionDep,
    SettingsDep,
    after_commit,
)
from master.core import roles
from master.db.models import AllocationModel, SlotModel
from master.errors import InvalidArgument, NotFound
from master.schemas import cluster
from master.services import access, agents, experiments, metrics, tasks
from master.services.access import Actor

router = APIRouter(prefix="/api/v1", tags=["Cluster"])


async def _allocation_states(session: SessionDep) -> dict[str, str]:
    rows = await session.execute(
        select(AllocationModel.id, AllocationModel.state).where(
            AllocationModel.state.in_(tasks.ACTIVE_STATES)
        )
    )
    return {allocation_id: state for allocation_id, state in rows.all()}


@router.get("/agents")
async def list_agents(
    session: SessionDep,
    _user: CurrentUser,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT),
) -> dict[str, Any]:
    states = await _allocation_states(session)
    latest = await metrics.latest_metrics(session)
    items = [
        cluster.agent(v, states, latest.get(v.agent.id)) for v in await agents.list_agents(session)
    ]
    return cluster.paginated("agents", items, offset, limit)


@router.get("/agents/{agent_id}")
async def get_agent(agent_id: str, session: SessionDep, _user: CurrentUser) -> dict[str, Any]:
    views = await agents.list_agents(session, agent_id)
    if not views:
        raise NotFound(f"agent {agent_id} not found")
    latest = await metrics.latest_metrics(session, [agent_id])
    return {
        "agent": cluster.agent(views[0], await _allocation_states(session), latest.get(agent_id))
    }


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_MILLIS = 2**63 - 1


def _since_millis(value: str | None) -> int | None:
    """`since` as unix milliseconds, from digits or an RFC 3339 time (UTC when it has no zone)."""
    if value is None or value == "":
        return None
    problem = f"since: expected an RFC 3339 time or unix milliseconds, got {value[:64]!r}"
    if value.isascii() and value.isdigit():
        if len(value) > 19 or int(value) > _MAX_MILLIS:
            raise InvalidArgument(f"since: {value[:64]} is out of range")
        return int(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(problem) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return (moment - _EPOCH) // timedelta(milliseconds=1)
    except OverflowError:
        raise InvalidArgument(f"since: {value[:64]} is out of range") from None


@router.get("/agents/{agent_id}/metrics")
async def get_agent_metrics(
    agent_id: str,
    session: SessionDep,
    _user: CurrentUser,
    since: str | None = Query(None, description="RFC 3339 time or unix milliseconds."),
    limit: int = Query(300, ge=1, le=10_000, description="The newest this many samples."),
) -> dict[str, Any]:
    """An agent's system-metric samples, oldest first: the newest `limit` at or after `since`."""
    since_millis = _since_millis(since)
    await agents.get_agent(session, agent_id)
    samples = await metrics.list_agent_metrics(
        session, agent_id, since_millis=since_millis, limit=limit
    )
    return {"agentId": agent_id, "samples": [cluster.metric_sample(m) for m in samples]}


@router.post("/agents/{agent_id}/enable")
async def enable_agent(agent_id: str, session: SessionDep, _user: CurrentUser) -> dict[str, Any]:
    access.require_admin(Actor.of(_user), "enabling an agent")
    await agents.enable_agent(session, agent_id)
    return await get_agent(agent_id, session, _user)


@router.post("/agents/{agent_id}/disable")
async def disable_agent(
    agent_id: str,
    session: SessionDep,
    _user: CurrentUser,
    body: cluster.DisableAgentRequest | None = Body(None),
) -> dict[str, Any]:
    drain = bool(body and body.drain)
    if body and body.agent_id not in (None, "", agent_id):
        raise InvalidArgument(f"agentId: the body says {body.agent_id!r}, the path {agent_id!r}")
    access.require_admin(Actor.of(_user), "disabling an agent")
    await agents.disable_agent(session, agent_id, drain=drain)
    return await get_agent(agent_id, session, _user)


@router.post("/agents/{agent_id}/revoke")
async def revoke_agent(
    agent_id: str, request: Request, session: SessionDep, user: CurrentUser
) -> dict[str, Any]:
    """resolute: the agent's credential is void and the id can no longer connect; its
    stream is closed once this commits, and its ranks are fenced like a lost agent's."""
    access.require_admin(Actor.of(user), "revoking an agent")
    await agents.revoke_agent(session, agent_id, user.username)
    hub = getattr(request.app.state, "agent_hub", None)
    if hub is not None:
        after_commit(session, lambda: hub.disconnect(agent_id, "revoked"))
    return await get_agent(agent_id, session, user)


@router.get("/tasks")
async def list_tasks(
    session: SessionDep,
    actor: CurrentActor,
    failed_within_s: int = Query(
        0,
        ge=0,
        le=MAX_INT,
        alias="failedWithinSeconds",
        description="resolute: also list allocations that ended this recently with their "
        "trial in ERROR, with their exitReason",
    ),
) -> dict[str, Any]:
    window = timedelta(seconds=failed_within_s) if failed_within_s else None
    readable = await access.readable(session, actor, "allocations")
    views = await tasks.list_tasks(session, failed_within=window, readable=readable)
    slots: dict[str, dict[int, SlotModel]] = {}
    for slot in (await session.scalars(select(SlotModel))).all():
        slots.setdefault(slot.agent_id, {})[slot.slot_id] = slot
    return {"allocationIdToSummary": {v.allocation.id: cluster.task(v, slots) for v in views}}


@router.get("/resource-pools")
async def list_resource_pools(
    session: SessionDep,
    settings: SettingsDep,
    _user: CurrentUser,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT),
) -> dict[str, Any]:
    types = {s.agent_id: s.device_type for s in (await session.scalars(select(SlotModel))).all()}
    has_gpu = any(t in ("cuda", "rocm") for t in types.values())
    slot_type = "TYPE_CUDA" if has_gpu else "TYPE_CPU"
    items = [
        cluster.pool(v, settings, slot_type) for v in await tasks.list_pools(session, settings)
    ]
    return cluster.paginated("resourcePools", items, offset, limit)


async def _jobs(
    session: SessionDep, actor: access.Actor, pool: str | None
) -> list[tuple[dict[str, Any], bool]]:
    """Each job in queue order, and whether the actor may read it. Positions count every
    job, readable or not: a user is told truly how many wait ahead."""
    views = await tasks.list_jobs(session, pool)
    seen = await access.sight(session, actor, roles.VIEW_EXPERIMENT_METADATA)
    ahead: dict[str, int] = {}  # jobs ahead in the same pool, in queue order
    jobs = []
    for view in views:
        pool_name = view.experiment.resource_pool
        readable = seen.sees(view.workspace_id, view.experiment.owner_id)
        jobs.append((cluster.job(view, jobs_ahead=ahead.get(pool_name, 0)), readable))
        ahead[pool_name] = ahead.get(pool_name, 0) + 1
    return jobs


@router.get("/job-queues")
async def list_jobs(
    session: SessionDep,
    actor: CurrentActor,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT),
    resource_pool: str | None = Query(None, alias="resourcePool"),
) -> dict[str, Any]:
    jobs = [job for job, readable in await _jobs(session, actor, resource_pool) if readable]
    return cluster.paginated("jobs", jobs, offset, limit)


@router.get("/job-queues-v2")
async def list_jobs_v2(
    session: SessionDep,
    actor: CurrentActor,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT),
    resource_pool: str | None = Query(None, alias="resourcePool"),
) -> dict[str, Any]:
    # A job the actor may not read is shown as Determined's LimitedJob: its place, pool
    # and priority, not its name or owner.
    items = [
        {"full": job, "limited": None}
        if readable
        else {"full": None, "limited": cluster.limited_job(job)}
        for job, readable in await _jobs(session, actor, resource_pool)
    ]
    return cluster.paginated("jobs", items, offset, limit)


@router.post("/job-queues")
async def update_job_queue(
    request: Request, body: cluster.UpdateJobQueueRequest, session: SessionDep, user: CurrentUser
) -> dict[str, Any]:
    """Determined's UpdateJobQueue: each update sets a job's priority, weight or resource
    pool (any of them); a refused one changes nothing, since the request is one transaction."""
    updates = [
        experiments.JobUpdate(
            u.job_id, u.priority, u.weight, u.resource_pool, bool(u.ahead_of or u.behind_of)
        )
        for u in body.updates
    ]
    await experiments.update_jobs(session, Actor.of(user), updates, request.app.state.settings)
    return {}
