"""Group commit: the writes of many concurrent callers, committed in one transaction.

A caller hands its item (already validated) to `GroupCommit.write` and waits for the
commit of the transaction that carried it; nothing is acknowledged before that commit.
While a transaction is in flight, the items that arrive wait and go together in the next
one, so a lone caller is committed at once (no timer to wait out) and many callers share
the statements, the fsync, the scheduler epoch's bump and the leader's fence check.

A batch that fails for a reason other than an outage is written again one item at a time,
each in its own transaction: one caller's bad item never fails the others. An outage fails
every caller of the batch (each would have failed alone), answered 503 by the API as today.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.db.session import is_outage, session_scope
from master.errors import Unavailable

log = logging.getLogger(__name__)

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

# The most items in one transaction: a burst of a thousand submits goes as a few batches,
# so the first callers are answered before the last ones' rows are even built.
MAX_BATCH = 64
STOPPING = Unavailable("the master is stopping; try again")


class GroupCommit(Generic[ItemT, ResultT]):
    """Commits the items of concurrent callers together.

    `write(session, items)` stores the items in the session's transaction and returns one
    result per item, in order; GroupCommit commits it. `after_commit(session.info)` runs
    once the transaction has committed (to wake the loops its changes concern)."""

    def __init__(
        self,
        factory: async_sessionmaker[AsyncSession],
        write: Callable[[AsyncSession, Sequence[ItemT]], Awaitable[Sequence[ResultT]]],
        *,
        after_commit: Callable[[dict[Any, Any]], None] | None = None,
        max_batch: int = MAX_BATCH,
        name: str = "writes",
    ) -> None:
        self.factory = factory
        self._write = write
        self._after_commit = after_commit
        self.max_batch = max_batch
        self.name = name
        self._waiting: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._writer: asyncio.Task[None] | None = None
        # What it has done, for tests and benchmarks: transactions committed, items in them.
        self.transactions = 0
        self.items = 0

    async def write(self, item: ItemT) -> ResultT:
        """Store `item`; returns its result once its transaction has committed."""
        future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name=f"group-commit-{self.name}")
        return await future

    async def close(self) -> None:
        """Wait for what was handed over to be written (at shutdown)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)

    async def _write_all(self) -> None:
        batch: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        try:
            while self._waiting:
                batch = self._waiting[: self.max_batch]
                del self._waiting[: self.max_batch]
                # A caller that gave up before its batch began (its client went away) is
                # not written: it was never acknowledged, and nothing of it is stored.
                batch = [(item, future) for item, future in batch if not future.cancelled()]
                if batch:
                    await self._commit_batch(batch)
        except BaseException as error:  # cancelled at shutdown: nobody may wait forever
            for _, future in batch + self._waiting:
                _fail(future, error if isinstance(error, Exception) else STOPPING)
            self._waiting.clear()
            raise

    async def _commit_batch(self, batch: list[tuple[ItemT, asyncio.Future[ResultT]]]) -> None:
        try:
            results = await self._commit([item for item, _ in batch])
        except Exception as error:
            if len(batch) == 1 or is_outage(error):
                for _, future in batch:
                    _fail(future, error)
                return
            log.info(
                "%s: a transaction of %d failed (%s); writing each alone",
                self.name,
                len(batch),
                type(error).__name__,
            )
            for one in batch:
                await self._commit_batch([one])
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def _commit(self, items: list[ItemT]) -> Sequence[ResultT]:
        async with session_scope(self.factory) as session:
            results = await self._write(session, items)
            if len(results) != len(items):
                raise RuntimeError(f"{self.name}: {len(results)} results for {len(items)} items")
        self.transactions += 1
        self.items += len(items)
        if self._after_commit is not None:
            self._after_commit(session.info)
        return results


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
