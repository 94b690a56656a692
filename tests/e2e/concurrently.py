"""Independent client calls of one test, run side by side: each is its own process, so a
test that makes several that need not wait for one another waits only for the slowest."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def concurrently(*calls: Callable[[], T]) -> list[T]:
    """Each call's result, in the order given; the first exception any call raised."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]
