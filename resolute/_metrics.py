"""Metric checks and the shipper: reports are validated and converted on the caller's thread
(so a bad value fails where it was made), then one daemon thread sends them in order, so a
report costs the training loop microseconds and never a network round trip."""

from __future__ import annotations

import math
import operator
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resolute._api import Session

MetricValue = int | float | str | None


def check_steps(steps_completed: Any, name: str = "steps_completed") -> int:
    if isinstance(steps_completed, bool):
        raise TypeError(f"{name} must be an int >= 0, got a bool")
    try:
        steps = operator.index(steps_completed)  # ints, numpy integers
    except TypeError:
        raise TypeError(
            f"{name} must be an int >= 0, got {type(steps_completed).__name__}"
        ) from None
    if steps < 0:
        raise ValueError(f"{name} must be an int >= 0, got {steps}")
    return steps


def metric_value(name: str, value: Any) -> MetricValue:
    """A JSON-ready value: Python ints stay exact, everything number-like (floats, numpy
    scalars, one-element tensors) goes through float(), and non-finite floats become the
    strings the master's wire format uses."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str | bytes):
        raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(
            f"metric {name!r} must be a number (or a one-element tensor), "
            f"got {type(value).__name__}: {exc}"
        ) from None
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number


def convert_metrics(metrics: Any) -> dict[str, MetricValue]:
    if not isinstance(metrics, Mapping):
        kind = type(metrics).__name__
        raise TypeError(f"metrics must be a mapping of name to number, got {kind}")
    out: dict[str, MetricValue] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric names must be non-empty strings, got {name!r}")
        out[name] = metric_value(name, value)
    return out


class ShippingError(RuntimeError):
    """Reports could not be delivered; raised by the next report, flush() or close()."""


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    body: Any
    call: str


_Item = _Request | threading.Event | None


class Shipper:
    """Sends queued requests in order on one daemon thread. After the first failure the
    rest are dropped: a master that is gone would otherwise cost a retry period each."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._error: str | None = None
        self._dropped = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="resolute-shipper", daemon=True)
        self._thread.start()

    def submit(self, method: str, path: str, body: Any, call: str) -> None:
        if self._closed:
            raise RuntimeError("the resolute context is closed; reports are no longer accepted")
        self._raise_if_failed()
        self._queue.put(_Request(method, path, body, call))

    def flush(self) -> None:
        """Wait until everything submitted so far was sent (or failed)."""
        if not self._closed:
            done = threading.Event()
            self._queue.put(done)
            done.wait()
        self._raise_if_failed()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        self._session.close()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            dropped = f"; {self._dropped} later report(s) were dropped" if self._dropped else ""
            raise ShippingError(f"sending reports to the master failed: {self._error}{dropped}")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            if self._error is not None:
                self._dropped += 1
                continue
            try:
                self._session.request(item.method, item.path, item.body, call=item.call)
            except Exception as exc:  # any failure: reported to the training loop, not lost
                self._error = str(exc)
