"""Renders every error, FastAPI's own included, as grpc-gateway does: {code, message, details}."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError, SQLAlchemyError
from starlette.exceptions import HTTPException

from master.db.session import is_outage
from master.errors import MasterError, TooManyRequests

log = logging.getLogger(__name__)

_HTTP_TO_GRPC = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 409: 6, 413: 8, 429: 8, 503: 14}


_GRPC_NAMES = {
    2: "Unknown",
    3: "InvalidArgument",
    5: "NotFound",
    6: "AlreadyExists",
    7: "PermissionDenied",
    8: "ResourceExhausted",
    9: "FailedPrecondition",
    12: "Unimplemented",
    13: "Internal",
    14: "Unavailable",
    16: "Unauthenticated",
}


def error_response(
    http_status: int,
    code: int,
    message: str,
    details: list[Any],
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    content = {
        "code": code,
        "message": message,
        "details": details,
        # Determined's client prints error.error for non-404 failures and the raw body
        # otherwise, so this copy turns a JSON dump into one readable line.
        "error": {"code": code, "reason": _GRPC_NAMES.get(code, "Unknown"), "error": message},
    }
    return JSONResponse(status_code=http_status, content=content, headers=headers)


def _location(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where, rest = parts[0], parts[1:]
        return f"{where} {'.'.join(rest)}" if rest else where
    return ".".join(parts)


@dataclass(frozen=True)
class Problem:
    """What the caller is told about an error, whichever way it is rendered."""

    http_status: int
    code: int
    message: str
    details: list[Any] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)


# What a client should wait before it asks again while the database is out (or busy).
RETRY_AFTER = {"Retry-After": "2"}
DATABASE_UNREACHABLE = "the database is unreachable; nothing was changed; retry shortly"


def describe_error(exc: Exception) -> Problem:
    """The one mapping from an exception to what the API (JSON) and the dashboard (pages)
    answer: the caller's mistakes are 4xx, a busy database 503, anything else our 500."""
    if is_outage(exc):
        return Problem(503, 14, DATABASE_UNREACHABLE, headers=RETRY_AFTER)
    if isinstance(exc, TooManyRequests):
        return Problem(429, 8, exc.message, headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, MasterError):
        return Problem(exc.http_status, exc.grpc_code, exc.message, exc.details)
    if isinstance(exc, RequestValidationError):
        details = [
            {"path": _location(tuple(e.get("loc", ()))), "message": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        message = "; ".join(f"{d['path']}: {d['message']}" for d in details)
        return Problem(400, 3, message or "invalid request", details)
    if isinstance(exc, HTTPException):
        return Problem(exc.status_code, _HTTP_TO_GRPC.get(exc.status_code, 2), str(exc.detail))
    if isinstance(exc, IntegrityError):
        log.warning("integrity error: %s", exc)
        return Problem(409, 6, "the change conflicts with data stored meanwhile; retry")
    if isinstance(exc, DBAPIError):
        return _database_problem(exc)
    if isinstance(exc, OverflowError):
        return Problem(400, 3, f"a number is too large: {exc}")
    log.exception("unexpected error", exc_info=exc)
    return Problem(500, 13, "internal error; see the master log")


def _database_problem(exc: DBAPIError) -> Problem:
    # A value the database cannot hold is the caller's; lost connections and lock
    # timeouts are worth a retry; anything else is our bug.
    if isinstance(exc, DataError):
        log.warning("value out of range for the database: %s", exc)
        return Problem(400, 3, "a value is out of range for the database")
    orig = getattr(exc, "orig", None)
    sqlstate = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
    if sqlstate.startswith("22"):
        # Postgres's "data exception" class, which asyncpg does not map to DataError: a
        # number out of range, a text with a NUL character or one the encoding cannot hold.
        log.warning("value the database cannot hold: %s", exc)
        return Problem(
            400, 3, "a value cannot be stored: out of range, or a text with a NUL character"
        )
    if isinstance(exc, OperationalError) or exc.connection_invalidated:
        log.warning("database unavailable: %s", exc)
        return Problem(503, 14, "the database is busy; retry shortly", headers=RETRY_AFTER)
    log.exception("unexpected database error", exc_info=exc)
    return Problem(500, 13, "internal error; see the master log")


async def _render(request: Request, exc: Exception) -> JSONResponse:
    note_outage(request, exc)
    problem = describe_error(exc)
    return error_response(
        problem.http_status, problem.code, problem.message, problem.details, problem.headers
    )


def note_outage(request: Request, exc: Exception) -> None:
    """An outage is logged once, by the app's DatabaseHealth, not per request."""
    health = getattr(request.app.state, "db_health", None)
    if health is not None and is_outage(exc):
        health.failed(exc)


def install_error_handlers(app: FastAPI) -> None:
    # Starlette picks a handler by the exception's class; every one renders describe_error.
    # OSError and SQLAlchemyError are named so that a database outage (a refused or reset
    # connection, a pool timeout) is answered here: errors that only reach the `Exception`
    # handler are answered too, but Starlette then re-raises them for the server to log.
    for kind in (
        MasterError,
        RequestValidationError,
        HTTPException,
        DBAPIError,
        SQLAlchemyError,
        OSError,
        OverflowError,
        Exception,
    ):
        app.add_exception_handler(kind, _render)
