"""End-to-end scheduling benchmark (issue 16): gangs from REST submit to running ranks and
back, on real processes, beside Ray's placement groups on the same cluster shape.

    .venv/bin/python -m benchmarks.bench_gangs [--quick | --smoke] [--rounds N]
        [--clients N] [--postgres DSN] [--no-ray] [--out PATH]

Prints one JSON document on stdout (progress on stderr): the machine, the parameters, the
figures per scenario, the ratios ours / Ray and the issue's targets.

Our cluster: a `det-master` on a fresh PostgreSQL database (created on the server behind
--postgres, fsync must be on; dropped at the end) and 8 `det-agent --artificial-slots 8`
(`--quick`, `--smoke`: 2 x 2), each with its own id and work dir, on free ports. Experiments are
submitted over REST (POST /api/v1/experiments, `activate: true`, searcher `single`,
`max_restarts: 0`) with a model definition holding `rank.py`, the entrypoint
`python3 -S rank.py DIR`: each rank writes time.time_ns() at its start, its RANK and
DET_ALLOCATION_ID to a file of its own in DIR, then sleeps until killed (`-S`: no site
import, so the interpreter starts in a few ms and no user imports count).

Four scenarios. In the issue's three, every round fills the cluster with gangs submitted
back to back on one kept-alive connection, waits for every rank, then kills every gang back
to back (POST /api/v1/experiments/{id}/kill) and waits for every slot to be free. With
`--clients N` the submits are pipelined, as Ray's driver pipelines placement-group creation:
N clients, each on its own connection, post their shares of the round (client i: gangs i,
i+N, ...) in order, all at once; the kills likewise:
- one_agent_gangs: gangs of one agent's slots (8), one per agent (8 per round);
- two_agent_gangs: gangs of two agents' slots (16), so each spans two agents (4 per round);
- single_slot_trials: 1-slot trials (64 per round).
The fourth, lone_gang_idle_cluster, is one 8-slot gang per round on an otherwise idle
cluster (5x the rounds): the path's own latency, with no queue ahead of the gang and no
other ranks starting beside its own.

When the slots are committed: the API shows no time of assignment, and polling it would
load the master being measured, so the benchmark adds two triggers to its own database
(AFTER INSERT / DELETE ON allocation_slots, FOR EACH ROW: pg_notify) and LISTENs on a
connection of its own in a thread. PostgreSQL delivers a notification when its transaction
commits, so the moment it arrives is when the slots were committed (held) or released
(freed), at sub-millisecond resolution. Figures per gang, against time.time_ns() taken just
before each POST: POST -> slots committed, POST -> every rank started (the rank files) and
kill POST -> its slots freed; per round: gangs / (last gang's slots committed - first POST),
and first kill -> every slot free (confirmed by GET /api/v1/agents). The CPU seconds of the
master and the agents (psutil; the ranks are not counted) over each scenario's rounds; each
cluster's memory and idle CPU (5 s beside the other, before the rounds).

Ray (when `import ray` works, `pip install ray==2.60.0`, the `bench` dependency group): a
`ray.cluster_utils.Cluster` of the same shape in the same run (8 nodes, num_cpus=0,
resources {"slot": 8}); per round the same number of placement groups created back to back,
each followed by pg.ready(): 8-slot and 1-slot gangs are bundles of {"slot": 1}, STRICT_PACK;
the 16-slot gang is 2 bundles of {"slot": 8}, STRICT_SPREAD, so it takes two whole nodes as
ours takes two whole agents. Figures: gangs/s, create -> ready (ray.wait as each resolves),
and first remove_placement_group -> every slot back in ray.available_resources(). Rounds
alternate which system goes first, after one unmeasured warm-up round each (full run).

`--smoke` is the smallest shape that still runs every path (tests/test_benchmark_smoke.py):
2 agents x 2 slots, one round of each scenario (the lone gang's too), a random search of 8
trials (more than the slots), 0.2 s of idle; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import importlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import yaml

from benchmarks import common
from benchmarks.common import host_facts, progress, seconds_since_start
from harness.cluster import AgentProcess, MasterProcess, wait_until
from harness.figures import ms_summary, ratio

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
CHANNEL = "bench_gangs"
START_TIMEOUT_S = 60.0
ROUND_TIMEOUT_S = 180.0
RANK_POLL_S = 0.01  # the ranks stamp themselves: this only ends the wait
TARGETS = {
    "gangs_per_s_over_ray_min": 2.0,
    "post_to_slots_committed_p50_ms_max": 10.0,
    "post_to_every_rank_started_p50_ms_max_8_rank_gang": 60.0,
    "kill_to_slots_free_p50_ms_max": 50.0,
    "search_fills_free_slots_ms_max": 200.0,
}

# Each rank stamps its start first thing, then waits for the kill. The file appears whole
# (written aside, then renamed), so a reader never sees half a line.
RANK_SCRIPT = b"""\
import os, sys, time
started = time.time_ns()
name = "%s.%s.%s" % (os.environ["DET_EXPERIMENT_ID"], os.environ["DET_TRIAL_ID"],
                     os.environ.get("RANK", "0"))
aside = os.path.join(sys.argv[1], "." + name)
with open(aside, "w") as out:
    out.write("%d %s %s\\n" % (started, os.environ.get("RANK", "0"),
                               os.environ.get("DET_ALLOCATION_ID", "")))
os.rename(aside, os.path.join(sys.argv[1], name))
while True:
    time.sleep(3600)
"""

# Instruments in the benchmark's own database: a notification per (allocation, agent) when
# its slot rows are inserted (the grant) or deleted (the release); identical payloads in one
# transaction are delivered once, at its commit.
TRIGGERS = f"""
CREATE FUNCTION bench_gangs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    PERFORM pg_notify('{CHANNEL}', 'held ' || NEW.allocation_id || ' ' || NEW.agent_id);
    RETURN NEW;
  END IF;
  PERFORM pg_notify('{CHANNEL}', 'freed ' || OLD.allocation_id || ' ' || OLD.agent_id);
  RETURN OLD;
