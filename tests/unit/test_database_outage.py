"""Which errors count as the database being out of reach (503, one log line) rather than a
statement that failed; and the outage's log lines."""

from __future__ import annotations

import errno
import logging

import pytest
from sqlalchemy import exc

from master.db.session import DatabaseHealth, is_outage


def wrapped(orig: BaseException, invalidated: bool = False) -> exc.DBAPIError:
    return exc.DBAPIError("SELECT 1", None, orig, connection_invalidated=invalidated)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"),
        ConnectionResetError(errno.ECONNRESET, "reset by peer"),
        TimeoutError(),
        OSError(errno.EHOSTUNREACH, "No route to host"),
        wrapped(Exception("server closed the connection unexpectedly"), invalidated=True),
    ],
)
def test_unreachable_database_errors_are_outages(error: BaseException) -> None:
    assert is_outage(error)


def test_an_outage_found_through_the_cause_chain() -> None:
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        except ConnectionRefusedError as inner:
            raise RuntimeError("while checking out a connection") from inner
    except RuntimeError as outer:
        assert is_outage(outer)


@pytest.mark.parametrize(
    "error",
    [
        exc.IntegrityError("INSERT", None, Exception("duplicate key")),  # type: ignore[arg-type]
        exc.OperationalError("INSERT", None, Exception("database is locked")),  # type: ignore[arg-type]
        ValueError("not a database problem"),
        OSError(errno.ENOSPC, "No space left on device"),
    ],
)
def test_failed_statements_are_not_outages(error: BaseException) -> None:
    assert not is_outage(error)


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = DatabaseHealth()
    caplog.set_level(logging.INFO, logger="master.db.session")
    for _ in range(50):
        health.failed(ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"))
    assert not health.reachable and health.errors == 50
    for _ in range(3):
        health.succeeded()
    assert health.reachable
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("database unreachable (ConnectionRefusedError")
    assert lines[1].startswith("database reachable again after")
