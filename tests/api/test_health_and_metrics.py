"""Liveness, readiness and the Prometheus scrape, on SQLite and Postgres: the figures a
cluster admin graphs, read after a gang is started, a heartbeat, a fenced run and a
stale report."""

from __future__ import annotations

import errno
import re

import httpx
from fastapi import FastAPI

from master.db.session import DatabaseHealth
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_agent_link import exited, started_gang


def samples(text: str, name: str) -> dict[str, float]:
    """`name`'s samples: the label text (or "") -> value."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(\{{[^}}]*\}})? (\S+)", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


async def test_liveness_stays_green_and_readiness_follows_the_database(
    app: FastAPI, anon: httpx.AsyncClient
) -> None:
    assert (await anon.get("/health/live")).json() == {"status": "live"}
    assert (await anon.get("/health/ready")).status_code == 200
    health: DatabaseHealth = app.state.db_health
    try:
        health.failed(ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"))
        live, ready = await anon.get("/health/live"), await anon.get("/health/ready")
        assert live.status_code == 200
        assert ready.status_code == 503 and ready.headers["Retry-After"] == "2"
        assert "database is unreachable" in ready.json()["reason"]
    finally:
        health.succeeded()
    assert (await anon.get("/health/ready")).status_code == 200


async def test_the_scrape_shows_allocations_agents_slots_and_the_fence(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, _experiment_id, allocation_id = await started_gang(app, api)
    await hub.on_message(
        a,
        pb.AgentMessage(
            heartbeat=pb.Heartbeat(
                seq=1,
                last_round_trip_micros=1500,
                samples=[
                    pb.MetricSample(
                        unix_millis=1,
                        cpu_util_simple=12.5,
                        gpus=[pb.GpuSample(index=0, uuid="GPU-a", gpu_util=87.0)],
                    )
                ],
            )
        ),
    )
    reply = await api.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = reply.text
    assert samples(text, "resolute_allocations") == {'{pool="default",state="RUNNING"}': 1}
    assert samples(text, "resolute_slots") == {
        '{pool="default",state="free"}': 0,
        '{pool="default",state="used"}': 2,
    }
    assert samples(text, "resolute_agents") == {'{pool="default",state="connected"}': 2}
    assert samples(text, "resolute_agent_heartbeat_round_trip_seconds") == {
        '{agent="agent-a"}': 0.0015
    }
    assert samples(text, "resolute_heartbeat_round_trip_seconds_count") == {"": 1}
    assert samples(text, "resolute_gpu_utilization_percent") == {
        '{agent="agent-a",gpu="0",uuid="GPU-a"}': 87
    }
    assert samples(text, "resolute_database_up") == {"": 1}
    fenced_before = samples(text, "resolute_fenced_runs_total")[""]

    await hub.on_message(b, exited(allocation_id, pb.EXIT_KIND_FENCED, "fenced"))
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_STOPPED, "stopped"))
    text = (await api.get("/metrics")).text
    assert samples(text, "resolute_fenced_runs_total") == {"": fenced_before + 1}
    # The trial waits again; agent-b is out until it reconnects.
    assert samples(text, "resolute_allocations") == {'{pool="default",state="PENDING"}': 1}
    assert samples(text, "resolute_agents") == {
        '{pool="default",state="connected"}': 1,
        '{pool="default",state="disconnected"}': 1,
    }
    assert "# TYPE resolute_scheduler_pass_seconds histogram" in text