END $$;
CREATE TRIGGER bench_gangs_held AFTER INSERT ON allocation_slots
  FOR EACH ROW EXECUTE FUNCTION bench_gangs_notify();
CREATE TRIGGER bench_gangs_freed AFTER DELETE ON allocation_slots
  FOR EACH ROW EXECUTE FUNCTION bench_gangs_notify();
"""


@dataclass(frozen=True)
class Params:
    agents: int
    slots_per_agent: int
    rounds: int  # measured, per scenario and system
    warmup_rounds: int  # unmeasured, per scenario and system, before the measured ones
    lone_gang_rounds_factor: int  # the lone gang's measured rounds: this many times `rounds`
    search_trials: int  # one-slot trials of the random search (the issue's: 1,000)
    idle_s: float  # each cluster's idle CPU is measured over this long


FULL = Params(
    agents=8,
    slots_per_agent=8,
    rounds=3,
    warmup_rounds=1,
    lone_gang_rounds_factor=5,
    search_trials=1000,
    idle_s=5.0,
)
QUICK = Params(
    agents=2,
    slots_per_agent=2,
    rounds=1,
    warmup_rounds=0,
    lone_gang_rounds_factor=5,
    search_trials=1000,
    idle_s=1.0,
)
# The least that runs every path: each scenario once, a search with more trials than slots.
SMOKE = Params(
    agents=2,
    slots_per_agent=2,
    rounds=1,
    warmup_rounds=0,
    lone_gang_rounds_factor=1,
    search_trials=8,
    idle_s=0.2,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    gang_slots: int
    gangs_per_round: int
    agents_per_gang: int
    # Measured rounds: this many times the run's --rounds (a lone gang's round is short).
    rounds_factor: int = 1

    def ray_bundles(self, slots_per_agent: int) -> tuple[list[dict[str, float]], str]:
        if self.agents_per_gang > 1:  # whole nodes, one bundle each, on different nodes
            return [{"slot": float(slots_per_agent)}] * self.agents_per_gang, "STRICT_SPREAD"
        return [{"slot": 1.0}] * self.gang_slots, "STRICT_PACK"


def scenarios_of(params: Params) -> list[Scenario]:
    per_agent, total = params.slots_per_agent, params.agents * params.slots_per_agent
    return [
        Scenario("one_agent_gangs", per_agent, total // per_agent, 1),
        Scenario("two_agent_gangs", 2 * per_agent, total // (2 * per_agent), 2),
        Scenario("single_slot_trials", 1, total, 1),
        # One gang at a time on an idle cluster: the path's own latency, with nothing
        # queued before it and no other ranks starting beside it.
        Scenario(
            "lone_gang_idle_cluster", per_agent, 1, 1, rounds_factor=params.lone_gang_rounds_factor
        ),
    ]


def median_of(rounds: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def cpu_seconds(processes: Sequence[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


# --- the database and its notifications ----------------------------------------------------


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.contextmanager
def fresh_database(admin_dsn: str) -> Iterator[str]:
    name = f"resolute_bench_gangs_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    asyncio.run(_execute(admin_dsn, f'CREATE DATABASE "{name}"'))
    try:
        yield f"{admin_dsn.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@dataclass(frozen=True)
class Notice:
    at_ns: int  # time.time_ns() when it arrived: the commit, plus delivery
    kind: str  # "held" or "freed"
    allocation: str
    agent: str


class CommitListener:
    """LISTEN on the benchmark's channel, in a thread with its own event loop, so that the
    arrival of a notification is stamped at once whatever the main thread is doing."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.notices: list[Notice] = []
        self.changed = threading.Condition()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="commit-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._error is not None:
            raise RuntimeError(f"LISTEN {CHANNEL} did not start: {self._error}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start() or seen as missing notices
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        conn = await asyncpg.connect(self.dsn, timeout=10)
        try:
            await conn.add_listener(CHANNEL, self._on_notice)
            self._ready.set()
            await self._stop.wait()
        finally:
            await conn.close()

    def _on_notice(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        at = time.time_ns()
        kind, allocation, agent = payload.split(" ", 2)
        with self.changed:
            self.notices.append(Notice(at, kind, allocation, agent))
            self.changed.notify_all()

    def mark(self) -> int:
        with self.changed:
            return len(self.notices)

    def since(self, mark: int) -> list[Notice]:
        with self.changed:
            return self.notices[mark:]

    def wait_for(
        self, what: str, mark: int, done: Callable[[list[Notice]], bool], timeout: float
    ) -> list[Notice]:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not done(self.notices[mark:]):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
                self.changed.wait(left)
            return self.notices[mark:]


def allocations_of(notices: Sequence[Notice], kind: str) -> dict[str, int]:
    """Allocation -> the last arrival of its notices of `kind` (a gang on two agents has two,
    from the same commit)."""
    out: dict[str, int] = {}
    for notice in notices:
        if notice.kind == kind:
            out[notice.allocation] = max(out.get(notice.allocation, 0), notice.at_ns)
    return out


# --- our cluster -----------------------------------------------------------------------------


@dataclass
class OurCluster:
    tmp: Path
    params: Params
    database_url: str
    master: MasterProcess
    agents: list[AgentProcess]
    client: httpx.Client
    listener: CommitListener
    start_s: float
    processes: list[psutil.Process] = field(default_factory=list)
    # The submitting clients, each on a kept-alive connection of its own: one posts back to
    # back; several (--clients) post their shares of a round at once, each in order.
    submitters: list[httpx.Client] = field(default_factory=list)

    def server_processes(self) -> list[psutil.Process]:
        return self.processes

    def check(self) -> None:
        self.master.check_running("det-master")
        for agent in self.agents:
            agent.check_running(f"det-agent {agent.id}")


@contextlib.contextmanager
def our_cluster(
    tmp: Path, params: Params, database_url: str, clients: int = 1
) -> Iterator[OurCluster]:
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        master = MasterProcess(tmp / "master-data", db_url=database_url)
        stack.callback(master.stop)
        master.start()
        # The master has migrated: the table the triggers watch exists.
        asyncio.run(_execute(database_url, TRIGGERS))
        listener = CommitListener(database_url)
        listener.start()
        stack.callback(listener.stop)
        agents: list[AgentProcess] = []
        for index in range(params.agents):
            agent_id = f"gang-agent-{index}"
            agent = AgentProcess(master, agent_id, tmp / agent_id, slots=params.slots_per_agent)
            stack.callback(agent.stop)
            agents.append(agent.start())
        client = stack.enter_context(master.client())

        def connected() -> bool:
            for agent in agents:
                agent.check_running(f"det-agent {agent.id}")
            reply = client.get("/api/v1/agents")
            if reply.status_code != 200:
                raise RuntimeError(f"GET /api/v1/agents -> {reply.status_code}: {reply.text}")
            listed = reply.json()["agents"]
            return sum(1 for a in listed if a.get("connected")) == params.agents

        wait_until(f"{params.agents} agents to connect", connected, START_TIMEOUT_S, 0.2)
        cluster = OurCluster(
            tmp,
            params,
            database_url,
            master,
            agents,
            client,
            listener,
            round(time.perf_counter() - started, 2),
        )
        cluster.processes = [psutil.Process(p.pid) for p in (master, *agents)]
        cluster.submitters = [client] + [
            stack.enter_context(master.client()) for _ in range(clients - 1)
        ]
        yield cluster


def model_definition() -> list[dict[str, Any]]:
    return [
        {
            "path": "rank.py",
            "type": 48,  # a regular file, as Determined's client sends it
            "content": base64.b64encode(RANK_SCRIPT).decode(),
            "mtime": str(int(time.time())),
            "mode": 0o644,
            "uid": 0,
            "gid": 0,
        }
    ]


def experiment_body(
    scenario: Scenario, rank_dir: Path, index: int, searcher: dict[str, Any] | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": f"{scenario.name}-{index}",
        "entrypoint": ["python3", "-S", "rank.py", str(rank_dir)],
        "resources": {"slots_per_trial": scenario.gang_slots},
        "searcher": searcher or {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
        "max_restarts": 0,
    }
    if searcher is not None:
        config["hyperparameters"] = {
            "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1},
            "width": {"type": "int", "minval": 16, "maxval": 512},
        }
    return {
        "config": yaml.safe_dump(config),
        "modelDefinition": model_definition(),
        "activate": True,
    }


def read_ranks(rank_dir: Path) -> dict[int, list[int]]:
    """Experiment id -> the start times (ns) of its ranks so far."""
    out: dict[int, list[int]] = {}
    for path in rank_dir.iterdir():
        if path.name.startswith("."):
            continue
        experiment = int(path.name.split(".")[0])
        out.setdefault(experiment, []).append(int(path.read_text().split()[0]))
    return out


async def _allocation_experiments(url: str, allocations: Sequence[str]) -> dict[str, int]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT id, experiment_id FROM allocations WHERE id = ANY($1::text[])",
            list(allocations),
        )
    finally:
        await conn.close()
    return {row["id"]: row["experiment_id"] for row in rows}


def wait_for_grants(cluster: OurCluster, mark: int, allocations: int) -> dict[str, int]:
    """Allocation -> when its slots were committed, once `allocations` have been."""
    notices = cluster.listener.wait_for(
        f"{allocations} allocations' slots committed",
        mark,
        lambda n: len(allocations_of(n, "held")) >= allocations,
        ROUND_TIMEOUT_S,
    )
    return allocations_of(notices, "held")


def wait_for_releases(cluster: OurCluster, mark: int, held: dict[str, int]) -> dict[str, int]:
    """Allocation -> when its slots were freed, once every one in `held` has been."""
    notices = cluster.listener.wait_for(
        f"{len(held)} allocations' slots freed",
        mark,
        lambda n: set(held) <= set(allocations_of(n, "freed")),
        ROUND_TIMEOUT_S,
    )
    return allocations_of(notices, "freed")


def wait_for_ranks(cluster: OurCluster, rank_dir: Path, ranks: int) -> None:
    def every_rank() -> bool:
        cluster.check()
        return sum(1 for name in os.listdir(rank_dir) if not name.startswith(".")) >= ranks

    wait_until(f"{ranks} ranks to start", every_rank, ROUND_TIMEOUT_S, RANK_POLL_S)


def post_all(
    clients: list[httpx.Client], requests: Sequence[tuple[str, dict[str, Any] | None]]
) -> list[tuple[int, float, httpx.Response]]:
    """POST each (path, body); with several clients, client i sends requests i, i+n, ... in
    order, all clients at once (threads, each its own connection). Per request, in the
    order given: time.time_ns() just before it was sent, its seconds, its reply."""
    results: list[tuple[int, float, httpx.Response] | None] = [None] * len(requests)

    def send(offset: int) -> None:
        client = clients[offset]
        for index in range(offset, len(requests), len(clients)):
            path, body = requests[index]
            at = time.time_ns()
            reply = client.post(path, json=body) if body is not None else client.post(path)
            results[index] = (at, (time.time_ns() - at) / 1e9, reply)

    if len(clients) == 1:
        send(0)
    else:
        threads = [
            threading.Thread(target=send, args=(i,), daemon=True)
            for i in range(min(len(clients), len(requests)))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if any(result is None for result in results):
        raise RuntimeError("a submitting client failed (its exception is above)")
    return [result for result in results if result is not None]


def our_round(cluster: OurCluster, scenario: Scenario, label: str) -> dict[str, Any]:
    client, listener = cluster.client, cluster.listener
    gangs = scenario.gangs_per_round
    total_ranks = gangs * scenario.gang_slots
    rank_dir = cluster.tmp / "ranks" / label
    rank_dir.mkdir(parents=True)
    bodies = [experiment_body(scenario, rank_dir, i) for i in range(gangs)]
    cpu_before = cpu_seconds(cluster.processes)
    client_cpu_before = time.process_time()
    mark = listener.mark()

    # Submit back to back (several clients: each its share, at once).
    sent: dict[int, int] = {}
    post_s: list[float] = []
    for at, seconds, reply in post_all(
        cluster.submitters, [("/api/v1/experiments", body) for body in bodies]
    ):
        post_s.append(seconds)
        if reply.status_code != 200:
            raise RuntimeError(f"POST /api/v1/experiments -> {reply.status_code}: {reply.text}")
        sent[reply.json()["experiment"]["id"]] = at
    held = wait_for_grants(cluster, mark, gangs)
    wait_for_ranks(cluster, rank_dir, total_ranks)
    ranks = read_ranks(rank_dir)
    experiment_of = asyncio.run(_allocation_experiments(cluster.database_url, list(held)))
    if set(experiment_of.values()) != set(sent) or len(experiment_of) != gangs:
        raise RuntimeError(f"allocations {experiment_of} are not the experiments {sorted(sent)}")
    agents_per_gang = {
        len({n.agent for n in listener.since(mark) if n.kind == "held" and n.allocation == a})
        for a in held
    }
    committed_s = [(held[a] - sent[e]) / 1e9 for a, e in experiment_of.items()]
    every_rank_s = [(max(ranks[e]) - sent[e]) / 1e9 for e in sent]
    first_post = min(sent.values())
    span_s = (max(held.values()) - first_post) / 1e9

    # Kill back to back, then wait for every release to commit.
    mark = listener.mark()
    killed: dict[int, int] = {}
    kill_s: list[float] = []
    kills = [(f"/api/v1/experiments/{experiment}/kill", None) for experiment in sent]
    for experiment, (at, seconds, reply) in zip(
        sent, post_all(cluster.submitters, kills), strict=True
    ):
        kill_s.append(seconds)
        if reply.status_code != 200:
            raise RuntimeError(f"kill {experiment} -> {reply.status_code}: {reply.text}")
        killed[experiment] = at
    freed = wait_for_releases(cluster, mark, held)
    freed_s = [(freed[a] - killed[e]) / 1e9 for a, e in experiment_of.items()]
    round_free_s = (max(freed.values()) - min(killed.values())) / 1e9
    # What a user sees: every slot free in the API (the commit above is what it reads).
    agents = client.get("/api/v1/agents").json()["agents"]
    busy = [
        f"{a['id']}/{s}" for a in agents for s, slot in a["slots"].items() if slot.get("container")
    ]
    if busy:
        raise RuntimeError(f"slots still held in GET /api/v1/agents after release: {busy}")
    # Let the trials end before the next round (not timed).
    wait_until(
        "the killed allocations to terminate",
        lambda: not client.get("/api/v1/tasks").json()["allocationIdToSummary"],
        ROUND_TIMEOUT_S,
        0.1,
    )
    # The gangs' whole life, their trials' ends included (and the few polls above).
    cpu = cpu_seconds(cluster.processes) - cpu_before
    client_cpu = time.process_time() - client_cpu_before
    return {
        "gangs": gangs,
        "agents_per_gang_seen": sorted(agents_per_gang),
        "gangs_per_s": round(gangs / span_s, 2),
        "post_to_slots_committed": ms_summary(committed_s),
        "post_to_every_rank_started": ms_summary(every_rank_s),
        "kill_to_slots_free": ms_summary(freed_s),
        "first_kill_to_every_slot_free_ms": round(round_free_s * 1000, 2),
        "post_reply": ms_summary(post_s),
        "kill_reply": ms_summary(kill_s),
        "master_and_agents_cpu_s": round(cpu, 3),
        "benchmark_client_cpu_s": round(client_cpu, 3),
    }


# --- Ray -------------------------------------------------------------------------------------


def ray_modules() -> tuple[Any, Any, Any] | None:
    """ray, ray.cluster_utils and ray.util.placement_group, or None when not installed (ray
    is imported by name so that neither mypy nor CI needs it)."""
    try:
        ray = importlib.import_module("ray")
    except ImportError:
        return None
    return (
        ray,
        importlib.import_module("ray.cluster_utils"),
        importlib.import_module("ray.util.placement_group"),
    )


@dataclass
class RayCluster:
    ray: Any
    pg: Any
    cluster: Any
    total_slots: int
    start_s: float
    processes: list[psutil.Process]

    def server_processes(self) -> list[psutil.Process]:
        return self.processes

    def free_slots(self) -> float:
        return float(self.ray.available_resources().get("slot", 0.0))


@contextlib.contextmanager
def ray_cluster(params: Params) -> Iterator[RayCluster]:
    modules = ray_modules()
    assert modules is not None
    ray, cluster_utils, pg = modules
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network here, no prompt
    started = time.perf_counter()
    # Ray's own processes (GCS, raylets, their agents) are the children it adds to this
    # process (the driver, not counted); ours were started before.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    node = {"num_cpus": 0, "resources": {"slot": params.slots_per_agent}}
    cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={**node, "include_dashboard": False}
    )
    try:
        for _ in range(params.agents - 1):
            cluster.add_node(**node)
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        cluster.wait_for_nodes()
        total = params.agents * params.slots_per_agent
        processes = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        handle = RayCluster(
            ray, pg, cluster, total, round(time.perf_counter() - started, 2), processes
        )
        wait_until("Ray's slots", lambda: handle.free_slots() == total, START_TIMEOUT_S, 0.1)
        yield handle
    finally:
        ray.shutdown()
        cluster.shutdown()


def ray_round(handle: RayCluster, scenario: Scenario, slots_per_agent: int) -> dict[str, Any]:
    ray = handle.ray
    bundles, strategy = scenario.ray_bundles(slots_per_agent)
    gangs = scenario.gangs_per_round
    processes = handle.processes
    cpu_before = cpu_seconds(processes)
    created: dict[Any, int] = {}
    groups = []
    for _ in range(gangs):
        at = time.time_ns()
        group = handle.pg.placement_group(bundles, strategy=strategy)
        created[group.ready()] = at
        groups.append(group)
    ready_at: dict[Any, int] = {}
    pending = list(created)
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=ROUND_TIMEOUT_S)
        now = time.time_ns()
        for ref in done:
            ready_at[ref] = now
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} Ray placement groups not ready")
    ready_s = [(ready_at[ref] - at) / 1e9 for ref, at in created.items()]
    span_s = (max(ready_at.values()) - min(created.values())) / 1e9
    # The gangs hold their slots (Ray's view of resources lags a little: not timed).
    expected_free = handle.total_slots - gangs * scenario.gang_slots
    wait_until(
        f"Ray to show {expected_free} slots free with the gangs placed",
        lambda: handle.free_slots() == expected_free,
        ROUND_TIMEOUT_S,
        0.01,
    )

    released = time.time_ns()
    for group in groups:
        handle.pg.remove_placement_group(group)
    wait_until(
        "Ray's slots to come back",
        lambda: handle.free_slots() == handle.total_slots,
        ROUND_TIMEOUT_S,
        0.001,  # each poll is a GCS call: finer would load what is measured
    )
    free_s = (time.time_ns() - released) / 1e9
    cpu = cpu_seconds(processes) - cpu_before
    return {
        "gangs": gangs,
        "gangs_per_s": round(gangs / span_s, 2),
        "create_to_ready": ms_summary(ready_s),
        "first_remove_to_every_slot_free_ms": round(free_s * 1000, 2),
        "ray_processes_cpu_s": round(cpu, 3),
    }


def search_round(cluster: OurCluster, label: str) -> dict[str, Any]:
    """One random search of `search_trials` one-slot trials, its trials created inside the
    master by the POST: POST -> the cluster's every slot committed and every rank started,
    then kill -> every slot free."""
    client, listener = cluster.client, cluster.listener
    slots = cluster.params.agents * cluster.params.slots_per_agent
    rank_dir = cluster.tmp / "ranks" / label
    rank_dir.mkdir(parents=True)
    searcher = {
        "name": "random",
        "metric": "loss",
        "max_trials": cluster.params.search_trials,
        "max_length": {"batches": 1},
    }
    body = experiment_body(Scenario("random_search", 1, slots, 1), rank_dir, 0, searcher)
    mark = listener.mark()
    cpu_before = cpu_seconds(cluster.processes)
    at = time.time_ns()
    reply = client.post("/api/v1/experiments", json=body)
    post_s = (time.time_ns() - at) / 1e9
    if reply.status_code != 200:
        raise RuntimeError(f"POST /api/v1/experiments -> {reply.status_code}: {reply.text}")
    experiment = reply.json()["experiment"]["id"]
    held = wait_for_grants(cluster, mark, slots)
    wait_for_ranks(cluster, rank_dir, slots)
    started = read_ranks(rank_dir)[experiment]
    mark = listener.mark()
    killed = time.time_ns()
    reply = client.post(f"/api/v1/experiments/{experiment}/kill")
    if reply.status_code != 200:
        raise RuntimeError(f"kill {experiment} -> {reply.status_code}: {reply.text}")
    freed = wait_for_releases(cluster, mark, held)
    wait_until(
        "the search's trials to end",
        lambda: not client.get("/api/v1/tasks").json()["allocationIdToSummary"],
        ROUND_TIMEOUT_S,
        0.1,
    )
    trials = client.get(f"/api/v1/experiments/{experiment}/trials?limit=1").json()
    return {
        "trials_created": trials["pagination"]["total"],
        "post_reply_ms": round(post_s * 1000, 2),
        "post_to_every_slot_committed_ms": round((max(held.values()) - at) / 1e6, 2),
        "post_to_first_slot_committed_ms": round((min(held.values()) - at) / 1e6, 2),
        "post_to_every_rank_started_ms": round((max(started) - at) / 1e6, 2),
        "kill_to_every_slot_free_ms": round((max(freed.values()) - killed) / 1e6, 2),
        "master_and_agents_cpu_s": round(cpu_seconds(cluster.processes) - cpu_before, 3),
    }


