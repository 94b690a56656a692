"""Async engine and session factories; one session per request and per loop iteration."""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import StaticPool

log = logging.getLogger(__name__)

# A database that stops answering is noticed within these (not the OS's two hours):
CONNECT_TIMEOUT_S = 3.0  # to open a connection
COMMAND_TIMEOUT_S = 30.0  # for one statement's answer
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 2, 1, 3
TCP_USER_TIMEOUT_MS = 3000  # unacknowledged data on a dead link
# A pooled connection idle for longer is pinged before use. SQLAlchemy's pool_pre_ping
# pings every checkout, three round trips each (BEGIN, a query, ROLLBACK): a tenth of a
# submit's time (issue 16). A connection used more recently is trusted; if the server went
# away since, its statement fails as an outage (a 503) and the pool discards every
# connection it opened before that, so the next request connects afresh.
PING_AFTER_IDLE_S = 1.0
_RETURNED_AT = "returned_at"
_OUTAGE_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ETIMEDOUT,
    errno.EPIPE,
}


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    kwargs: dict[str, Any] = {"echo": echo}
    if url.startswith("sqlite") and ":memory:" in url:
        # An in-memory database lives only as long as its one connection.
        kwargs["poolclass"] = StaticPool
        kwargs["connect_args"] = {"check_same_thread": False}
    if url.startswith("postgresql"):
        kwargs["connect_args"] = {
            "timeout": CONNECT_TIMEOUT_S,
            "command_timeout": COMMAND_TIMEOUT_S,
        }
    engine = create_async_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    if engine.dialect.name == "postgresql":
        event.listen(engine.sync_engine, "connect", _postgres_on_connect)
        event.listen(engine.sync_engine, "checkin", _note_return)
        event.listen(engine.sync_engine, "checkout", _ping_if_idle)
    return engine


def _note_return(_dbapi_connection: Any, record: Any) -> None:
    if record is not None:
        record.info[_RETURNED_AT] = time.monotonic()


def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """Checks a connection that sat idle in the pool, so after a database restart the
    first request gets a fresh one instead of an error; raising DisconnectionError makes
    the pool discard it and try another (SQLAlchemy's pessimistic disconnect handling)."""
    returned_at = record.info.get(_RETURNED_AT)
    if returned_at is None or time.monotonic() - returned_at <= PING_AFTER_IDLE_S:
        return  # just opened, or in use a moment ago
    try:
        dbapi_connection.ping()
    except Exception as error:
        raise exc.DisconnectionError(f"a pooled connection is dead: {error}") from error


def _postgres_on_connect(dbapi_connection: Any, _record: Any) -> None:
    """TCP keepalives and a user timeout on the connection's socket: asyncpg has no
    settings for them, and without them a database behind a cut link is noticed only
    when the kernel gives up retransmitting (about 15 minutes) or never, when idle."""
    transport = getattr(getattr(dbapi_connection, "_connection", None), "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a Unix socket: nothing between us and the server to go silent
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S),
        (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S),
        (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT),
        (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS),
    ]
    for level, option, value in options:
        sock.setsockopt(level, option, value)


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__


def is_outage(error: BaseException) -> bool:
    """Whether `error`, or what caused it, says the database cannot be reached (refused,
    reset, timed out, shutting down), as opposed to a statement that failed."""
    for cause in _causes(error):
        if isinstance(cause, exc.DBAPIError) and cause.connection_invalidated:
            return True
        if isinstance(cause, TimeoutError | ConnectionError):
            return True
        if isinstance(cause, OSError) and cause.errno in _OUTAGE_ERRNOS:
            return True
        module = type(cause).__module__
        if module.startswith("asyncpg") and type(cause).__name__ in _ASYNCPG_OUTAGES:
            return True
        if module.startswith("asyncpg") and "connection is closed" in str(cause):
            return True
    return False


_ASYNCPG_OUTAGES = {
    "PostgresConnectionError",
    "ConnectionDoesNotExistError",
    "ConnectionFailureError",
    "ClientCannotConnectError",
    "ConnectionRejectionError",
    "CannotConnectNowError",
    "AdminShutdownError",
    "CrashShutdownError",
    "TooManyConnectionsError",
}


class DatabaseHealth:
    """Whether the database answers, as the master last saw it: one log line when it
    stops answering and one when it is back, instead of a traceback per request."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.last_error = ""
        self.errors = 0  # outage errors seen since start (exported as a counter)

    @property
    def reachable(self) -> bool:
        return self.down_since is None

    def failed(self, error: BaseException) -> None:
        self.errors += 1
        self.last_error = _one_line(error)
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.error(
                "database unreachable (%s): API calls answer 503 and decisions wait until it "
                "is back; running trials carry on",
                self.last_error,
            )

    def succeeded(self) -> None:
        if self.down_since is not None:
            log.warning("database reachable again after %.1fs", time.monotonic() - self.down_since)
            self.down_since = None


def _one_line(error: BaseException) -> str:
    innermost = list(_causes(error))[-1]
    text = str(innermost).strip().splitlines()
    return f"{type(innermost).__name__}: {text[0] if text else ''}".strip().rstrip(":")


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def create_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False)


@asynccontextmanager
async def session_scope(factory: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A session for a background loop iteration: commit on success, roll back on error."""
    async with factory() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise
