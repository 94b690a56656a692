"""The cluster message: one banner admins set for everyone, with a start and maybe an end.

Only the newest message counts. Setting one ends any that are showing or waiting to show,
and clearing ends them all, so the table keeps the history of what was said.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.durations import parse_duration
from master.core.text import unstorable
from master.db.models import ClusterMessageModel, utcnow
from master.errors import InvalidArgument
from master.services.access import Actor, require_admin

log = logging.getLogger(__name__)

MAX_LENGTH = 250  # characters, as Determined caps it


@dataclass(frozen=True)
class ClusterMessage:
    message: str
    start_time: datetime
    end_time: datetime | None
    created_time: datetime

    def active_at(self, now: datetime) -> bool:
        return self.start_time <= now and (self.end_time is None or self.end_time > now)


async def _newest(session: AsyncSession) -> ClusterMessageModel | None:
    return await session.scalar(
        select(ClusterMessageModel)
        .order_by(ClusterMessageModel.created_time.desc(), ClusterMessageModel.id.desc())
        .limit(1)
    )


async def current(session: AsyncSession, *, include_scheduled: bool) -> ClusterMessage | None:
    """The newest message if it has not ended; one whose start is still ahead only with
    `include_scheduled` (what admins see; everyone else sees it once it starts)."""
    row = await _newest(session)
    if row is None:
        return None
    now = utcnow()
    if row.end_time is not None and row.end_time <= now:
        return None
    if row.start_time > now and not include_scheduled:
        return None
    return ClusterMessage(row.message, row.start_time, row.end_time, row.created_time)


def _timestamp(value: str | None, field: str) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidArgument(
            f"{field}: {value[:64]!r} is not an RFC 3339 time like '2026-10-26T23:17:12Z'"
        ) from None
    if moment.tzinfo is None:
        raise InvalidArgument(f"{field}: {value[:64]!r} has no time zone; add 'Z' for UTC")
    return moment


async def set_message(
    session: AsyncSession,
    actor: Actor,
    *,
    message: str,
    start_time: str | None,
    end_time: str | None,
    duration: str | None,
) -> ClusterMessage:
    require_admin(actor, "setting the cluster message")
    if not message.strip():
        raise InvalidArgument("message: must not be empty")
    if unstorable(message):
        raise InvalidArgument("message: holds a NUL character or a lone surrogate")
    if len(message) > MAX_LENGTH:
        raise InvalidArgument(
            f"message: at most {MAX_LENGTH} characters; this one has {len(message)}"
        )
    if end_time and duration:
        raise InvalidArgument("endTime, duration: give one or the other, not both")
    now = utcnow()
    start = _timestamp(start_time, "startTime") or now
    end = _timestamp(end_time, "endTime")
    if duration:
        try:
            span: timedelta = parse_duration(duration, "duration")
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        try:
            end = start + span
        except OverflowError:
            raise InvalidArgument(
                f"duration: {duration!r} after startTime is past year 9999"
            ) from None
    if end is not None and end <= start:
        raise InvalidArgument("endTime: must be after startTime")
    if end is not None and end <= now:
        raise InvalidArgument("endTime: must be in the future")
    await _end_all(session, now)
    row = ClusterMessageModel(
        message=message, start_time=start, end_time=end, created_time=now, created_by=actor.user_id
    )
    session.add(row)
    await session.flush()
    log.info("cluster message set by %s (from %s to %s)", actor.username, start, end or "never")
    return ClusterMessage(row.message, row.start_time, row.end_time, row.created_time)


async def clear(session: AsyncSession, actor: Actor) -> None:
    require_admin(actor, "clearing the cluster message")
    if await _end_all(session, utcnow()):
        log.info("cluster message cleared by %s", actor.username)


async def _end_all(session: AsyncSession, now: datetime) -> int:
    result = await session.execute(
        update(ClusterMessageModel)
        .where(or_(ClusterMessageModel.end_time.is_(None), ClusterMessageModel.end_time > now))
        .values(end_time=now)
    )
    return int(getattr(result, "rowcount", 0) or 0)
