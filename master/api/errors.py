"""Renders every error, FastAPI's own included, as grpc-gateway does: {code, message, details}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException

from master.errors import MasterError

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


def error_response(http_status: int, code: int, message: str, details: list[Any]) -> JSONResponse:
    content = {
        "code": code,
        "message": message,
        "details": details,
        # Determined's client prints error.error for non-404 failures and the raw body
        # otherwise, so this copy turns a JSON dump into one readable line.
        "error": {"code": code, "reason": _GRPC_NAMES.get(code, "Unknown"), "error": message},
    }
    return JSONResponse(status_code=http_status, content=content)


def _location(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where, rest = parts[0], parts[1:]
        return f"{where} {'.'.join(rest)}" if rest else where
    return ".".join(parts)


async def _master_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MasterError)
    return error_response(exc.http_status, exc.grpc_code, exc.message, exc.details)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [
        {"path": _location(tuple(e.get("loc", ()))), "message": str(e.get("msg", ""))}
        for e in exc.errors()
    ]
    message = "; ".join(f"{d['path']}: {d['message']}" for d in details) or "invalid request"
    return error_response(400, 3, message, details)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = _HTTP_TO_GRPC.get(exc.status_code, 2)
    return error_response(exc.status_code, code, str(exc.detail), [])


async def _integrity_error(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("integrity error: %s", exc)
    return error_response(409, 6, "the change conflicts with data stored meanwhile; retry", [])


async def _db_error(request: Request, exc: Exception) -> JSONResponse:
    # A value the database cannot hold is the caller's; lost connections and lock
    # timeouts are worth a retry; anything else is our bug.
    if isinstance(exc, DataError):
        log.warning("value out of range for the database: %s", exc)
        return error_response(400, 3, "a value is out of range for the database", [])
    orig = getattr(exc, "orig", None)
    sqlstate = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
    if sqlstate.startswith("22"):
        # Postgres's "data exception" class, which asyncpg does not map to DataError: a text
        # with a NUL character, or one the database encoding cannot hold.
        log.warning("value the database cannot hold: %s", exc)
        return error_response(
            400, 3, "a text value cannot be stored (NUL characters are not allowed)", []
        )
    if isinstance(exc, OperationalError) or getattr(exc, "connection_invalidated", False):
        log.warning("database unavailable: %s", exc)
        return error_response(503, 14, "the database is unavailable or busy; retry shortly", [])
    return await _unexpected(request, exc)


async def _overflow(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(400, 3, f"a number is too large: {exc}", [])


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", exc_info=exc)
    return error_response(500, 13, "internal error; see the master log", [])


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(MasterError, _master_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(IntegrityError, _integrity_error)
    app.add_exception_handler(DBAPIError, _db_error)
    app.add_exception_handler(OverflowError, _overflow)
    app.add_exception_handler(Exception, _unexpected)
