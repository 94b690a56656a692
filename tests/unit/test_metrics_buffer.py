"""MetricsBuffer without a database: the cap, drop counting, take/restore, row building."""

from __future__ import annotations

import json
import logging
import math
from typing import Any, cast

import pytest
from sqlalchemy.dialects.sqlite import aiosqlite
from sqlalchemy.ext.asyncio import AsyncSession

from master.services.metrics import _COLUMNS, GpuReading, MetricReading, MetricsBuffer


def reading(millis: int, cpu: float = 10.0, gpus: int = 0) -> MetricReading:
    return MetricReading(
        unix_millis=millis,
        cpu_util_simple=cpu,
        memory_free=2**30,
        memory_used=2**29,
        disk_throughput_read=1.0,
        disk_throughput_write=2.0,
        disk_iops=3.0,
        net_throughput_sent=4.0,
        net_throughput_recv=5.0,
        gpus=tuple(
            GpuReading(
                index=i,
                uuid=f"GPU-{i}",
                gpu_util=50.0 + i,
                gpu_memory_used=2**20,
                gpu_free_memory=2**21,
                temperature_c=60.0,
                power_w=250.0,
            )
            for i in range(gpus)
        ),
    )


def times(buffer: MetricsBuffer) -> list[tuple[str, int]]:
    """What is pending, oldest first, without emptying the buffer."""
    batch = buffer.take()
    buffer.restore(batch)
    return [(agent_id, r.unix_millis) for agent_id, readings in batch for r in readings]


class RecordingSession:
    """Stands in for AsyncSession and its connection (SQLite's dialect): records the rows of
    each insert the buffer hands the driver, by column name with the GPUs' JSON decoded, or
    fails."""

    dialect = aiosqlite.dialect()

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.inserts: list[list[dict[str, Any]]] = []

    async def connection(self) -> RecordingSession:
        return self

    async def exec_driver_sql(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if self.fail:
            raise RuntimeError("database down")
        assert sql.startswith("INSERT INTO agent_metrics (agent_id, unix_millis, ")
        named = [dict(zip(_COLUMNS, row, strict=True)) for row in rows]
        for row in named:
            assert isinstance(row["gpus"], str), "the driver gets the GPUs as JSON text"
            row["gpus"] = json.loads(row["gpus"])
        self.inserts.append(named)


def session(recording: RecordingSession) -> AsyncSession:
    return cast(AsyncSession, recording)


def test_add_keeps_order_and_counts_pending() -> None:
    buffer = MetricsBuffer()
    buffer.add("a", [reading(1), reading(2)])
    buffer.add("b", (reading(3),))
    buffer.add("a", [])
    assert buffer.pending == 3
    assert times(buffer) == [("a", 1), ("a", 2), ("b", 3)]
    assert buffer.pending == 3 and buffer.dropped == 0


def test_add_copies_a_list_the_caller_reuses() -> None:
    buffer = MetricsBuffer()
    readings = [reading(1)]
    buffer.add("a", readings)
    readings.append(reading(2))
    readings.clear()
    assert times(buffer) == [("a", 1)]


def test_cap_drops_the_oldest_and_counts() -> None:
    buffer = MetricsBuffer(max_rows=5)
    buffer.add("a", [reading(i) for i in range(3)])
    buffer.add("b", [reading(i) for i in range(10, 14)])  # 7 > 5: drop a's 0 and 1
    assert buffer.pending == 5 and buffer.dropped == 2
    assert times(buffer) == [("a", 2), ("b", 10), ("b", 11), ("b", 12), ("b", 13)]
    buffer.add("c", [reading(i) for i in range(20, 26)])  # one chunk larger than the cap
    assert buffer.pending == 5 and buffer.dropped == 2 + 6
    assert times(buffer) == [("c", i) for i in range(21, 26)]


def test_restore_goes_in_front_and_respects_the_cap() -> None:
    buffer = MetricsBuffer(max_rows=4)
    buffer.add("a", [reading(1), reading(2), reading(3)])
    batch = buffer.take()
    assert buffer.pending == 0
    buffer.add("b", [reading(4), reading(5)])
    buffer.restore(batch)  # 5 > 4: the oldest restored reading goes
    assert times(buffer) == [("a", 2), ("a", 3), ("b", 4), ("b", 5)]
    assert buffer.dropped == 1


async def test_flush_builds_rows_once_and_empties() -> None:
    buffer = MetricsBuffer()
    buffer.add("a", [reading(1, gpus=2)])
    buffer.add("b", [reading(2)])
    recording = RecordingSession()
    assert await buffer.flush(session(recording)) == 2
    assert buffer.pending == 0
    [rows] = recording.inserts
    assert [(r["agent_id"], r["unix_millis"]) for r in rows] == [("a", 1), ("b", 2)]
    assert rows[0]["gpus"] == [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "gpu_util": 50.0 + i,
            "gpu_memory_used": 2**20,
            "gpu_free_memory": 2**21,
            "temperature_c": 60.0,
            "power_w": 250.0,
        }
        for i in range(2)
    ]
    assert rows[1]["gpus"] == [] and rows[1]["cpu_util_simple"] == 10.0
    assert await buffer.flush(session(recording)) == 0
    assert len(recording.inserts) == 1  # nothing pending: no statement at all


async def test_flush_failure_puts_the_rows_back() -> None:
    buffer = MetricsBuffer()
    buffer.add("a", [reading(1), reading(2)])
    with pytest.raises(RuntimeError, match="database down"):
        await buffer.flush(session(RecordingSession(fail=True)))
    buffer.add("a", [reading(3)])
    assert times(buffer) == [("a", 1), ("a", 2), ("a", 3)]
    recording = RecordingSession()
    assert await buffer.flush(session(recording)) == 3


async def test_values_a_column_cannot_hold_are_made_storable() -> None:
    buffer = MetricsBuffer()
    bad_gpu = GpuReading(0, "GPU-0", math.nan, 2**70, -(2**70), math.inf, -math.inf)
    buffer.add(
        "a",
        [
            MetricReading(5, math.nan, 2**64, 1, math.inf, 0.0, 0.0, 0.0, 0.0, (bad_gpu,)),
            reading(-1),  # before the epoch
            reading(10**18),  # after the year 9999
        ],
    )
    buffer.add("x" * 257, [reading(6)])  # longer than any agent id
    buffer.add("", [reading(7)])
    recording = RecordingSession()
    assert await buffer.flush(session(recording)) == 1
    [[row]] = recording.inserts
    assert row["cpu_util_simple"] == 0.0 and row["disk_throughput_read"] == 0.0
    assert row["memory_free"] == 2**63 - 1
    assert row["gpus"][0]["gpu_util"] == 0.0
    assert row["gpus"][0]["gpu_memory_used"] == 2**63 - 1
    assert row["gpus"][0]["gpu_free_memory"] == -(2**63)
    assert buffer.dropped == 4


async def test_drops_are_logged_once_per_flush(caplog: pytest.LogCaptureFixture) -> None:
    buffer = MetricsBuffer(max_rows=2)
    for i in range(5):
        buffer.add("a", [reading(i)])
    recording = RecordingSession()
    with caplog.at_level(logging.WARNING, logger="master.services.metrics"):
        await buffer.flush(session(recording))
        await buffer.flush(session(recording))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["agent metrics buffer full (2 samples): dropped the 3 oldest samples"]
    assert buffer.dropped == 3


def test_max_rows_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        MetricsBuffer(max_rows=0)