def run_search(cluster: OurCluster, params: Params) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for index in range(params.warmup_rounds + params.rounds):
        figures = search_round(cluster, f"random-search-{index}")
        tag = "" if index >= params.warmup_rounds else " (warm-up)"
        progress(
            f"random search {index}{tag}: {figures['trials_created']} trials, every slot "
            f"committed {figures['post_to_every_slot_committed_ms']} ms, every rank "
            f"{figures['post_to_every_rank_started_ms']} ms"
        )
        if index >= params.warmup_rounds:
            rounds.append(figures)
    keys = [k for k in rounds[0] if k.endswith("_ms")]
    return {
        "what": f"one random search of {params.search_trials} one-slot trials per round, created "
        "by the POST inside the master, onto the idle cluster (Ray has no searcher: ours only)",
        "median": {k: median_of(rounds, k) for k in keys},
        "rounds": rounds,
        "target_met": median_of(rounds, "post_to_every_slot_committed_ms") is not None
        and (median_of(rounds, "post_to_every_slot_committed_ms") or 0)
        <= TARGETS["search_fills_free_slots_ms_max"],
    }


# --- the run ---------------------------------------------------------------------------------


def summarize_ours(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    flat = [
        {
            "gangs_per_s": r["gangs_per_s"],
            "committed_p50": r["post_to_slots_committed"]["p50_ms"],
            "committed_p99": r["post_to_slots_committed"]["p99_ms"],
            "ranks_p50": r["post_to_every_rank_started"]["p50_ms"],
            "free_p50": r["kill_to_slots_free"]["p50_ms"],
            "round_free": r["first_kill_to_every_slot_free_ms"],
            "post_p50": r["post_reply"]["p50_ms"],
            "kill_p50": r["kill_reply"]["p50_ms"],
        }
        for r in rounds
    ]
    gangs = sum(r["gangs"] for r in rounds)
    cpu = sum(r["master_and_agents_cpu_s"] for r in rounds)
    return {
        "gangs_per_s": median_of(flat, "gangs_per_s"),
        "post_to_slots_committed_p50_ms": median_of(flat, "committed_p50"),
        "post_to_slots_committed_p99_ms": median_of(flat, "committed_p99"),
        "post_to_every_rank_started_p50_ms": median_of(flat, "ranks_p50"),
        "kill_to_slots_free_p50_ms": median_of(flat, "free_p50"),
        "first_kill_to_every_slot_free_ms": median_of(flat, "round_free"),
        "post_reply_p50_ms": median_of(flat, "post_p50"),
        "kill_reply_p50_ms": median_of(flat, "kill_p50"),
        "master_and_agents_cpu_s": round(cpu, 3),
        "master_and_agents_cpu_ms_per_gang": round(cpu / gangs * 1000, 2) if gangs else None,
    }


def summarize_ray(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    flat = [
        {
            "gangs_per_s": r["gangs_per_s"],
            "p50": r["create_to_ready"]["p50_ms"],
            "p99": r["create_to_ready"]["p99_ms"],
            "free": r["first_remove_to_every_slot_free_ms"],
        }
        for r in rounds
    ]
    gangs = sum(r["gangs"] for r in rounds)
    cpu = sum(r["ray_processes_cpu_s"] for r in rounds)
    return {
        "gangs_per_s": median_of(flat, "gangs_per_s"),
        "create_to_ready_p50_ms": median_of(flat, "p50"),
        "create_to_ready_p99_ms": median_of(flat, "p99"),
        "first_remove_to_every_slot_free_ms": median_of(flat, "free"),
        "ray_processes_cpu_s": round(cpu, 3),
        "ray_processes_cpu_ms_per_gang": round(cpu / gangs * 1000, 2) if gangs else None,
    }


def ours_over_ray(ours: dict[str, Any], ray: dict[str, Any]) -> dict[str, float | None]:
    def r(a: float | None, b: float | None) -> float | None:
        return ratio(a, b) if a is not None and b is not None else None

    return {
        "gangs_per_s": r(ours["gangs_per_s"], ray["gangs_per_s"]),
        "latency_p50": r(ours["post_to_slots_committed_p50_ms"], ray["create_to_ready_p50_ms"]),
        "latency_p99": r(ours["post_to_slots_committed_p99_ms"], ray["create_to_ready_p99_ms"]),
        "release_round": r(
            ours["first_kill_to_every_slot_free_ms"], ray["first_remove_to_every_slot_free_ms"]
        ),
        "release_ours_per_gang_p50_over_ray_round": r(
            ours["kill_to_slots_free_p50_ms"], ray["first_remove_to_every_slot_free_ms"]
        ),
        "cpu_per_gang": r(
            ours["master_and_agents_cpu_ms_per_gang"], ray["ray_processes_cpu_ms_per_gang"]
        ),
    }


def judge(figures: dict[str, Any], params: Params) -> dict[str, Any]:
    full = (params.agents, params.slots_per_agent) == (FULL.agents, FULL.slots_per_agent)
    out: dict[str, Any] = {"judged_at_full_scale": full}
    out |= TARGETS
    for name, scenario in figures.items():
        ours, over = scenario["ours"], scenario.get("ours_over_ray", {})
        lone = figures[name]["gangs_per_round"] == 1  # a rate over one gang says nothing
        met: dict[str, bool | None] = {
            "rate_at_least_2x_ray": None
            if over.get("gangs_per_s") is None or lone
            else over["gangs_per_s"] >= TARGETS["gangs_per_s_over_ray_min"],
            "post_to_slots_committed_p50": ours["post_to_slots_committed_p50_ms"]
            <= TARGETS["post_to_slots_committed_p50_ms_max"],
            "kill_to_slots_free_p50": ours["kill_to_slots_free_p50_ms"]
            <= TARGETS["kill_to_slots_free_p50_ms_max"],
        }
        if name in ("one_agent_gangs", "lone_gang_idle_cluster"):
            met["post_to_every_rank_started_p50"] = (
                ours["post_to_every_rank_started_p50_ms"]
                <= TARGETS["post_to_every_rank_started_p50_ms_max_8_rank_gang"]
            )
        out[f"{name}_met"] = met
    return out


def footprint(processes: Sequence[psutil.Process]) -> float:
    rss = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            rss += process.memory_info().rss
    return round(rss / 2**30, 2)


def run_scenario(
    ours: OurCluster, ray: RayCluster | None, scenario: Scenario, params: Params
) -> dict[str, Any]:
    our_rounds: list[dict[str, Any]] = []
    ray_rounds: list[dict[str, Any]] = []
    for index in range(params.warmup_rounds + params.rounds * scenario.rounds_factor):
        measured = index >= params.warmup_rounds
        label = f"{scenario.name}-{index}"
        tag = "" if measured else " (warm-up)"
        # Alternate who goes first, so a drift in the machine's load hits both.
        for system in ("ours", "ray") if index % 2 == 0 else ("ray", "ours"):
            if system == "ours":
                figures = our_round(ours, scenario, label)
                if measured:
                    our_rounds.append(figures)
                progress(
                    f"{label} ours{tag}: {figures['gangs_per_s']} gangs/s, committed p50 "
                    f"{figures['post_to_slots_committed']['p50_ms']} ms, ranks p50 "
                    f"{figures['post_to_every_rank_started']['p50_ms']} ms, free p50 "
                    f"{figures['kill_to_slots_free']['p50_ms']} ms"
                )
            elif ray is not None:
                figures = ray_round(ray, scenario, params.slots_per_agent)
                if measured:
                    ray_rounds.append(figures)
                progress(
                    f"{label} ray{tag}: {figures['gangs_per_s']} gangs/s, ready p50 "
                    f"{figures['create_to_ready']['p50_ms']} ms, free "
                    f"{figures['first_remove_to_every_slot_free_ms']} ms"
                )
    entry: dict[str, Any] = {
        "gang_slots": scenario.gang_slots,
        "gangs_per_round": scenario.gangs_per_round,
        "agents_per_gang": scenario.agents_per_gang,
        "ours": summarize_ours(our_rounds),
        "ours_rounds": our_rounds,
    }
    if ray is not None:
        bundles, strategy = scenario.ray_bundles(params.slots_per_agent)
        entry["ray_placement_group"] = {"bundles": bundles, "strategy": strategy}
        entry["ray"] = summarize_ray(ray_rounds)
        entry["ray_rounds"] = ray_rounds
        entry["ours_over_ray"] = ours_over_ray(entry["ours"], entry["ray"])
    return entry


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    params = {"full": FULL, "quick": QUICK, "smoke": SMOKE}[mode]
    if args.rounds:
        params = dataclasses.replace(params, rounds=args.rounds)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    facts = host_facts(("fastapi", "uvicorn", "sqlalchemy", "asyncpg", "grpcio", "httpx", "ray"))
    try:
        facts["postgres"] = asyncio.run(common.postgres_facts(args.postgres))
    except (OSError, asyncpg.PostgresError) as exc:
        raise SystemExit(f"cannot use PostgreSQL at {args.postgres}: {exc}") from exc
    if facts["postgres"]["fsync"] != "on":
        raise SystemExit(f"PostgreSQL has fsync={facts['postgres']['fsync']}; it must be on")
    with_ray = not args.no_ray and ray_modules() is not None
    ray_note = (
        "ray skipped (--no-ray)"
        if args.no_ray
        else f"ray {facts['libraries']['ray']} run in the same process tree"
        if with_ray
        else "ray is not installed (pip install ray==2.60.0, the bench group): skipped"
    )
    progress(f"{mode} run: {params}; {ray_note}")
    scenarios = scenarios_of(params)
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="resolute-bench-gangs-")))
        database_url = stack.enter_context(fresh_database(args.postgres))
        facts["postgres"]["database"] = database_url.rsplit("/", 1)[1]
        ours = stack.enter_context(our_cluster(tmp, params, database_url, args.clients))
        progress(f"our cluster up in {ours.start_s} s ({params.agents} agents)")
        ray = stack.enter_context(ray_cluster(params)) if with_ray else None
        if ray is not None:
            progress(f"Ray cluster up in {ray.start_s} s ({params.agents} nodes)")
        footprints: dict[str, float] = {"ours_rss_gib": footprint(ours.server_processes())}
        if ray is not None:
            footprints["ray_rss_gib"] = footprint(ray.server_processes())
        # What each cluster costs doing nothing (heartbeats, polls), beside the other.
        idle_s = params.idle_s
        ours_cpu = cpu_seconds(ours.server_processes())
        ray_cpu = cpu_seconds(ray.server_processes()) if ray is not None else 0.0
        time.sleep(idle_s)
        footprints["ours_idle_cpu_fraction_of_one_core"] = round(
            (cpu_seconds(ours.server_processes()) - ours_cpu) / idle_s, 3
        )
        if ray is not None:
            footprints["ray_idle_cpu_fraction_of_one_core"] = round(
                (cpu_seconds(ray.server_processes()) - ray_cpu) / idle_s, 3
            )
        ours_cpu = cpu_seconds(ours.server_processes())
        ray_cpu = cpu_seconds(ray.server_processes()) if ray is not None else 0.0
        if args.profile is not None:
            # The master and the first agent, sampled over every scenario's rounds.
            stack.enter_context(py_spy(ours.processes[0].pid, args.profile / "master.txt"))
            stack.enter_context(py_spy(ours.processes[1].pid, args.profile / "agent.txt"))
        for scenario in scenarios:
            results[scenario.name] = run_scenario(ours, ray, scenario, params)
        search = run_search(ours, params)
        clusters: dict[str, Any] = {
            "ours_start_s": ours.start_s,
            **footprints,
            "ours_master_and_agents_cpu_s_over_the_run": round(
                cpu_seconds(ours.server_processes()) - ours_cpu, 2
            ),
        }
        if ray is not None:
            clusters["ray_start_s"] = ray.start_s
            clusters["ray_processes_cpu_s_over_the_run"] = round(
                cpu_seconds(ray.server_processes()) - ray_cpu, 2
            )
    profile: dict[str, Any] = {}
    if args.profile is not None:
        profile = {
            "what": "py-spy record --rate 200 --nonblocking over every scenario's rounds "
            "(idle frames left out); shares of the samples. SQLAlchemy runs statements in "
            "greenlets, whose stacks py-spy reports cut off from the coroutine that asked, "
            "so the entry points' inclusive shares undercount the database work under them",
            "master": summarize_profile(args.profile / "master.txt"),
            "agent_0": summarize_profile(args.profile / "agent.txt"),
        }
    return {
        "benchmark": "resolute end-to-end gang scheduling: REST submit to running ranks and "
        "back, on Postgres, beside Ray placement groups",
        "mode": mode,
        "command": " ".join(["python -m benchmarks.bench_gangs", *sys.argv[1:]]),
        "started_at": started_at,
        "total_seconds": round(seconds_since_start(), 1),
        "machine": facts,
        "parameters": asdict(params)
        | {"ray": ray_note, "submitting_clients": args.clients, "pipelined": args.clients > 1},
        "clusters": clusters,
        "scenarios": results,
        "random_search": search,
        "targets": judge(results, params),
        **({"profile": profile} if profile else {}),
        "notes": [
            "Figures per scenario are medians over the measured rounds of each round's "
            "figure (a round's p99 over 4 or 8 gangs is its maximum); every round's own "
            "figures are in *_rounds.",
            "slots committed / freed: the arrival (time.time_ns) of a pg_notify sent by "
            "triggers on allocation_slots, added by the benchmark to its own database; "
            "PostgreSQL delivers it when the granting or releasing transaction commits, so "
            "the resolution is the delivery (sub-millisecond on loopback), not a poll. "
            "The triggers add a few microseconds per slot row to those transactions.",
            "every rank started: time.time_ns() written by each rank first thing "
            "(python3 -S), against time.time_ns() just before the POST, on the same clock.",
            "kill -> slots free: per gang, from just before its kill POST to its release's "
            "commit; first_kill_to_every_slot_free_ms: per round, first kill POST to the "
            "last release, then confirmed in GET /api/v1/agents.",
            "gangs/s: gangs in the round / (last gang's slots committed - first POST); Ray: "
            "/ (last pg.ready() resolved - first placement_group() call).",
            "CPU: psutil user+system of the master and agent processes over the measured "
            "rounds, from the first POST to every trial ended (ranks not counted); Ray: its "
            "GCS, raylets and agents, not the driver, from the first create to every slot "
            "back. Clock ticks of 10 ms per process, so per-gang CPU is coarse in short "
            "rounds. *_over_the_run: from both clusters up to the last round, warm-up "
            "rounds and idle time included. Both clusters stay up the whole run, so each "
            "idles beside the other's rounds.",
            "Ray's release is per round only: available_resources() does not say which "
            "group's bundles came back.",
        ],
    }


