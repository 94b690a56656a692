"""Cluster page: resource pools, agents and their slots, live utilisation, agent actions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import SessionDep, SettingsDep
from master.db.models import AgentMetricModel
from master.errors import InvalidArgument, MasterError
from master.schemas import cluster as wire
from master.services import access, agents, metrics, tasks
from master.services.agents import AgentView
from master.services.tasks import TaskView
from master.settings import MasterSettings
from master.web.common import (
    Paging,
    WebRoute,
    WebSession,
    WebSessionDep,
    checked_form,
    is_htmx,
    json_response,
    page_links,
    page_response,
    paging_by,
    redirect,
    slice_page,
)

router = APIRouter(route_class=WebRoute)

# Five minutes at the agents' one sample a second: what a small chart can show.
CHART_SAMPLES = 300
MAX_CHART_AGENTS = 100
# A page never shows more agents than its chart feed answers for.
ClusterPaging = Annotated[Paging, Depends(paging_by(20, most=MAX_CHART_AGENTS))]


@dataclass(frozen=True)
class SlotCell:
    slot_id: int
    device_type: str
    brand: str
    enabled: bool
    task: TaskView | None
    allocation_id: str | None


@dataclass(frozen=True)
class AgentRow:
    view: AgentView
    slots: list[SlotCell]
    busy: int
    gpus: int
    utilization: dict[str, Any] | None
    seen: datetime


def _agent_row(
    view: AgentView,
    by_allocation: dict[str, TaskView],
    latest: AgentMetricModel | None,
    heard: datetime | None,
) -> AgentRow:
    cells = []
    for slot in view.slots:
        holder = view.holders.get(slot.slot_id)
        cells.append(
            SlotCell(
                slot_id=slot.slot_id,
                device_type=slot.device_type,
                brand=slot.brand,
                enabled=view.agent.enabled and slot.enabled,
                task=by_allocation.get(holder) if holder else None,
                allocation_id=holder,
            )
        )
    return AgentRow(
        view=view,
        slots=cells,
        busy=sum(1 for c in cells if c.allocation_id),
        gpus=sum(1 for s in view.slots if s.device_type in ("cuda", "rocm")),
        utilization=wire.utilization(latest),
        # The stored time moves only on (re)connect; the hub's moves with every heartbeat.
        seen=max(view.agent.last_seen_at, heard) if heard else view.agent.last_seen_at,
    )


def last_heard(request: Request) -> Mapping[str, datetime]:
    hub = getattr(request.app.state, "agent_hub", None)
    return hub.last_heard if hub is not None else {}


async def _cluster_context(
    session: AsyncSession,
    actor: access.Actor,
    settings: MasterSettings,
    paged: Paging,
    heard: Mapping[str, datetime],
) -> dict[str, Any]:
    pools = await tasks.list_pools(session, settings)
    views = await agents.list_agents(session)
    shown = slice_page(views, paged)
    latest = await metrics.latest_metrics(session, [v.agent.id for v in shown])
    # A slot held by work the viewer may not read shows as busy, without whose.
    readable = await access.readable(session, actor, "allocations")
    by_allocation = {t.allocation.id: t for t in await tasks.list_tasks(session, readable=readable)}
    rows = [
        _agent_row(v, by_allocation, latest.get(v.agent.id), heard.get(v.agent.id)) for v in shown
    ]
    return {
        "pools": pools,
        "agents": rows,
        "pager": page_links("/ui/cluster", paged, len(views), len(rows)),
    }


@router.get("/ui/")
async def home(_web: WebSessionDep) -> Response:
    return redirect("/ui/cluster")


@router.get("/ui/cluster")
async def cluster_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    web: WebSessionDep,
    paged: ClusterPaging,
) -> Response:
    context = await _cluster_context(session, web.actor, settings, paged, last_heard(request))
    template = "cluster_live.html" if is_htmx(request) else "cluster.html"
    return page_response(request, template, {**context, "nav": "cluster"}, web=web)


@router.get("/ui/cluster/metrics.json")
async def cluster_metrics(
    session: SessionDep,
    _web: WebSessionDep,
    agent: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    since: int | None = Query(None, ge=0, le=2**53),
) -> Response:
    """Samples of the agents the page shows, oldest first: what the small charts draw."""
    if len(agent) > MAX_CHART_AGENTS:
        raise InvalidArgument(f"agent: at most {MAX_CHART_AGENTS} agents per request")
    samples: dict[str, list[dict[str, Any]]] = {}
    for agent_id in dict.fromkeys(agent):
        rows = await metrics.list_agent_metrics(
            session, agent_id, since_millis=since, limit=CHART_SAMPLES
        )
        samples[agent_id] = [wire.metric_sample(m) for m in rows]
    return json_response({"agents": samples})


AgentAction = Literal["enable", "disable", "drain"]


@router.post("/ui/agents/{agent_id}/{action}")
async def agent_action(
    request: Request,
    agent_id: str,
    action: AgentAction,
    session: SessionDep,
    settings: SettingsDep,
    web: WebSessionDep,
) -> Response:
    await checked_form(request, web)
    try:
        access.require_admin(web.actor, f"{action} an agent")
        if action == "enable":
            await agents.enable_agent(session, agent_id)
        else:
            await agents.disable_agent(session, agent_id, drain=action == "drain")
    except MasterError as exc:
        await session.rollback()
        return await _page_with_error(request, session, settings, web, exc)
    return redirect("/ui/cluster")


async def _page_with_error(
    request: Request,
    session: AsyncSession,
    settings: MasterSettings,
    web: WebSession,
    exc: MasterError,
) -> Response:
    context = await _cluster_context(
        session, web.actor, settings, Paging(1, 20), last_heard(request)
    )
    context.update(nav="cluster", error=exc.message)
    return page_response(request, "cluster.html", context, web=web)
