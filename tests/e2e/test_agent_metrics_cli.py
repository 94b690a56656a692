"""`det agent list` utilisation and `det agent metrics` against a real master.

Simulated agents register through the agent service (tests/simulated.py) and their samples
go into the master's database through `MetricsBuffer`, what the heartbeat handler feeds.
The module runs its own master per backend: registered agents would otherwise take the
queued trials other modules leave on the shared one.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cli.cluster import AGENT_HEADERS, METRIC_HEADERS
from master.db.session import create_engine, create_session_factory, session_scope
from master.services.metrics import GpuReading, MetricReading, MetricsBuffer
from master.settings import async_database_url
from tests.conftest import require
from tests.e2e.conftest import (
    BACKENDS,
    MasterProcess,
    describe_run,
    lines,
    official_client_path,
    ok,
    running_master,
    unique,
)
from tests.e2e.test_cluster_cli import presto_table, rich_table
from tests.simulated import register_simulated_agents_sync

pytestmark = pytest.mark.e2e

GIB = 2**30


def write_samples(master: MasterProcess, agent_id: str, readings: Sequence[MetricReading]) -> None:
    """Store samples in the master's database as its heartbeat path would."""

    async def run() -> None:
        engine = create_engine(async_database_url(master.db_url, master.data_dir))
        try:
            buffer = MetricsBuffer()
            buffer.add(agent_id, readings)
            async with session_scope(create_session_factory(engine)) as session:
                assert await buffer.flush(session) == len(readings)
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, run()).result()


def reading(millis: int, cpu: float, gpu_utils: Sequence[float] = ()) -> MetricReading:
    return MetricReading(
        unix_millis=millis,
        cpu_util_simple=cpu,
        memory_free=48 * GIB,
        memory_used=16 * GIB,
        disk_throughput_read=2 * 2**20,
        disk_throughput_write=512.0,
        disk_iops=12.0,
        net_throughput_sent=3 * 2**10,
        net_throughput_recv=0.0,
        gpus=tuple(
            GpuReading(i, f"GPU-{i}", util, 4 * GIB, 76 * GIB, 60.0, 250.0)
            for i, util in enumerate(gpu_utils)
        ),
    )


class Scene:
    def __init__(self, master: MasterProcess) -> None:
        self.master = master
        self.gpu_agent = unique("gpu-agent")
        self.cpu_agent = unique("cpu-agent")
        self.quiet_agent = unique("quiet-agent")
        # Recent times: the master's own loop trims samples older than a day.
        self.start = (int(time.time()) - 60) * 1000


@pytest.fixture(scope="module", params=BACKENDS)
def scene(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scene]:
    with running_master(request, tmp_path_factory, "metrics") as master:
        s = Scene(master)
        register_simulated_agents_sync(
            master.db_url, [(s.gpu_agent, 2)], device_type="cuda", data_dir=master.data_dir
        )
        register_simulated_agents_sync(
            master.db_url, [(s.cpu_agent, 1), (s.quiet_agent, 1)], data_dir=master.data_dir
        )
        write_samples(
            master,
            s.gpu_agent,
            [reading(s.start + i * 1000, 10.0 * (i + 1), (20.0 * i, 40.0)) for i in range(5)],
        )
        write_samples(master, s.cpu_agent, [reading(s.start, 7.25)])
        yield s


def parse_json(args: Sequence[str], master: MasterProcess) -> Any:
    result = ok(master.det(*args))
    assert "Traceback" not in result.stderr, describe_run(result)
    return json.loads(result.stdout)


