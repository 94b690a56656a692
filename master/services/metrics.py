"""Agent system metrics: buffered in memory from heartbeats, written in batches, trimmed by age.

Heartbeats arrive from every agent every second, so `MetricsBuffer.add` only appends to a
bounded queue; `MetricsLoop` turns what piled up into one bulk INSERT a second.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from sqlalchemy import Table, delete, insert, select
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import aliased

from master.db.models import AgentMetricModel, AgentModel
from master.db.session import session_scope
from master.services.loops import Loop
from master.settings import MasterSettings

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 200_000
# The columns' limits: BIGINT, String(256), and what datetime can show (years 1970-9999).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_AGENT_ID = 256
_MAX_UNIX_MILLIS = 253_402_300_799_999


# Named tuples rather than dataclasses: a tuple holding only numbers and strings drops out
# of the garbage collector's sight at its first collection, so the thousands of readings a
# second that wait in the buffer are neither traversed nor promoted to older generations
# (as dataclasses they were, and 1,000 agents at 1 Hz saw collections of 10-100 ms).
class GpuReading(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index, which nothing here calls
    uuid: str
    gpu_util: float  # percent
    gpu_memory_used: int  # bytes
    gpu_free_memory: int  # bytes
    temperature_c: float
    power_w: float


class MetricReading(NamedTuple):
    unix_millis: int
    cpu_util_simple: float  # percent of all cores
    memory_free: int  # bytes available
    memory_used: int  # bytes
    disk_throughput_read: float  # bytes/s
    disk_throughput_write: float  # bytes/s
    disk_iops: float
    net_throughput_sent: float  # bytes/s
    net_throughput_recv: float  # bytes/s
    gpus: tuple[GpuReading, ...] = ()


# What `take` hands out and `restore` puts back: (agent id, its readings) in arrival order.
MetricsBatch = list[tuple[str, tuple[MetricReading, ...]]]


def _float(value: float) -> float:
    # NaN and infinities are neither valid JSON nor storable in SQLite's NOT NULL REAL.
    return value if math.isfinite(value) else 0.0


def _int(value: int) -> int:
    return _INT64_MIN if value < _INT64_MIN else _INT64_MAX if value > _INT64_MAX else value


def _gpu_row(gpu: GpuReading) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "gpu_util": _float(gpu.gpu_util),
        "gpu_memory_used": _int(gpu.gpu_memory_used),
        "gpu_free_memory": _int(gpu.gpu_free_memory),
        "temperature_c": _float(gpu.temperature_c),
        "power_w": _float(gpu.power_w),
    }


# The insert's columns, in the order of the row tuples `_rows` builds.
_COLUMNS = (
    "agent_id",
    "unix_millis",
    "cpu_util_simple",
    "memory_free",
    "memory_used",
    "disk_throughput_read",
    "disk_throughput_write",
    "disk_iops",
    "net_throughput_sent",
    "net_throughput_recv",
    "gpus",
)
Row = tuple[Any, ...]


def _rows(batch: MetricsBatch) -> tuple[list[Row], int]:
    """Insert rows for a batch (tuples in `_COLUMNS` order, the GPUs already JSON text), and
    how many readings could not be stored as sent."""
    rows: list[Row] = []
    invalid = 0
    encode = _JSON.encode
    for agent_id, readings in batch:
        if not agent_id or len(agent_id) > _MAX_AGENT_ID:
            invalid += len(readings)
            continue
        for r in readings:
            if not 0 <= r.unix_millis <= _MAX_UNIX_MILLIS:
                invalid += 1
                continue
            rows.append(
                (
                    agent_id,
                    r.unix_millis,
                    _float(r.cpu_util_simple),
                    _int(r.memory_free),
                    _int(r.memory_used),
                    _float(r.disk_throughput_read),
                    _float(r.disk_throughput_write),
                    _float(r.disk_iops),
                    _float(r.net_throughput_sent),
                    _float(r.net_throughput_recv),
                    encode([_gpu_row(g) for g in r.gpus]),
                )
            )
    return rows, invalid


_JSON = json.JSONEncoder(separators=(",", ":"))
_METRICS_TABLE = cast(Table, AgentMetricModel.__table__)


_INSERT_SQL: dict[tuple[str, str, str], str] = {}


def _insert_sql(dialect: Dialect) -> str:
    """The bulk insert in the driver's own parameter style, for `exec_driver_sql`: rows go
    to the driver's executemany as built, without SQLAlchemy's per-row parameter
    processing, which cost more than building them (1,000 rows a second)."""
    key = (dialect.name, dialect.driver, dialect.paramstyle)
    if key not in _INSERT_SQL:
        statement = insert(_METRICS_TABLE).inline()
        compiled = statement.compile(dialect=dialect, column_keys=_COLUMNS)
        if compiled.positiontup != list(_COLUMNS):  # a named or reordered parameter style
            raise RuntimeError(f"unsupported parameter style {dialect.paramstyle!r}")
        _INSERT_SQL[key] = compiled.string
    return _INSERT_SQL[key]


_INSERT_CHUNK = 100  # agents' readings per statement


class MetricsBuffer:
    """Readings waiting for the next bulk insert, at most `max_rows` of them.

    `add` runs on every heartbeat and does no I/O and no conversion: it keeps the caller's
    sequence as one chunk. When full, the oldest readings go first; `dropped` counts them
    and the next flush logs the count once. Not thread-safe: one event loop uses it.
    """

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        self.max_rows = max_rows
        self._chunks: deque[tuple[str, tuple[MetricReading, ...]]] = deque()
        self._pending = 0
        self.dropped = 0  # readings lost to the cap or to invalid values, since start
        self._unreported = 0  # the part of `dropped` not yet logged

    @property
    def pending(self) -> int:
        return self._pending

    def add(self, agent_id: str, readings: Sequence[MetricReading]) -> None:
        if not readings:
            return
        # A tuple is kept as is; anything else is copied, so the caller may reuse its list.
        chunk = readings if isinstance(readings, tuple) else tuple(readings)
        self._chunks.append((agent_id, chunk))
        self._pending += len(chunk)
        if self._pending > self.max_rows:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        excess = self._pending - self.max_rows
        while excess > 0:
            agent_id, chunk = self._chunks[0]
            if len(chunk) <= excess:
                self._chunks.popleft()
                lost = len(chunk)
            else:
                self._chunks[0] = (agent_id, chunk[excess:])
                lost = excess
            excess -= lost
            self._pending -= lost
            self._count_dropped(lost)

    def _count_dropped(self, count: int) -> None:
        self.dropped += count
        self._unreported += count

    def take(self) -> MetricsBatch:
        """Everything pending, oldest first; the buffer is empty afterwards."""
        batch = list(self._chunks)
        self._chunks.clear()
        self._pending = 0
        return batch

    def restore(self, batch: MetricsBatch) -> None:
        """Put a batch that could not be stored back in front of what arrived since."""
        self._chunks.extendleft(reversed(batch))
        self._pending += sum(len(readings) for _, readings in batch)
        if self._pending > self.max_rows:
            self._drop_oldest()

    async def write(self, session: AsyncSession, batch: MetricsBatch) -> int:
        """Insert `batch`, a slice at a time; the caller commits. Returns the rows written."""
        self._report_dropped()
        if not batch:
            return 0  # an idle master's flush touches no connection
        # Rows are inserted a slice at a time, yielding between slices: one 1,000-agent
        # flush in a single go held the event loop for up to 70 ms, felt by every heartbeat
        # behind it.
        connection = await session.connection()
        sql = _insert_sql(connection.dialect)
        written = invalid = 0
        for start in range(0, len(batch), _INSERT_CHUNK):
            rows, bad = _rows(batch[start : start + _INSERT_CHUNK])
            invalid += bad
            if rows:
                await connection.exec_driver_sql(sql, rows)
                written += len(rows)
            await asyncio.sleep(0)
        if invalid:  # counted only once the batch is in, so a retried batch counts them once
            log.warning("dropped %d agent metric samples with an invalid agent id or time", invalid)
            self.dropped += invalid
        return written

    async def flush(self, session: AsyncSession) -> int:
        """Insert everything pending in one statement; the caller's session commits.

        If the insert fails the readings go back into the buffer and the error propagates.
        A caller whose commit may fail after this returns should use take/write/restore.
        """
        batch = self.take()
        if not batch:
            self._report_dropped()
            return 0
        try:
            return await self.write(session, batch)
        except BaseException:
            self.restore(batch)
            raise

    def _report_dropped(self) -> None:
        if self._unreported:
            log.warning(
                "agent metrics buffer full (%d samples): dropped the %d oldest samples",
                self.max_rows,
                self._unreported,
            )
            self._unreported = 0


async def list_agent_metrics(
    session: AsyncSession, agent_id: str, *, since_millis: int | None = None, limit: int = 300
) -> list[AgentMetricModel]:
    """The newest `limit` samples of one agent taken at or after `since_millis`, oldest first."""
    query = select(AgentMetricModel).where(AgentMetricModel.agent_id == agent_id)
    if since_millis is not None:
        query = query.where(AgentMetricModel.unix_millis >= since_millis)
    query = query.order_by(AgentMetricModel.unix_millis.desc(), AgentMetricModel.id.desc())
    rows = list((await session.scalars(query.limit(limit))).all())
    rows.reverse()
    return rows


async def latest_metrics(
    session: AsyncSession, agent_ids: Sequence[str] | None = None
) -> dict[str, AgentMetricModel]:
    """The newest sample of each registered agent (all of them, or those in `agent_ids`).

    One query: an index lookup per agent on (agent_id, unix_millis), never a scan of the
    table, which holds a day of samples per agent.
    """
    sample = aliased(AgentMetricModel)
    newest = (
        select(sample.id)
        .where(sample.agent_id == AgentModel.id)
        .order_by(sample.unix_millis.desc(), sample.id.desc())
        .limit(1)
        .correlate(AgentModel)
        .scalar_subquery()
    )
    wanted = select(newest).select_from(AgentModel)
    if agent_ids is not None:
        if not agent_ids:
            return {}
        wanted = wanted.where(AgentModel.id.in_(agent_ids))
    query = select(AgentMetricModel).where(AgentMetricModel.id.in_(wanted))
    return {m.agent_id: m for m in (await session.scalars(query)).all()}


async def trim_metrics(
    session: AsyncSession, before_millis: int, *, limit: int | None = None
) -> int:
    """Delete samples taken before `before_millis` (at most `limit` of them); returns how many."""
    old = AgentMetricModel.unix_millis < before_millis
    if limit is None:
        statement = delete(AgentMetricModel).where(old)
    else:
        ids = select(AgentMetricModel.id).where(old).limit(limit).scalar_subquery()
        statement = delete(AgentMetricModel).where(AgentMetricModel.id.in_(ids))
    result = await session.execute(statement.execution_options(synchronize_session=False))
    deleted: int = getattr(result, "rowcount", 0) or 0
    return deleted


class MetricsLoop(Loop):
    """Writes the buffer every `interval` seconds and trims old samples every TRIM_EVERY_S.

    Each write and each trim chunk runs in a session of its own, so a slow trim never holds
    back heartbeats' rows, and SQLite's write lock is held briefly.
    """

    name = "metrics"
    TRIM_EVERY_S = 60.0
    TRIM_CHUNK = 50_000

    def __init__(
        self,
        factory: async_sessionmaker[AsyncSession],
        buffer: MetricsBuffer,
        settings: MasterSettings,
        interval: float = 1.0,
    ) -> None:
        super().__init__(interval)
        self.factory = factory
        self.buffer = buffer
        self.settings = settings
        self._last_trim: float | None = None

    async def run_once(self) -> None:
        await self.write_pending()
        now = time.monotonic()
        if self._last_trim is None or now - self._last_trim >= self.TRIM_EVERY_S:
            self._last_trim = now
            await self.trim()

    async def write_pending(self) -> int:
        batch = self.buffer.take()
        try:
            async with session_scope(self.factory) as session:
                written = await self.buffer.write(session, batch)
        except BaseException:
            # Commit failures included: keep the readings for the next attempt (the cap
            # bounds what a long outage can pile up).
            self.buffer.restore(batch)
            raise
        if written:
            log.debug("wrote %d agent metric samples", written)
        return written

    async def trim(self) -> int:
        retention_ms = int(self.settings.agent_link.metrics_retention_s * 1000)
        before = int(time.time() * 1000) - retention_ms
        total = 0
        while True:
            async with session_scope(self.factory) as session:
                deleted = await trim_metrics(session, before, limit=self.TRIM_CHUNK)
            total += deleted
            if deleted < self.TRIM_CHUNK:
                break
        if total:
            log.info(
                "trimmed %d agent metric samples older than %.0f s", total, retention_ms / 1000
            )
        return total

    async def stop(self) -> None:
        """Stop the loop, then write what is still pending."""
        await super().stop()
        try:
            await self.write_pending()
        except Exception:
            log.exception("final write of %d agent metric samples failed", self.buffer.pending)
