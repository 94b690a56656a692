"""Unauthenticated cluster identity (`/info`), `det master info` (open too, less the
cluster message), and for admins `det master
config` (the settings, secrets hidden), `det master logs [-f] [--tail N]`, and the cluster
message (`det master cluster-message set|get|clear`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from master.api.deps import CurrentUser, OptionalUser, SessionDep
from master.core.masking import masked
from master.schemas.cluster import iso
from master.schemas.common import WireInput
from master.services import cluster_message
from master.services.access import Actor, require_admin
from master.services.master_logs import MasterLogBuffer, MasterLogLine
from master.version import DETERMINED_COMPAT_VERSION, __version__

router = APIRouter()


def _identity(request: Request) -> dict[str, Any]:
    state = request.app.state
    return {
        # The official client prints an upgrade hint for any other version string.
        "version": DETERMINED_COMPAT_VERSION,
        "masterId": state.master_id,
        "clusterId": state.cluster_id,
        "clusterName": state.settings.cluster_name,
        "resoluteVersion": __version__,
    }


@router.get("/info")
async def info(request: Request) -> dict[str, Any]:
    identity = _identity(request)
    # Determined's plain /info speaks snake_case; send both spellings of the ids.
    return {**identity, "master_id": identity["masterId"], "cluster_id": identity["clusterId"]}


def _message_wire(message: cluster_message.ClusterMessage) -> dict[str, Any]:
    return {
        "message": message.message,
        "startTime": iso(message.start_time),
        "endTime": iso(message.end_time),
        "createdTime": iso(message.created_time),
    }


@router.get("/api/v1/master")
async def master_info(request: Request, session: SessionDep, user: OptionalUser) -> dict[str, Any]:
    # Open without a token, as Determined's: its client reads rbacEnabled here through a
    # session that sends none before any `det user-group` verb. The cluster message
    # (the banner every signed-in user sees: started, not ended) is for signed-in users.
    showing = None
    if user is not None:
        showing = await cluster_message.current(session, include_scheduled=False)
    return {
        **_identity(request),
        "clusterMessage": _message_wire(showing) if showing is not None else None,
        "hasCustomLogo": False,
        "strictJobQueueControl": False,
        # Determined's client runs `det user-group` only where this is true.
        "rbacEnabled": request.app.state.settings.security.authz.rbac_ui_enabled,
        "telemetryEnabled": False,
        "ssoProviders": [],
        "externalLoginUri": "",
        "externalLogoutUri": "",
        "branding": "",
        "featureSwitches": [],
        "userManagementEnabled": True,
    }


@router.get("/api/v1/master/config")
async def master_config(request: Request, user: CurrentUser) -> dict[str, Any]:
    """Determined's GetMasterConfig: the settings this master runs with, secrets hidden."""
    require_admin(Actor.of(user), "reading the master's config")
    settings = request.app.state.settings
    return {"config": masked(settings.model_dump(mode="json"))}


class SetClusterMessageBody(WireInput):
    """Determined's SetClusterMessageRequest."""

    message: str = Field(max_length=10_000)
    start_time: str | None = Field(default=None, max_length=64)
    end_time: str | None = Field(default=None, max_length=64)
    duration: str | None = Field(default=None, max_length=64)


@router.get("/api/v1/master/cluster_message")
async def get_cluster_message(session: SessionDep, user: CurrentUser) -> dict[str, Any]:
    """Determined's GetClusterMessage: the message that shows or will show (admins only,
    as there; everyone sees the active one in GET /api/v1/master)."""
    require_admin(Actor.of(user), "reading the scheduled cluster message")
    message = await cluster_message.current(session, include_scheduled=True)
    return {"clusterMessage": _message_wire(message) if message is not None else None}


@router.put("/api/v1/master/cluster_message")
async def set_cluster_message(
    body: SetClusterMessageBody, session: SessionDep, user: CurrentUser
) -> dict[str, Any]:
    """Determined's SetClusterMessage: replaces any message showing or scheduled."""
    await cluster_message.set_message(
        session,
        Actor.of(user),
        message=body.message,
        start_time=body.start_time,
        end_time=body.end_time,
        duration=body.duration,
    )
    return {}


@router.delete("/api/v1/master/cluster_message")
async def clear_cluster_message(session: SessionDep, user: CurrentUser) -> dict[str, Any]:
    """Determined's DeleteClusterMessage."""
    await cluster_message.clear(session, Actor.of(user))
    return {}


# Python's level names as Determined's v1LogLevel.
_LEVELS = {
    "DEBUG": "LOG_LEVEL_DEBUG",
    "INFO": "LOG_LEVEL_INFO",
    "WARNING": "LOG_LEVEL_WARNING",
    "ERROR": "LOG_LEVEL_ERROR",
    "CRITICAL": "LOG_LEVEL_CRITICAL",
}


@router.get("/api/v1/master/logs", response_class=StreamingResponse)
async def master_logs(
    request: Request,
    user: CurrentUser,
    follow: bool = False,
    limit: Annotated[int, Query(ge=0)] = 0,
    offset: Annotated[int, Query(ge=-(2**31), le=2**31 - 1)] = 0,
) -> StreamingResponse:
    """Determined's MasterLogs: the master's recent lines (the last 10,000) as NDJSON, one
    {"result": {"logEntry": ...}} each. `offset` < 0: only the last -offset; > 0: skip that
    many; `follow`: then each new line as it is logged; `limit` > 0: stop after that many."""
    require_admin(Actor.of(user), "reading the master's logs")
    buffer: MasterLogBuffer = request.app.state.master_logs
    tail = -offset if offset < 0 else None
    skip = max(offset, 0)

    async def lines() -> AsyncIterator[MasterLogLine]:
        if follow:
            async for line in buffer.follow(tail=tail):
                yield line
        else:
            for line in buffer.lines(tail=tail):
                yield line

    async def ndjson() -> AsyncIterator[str]:
        sent = skipped = 0
        async for line in lines():
            if skipped < skip:
                skipped += 1
                continue
            entry = {
                "id": line.id,
                "timestamp": line.timestamp.isoformat().replace("+00:00", "Z"),
                "level": _LEVELS.get(line.level, "LOG_LEVEL_INFO"),
                "message": line.message,
            }
            yield json.dumps({"result": {"logEntry": entry}}) + "\n"
            sent += 1
            if limit and sent >= limit:
                return

    return StreamingResponse(ndjson(), media_type="application/x-ndjson")