@contextlib.contextmanager
def py_spy(pid: int, out: Path) -> Iterator[None]:
    """`py-spy record` (collapsed stacks, idle frames left out) on `pid` until the block
    ends; py-spy writes `out` when it is interrupted."""
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [
        str(Path(sys.executable).parent / "py-spy"),
        "record",
        "--pid",
        str(pid),
        "--format",
        "raw",
        "--rate",
        "200",
    ]
    recorder = subprocess.Popen(
        [*command, "--output", str(out), "--nonblocking"], stderr=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=60)


# Where a profile's samples fall: the package of the innermost frame (self time), and our
# own entry points anywhere in the stack (inclusive time).
PROFILE_PACKAGES = (
    ("waiting in epoll (idle, as py-spy sees it)", "EpollSelector.select ("),
    ("socket sends (the send syscall)", "_SelectorSocketTransport.write ("),
    ("sqlalchemy", "sqlalchemy/"),
    ("asyncpg", "asyncpg/"),
    ("grpc", "grpc/"),
    ("web (fastapi, starlette, uvicorn, pydantic)", ("fastapi/", "starlette/", "uvicorn/")),
    ("web (fastapi, starlette, uvicorn, pydantic)", ("pydantic", "anyio/", "h11/")),
    ("asyncio and selectors", ("asyncio/", "selectors.py")),
    ("subprocess and threads", ("subprocess.py", "threading.py", "concurrent/")),
    ("yaml", "yaml/"),
    ("resolute (master/, agent/, resolute/)", ("master/", "agent/", "resolute/")),
)
PROFILE_ENTRY_POINTS = {
    "submit (POST /api/v1/experiments)": "create_experiment (master/api/routes/experiments.py",
    "kill (POST .../kill)": "kill_experiment (master/api/routes/experiments.py",
    "scheduling pass": "run_pass (master/services/scheduler.py",
    "hub tick (launch, stop)": "AgentHub.tick (master/services/agent_link.py",
    "agent messages (prepared, started, exited, logs)": "AgentHub.on_message (",
    "heartbeats": "AgentHub.on_heartbeat (",
    "rank spawn (agent)": "Runner._spawn (agent/runner.py",
    "allocation start (agent)": "Runner.start (agent/runner.py",
}


