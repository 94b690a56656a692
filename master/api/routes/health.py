"""Probes and metrics: /health/live, /health/ready, /metrics (Prometheus text format)."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from master.api.deps import bearer_token
from master.core import roles
from master.db.session import session_scope
from master.errors import PermissionDenied, Unauthenticated
from master.services import access, auth, health
from master.settings import MasterSettings

router = APIRouter(tags=["health"])

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@router.get("/health/live")
async def live() -> JSONResponse:
    """The process serves requests; nothing else is checked (a database outage is not a
    reason to restart the master)."""
    return JSONResponse({"status": "live"})


@router.get("/health/ready")
async def ready(request: Request) -> JSONResponse:
    state = request.app.state
    is_ready, why = health.readiness(state.db_health, getattr(state, "leadership", None))
    return JSONResponse(
        {"status": "ready" if is_ready else "not ready", "reason": why},
        status_code=200 if is_ready else 503,
        headers={} if is_ready else {"Retry-After": "2"},
    )


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    """Not open to anyone who can reach the port: it names agents, pools and load."""
    state = request.app.state
    seen = await _check_scraper(request)
    text = await health.scrape(
        state.session_factory,
        hub=state.agent_hub,
        health=state.db_health,
        scheduler=state.scheduler,
        settings=state.settings,
        seen=seen,
    )
    return PlainTextResponse(text, media_type=PROMETHEUS_TEXT)


async def _check_scraper(request: Request) -> access.Sight:
    """Which workspaces' series the scrape may show: all for the metrics token (the
    operator's Prometheus); for a signed-in user, those they read (workspaces kept apart)."""
    settings: MasterSettings = request.app.state.settings
    token = bearer_token(request)
    expected = settings.security.metrics_token
    if expected:
        if not secrets.compare_digest(token.encode(), expected.encode()):
            raise Unauthenticated("wrong bearer token for /metrics (security.metrics_token)")
        return access.EVERYTHING
    async with session_scope(request.app.state.session_factory) as session:
        session.info[access.OPEN_READING] = settings.security.authz.type == "basic"
        user = await auth.user_for_token(session, token)
        if session.info.get(access.TOKEN_KIND) == access.TASK:
            raise PermissionDenied("a run's token opens its own trial's routes, not /metrics")
        return await access.sight(session, access.Actor.of(user), roles.VIEW_WORKSPACE)
