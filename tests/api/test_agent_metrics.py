"""Agent system metrics through the master, on SQLite and Postgres.

Samples go in the way heartbeats put them: `MetricsBuffer.add`, then a flush in a session
of its own (what MetricsLoop does each second); the API serves them back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event, func, select

from master.db.models import AgentMetricModel
from master.db.session import session_scope
from master.services import agents as agent_service
from master.services import metrics as metric_service
from master.services.metrics import GpuReading, MetricReading, MetricsBuffer, MetricsLoop

BASE = 1_763_700_000_000  # 2025-11-21T04:40:00Z


def gpu(index: int, util: float) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-{index:04d}",
        gpu_util=util,
        gpu_memory_used=(index + 1) * 2**30,
        gpu_free_memory=80 * 2**30,
        temperature_c=55.5,
        power_w=300.25,
    )


def reading(millis: int, cpu: float = 12.5, gpus: Sequence[GpuReading] = ()) -> MetricReading:
    return MetricReading(
        unix_millis=millis,
        cpu_util_simple=cpu,
        memory_free=64 * 2**30,
        memory_used=16 * 2**30,
        disk_throughput_read=1000.0,
        disk_throughput_write=2000.0,
        disk_iops=30.0,
        net_throughput_sent=4000.0,
        net_throughput_recv=5000.0,
        gpus=tuple(gpus),
    )


async def register(app: FastAPI, agent_id: str, gpus: int = 0) -> None:
    devices = tuple(
        agent_service.Device(slot_id=i, type="cuda" if gpus else "cpu") for i in range(max(gpus, 1))
    )
    registration = agent_service.AgentRegistration(
        id=agent_id, resource_pool="default", devices=devices
    )
    async with session_scope(app.state.session_factory) as session:
        await agent_service.register_agent(session, app.state.settings, registration)


async def store(
    app: FastAPI,
    agent_id: str,
    readings: Sequence[MetricReading],
    buffer: MetricsBuffer | None = None,
) -> int:
    buffer = buffer or MetricsBuffer()
    buffer.add(agent_id, readings)
    async with session_scope(app.state.session_factory) as session:
        return await buffer.flush(session)


async def samples(api: httpx.AsyncClient, agent_id: str, **params: Any) -> list[dict[str, Any]]:
    reply = await api.get(f"/api/v1/agents/{agent_id}/metrics", params=params)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    assert body["agentId"] == agent_id
    found: list[dict[str, Any]] = body["samples"]
    return found


async def stored_millis(app: FastAPI) -> list[int]:
    async with session_scope(app.state.session_factory) as session:
        return list(
            (
                await session.scalars(
                    select(AgentMetricModel.unix_millis).order_by(AgentMetricModel.unix_millis)
                )
            ).all()
        )


@contextmanager
def counting_statements(app: FastAPI) -> Iterator[list[str]]:
    seen: list[str] = []

    def before(*args: Any) -> None:
        seen.append(args[2])

    engine = app.state.engine.sync_engine
    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


async def test_samples_are_stored_and_served_oldest_first(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "gpu-node", gpus=2)
    buffer = MetricsBuffer()
    # Two heartbeats, the later one first: the order served is by sample time.
    buffer.add("gpu-node", [reading(BASE + 3000, gpus=[gpu(0, 90.0), gpu(1, 70.0)])])
    buffer.add("gpu-node", [reading(BASE + 1000), reading(BASE + 2000, cpu=50.0)])
    assert buffer.pending == 3
    async with session_scope(app.state.session_factory) as session:
        assert await buffer.flush(session) == 3
    assert buffer.pending == 0 and buffer.dropped == 0

    found = await samples(api, "gpu-node")
    assert [s["unixMillis"] for s in found] == [BASE + 1000, BASE + 2000, BASE + 3000]
    assert found[0] == {
        "timestamp": "2025-11-21T04:40:01.000Z",
        "unixMillis": BASE + 1000,
        "cpu_util_simple": 12.5,
        "memory_free": 64 * 2**30,
        "memory_used": 16 * 2**30,
        "disk_throughput_read": 1000.0,
        "disk_throughput_write": 2000.0,
        "disk_iops": 30.0,
        "net_throughput_sent": 4000.0,
        "net_throughput_recv": 5000.0,
        "gpus": [],
    }
    assert found[1]["cpu_util_simple"] == 50.0
    assert found[2]["gpus"] == [
        {
            "index": 0,
            "uuid": "GPU-0000",
            "gpu_util": 90.0,
            "gpu_memory_used": 2**30,
            "gpu_free_memory": 80 * 2**30,
            "temperature_c": 55.5,
            "power_w": 300.25,
        },
        {
            "index": 1,
            "uuid": "GPU-0001",
            "gpu_util": 70.0,
            "gpu_memory_used": 2 * 2**30,
            "gpu_free_memory": 80 * 2**30,
            "temperature_c": 55.5,
            "power_w": 300.25,
        },
    ]


async def test_samples_of_one_agent_only(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "a")
    await register(app, "b")
    await store(app, "a", [reading(BASE)])
    await store(app, "b", [reading(BASE + 1), reading(BASE + 2)])
    assert [s["unixMillis"] for s in await samples(api, "a")] == [BASE]
    assert len(await samples(api, "b")) == 2


async def test_since_and_limit(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "node")
    await store(app, "node", [reading(BASE + i * 1000) for i in range(10)])

    def millis(found: list[dict[str, Any]]) -> list[int]:
        return [(s["unixMillis"] - BASE) // 1000 for s in found]

    assert millis(await samples(api, "node")) == list(range(10))
    # limit keeps the newest, still oldest first.
    assert millis(await samples(api, "node", limit=3)) == [7, 8, 9]
    assert millis(await samples(api, "node", limit=10_000)) == list(range(10))
    # since is inclusive, in unix millis or RFC 3339 (any offset; UTC without one).
    assert millis(await samples(api, "node", since=BASE + 6000)) == [6, 7, 8, 9]
    assert millis(await samples(api, "node", since=BASE + 6001)) == [7, 8, 9]
    for text in (
        "2025-11-21T04:40:06Z",
        "2025-11-21T04:40:06.000+00:00",
        "2025-11-21T05:40:06+01:00",
        "2025-11-21T04:40:06",
    ):
        assert millis(await samples(api, "node", since=text)) == [6, 7, 8, 9], text
    assert millis(await samples(api, "node", since=BASE + 2000, limit=2)) == [8, 9]
    assert await samples(api, "node", since=BASE + 60_000) == []
    assert millis(await samples(api, "node", since="1970-01-01T00:00:00Z", limit=1)) == [9]


async def test_utilization_in_the_agent_listing(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "gpu-node", gpus=2)
    await register(app, "cpu-node")
    await register(app, "quiet-node")
    await store(
        app,
        "gpu-node",
        [
            reading(BASE, cpu=1.0, gpus=[gpu(0, 10.0), gpu(1, 20.0)]),
            reading(BASE + 2000, cpu=40.0, gpus=[gpu(0, 80.0), gpu(1, 60.0)]),
            reading(BASE + 1000, cpu=2.0, gpus=[gpu(0, 30.0), gpu(1, 40.0)]),
        ],
    )
    await store(app, "cpu-node", [reading(BASE + 5000, cpu=7.5)])

    reply = await api.get("/api/v1/agents")
    assert reply.status_code == 200, reply.text
    listed = {a["id"]: a for a in reply.json()["agents"]}
    assert listed["gpu-node"]["utilization"] == {
        "cpu_util_simple": 40.0,
        "memory_free": 64 * 2**30,
        "memory_used": 16 * 2**30,
        "gpu_util": 70.0,
        "timestamp": "2025-11-21T04:40:02.000Z",
    }
    assert listed["cpu-node"]["utilization"]["gpu_util"] is None
    assert listed["cpu-node"]["utilization"]["cpu_util_simple"] == 7.5
    assert listed["quiet-node"]["utilization"] is None

    one = await api.get("/api/v1/agents/gpu-node")
    assert one.status_code == 200, one.text
    assert one.json()["agent"]["utilization"] == listed["gpu-node"]["utilization"]
    quiet = await api.get("/api/v1/agents/quiet-node")
    assert quiet.json()["agent"]["utilization"] is None


async def test_latest_metrics_is_one_query(app: FastAPI, api: httpx.AsyncClient) -> None:
    for i in range(5):
        await register(app, f"n{i}")
        await store(app, f"n{i}", [reading(BASE + j * 1000 + i) for j in range(4)])
    await store(app, "n0", [reading(BASE + 3000 + 0)])  # a duplicate time: either is newest
    async with session_scope(app.state.session_factory) as session:
        with counting_statements(app) as seen:
            latest = await metric_service.latest_metrics(session)
        assert len(seen) == 1, seen
        assert {k: v.unix_millis for k, v in latest.items()} == {
            f"n{i}": BASE + 3000 + i for i in range(5)
        }
        some = await metric_service.latest_metrics(session, ["n1", "n3", "unknown"])
        assert sorted(some) == ["n1", "n3"]
        assert await metric_service.latest_metrics(session, []) == {}


async def test_trim_deletes_only_old_samples(app: FastAPI, api: httpx.AsyncClient) -> None:
    await register(app, "node")
    await store(app, "node", [reading(BASE + i) for i in range(6)])
    async with session_scope(app.state.session_factory) as session:
        assert await metric_service.trim_metrics(session, BASE + 2) == 2
    assert await stored_millis(app) == [BASE + i for i in range(2, 6)]
    async with session_scope(app.state.session_factory) as session:
        assert await metric_service.trim_metrics(session, BASE + 5, limit=2) == 2
        assert await metric_service.trim_metrics(session, BASE + 5, limit=2) == 1
        assert await metric_service.trim_metrics(session, BASE + 5, limit=2) == 0
    assert await stored_millis(app) == [BASE + 5]


async def test_loop_writes_trims_by_retention_and_flushes_on_stop(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    await register(app, "node")
    now = int(time.time() * 1000)
    retention_ms = int(app.state.settings.agent_link.metrics_retention_s * 1000)
    old, recent = now - retention_ms - 60_000, now - 60_000
    buffer = MetricsBuffer()
    loop = MetricsLoop(app.state.session_factory, buffer, app.state.settings)
    loop.TRIM_CHUNK = 2  # several chunks, each in its own session
    buffer.add("node", [reading(old + i) for i in range(5)] + [reading(recent)])
    await loop.run_once()  # writes, then trims (the first pass always trims)
    assert buffer.pending == 0
    assert await stored_millis(app) == [recent]

    buffer.add("node", [reading(old), reading(now)])
    await loop.run_once()  # written; the next trim is a minute away
    assert await stored_millis(app) == [old, recent, now]
    assert await loop.trim() == 1

    buffer.add("node", [reading(now + 1)])
    await loop.stop()  # never started: still writes what is pending
    assert buffer.pending == 0
    assert await stored_millis(app) == [recent, now, now + 1]


async def test_buffer_cap_drops_the_oldest(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "node")
    buffer = MetricsBuffer(max_rows=3)
    buffer.add("node", [reading(BASE + i) for i in range(2)])
    buffer.add("node", [reading(BASE + i) for i in range(2, 5)])
    assert buffer.pending == 3 and buffer.dropped == 2
    async with session_scope(app.state.session_factory) as session:
        assert await buffer.flush(session) == 3
    assert [s["unixMillis"] - BASE for s in await samples(api, "node")] == [2, 3, 4]


async def test_values_out_of_range_never_break_a_batch(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    await register(app, "node")
    nan = float("nan")
    strange = MetricReading(BASE, nan, 2**64 - 1, 0, float("inf"), 0.0, 0.0, 0.0, 0.0)
    assert await store(app, "node", [strange, reading(BASE + 1), reading(-5)]) == 2
    found = await samples(api, "node")
    assert [s["unixMillis"] for s in found] == [BASE, BASE + 1]
    assert found[0]["cpu_util_simple"] == 0.0 and found[0]["memory_free"] == 2**63 - 1


async def test_unknown_agent_is_404(api: httpx.AsyncClient) -> None:
    reply = await api.get("/api/v1/agents/nobody/metrics")
    assert reply.status_code == 404, reply.text
    assert reply.json()["message"] == "agent nobody not found"


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": 2**70}, "limit"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2025-13-01T00:00:00Z"}, "since"),
        ({"since": "-5"}, "since"),
        ({"since": "1" * 40}, "since"),
        ({"since": "99999999999999999999"}, "since"),
        ({"since": "\u00b2"}, "since"),  # a digit to str.isdigit, not to int()
        ({"since": "1.5"}, "since"),
    ],
)
async def test_bad_parameters_are_400(
    api: httpx.AsyncClient, app: FastAPI, params: dict[str, Any], named: str
) -> None:
    await register(app, "node")
    reply = await api.get("/api/v1/agents/node/metrics", params=params)
    assert reply.status_code == 400, reply.text
    body = reply.json()
    assert body["code"] == 3 and named in body["message"], body


async def test_metrics_need_a_login(anon: httpx.AsyncClient) -> None:
    reply = await anon.get("/api/v1/agents/node/metrics")
    assert reply.status_code == 401, reply.text


async def test_rows_stored_match_what_was_added(api: httpx.AsyncClient, app: FastAPI) -> None:
    await register(app, "node", gpus=8)
    gpus = [gpu(i, float(i)) for i in range(8)]
    assert await store(app, "node", [reading(BASE + i, gpus=gpus) for i in range(50)]) == 50
    async with session_scope(app.state.session_factory) as session:
        count = await session.scalar(select(func.count()).select_from(AgentMetricModel))
    assert count == 50
    found = await samples(api, "node", limit=1)
    assert [g["index"] for g in found[0]["gpus"]] == list(range(8))