def summarize_profile(path: Path) -> dict[str, Any]:
    """Shares of a py-spy raw profile (collapsed stacks, one `frames count` per line)."""
    total = 0
    by_package: dict[str, int] = {}
    by_entry: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples = int(count)
        total += samples
        leaf = stack.rsplit(";", 1)[-1]
        package = next(
            (
                name
                for name, marks in PROFILE_PACKAGES
                if any(m in leaf for m in ((marks,) if isinstance(marks, str) else marks))
            ),
            "other",
        )
        by_package[package] = by_package.get(package, 0) + samples
        for name, mark in PROFILE_ENTRY_POINTS.items():
            if mark in stack:
                by_entry[name] = by_entry.get(name, 0) + samples

    def shares(counts: dict[str, int]) -> dict[str, float]:
        ordered = sorted(counts.items(), key=lambda kv: -kv[1])
        return {name: round(n / total, 3) for name, n in ordered} if total else {}

    return {
        "samples": total,
        "self_time_by_package": shares(by_package),
        "inclusive_by_entry_point": shares(by_entry),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_gangs",
        description="End-to-end gang scheduling benchmark; prints one JSON document on stdout.",
    )
    common.add_shape_flags(
        parser,
        quick="2 agents x 2 slots, 1 round, no warm-up",
        smoke="2 agents x 2 slots, 1 round of each scenario, a search of 8 trials",
    )
    parser.add_argument("--rounds", type=int, help="measured rounds per scenario (default 3)")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="admin DSN of the server")
    parser.add_argument("--no-ray", action="store_true", help="skip Ray even if installed")
    parser.add_argument(
        "--clients",
        type=int,
        default=1,
        help="submitting clients, each on its own connection posting its share of a round "
        "in order, all at once (the kills too); default 1: back to back on one connection",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record py-spy profiles (collapsed stacks) of the master and one agent into DIR",
    )
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.clients < 1:
        parser.error(f"--clients must be at least 1, not {args.clients}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    common.emit_report(result, args.out)


if __name__ == "__main__":
    main()
