"""Turns config problems from the pure cores into API errors that name each path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from master.core.errors import ConfigError
from master.errors import InvalidArgument


@contextmanager
def config_errors_as_invalid_argument(what: str) -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        details = [{"path": p.path, "message": p.message} for p in exc.problems]
        raise InvalidArgument(f"invalid {what}: {exc}", details) from exc
