"""Preemption signals for trial code: a long-poll answered the moment the master wants the
allocation to stop, so a trial can checkpoint and exit on its own instead of being killed."""

from __future__ import annotations

import asyncio
import time


class PreemptionSignals:
    """In-memory, per master process: the hub raises a signal, long-polls wait on it."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._last_poll: dict[str, float] = {}
        self._waiting: dict[str, int] = {}
        self._acked: set[str] = set()
        self._closing = asyncio.Event()

    def _event(self, allocation_id: str) -> asyncio.Event:
        return self._events.setdefault(allocation_id, asyncio.Event())

    def raise_signal(self, allocation_id: str) -> None:
        self._event(allocation_id).set()

    def is_raised(self, allocation_id: str) -> bool:
        event = self._events.get(allocation_id)
        return event is not None and event.is_set()

    def close(self) -> None:
        """The master is stopping: every poll answers now, not preempted, instead of holding
        the shutdown up for uvicorn's grace period; the trial polls again, and whichever
        master runs next answers it."""
        self._closing.set()

    async def wait(self, allocation_id: str, timeout_s: float) -> bool:
        """True as soon as the signal is raised; False when `timeout_s` passes first, or
        once the master is stopping."""
        event = self._event(allocation_id)
        self._waiting[allocation_id] = self._waiting.get(allocation_id, 0) + 1
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._closing.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if not event.is_set():
                return False
        finally:
            for waiting in waits:
                waiting.cancel()
            # The allocation may have ended (forget) while this poll waited.
            left = self._waiting.get(allocation_id, 0) - 1
            if left > 0:
                self._waiting[allocation_id] = left
            else:
                self._waiting.pop(allocation_id, None)
            if allocation_id in self._events:
                self._last_poll[allocation_id] = time.monotonic()
        return True

    def told_at_once(self, allocation_id: str) -> None:
        """A poll was answered "stop" without waiting (the master's wish was already
        stored): the trial polls, so it counts as listening like one woken from a wait."""
        self._last_poll[allocation_id] = time.monotonic()

    def acknowledge(self, allocation_id: str) -> None:
        self._acked.add(allocation_id)

    def watched(self, allocation_id: str, within_s: float) -> bool:
        """Whether trial code polled (or is polling) the signal recently: only then is it
        worth waiting for the trial to stop on its own."""
        if allocation_id in self._acked or self._waiting.get(allocation_id, 0) > 0:
            return True
        last = self._last_poll.get(allocation_id)
        return last is not None and time.monotonic() - last <= within_s

    def forget(self, allocation_id: str) -> None:
        self._events.pop(allocation_id, None)
        self._last_poll.pop(allocation_id, None)
        self._waiting.pop(allocation_id, None)
        self._acked.discard(allocation_id)