def test_agent_list_shows_utilisation(scene: Scene) -> None:
    master = scene.master
    listed = {a["id"]: a for a in parse_json(("agent", "list", "--json"), master)}
    assert listed[scene.gpu_agent]["utilization"] == {
        "cpu_util_simple": 50.0,
        "memory_free": 48 * GIB,
        "memory_used": 16 * GIB,
        "gpu_util": 60.0,  # the newest sample: (80 + 40) / 2
        "timestamp": listed[scene.gpu_agent]["utilization"]["timestamp"],
    }
    assert listed[scene.cpu_agent]["utilization"]["gpu_util"] is None
    assert listed[scene.quiet_agent]["utilization"] is None

    table = ok(master.det("agent", "list"))
    rows = {r["Agent ID"]: r for r in rich_table(table.stdout, AGENT_HEADERS)}
    shown = {
        agent: (rows[agent]["CPU %"], rows[agent]["Mem free"], rows[agent]["GPU %"])
        for agent in (scene.gpu_agent, scene.cpu_agent, scene.quiet_agent)
    }
    assert shown == {
        scene.gpu_agent: ("50.0", "48.0 GiB", "60.0"),
        scene.cpu_agent: ("7.2", "48.0 GiB", ""),
        scene.quiet_agent: ("", "", ""),
    }, table.stdout

    as_csv = list(csv.DictReader(io.StringIO(ok(master.det("agent", "list", "--csv")).stdout)))
    assert list(as_csv[0]) == AGENT_HEADERS
    by_id = {r["Agent ID"]: r for r in as_csv}
    assert by_id[scene.gpu_agent]["GPU %"] == "60.0" and by_id[scene.quiet_agent]["CPU %"] == ""


def test_agent_metrics_table_and_json(scene: Scene) -> None:
    master = scene.master
    table = ok(master.det("agent", "metrics", scene.gpu_agent))
    rows = rich_table(table.stdout, METRIC_HEADERS)
    assert [r["CPU %"] for r in rows] == ["10.0", "20.0", "30.0", "40.0", "50.0"], table.stdout
    assert [r["GPU %"] for r in rows] == ["20.0", "30.0", "40.0", "50.0", "60.0"]
    first = rows[0]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(scene.start / 1000))
    assert first["Time"] == started, table.stdout
    assert (first["Mem used"], first["Mem free"]) == ("16.0 GiB", "48.0 GiB")
    assert (first["Disk read/s"], first["Disk write/s"], first["Disk IOPS"]) == (
        "2.0 MiB/s",
        "512 B/s",
        "12.0",
    )
    assert (first["Net sent/s"], first["Net recv/s"]) == ("3.0 KiB/s", "0 B/s")
    assert first["GPU mem used"] == "8.0 GiB"

    newest = parse_json(("agent", "metrics", scene.gpu_agent, "--limit", "2", "--json"), master)
    assert [s["unixMillis"] for s in newest] == [scene.start + 3000, scene.start + 4000]
    assert [g["gpu_util"] for g in newest[1]["gpus"]] == [80.0, 40.0]
    assert newest[1]["timestamp"].endswith("Z")

    since = parse_json(
        ("agent", "metrics", scene.gpu_agent, "--since", str(scene.start + 2000), "--json"),
        master,
    )
    assert [s["cpu_util_simple"] for s in since] == [30.0, 40.0, 50.0]
    quiet = ok(master.det("agent", "metrics", scene.quiet_agent, "--csv"))
    assert lines(quiet.stdout) == [",".join(METRIC_HEADERS)], describe_run(quiet)


def test_agent_metrics_errors(scene: Scene) -> None:
    master = scene.master
    for args, message in (
        (("agent", "metrics", "no-such-agent"), "Error: agent no-such-agent not found"),
        (
            ("agent", "metrics", scene.gpu_agent, "--since", "yesterday"),
            "Error: since: expected an RFC 3339 time or unix milliseconds, got 'yesterday'",
        ),
        (
            ("agent", "metrics", scene.gpu_agent, "--json", "--csv"),
            "Error: --json and --csv cannot be used together",
        ),
    ):
        result = master.det(*args)
        assert result.returncode == 1, describe_run(result)
        assert result.stdout == "" and lines(result.stderr) == [message], describe_run(result)
    refused = master.det("agent", "metrics", scene.gpu_agent, "--limit", "0")
    assert refused.returncode != 0 and refused.stdout == "", describe_run(refused)


@pytest.mark.official_client
def test_official_client_ignores_utilisation(scene: Scene) -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )
    master = scene.master
    listed = ok(master.official("agent", "list"))
    assert "Traceback" not in listed.stderr + listed.stdout, describe_run(listed)
    rows = {r["Agent ID"]: r for r in presto_table(listed.stdout, "Agent ID")}
    assert {scene.gpu_agent, scene.cpu_agent, scene.quiet_agent} <= set(rows), listed.stdout
    agents = json.loads(ok(master.official("agent", "list", "--json")).stdout)
    assert {a["id"] for a in agents} >= {scene.gpu_agent, scene.quiet_agent}
    assert all("utilization" not in a for a in agents)  # the official client shows its fields
