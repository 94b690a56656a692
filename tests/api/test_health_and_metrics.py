"""Liveness, readiness and the Prometheus scrape, on SQLite and Postgres: the figures a
cluster admin graphs, read after a gang is started, a heartbeat, a fenced run and a
stale report; workspaces' quotas and the slots they hold and borrow, and the scrape
through a database outage that starts while it reads them."""

from __future__ import annotations

import errno
import re
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import event

from master.db.session import DatabaseHealth
from master.settings import ResourcePoolSettings, WorkspaceQuotaSettings
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_access import PASSWORD, create_user, sign_in
from tests.api.test_agent_link import exited, started_gang
from tests.api.test_workspaces import workspaces_of


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


QUOTA_GAUGES = (
    "resolute_workspace_quota_nominal_slots",
    "resolute_workspace_held_slots",
    "resolute_workspace_borrowed_slots",
)


async def test_the_scrape_shows_each_workspaces_quota_held_and_borrowed_slots(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    # The gang (2 slots, Uncategorized) runs; "vision" has the config's quota in "default"
    # and holds nothing; Uncategorized gets 1 slot through the API, so it borrows 1.
    settings = app.state.settings
    vision_quota = WorkspaceQuotaSettings(workspace="vision", nominal_slots=2, lending_limit=0)
    app.state.settings = settings.model_copy(
        update={
            "resource_pools": [ResourcePoolSettings(pool_name="default", quotas=[vision_quota])]
        }
    )
    try:
        await started_gang(app, api)
        assert (await api.post("/api/v1/workspaces", json={"name": "vision"})).status_code == 200
        [home] = [w["id"] for w in await workspaces_of(api) if w["name"] == "Uncategorized"]
        reply = await admin.put(
            f"/api/v1/workspaces/{home}/quotas/default", json={"nominalSlots": 1}
        )
        assert reply.status_code == 200, reply.text
        text = (await api.get("/metrics")).text
        # A user without a role in vision is not told that it exists, nor its quota.
        await create_user(admin, "carol")
        async with sign_in(app, "carol", PASSWORD) as carol:
            carols = (await carol.get("/metrics")).text
    finally:
        app.state.settings = settings
    assert 'workspace="Uncategorized"' in carols
    assert "vision" not in carols
    uncategorized, vision = (
        f'{{pool="default",workspace="{name}"}}' for name in ("Uncategorized", "vision")
    )
    assert samples(text, "resolute_workspace_quota_nominal_slots") == {uncategorized: 1, vision: 2}
    assert samples(text, "resolute_workspace_held_slots") == {uncategorized: 2, vision: 0}
    assert samples(text, "resolute_workspace_borrowed_slots") == {uncategorized: 1, vision: 0}
    for name in QUOTA_GAUGES:
        assert f"# TYPE {name} gauge" in text

    # Without its quota, all Uncategorized holds is borrowed (the scheduler may reclaim it);
    # "vision" holds nothing and has no quota any more: not listed.
    assert (await admin.delete(f"/api/v1/workspaces/{home}/quotas/default")).status_code == 200
    text = (await api.get("/metrics")).text
    assert samples(text, "resolute_workspace_quota_nominal_slots") == {}
    assert samples(text, "resolute_workspace_held_slots") == {uncategorized: 2}
    assert samples(text, "resolute_workspace_borrowed_slots") == {uncategorized: 2}


async def test_an_outage_while_reading_quotas_is_a_scrape_without_the_databases_gauges(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    """As for every gauge read from the database: a 200 that says resolute_database_up 0,
    never an error, when the database goes away mid-scrape (here, at the quotas' read)."""
    engine = app.state.engine.sync_engine
    health: DatabaseHealth = app.state.db_health

    def refuse(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "workspace_quotas" in statement:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")

    event.listen(engine, "before_cursor_execute", refuse)
    try:
        reply = await api.get("/metrics")
    finally:
        event.remove(engine, "before_cursor_execute", refuse)
        health.succeeded()
    assert reply.status_code == 200, reply.text
    assert samples(reply.text, "resolute_database_up") == {"": 0}
    for name in (*QUOTA_GAUGES, "resolute_allocations", "resolute_slots"):
        assert f"# TYPE {name} " not in reply.text
    assert "# TYPE resolute_scheduler_pass_seconds histogram" in reply.text
