"""The master's own log lines, kept in memory for `det master logs [-f] [--tail N]` (as
Determined keeps its master's recent lines): the last MAX_LINES, each with an id that
keeps counting, so a follower asks for what came after the last id it saw.

Lines come from any thread (the hashing pool, gRPC); a follower on the event loop is woken
through the loop, never from the logging thread directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

MAX_LINES = 10_000


@dataclass(frozen=True)
class MasterLogLine:
    id: int
    timestamp: datetime
    level: str
    message: str


class MasterLogBuffer(logging.Handler):
    def __init__(self, max_lines: int = MAX_LINES) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        self._lines: deque[MasterLogLine] = deque(maxlen=max_lines)
        self._next_id = 1
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Followers wait on this loop; lines logged from now on wake them."""
        self._loop = loop
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
        except Exception:  # a bad format argument must not lose the line's existence
            message = str(record.msg)
        with self._guard:
            line = MasterLogLine(
                self._next_id,
                datetime.fromtimestamp(record.created, UTC),
                record.levelname,
                message,
            )
            self._next_id += 1
            self._lines.append(line)
        loop, changed = self._loop, self._changed
        if loop is not None and changed is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutdown)
                loop.call_soon_threadsafe(changed.set)

    def lines(self, *, after: int = 0, tail: int | None = None) -> list[MasterLogLine]:
        """Lines with an id above `after`; with `tail`, only the last `tail` of them."""
        with self._guard:
            found = [line for line in self._lines if line.id > after]
        return found[-tail:] if tail is not None else found

    async def follow(self, *, tail: int | None = None) -> AsyncIterator[MasterLogLine]:
        """The kept lines (or the last `tail`), then each new one as it is logged, until
        the caller stops iterating."""
        last = 0
        batch = self.lines(tail=tail)
        while True:
            for line in batch:
                last = line.id
                yield line
            changed = self._changed
            if changed is None:
                return  # not attached to a loop: nothing will wake a follower
            changed.clear()
            batch = self.lines(after=last)
            if not batch:
                await changed.wait()
                batch = self.lines(after=last)
