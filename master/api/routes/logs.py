"""Trial and task logs as grpc-gateway streams them: NDJSON, one {"result": ...} per line."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.api.deps import MAX_INT, CurrentUser, ObjectId, SessionDep
from master.db.models import TaskLogModel
from master.errors import InvalidArgument
from master.schemas.common import WireModel
from master.schemas.logs import TaskLog, TrialLog
from master.services import logs
from master.services.logs import LogFilter, LogTarget

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1", tags=["Logs"])

ORDER_BY = ("ORDER_BY_UNSPECIFIED", "ORDER_BY_ASC", "ORDER_BY_DESC")
# grpc-gateway sends its streams as application/json, one JSON object per line.
MEDIA_TYPE = "application/json"

RankId = Annotated[int, Field(ge=0, le=MAX_INT)]


@dataclass(frozen=True)
class LogRequest:
    where: LogFilter
    follow: bool
    limit: int
    descending: bool


def _text(name: str, values: list[str]) -> tuple[str, ...]:
    for value in values:
        if "\x00" in value:
            raise InvalidArgument(f"{name}: must not contain NUL characters")
    return tuple(values)


def _levels(values: list[str]) -> tuple[str, ...]:
    parsed = []
    for value in values:
        level = value if value.startswith("LOG_LEVEL_") else f"LOG_LEVEL_{value}"
        if level.upper() not in logs.FILTER_LEVELS:
            raise InvalidArgument(
                f"levels: {value!r} is not one of {', '.join(logs.FILTER_LEVELS)}"
            )
        parsed.append(level.upper())
    return tuple(parsed)


def _time(name: str, value: str | None) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(
            f"{name}: {value!r} is not an RFC 3339 time such as 2026-11-21T10:00:00Z"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def log_request(
    follow: bool = False,
    limit: int = Query(0, ge=0, le=MAX_INT, description="0 returns every line"),
    order_by: Annotated[str, Query(alias="orderBy")] = "ORDER_BY_UNSPECIFIED",
    levels: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    rank_ids: Annotated[list[RankId], Query(alias="rankIds")] = [],  # noqa: B006
    agent_ids: Annotated[list[str], Query(alias="agentIds")] = [],  # noqa: B006
    allocation_ids: Annotated[list[str], Query(alias="allocationIds")] = [],  # noqa: B006
    container_ids: Annotated[list[str], Query(alias="containerIds")] = [],  # noqa: B006
    stdtypes: Annotated[list[str], Query()] = [],  # noqa: B006
    sources: Annotated[list[str], Query()] = [],  # noqa: B006
    timestamp_before: Annotated[str | None, Query(alias="timestampBefore")] = None,
    timestamp_after: Annotated[str | None, Query(alias="timestampAfter")] = None,
    search_text: Annotated[str | None, Query(alias="searchText")] = None,
    enable_regex: Annotated[bool, Query(alias="enableRegex")] = False,
) -> LogRequest:
    if order_by not in ORDER_BY:
        raise InvalidArgument(f"orderBy: {order_by!r} is not one of {', '.join(ORDER_BY)}")
    descending = order_by == "ORDER_BY_DESC"
    if follow and descending:
        raise InvalidArgument("orderBy: ORDER_BY_DESC cannot be combined with follow=true")
    if enable_regex:
        raise InvalidArgument("enableRegex: regular expressions are not supported; use searchText")
    where = LogFilter(
        rank_ids=tuple(rank_ids),
        agent_ids=_text("agentIds", agent_ids),
        allocation_ids=_text("allocationIds", allocation_ids),
        container_ids=_text("containerIds", container_ids),
        stdtypes=_text("stdtypes", stdtypes),
        sources=_text("sources", sources),
        levels=_levels(levels),
        timestamp_before=_time("timestampBefore", timestamp_before),
        timestamp_after=_time("timestampAfter", timestamp_after),
        search_text=_text("searchText", [search_text])[0] if search_text else None,
    )
    return LogRequest(where=where, follow=follow, limit=limit, descending=descending)


LogRequestDep = Annotated[LogRequest, Depends(log_request)]
TaskId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[^\x00]*$")]


@router.get("/trials/{trial_id}/logs", response_class=StreamingResponse)
async def trial_logs(
    trial_id: ObjectId,
    params: LogRequestDep,
    request: Request,
    session: SessionDep,
    _user: CurrentUser,
) -> StreamingResponse:
    """Stream a trial's logs; with follow=true, until the trial has ended."""
    target = await logs.get_trial_target(session, trial_id)
    return _stream(request, target, params, TrialLog.of)


@router.get("/tasks/{task_id}/logs", response_class=StreamingResponse)
async def task_logs(
    task_id: TaskId,
    params: LogRequestDep,
    request: Request,
    session: SessionDep,
    _user: CurrentUser,
) -> StreamingResponse:
    """Stream a task's logs (a trial's task id is "<experiment id>.<request id>")."""
    target = await logs.get_task_target(session, task_id)
    return _stream(request, target, params, TaskLog.of)


def _stream(
    request: Request,
    target: LogTarget,
    params: LogRequest,
    shape: Callable[[TaskLogModel], WireModel],
) -> StreamingResponse:
    # The request's own session ends before the body is sent: the stream reads with
    # short sessions of its own.
    factory: async_sessionmaker[AsyncSession] = request.app.state.session_factory
    batches = logs.stream_logs(
        factory,
        target,
        params.where,
        descending=params.descending,
        limit=params.limit,
        follow=params.follow,
    )
    return StreamingResponse(_ndjson(batches, shape, target), media_type=MEDIA_TYPE)


async def _ndjson(
    batches: AsyncIterator[list[TaskLogModel]],
    shape: Callable[[TaskLogModel], WireModel],
    target: LogTarget,
) -> AsyncIterator[str]:
    try:
        async for rows in batches:
            yield "".join(
                f'{{"result":{shape(row).model_dump_json(by_alias=True)}}}\n' for row in rows
            )
    except Exception as exc:
        # The 200 is already sent: grpc-gateway ends a failed stream with an error line.
        if isinstance(exc, OperationalError):
            code, status, message = 14, 503, "the database is unavailable or busy; retry shortly"
        else:
            code, status, message = 13, 500, "internal error; see the master log"
        log.exception("log stream of trial %s failed", target.trial_id)
        error = {"grpcCode": code, "httpCode": status, "message": message, "details": []}
        yield json.dumps({"error": error}) + "\n"
