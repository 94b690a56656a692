"""Domain errors raised by services, each with an HTTP status and a gRPC code.

The API renders every error as grpc-gateway does, `{"code", "message", "details"}`,
because Determined's official client reads `message` from that shape.
"""

from __future__ import annotations

from typing import Any


class MasterError(Exception):
    http_status = 500
    grpc_code = 13  # INTERNAL

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class InvalidArgument(MasterError):
    http_status = 400
    grpc_code = 3


class NotFound(MasterError):
    http_status = 404
    grpc_code = 5


class AlreadyExists(MasterError):
    http_status = 409
    grpc_code = 6


class PermissionDenied(MasterError):
    http_status = 403
    grpc_code = 7


class Conflict(MasterError):
    """The request is valid but the object's current state forbids it (FAILED_PRECONDITION)."""

    http_status = 409
    grpc_code = 9


class PayloadTooLarge(MasterError):
    http_status = 413
    grpc_code = 8  # RESOURCE_EXHAUSTED


class TooManyRequests(MasterError):
    """Slow down (login attempts); `retry_after_s` becomes the Retry-After header."""

    http_status = 429
    grpc_code = 8  # RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unauthenticated(MasterError):
    http_status = 401
    grpc_code = 16


class Unavailable(MasterError):
    http_status = 503
    grpc_code = 14
