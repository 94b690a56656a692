"""Background loops: start and stop in the app's lifespan, one `run_once` per iteration."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from abc import ABC, abstractmethod

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.db.session import DatabaseHealth, is_outage

log = logging.getLogger(__name__)


class Loop(ABC):
    """Runs `run_once` every `interval` seconds, or at once when woken.

    An error in one iteration is logged and the loop carries on after its interval plus a
    little jitter, so a flapping dependency is not hammered in lockstep.
    """

    name = "loop"
    # Set by the app: a database outage is then one line there, not a traceback per turn.
    health: DatabaseHealth | None = None

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @abstractmethod
    async def run_once(self) -> None: ...

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Let an iteration in flight finish, then end."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _run(self) -> None:
        log.info("%s started (every %.2fs)", self.name, self.interval)
        delay = self.interval
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            self._wake.clear()
            if self._stopping:
                break
            try:
                await self.run_once()
                delay = self.interval
            except Exception as exc:
                if self.health is not None and is_outage(exc):
                    self.health.failed(exc)
                else:
                    log.exception("%s iteration failed; retrying", self.name)
                delay = self.interval + random.uniform(0, self.interval)
        log.info("%s stopped", self.name)


class DatabaseWatch(Loop):
    """Asks the database a trivial question every `interval`: readiness, the dashboard's
    banner and the outage's closing log line follow its answer within a second or two,
    whether or not requests come in."""

    name = "database-watch"

    def __init__(self, factory: async_sessionmaker[AsyncSession], health: DatabaseHealth) -> None:
        super().__init__(interval=1.0)
        self.factory = factory
        self.health = self.watched = health

    async def run_once(self) -> None:
        async with self.factory() as session:
            await asyncio.wait_for(session.execute(text("SELECT 1")), timeout=2.0)
        self.watched.succeeded()
