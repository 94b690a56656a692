"""Heartbeat benchmark: 1,000 simulated agents streaming 8-GPU metric heartbeats at 1 Hz.

    .venv/bin/python -m benchmarks.bench_heartbeats [--quick | --smoke] [--agents N]
        [--window S] [--workers N] [--heartbeat-interval-s S] [--metrics-period-s S]
        [--lost-after-s S] [--no-floor] [--out PATH]

Prints one JSON document on stdout (progress goes to stderr): the machine it ran on, the
parameters, the figures, the targets and whether each was met.

A real `det-master` subprocess runs on SQLite in a temporary directory with free ports; the
simulated agents live in separate worker processes (this module run with `--worker`, two by
default: one keeps up with 1,000 agents on this machine, but two leave headroom), so the
master's CPU time is its own. Each simulated agent opens its own gRPC channel (its own TCP
connection) and one Connect stream on grpc.aio, sends Hello (8 cuda devices, interfaces,
the join token), waits for Welcome, then sends a Heartbeat every interval the Welcome names
(1 s), its first one at a random phase so the agents do not fire together. Every heartbeat
carries one MetricSample with 8 GpuSamples and the system fields, as `det-agent` sends it.
The round trip is timed from just before the write to the matching HeartbeatAck (by seq).

Figures, over a window (30 s; `--quick`: 5 s with 50 agents; `--smoke`, the least that runs
every path: 1 s with 2 agents beating every 0.25 s, lost after 2.5 s) after a warm-up:
- the master's CPU (user + system of its process, all threads) / wall = fraction of one core,
  split by thread (the event loop; grpc's C-core threads; the rest), beside the idle
  master's before any agent connected;
- heartbeats offered and acknowledged per second: the workers also report how late their
  sends were against the schedule and their own CPU, since the master's figure means
  something only if the load was really offered; and how busy the rest of the (shared)
  machine was meanwhile;
- round trips p50 / p95 / p99 / max, and the slow ones (over the p99 target) grouped into
  episodes: about one episode a second means a periodic stall of the master's event loop;
- persistence: after the clients stop and the metrics loop has flushed, one sample agent's
  rows through GET /api/v1/agents/<id>/metrics, and every agent's rows counted in the
  master's SQLite file, against the heartbeats each agent had acknowledged.

Then, with the others still streaming, one agent stops sending heartbeats without closing
its stream (a hung machine). The time until GET /api/v1/agents/<id> shows `connected` false
is measured from its first missed heartbeat (when it went silent; the target is judged on
this) and from its last heartbeat sent (lost_after_s plus the hub's 0.25 s tick and a
commit); the moment the master closed that stream, as the agent saw it, is reported too.

Two baselines, in the same run (`--smoke`, which judges no timing: both while the silent
agent waits to be declared lost, which is otherwise idle):
- The gRPC floor, once the master has stopped: the same agents against a bare grpc.aio
  server in a process of its own (started beside the master, idle until then; EchoService:
  parse each heartbeat, answer its ack in the stream's coroutine; no hub, queue or
  database). It is what any master built on grpc.aio in one Python process pays
  per heartbeat on this machine, so it says how much of the master's CPU is ours.
- The naive way, once the master has stopped: every heartbeat's sample committed to the
  database in a transaction of its own (an ORM AgentMetricModel row on an engine from
  master.db.session.create_engine, on a fresh migrated SQLite file) against our way on
  another fresh file: MetricsBuffer.add per heartbeat and MetricsLoop.write_pending once
  per second's worth of heartbeats (one per agent), the code the master runs. Both start
  from the same parsed Heartbeat messages and include the conversion to rows. Reported:
  CPU and wall per heartbeat of each, their ratio, the rate the naive way can sustain at
  all (SQLite has one writer, so 1 / wall per commit), and the master's CPU at 1,000
  heartbeats/s projected for the naive way: our measured master CPU per heartbeat with our
  persistence cost swapped for the naive one. Persistence is what differs between the two
  designs; the gRPC handling is the same in both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import psutil

from benchmarks import common
from benchmarks.common import host_facts, progress, seconds_since_start
from harness.cluster import MasterProcess
from harness.figures import ms_percentiles, ms_summary, percentile, ratio
from resolute_proto.agent.v1 import agent_pb2 as pb
from resolute_proto.agent.v1 import agent_pb2_grpc

# The master's modules (and SQLAlchemy under them) are imported where they are used: the
# worker processes, which only speak gRPC, import this module too and start in a fraction
# of the time without them.
if TYPE_CHECKING:
    from master.db.models import AgentMetricModel

ROOT = Path(__file__).resolve().parent.parent
GPUS_PER_AGENT = 8
START_TIMEOUT_S = 30.0
CONNECT_CONCURRENCY = 20  # Hellos in flight per worker: registrations are transactions
ACK_DRAIN_TIMEOUT_S = 10.0
METRICS_FLUSH_TIMEOUT_S = 10.0  # MetricsLoop writes every second
API_POLL_S = 0.1
SLOW_EPISODE_GAP_S = 0.2
TARGETS = {
    "master_cpu_fraction_of_one_core_max": 0.25,
    "rtt_p99_ms_max": 20.0,
    "silent_agent_lost_s_max": 10.0,
}
# The load counts as offered if the workers sent at least this share of the intended rate.
OFFERED_LOAD_MIN_SHARE = 0.98


# --- statistics ----------------------------------------------------------------------------


def rtt_summary(seconds: Sequence[float]) -> dict[str, float]:
    """n, p50, p95, p99, max and mean, in ms to the microsecond."""
    return ms_summary(seconds, digits=3, mean=True) | ms_percentiles(seconds, (95,), digits=3)


# --- the simulated agents (worker processes) -----------------------------------------------


def agent_name(index: int) -> str:
    return f"hb-{index:04d}"


def gpu_uuid(agent: int, gpu: int) -> str:
    return f"GPU-{uuid.UUID(int=agent << 16 | gpu)}"


def hello(index: int, join_token: str) -> pb.Hello:
    return pb.Hello(
        agent_id=agent_name(index),
        version="bench",
        hostname=agent_name(index),
        join_token=join_token,
        devices=[
            pb.Device(
                slot_id=g,
                type="cuda",
                brand="NVIDIA H100 80GB HBM3",
                uuid=gpu_uuid(index, g),
                memory_bytes=80 * 2**30,
                index=g,
            )
            for g in range(GPUS_PER_AGENT)
        ],
        interfaces=[
            pb.NetworkInterface(name="eth0", ipv4=[f"10.{index >> 8 & 255}.{index & 255}.1"]),
            pb.NetworkInterface(name="ib0", ipv4=[f"192.168.{index >> 8 & 255}.{index & 255}"]),
        ],
    )


def metric_sample(index: int, rng: random.Random) -> pb.MetricSample:
    """A sample as det-agent's sampler fills it, with plausible values."""
    return pb.MetricSample(
        unix_millis=int(time.time() * 1000),
        gpus=[
            pb.GpuSample(
                index=g,
                uuid=gpu_uuid(index, g),
                gpu_util=rng.uniform(0, 100),
                gpu_memory_used=rng.randrange(80 * 2**30),
                gpu_free_memory=rng.randrange(80 * 2**30),
                temperature_c=rng.uniform(30, 85),
                power_w=rng.uniform(60, 700),
            )
            for g in range(GPUS_PER_AGENT)
        ],
        cpu_util_simple=rng.uniform(0, 100),
        memory_free=rng.randrange(2**40),
        memory_used=rng.randrange(2**40),
        disk_throughput_read=rng.uniform(0, 1e9),
        disk_throughput_write=rng.uniform(0, 1e9),
        disk_iops=rng.uniform(0, 1e5),
        net_throughput_sent=rng.uniform(0, 1e10),
        net_throughput_recv=rng.uniform(0, 1e10),
    )


def channel_options() -> list[tuple[str, Any]]:
    return [
        # One TCP connection per agent, as separate machines have: without this, channels
        # to the same target share grpc's global subchannel pool (one connection).
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.keepalive_time_ms", 120_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


@dataclass(eq=False)
class SimAgent:
    index: int
    name: str
    channel: Any = None
    call: Any = None
    message: pb.AgentMessage = field(default_factory=pb.AgentMessage)
    pending: dict[int, float] = field(default_factory=dict)  # seq -> monotonic send time
    seq: int = 0
    sent: int = 0
    acked: int = 0
    silent: bool = False
    last_sent: float | None = None
    first_missed_due: float | None = None
    closed_at: float | None = None
    close_reason: str = ""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class Worker:
    """Some of the simulated agents, driven by JSON-line commands on stdin."""

    def __init__(self, indices: Sequence[int], address: str, join_token: str, seed: int) -> None:
        self.agents = [SimAgent(i, agent_name(i)) for i in indices]
        self.by_name = {a.name: a for a in self.agents}
        self.address = address
        self.join_token = join_token
        self.rng = random.Random(seed)
        self.interval = 1.0
        self.metrics_period_ms = 1000
        self.stopping = False
        # (scheduled, actual) send times, and (send time, round trip), all monotonic.
        self.sends: list[tuple[float, float]] = []
        self.acks: list[tuple[float, float]] = []
        self.ack_times: list[float] = []
        self.unexpected_acks = 0
        self.refused: list[str] = []

    async def connect_all(self) -> dict[str, Any]:
        started = time.monotonic()
        gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

        async def one(agent: SimAgent) -> None:
            async with gate:
                await self.connect(agent)

        await asyncio.gather(*(one(a) for a in self.agents))
        registered = sum(1 for a in self.agents if a.call is not None)
        return {
            "registered": registered,
            "refused": self.refused[:10],
            "connect_seconds": round(time.monotonic() - started, 2),
        }

    async def connect(self, agent: SimAgent) -> None:
        agent.channel = grpc.aio.insecure_channel(self.address, options=channel_options())
        stub = agent_pb2_grpc.AgentServiceStub(agent.channel)  # type: ignore[no-untyped-call]
        call = stub.Connect()
        await call.write(pb.AgentMessage(hello=hello(agent.index, self.join_token)))
        first = await asyncio.wait_for(call.read(), timeout=120)
        if first is grpc.aio.EOF or first.WhichOneof("body") != "welcome":
            reason = "stream closed" if first is grpc.aio.EOF else first.refused.reason
            self.refused.append(f"{agent.name}: {reason}")
            call.cancel()
            return
        self.interval = first.welcome.heartbeat_interval_s or 1.0
        # As det-agent: a sample every metrics period, all sent with the next heartbeat.
        period = first.welcome.metrics_period_s or 1.0
        self.metrics_period_ms = round(period * 1000)
        agent.call = call
        per_heartbeat = max(1, round(self.interval / period))
        samples = [metric_sample(agent.index, self.rng)] * per_heartbeat
        agent.message = pb.AgentMessage(heartbeat=pb.Heartbeat(samples=samples))
        first_due = time.monotonic() + self.rng.uniform(0, self.interval)
        agent.tasks = [
            asyncio.create_task(self.read(agent)),
            asyncio.create_task(self.beat(agent, first_due)),
        ]

    async def beat(self, agent: SimAgent, due: float) -> None:
        heartbeat = agent.message.heartbeat
        last = len(heartbeat.samples) - 1
        while True:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.stopping or agent.silent or agent.closed_at is not None:
                agent.first_missed_due = due
                return
            agent.seq += 1
            heartbeat.seq = agent.seq
            heartbeat.sent_unix_nanos = time.time_ns()
            now_ms = heartbeat.sent_unix_nanos // 1_000_000
            for n, sample in enumerate(heartbeat.samples):
                sample.unix_millis = now_ms - (last - n) * self.metrics_period_ms
            sent_at = time.monotonic()
            agent.pending[agent.seq] = sent_at
            self.sends.append((due, sent_at))
            try:
                await agent.call.write(agent.message)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                agent.pending.pop(agent.seq, None)
                self.sends.pop()
                agent.close_reason = agent.close_reason or f"write failed: {exc}"
                return
            agent.sent += 1
            agent.last_sent = sent_at
            due += self.interval

    async def read(self, agent: SimAgent) -> None:
        try:
            while True:
                message = await agent.call.read()
                now = time.monotonic()
                if message is grpc.aio.EOF:
                    agent.closed_at, agent.close_reason = now, "the master closed the stream"
                    return
                if message.WhichOneof("body") != "heartbeat_ack":
                    continue
                sent_at = agent.pending.pop(message.heartbeat_ack.seq, None)
                if sent_at is None:
                    self.unexpected_acks += 1
                    continue
                agent.acked += 1
                self.acks.append((sent_at, now - sent_at))
                self.ack_times.append(now)
        except grpc.aio.AioRpcError as exc:
            if agent.closed_at is None:
                agent.closed_at = time.monotonic()
                agent.close_reason = f"{exc.code().name}: {exc.details()}"

    async def window(self, start: float, end: float) -> dict[str, Any]:
        # The acks of heartbeats sent just before the window's end may still be on their way
        # (on a loaded machine, tens of ms): wait for them, or the window counts them lost.
        deadline = time.monotonic() + ACK_DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if not any(
                a.closed_at is None and any(at < end for at in a.pending.values())
                for a in self.agents
            ):
                break
            await asyncio.sleep(0.02)
        sends = [(due, at) for due, at in self.sends if start <= at < end]
        acks = [(at, rtt) for at, rtt in self.acks if start <= at < end]
        return {
            "sent": len(sends),
            "acked_of_sent": len(acks),
            "acks_received": sum(1 for t in self.ack_times if start <= t < end),
            # (send time in ms from the window's start, round trip in us)
            "rtt_us": [(round((at - start) * 1000, 1), round(rtt * 1e6)) for at, rtt in acks],
            "late_us": [round(max(0.0, at - due) * 1e6) for due, at in sends],
        }

    def silence(self, name: str) -> dict[str, Any]:
        self.by_name[name].silent = True
        return {"silenced": name}

    def silent_status(self, name: str) -> dict[str, Any]:
        agent = self.by_name[name]
        return {
            "last_sent": agent.last_sent,
            "first_missed_due": agent.first_missed_due,
            "closed_at": agent.closed_at,
            "close_reason": agent.close_reason,
        }

    async def stop(self) -> dict[str, Any]:
        """Stop sending, wait for the acks still due, close every stream; the totals."""
        self.stopping = True
        deadline = time.monotonic() + ACK_DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if not any(a.pending and a.closed_at is None for a in self.agents):
                break
            await asyncio.sleep(0.05)
        totals = {
            "sent": sum(a.sent for a in self.agents),
            "acked": sum(a.acked for a in self.agents),
            "unacked": sum(len(a.pending) for a in self.agents),
            "unexpected_acks": self.unexpected_acks,
            "closed_by_master": [a.name for a in self.agents if a.closed_at is not None],
            "acked_per_agent": {a.name: a.acked for a in self.agents},
        }
        for agent in self.agents:
            for task in agent.tasks:
                task.cancel()
            if agent.call is not None:
                agent.call.cancel()
        for agent in self.agents:
            for task in agent.tasks:
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await task
            if agent.channel is not None:
                await agent.channel.close()
        return totals


async def worker_main(config: dict[str, Any]) -> None:
    worker = Worker(config["indices"], config["address"], config["join_token"], config["seed"])
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def reply(body: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(body) + "\n")
        sys.stdout.flush()

    while line := await reader.readline():
        command = json.loads(line)
        match command["cmd"]:
            case "connect":
                reply(await worker.connect_all())
            case "window":
                reply(await worker.window(command["start"], command["end"]))
            case "silence":
                reply(worker.silence(command["agent"]))
            case "silent_status":
                reply(worker.silent_status(command["agent"]))
            case "stop":
                reply(await worker.stop())
                return
            case other:
                raise SystemExit(f"worker: unknown command {other!r}")


class WorkerProcess:
    """The coordinator's handle on one worker: this module run with --worker."""

    def __init__(self, process: asyncio.subprocess.Process, indices: Sequence[int]) -> None:
        self.process = process
        self.indices = list(indices)
        self.ps = psutil.Process(process.pid)
        self.names = {agent_name(i) for i in indices}

    @classmethod
    async def start(cls, indices: Sequence[int], address: str, token: str, seed: int) -> Any:
        config = {"indices": list(indices), "address": address, "join_token": token, "seed": seed}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.bench_heartbeats",
            "--worker",
            json.dumps(config),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=2**26,
        )
        return cls(process, indices)

    async def ask(self, cmd: str, **fields: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((json.dumps({"cmd": cmd, **fields}) + "\n").encode())
        await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.process.pid} exited answering {cmd}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def cpu_seconds(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


# --- the master ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def api_client(master: MasterProcess) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {master.login()}"}
    async with httpx.AsyncClient(base_url=master.url, timeout=30, headers=headers) as client:
        yield client


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def connected_agents(client: httpx.AsyncClient) -> int:
    reply = await client.get("/api/v1/agents")
    reply.raise_for_status()
    return sum(1 for a in reply.json()["agents"] if a["connected"])


async def agent_connected(client: httpx.AsyncClient, name: str) -> bool:
    reply = await client.get(f"/api/v1/agents/{name}")
    reply.raise_for_status()
    return bool(reply.json()["agent"]["connected"])


# --- offering the load ----------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    agents: int
    workers: int
    warmup_s: float
    window_s: float
    floor_window_s: float  # 0: no gRPC floor measurement
    idle_s: float
    lost_after_s: float | None  # None: the master's default
    heartbeat_interval_s: float  # the master's agent_link.heartbeat_interval_s
    metrics_period_s: float  # the master's agent_link.metrics_period_s (agents sample at it)
    naive_heartbeats: int
    seed: int


def samples_per(params: Params) -> int:
    """Metric samples in each heartbeat: one per metrics period since the last one."""
    return max(1, round(params.heartbeat_interval_s / params.metrics_period_s))


def split_agents(agents: int, workers: int) -> list[list[int]]:
    return [list(range(w, agents, workers)) for w in range(workers)]


def thread_cpu_seconds(process: psutil.Process) -> dict[str, float]:
    """CPU seconds per kind of thread: the main one (the event loop), grpc's C-core
    threads (named event_engine) and the rest (aiosqlite, anyio workers)."""
    out = {"main_thread": 0.0, "grpc_event_engine_threads": 0.0, "other_threads": 0.0}
    for thread in process.threads():
        try:
            name = Path(f"/proc/{process.pid}/task/{thread.id}/comm").read_text().strip()
        except OSError:
            name = ""
        if thread.id == process.pid:
            kind = "main_thread"
        elif name.startswith("event_engine"):
            kind = "grpc_event_engine_threads"
        else:
            kind = "other_threads"
        out[kind] += thread.user_time + thread.system_time
    return out


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy (every process, every core)."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq)


async def connect_agents(
    params: Params, address: str, token: str, workers: list[WorkerProcess]
) -> dict[str, Any]:
    """Start the worker processes (appended to `workers`, which the caller closes) and
    connect every simulated agent; raises if any was refused."""
    progress(f"{params.workers} workers connecting {params.agents} agents to {address}")
    for w, indices in enumerate(split_agents(params.agents, params.workers)):
        workers.append(await WorkerProcess.start(indices, address, token, params.seed + w))
    started = time.monotonic()
    answers = await asyncio.gather(*(w.ask("connect") for w in workers))
    registered = sum(a["registered"] for a in answers)
    refused = [r for a in answers for r in a["refused"]]
    progress(f"{registered} agents registered")
    if registered != params.agents:
        raise RuntimeError(f"only {registered} of {params.agents} agents registered: {refused}")
    return {
        "agents": params.agents,
        "registered": registered,
        "refused": refused,
        "seconds": round(time.monotonic() - started, 2),
    }


async def measure_window(
    seconds: float, server: psutil.Process, workers: list[WorkerProcess], params: Params
) -> dict[str, Any]:
    """The server's CPU and the heartbeats' fate over `seconds` of steady streaming."""
    interval = params.heartbeat_interval_s
    samples_per_heartbeat = samples_per(params)
    progress(f"measuring for {seconds:.0f} s")
    me = psutil.Process()
    rss0 = server.memory_info().rss
    worker_cpu0 = [w.cpu_seconds() for w in workers]
    busy0, mine0 = busy_cpu_seconds(), cpu_seconds(me)
    threads0 = thread_cpu_seconds(server)
    cpu0, t0 = cpu_seconds(server), time.monotonic()
    await asyncio.sleep(seconds)
    cpu1, t1 = cpu_seconds(server), time.monotonic()
    threads1 = thread_cpu_seconds(server)
    busy, mine = busy_cpu_seconds() - busy0, cpu_seconds(me) - mine0
    worker_cpu = [w.cpu_seconds() - c for w, c in zip(workers, worker_cpu0, strict=True)]
    rss1 = server.memory_info().rss
    wall = t1 - t0
    windows = await asyncio.gather(*(w.ask("window", start=t0, end=t1) for w in workers))
    timed = sorted((ms / 1000, us / 1e6) for w in windows for ms, us in w["rtt_us"])
    rtts = [rtt for _, rtt in timed]
    late = [us / 1e6 for w in windows for us in w["late_us"]]
    sent = sum(w["sent"] for w in windows)
    acks = sum(w["acks_received"] for w in windows)
    server_cpu = cpu1 - cpu0
    others = busy - server_cpu - sum(worker_cpu) - mine
    intended = params.agents / interval  # one heartbeat per agent per interval (the Welcome's)
    figures = {
        "seconds": round(wall, 2),
        "server_cpu_seconds": round(server_cpu, 3),
        "server_cpu_fraction_of_one_core": round(server_cpu / wall, 4),
        "server_cpu_us_per_heartbeat": round(server_cpu / acks * 1e6, 1) if acks else None,
        "metric_samples_per_heartbeat": samples_per_heartbeat,
        "metric_samples_acked_per_s": round(acks * samples_per_heartbeat / wall, 1),
        # Threads that ended inside the window are missing here (none are expected).
        "server_cpu_fraction_of_one_core_by_thread": {
            kind: round((threads1[kind] - threads0[kind]) / wall, 4) for kind in threads1
        },
        "server_rss_mib_start_end": [round(rss0 / 2**20, 1), round(rss1 / 2**20, 1)],
        "heartbeats_intended_per_s": round(intended, 1),
        "heartbeats_sent_per_s": round(sent / wall, 1),
        "acks_received_per_s": round(acks / wall, 1),
        "heartbeats_sent_in_window": sent,
        "of_those_acked": sum(w["acked_of_sent"] for w in windows),
        "load_offered": sent / wall >= OFFERED_LOAD_MIN_SHARE * intended,
        "rtt": rtt_summary(rtts),
        "slow_round_trips": slow_episodes(timed, wall),
        "client_send_lateness": rtt_summary(late),
        "client_worker_cpu_fraction_of_one_core": [round(c / wall, 3) for c in worker_cpu],
        # Everything else the machine ran meanwhile (it is shared): a noise gauge.
        "other_processes_cpu_cores": round(max(others, 0.0) / wall, 3),
    }
    rtt = figures["rtt"]
    progress(
        f"{acks / wall:.0f} acks/s, server {server_cpu / wall:.1%} of a core, rtt p50 "
        f"{rtt.get('p50_ms')} ms p99 {rtt.get('p99_ms')} ms, other processes "
        f"{figures['other_processes_cpu_cores']} cores"
    )
    return figures


def slow_episodes(timed: Sequence[tuple[float, float]], wall: float) -> dict[str, Any]:
    """Round trips over the p99 target, grouped into episodes (sent less than
    SLOW_EPISODE_GAP_S apart): one episode a second points at a periodic stall of the
    server's event loop rather than at load spread over the second."""
    slow = [at for at, rtt in timed if rtt * 1000 >= TARGETS["rtt_p99_ms_max"]]
    episodes: list[tuple[float, float, int]] = []  # first send, last send, count
    for at in slow:
        if episodes and at - episodes[-1][1] < SLOW_EPISODE_GAP_S:
            first, _, count = episodes[-1]
            episodes[-1] = (first, at, count + 1)
        else:
            episodes.append((at, at, 1))
    spans = sorted((last - first) * 1000 for first, last, _ in episodes)
    return {
        "threshold_ms": TARGETS["rtt_p99_ms_max"],
        "count": len(slow),
        "share": round(len(slow) / len(timed), 4) if timed else 0.0,
        "episodes": len(episodes),
        "episodes_per_s": round(len(episodes) / wall, 2),
        "episode_span_ms_p50": round(percentile(spans, 50), 1) if spans else None,
        "episode_span_ms_max": round(spans[-1], 1) if spans else None,
    }


async def stop_workers(workers: list[WorkerProcess]) -> dict[str, Any]:
    finals = await asyncio.gather(*(w.ask("stop") for w in workers))
    totals: dict[str, Any] = {
        key: sum(f[key] for f in finals) for key in ("sent", "acked", "unacked", "unexpected_acks")
    }
    totals["closed_by_master"] = [n for f in finals for n in f["closed_by_master"]]
    totals["acked_per_agent"] = {k: v for f in finals for k, v in f["acked_per_agent"].items()}
    return totals


# --- the master under load -----------------------------------------------------------------


async def against_master(
    params: Params, tmp: Path, while_silent: Awaitable[Any] | None = None
) -> dict[str, Any]:
    """The master's figures. `while_silent` (the smoke shape's two baselines) runs during
    the silent agent's wait, which is otherwise idle, and is awaited before the master
    stops; its result is under "while_silent"."""
    env = {"DET_MASTER_LOG_LEVEL": "INFO"}
    if params.lost_after_s is not None:
        env["DET_MASTER_AGENT_LINK__LOST_AFTER_S"] = str(params.lost_after_s)
    env["DET_MASTER_AGENT_LINK__HEARTBEAT_INTERVAL_S"] = str(params.heartbeat_interval_s)
    env["DET_MASTER_AGENT_LINK__METRICS_PERIOD_S"] = str(params.metrics_period_s)
    master = MasterProcess(tmp / "master", env=env)
    progress(f"starting det-master (log {master.log})")
    master.start()
    workers: list[WorkerProcess] = []
    result: dict[str, Any] = {}
    try:
        proc = psutil.Process(master.pid)
        async with api_client(master) as client:
            # The idle master: what it spends with no agent at all (its loops, the API).
            cpu0, t0 = cpu_seconds(proc), time.monotonic()
            await asyncio.sleep(params.idle_s)
            idle = (cpu_seconds(proc) - cpu0) / (time.monotonic() - t0)
            result["idle_master_cpu_fraction_of_one_core"] = round(idle, 4)
            registration = await connect_agents(
                params, master.agent_address, master.join_token, workers
            )
            registration["connected_in_api"] = await connected_agents(client)
            result["registration"] = registration
            progress(f"warm-up {params.warmup_s:.0f} s")
            await asyncio.sleep(params.warmup_s)
            result["window"] = await measure_window(params.window_s, proc, workers, params)
            side = asyncio.ensure_future(while_silent) if while_silent is not None else None
            try:
                result["silent_agent"] = await silent_agent(params, workers[0], client)
            except BaseException:
                if side is not None:
                    side.cancel()
                raise
            if side is not None:
                result["while_silent"] = await side
            progress("stopping the clients")
            totals = await stop_workers(workers)
            progress("waiting for the metrics loop to flush")
            sample_agent = agent_name(params.agents - 1)
            expected = totals["acked_per_agent"][sample_agent] * samples_per(params)
            samples = await flushed_samples(client, sample_agent, expected)
    finally:
        for worker in workers:
            await worker.close()
        progress("stopping det-master")
        master.stop()
    acked_per_agent: dict[str, int] = totals.pop("acked_per_agent")
    per_heartbeat = samples_per(params)
    rows = stored_rows(master.data_dir / "resolute.db")
    differ = {
        name: {"acked": acked, "rows": rows.get(name, 0)}
        for name, acked in acked_per_agent.items()
        if rows.get(name, 0) != acked * per_heartbeat
    }
    result["persistence"] = {
        "sample_agent": sample_agent,
        "sample_agent_heartbeats_acked": acked_per_agent[sample_agent],
        "sample_agent_rows_through_api": len(samples),
        "sample_agent_newest_row_gpus": len(samples[-1]["gpus"]) if samples else 0,
        "rows_in_sqlite_after_stop": sum(rows.values()),
        "heartbeats_acked_in_all": totals["acked"],
        "metric_samples_per_heartbeat": per_heartbeat,
        "agents_whose_rows_equal_their_acked_samples": len(acked_per_agent) - len(differ),
        "agents_that_differ": dict(list(differ.items())[:10]),
    }
    result["totals"] = totals
    return result


async def flushed_samples(
    client: httpx.AsyncClient, agent: str, expected: int
) -> list[dict[str, Any]]:
    """The agent's samples through the API once the metrics loop (which writes every
    second) has stored `expected` of them, or what is there after METRICS_FLUSH_TIMEOUT_S."""
    deadline = time.monotonic() + METRICS_FLUSH_TIMEOUT_S
    while True:
        reply = await client.get(f"/api/v1/agents/{agent}/metrics", params={"limit": 10_000})
        reply.raise_for_status()
        samples: list[dict[str, Any]] = reply.json()["samples"]
        if len(samples) >= expected or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(API_POLL_S)


def stored_rows(database: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT agent_id, count(*) FROM agent_metrics GROUP BY agent_id")
        return {agent_id: count for agent_id, count in rows}


async def silent_agent(
    params: Params, worker: WorkerProcess, client: httpx.AsyncClient
) -> dict[str, Any]:
    name = agent_name(worker.indices[0])
    lost_after = params.lost_after_s if params.lost_after_s is not None else 10.0
    progress(f"agent {name} goes silent (its stream stays open)")
    await worker.ask("silence", agent=name)
    deadline = time.monotonic() + lost_after + 30
    seen_at: float | None = None
    polls = 0
    while time.monotonic() < deadline:
        polls += 1
        if not await agent_connected(client, name):
            seen_at = time.monotonic()
            break
        await asyncio.sleep(API_POLL_S)
    status = await worker.ask("silent_status", agent=name)
    last_sent, missed = status["last_sent"], status["first_missed_due"]

    def since(start: float | None, end: float | None) -> float | None:
        return round(end - start, 3) if start is not None and end is not None else None

    figures = {
        "agent": name,
        "lost_after_s": lost_after,
        "api_connected_false_seen": seen_at is not None,
        "from_first_missed_heartbeat_to_api_disconnected_s": since(missed, seen_at),
        "from_last_heartbeat_to_api_disconnected_s": since(last_sent, seen_at),
        "from_last_heartbeat_to_stream_closed_by_master_s": since(last_sent, status["closed_at"]),
        "stream_close_seen_by_agent": status["close_reason"],
        "api_polls": polls,
        "api_poll_interval_s": API_POLL_S,
    }
    progress(
        f"{name} seen disconnected {figures['from_first_missed_heartbeat_to_api_disconnected_s']}"
        f" s after its first missed heartbeat"
    )
    return figures


# --- the gRPC floor ------------------------------------------------------------------------


class EchoService(agent_pb2_grpc.AgentServiceServicer):
    """The least a grpc.aio server can do per heartbeat: parse it and answer the ack, in the
    stream's own coroutine (no hub, no queue, no database)."""

    def __init__(self, heartbeat_interval_s: float, metrics_period_s: float) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.metrics_period_s = metrics_period_s

    async def Connect(
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: Any
    ) -> AsyncIterator[pb.MasterMessage]:
        async for message in request_iterator:
            kind = message.WhichOneof("body")
            if kind == "hello":
                welcome = pb.Welcome(
                    stream_id=str(uuid.uuid4()),
                    heartbeat_interval_s=self.heartbeat_interval_s,
                    metrics_period_s=self.metrics_period_s,
                )
                yield pb.MasterMessage(welcome=welcome)
            elif kind == "heartbeat":
                beat = message.heartbeat
                ack = pb.HeartbeatAck(seq=beat.seq, sent_unix_nanos=beat.sent_unix_nanos)
                yield pb.MasterMessage(heartbeat_ack=ack)


async def echo_main(heartbeat_interval_s: float, metrics_period_s: float) -> None:
    from master.grpc_server import channel_options
    from master.settings import AgentLinkSettings

    server = grpc.aio.server(options=channel_options(AgentLinkSettings()))
    service = EchoService(heartbeat_interval_s, metrics_period_s)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sys.stdout.write(json.dumps({"port": port}) + "\n")
    sys.stdout.flush()
    await server.wait_for_termination()


@contextlib.asynccontextmanager
async def echo_server(params: Params) -> AsyncIterator[asyncio.subprocess.Process]:
    """EchoService in a process of its own, terminated on the way out. It is started before
    the master, so that its start-up overlaps the master's, and idles until grpc_floor."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.bench_heartbeats",
        "--echo-server",
        "--heartbeat-interval-s",
        str(params.heartbeat_interval_s),
        "--metrics-period-s",
        str(params.metrics_period_s),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def grpc_floor(params: Params, process: asyncio.subprocess.Process) -> dict[str, Any]:
    """The same agents against EchoService (`process`, from echo_server): the transport's
    share."""
    workers: list[WorkerProcess] = []
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
        if not line:
            raise RuntimeError("the echo server exited while starting")
        address = f"127.0.0.1:{json.loads(line)['port']}"
        progress(f"gRPC floor: bare echo server on {address}")
        registration = await connect_agents(params, address, "", workers)
        await asyncio.sleep(params.warmup_s)
        window = await measure_window(
            params.floor_window_s, psutil.Process(process.pid), workers, params
        )
        totals = await stop_workers(workers)
        totals.pop("acked_per_agent")
    finally:
        for worker in workers:
            await worker.close()
    return {"registration": registration, "window": window, "totals": totals}


# --- the naive way -------------------------------------------------------------------------


def parsed_heartbeats(
    count: int, agents: int, seed: int, samples_per_heartbeat: int, metrics_period_s: float
) -> list[tuple[str, pb.Heartbeat]]:
    """What the master's servicer hands on: parsed Heartbeat messages, each carrying the
    samples of one heartbeat interval, a metrics period apart."""
    rng = random.Random(seed)
    period_ms = round(metrics_period_s * 1000)
    templates = [
        pb.Heartbeat(samples=[metric_sample(i, rng)] * samples_per_heartbeat).SerializeToString()
        for i in range(agents)
    ]
    out: list[tuple[str, pb.Heartbeat]] = []
    for n in range(count):
        heartbeat = pb.Heartbeat.FromString(templates[n % agents])
        heartbeat.seq = n // agents + 1
        for k, sample in enumerate(heartbeat.samples):
            sample.unix_millis += ((n // agents) * samples_per_heartbeat + k) * period_ms
        out.append((agent_name(n % agents), heartbeat))
    return out


def naive_row(
    model: type[AgentMetricModel], agent_id: str, sample: pb.MetricSample
) -> AgentMetricModel:
    """The ORM row of one sample (`model` is AgentMetricModel, imported by the caller)."""
    return model(
        agent_id=agent_id,
        unix_millis=sample.unix_millis,
        cpu_util_simple=sample.cpu_util_simple,
        memory_free=sample.memory_free,
        memory_used=sample.memory_used,
        disk_throughput_read=sample.disk_throughput_read,
        disk_throughput_write=sample.disk_throughput_write,
        disk_iops=sample.disk_iops,
        net_throughput_sent=sample.net_throughput_sent,
        net_throughput_recv=sample.net_throughput_recv,
        gpus=[
            {
                "index": g.index,
                "uuid": g.uuid,
                "gpu_util": g.gpu_util,
                "gpu_memory_used": g.gpu_memory_used,
                "gpu_free_memory": g.gpu_free_memory,
                "temperature_c": g.temperature_c,
                "power_w": g.power_w,
            }
            for g in sample.gpus
        ],
    )


async def naive_comparison(params: Params, tmp: Path) -> dict[str, Any]:
    from sqlalchemy import func, select

    from master.db.migrate import upgrade_to_head
    from master.db.models import AgentMetricModel
    from master.db.session import create_engine, create_session_factory, session_scope
    from master.services.agent_protos import reading_of
    from master.services.metrics import MetricsBuffer, MetricsLoop
    from master.settings import MasterSettings

    per_heartbeat = samples_per(params)
    heartbeats = parsed_heartbeats(
        params.naive_heartbeats, params.agents, params.seed, per_heartbeat, params.metrics_period_s
    )
    offered_per_s = params.agents / params.heartbeat_interval_s
    figures: dict[str, Any] = {
        "heartbeats": len(heartbeats),
        "agents": params.agents,
        "metric_samples_per_heartbeat": per_heartbeat,
    }
    # Both variants start from a fresh migrated file: copies of one, migrated once.
    migrated = tmp / "migrated.db"
    engine = create_engine(f"sqlite+aiosqlite:///{migrated}")
    try:
        await upgrade_to_head(engine)
    finally:
        await engine.dispose()
    for variant in ("naive_one_transaction_per_heartbeat", "ours_buffer_and_bulk_insert"):
        database = tmp / f"{variant}.db"
        shutil.copyfile(migrated, database)
        engine = create_engine(f"sqlite+aiosqlite:///{database}")
        try:
            factory = create_session_factory(engine)
            buffer = MetricsBuffer()
            loop = MetricsLoop(factory, buffer, MasterSettings(data_dir=tmp / "naive"))
            progress(f"{variant}: {len(heartbeats)} heartbeats")
            cpu0, wall0 = time.process_time(), time.perf_counter()
            if variant.startswith("naive"):
                for agent_id, heartbeat in heartbeats:
                    async with session_scope(factory) as session:
                        for sample in heartbeat.samples:
                            session.add(naive_row(AgentMetricModel, agent_id, sample))
            else:
                for n, (agent_id, heartbeat) in enumerate(heartbeats, 1):
                    buffer.add(agent_id, [reading_of(s) for s in heartbeat.samples])
                    if n % params.agents == 0 or n == len(heartbeats):
                        await loop.write_pending()  # once per second's worth of heartbeats
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - wall0
            async with factory() as session:
                stored = await session.scalar(select(func.count()).select_from(AgentMetricModel))
        finally:
            await engine.dispose()
        figures[variant] = {
            "cpu_us_per_heartbeat": round(cpu / len(heartbeats) * 1e6, 1),
            "wall_us_per_heartbeat": round(wall / len(heartbeats) * 1e6, 1),
            "rows_stored": stored,
            "core_fraction_at_the_offered_rate": round(cpu / len(heartbeats) * offered_per_s, 4),
            "max_heartbeats_per_s_one_writer": round(len(heartbeats) / wall),
        }
    naive = figures["naive_one_transaction_per_heartbeat"]
    ours = figures["ours_buffer_and_bulk_insert"]
    figures["ratio_naive_over_ours_cpu_per_heartbeat"] = ratio(
        naive["cpu_us_per_heartbeat"], ours["cpu_us_per_heartbeat"]
    )
    figures["ratio_naive_over_ours_wall_per_heartbeat"] = ratio(
        naive["wall_us_per_heartbeat"], ours["wall_us_per_heartbeat"]
    )
    return figures


# --- main ----------------------------------------------------------------------------------


# (agents, workers, warmup_s, window_s, the gRPC floor's longest window, idle_s, naive
# heartbeats) of each shape. The smoke shape: two agents and a 1 s window, heartbeats every
# 0.25 s carrying two samples each (metrics every 0.125 s); an agent is lost after 2.5 s
# without one (ten intervals: a loaded machine's stalls must not drop the other agent).
SHAPES = {
    "full": (1000, 2, 5.0, 30.0, 20.0, 5.0, 3000),
    "quick": (50, 1, 2.0, 5.0, 3.0, 2.0, 200),
    "smoke": (2, 1, 0.2, 1.0, 0.5, 0.2, 20),
}
SMOKE_HEARTBEAT_INTERVAL_S = 0.25
SMOKE_LOST_AFTER_S = 2.5


def params_of(args: argparse.Namespace) -> Params:
    from master.settings import AgentLinkSettings

    mode = common.mode_of(args)
    agents, workers, warmup, window, floor_max, idle, naive = SHAPES[mode]
    window = args.window or window
    defaults = AgentLinkSettings()  # the master's: heartbeats every 1 s, metrics at 1 Hz
    interval = args.heartbeat_interval_s or (
        SMOKE_HEARTBEAT_INTERVAL_S if mode == "smoke" else defaults.heartbeat_interval_s
    )
    period = args.metrics_period_s or (
        interval / 2 if mode == "smoke" else defaults.metrics_period_s
    )
    lost_after: float | None = None  # the master's default (10 s)
    if args.lost_after_s is not None:
        lost_after = args.lost_after_s
    elif mode != "full":
        # Heartbeats must fit five times in it: the agents' fence (60%) needs three.
        lost_after = 5.0 * interval
        if mode == "smoke":
            lost_after = max(lost_after, SMOKE_LOST_AFTER_S)
    return Params(
        agents=args.agents or agents,
        workers=args.workers or workers,
        warmup_s=args.warmup if args.warmup is not None else warmup,
        window_s=window,
        floor_window_s=0.0 if args.no_floor else min(window, floor_max),
        idle_s=idle,
        lost_after_s=lost_after,
        heartbeat_interval_s=interval,
        metrics_period_s=period,
        naive_heartbeats=naive,
        seed=args.seed,
    )


def judge(result: dict[str, Any], params: Params) -> dict[str, Any]:
    window = result["window"]
    silent = result["silent_agent"]
    cpu = window["server_cpu_fraction_of_one_core"]
    p99 = window["rtt"].get("p99_ms")
    lost = silent["from_first_missed_heartbeat_to_api_disconnected_s"]
    return {
        "judged_at_full_scale": params.agents >= 1000 and params.lost_after_s is None,
        "load_offered": window["load_offered"],
        "master_cpu_fraction_of_one_core_max": TARGETS["master_cpu_fraction_of_one_core_max"],
        "master_cpu_fraction_of_one_core": cpu,
        "master_cpu_met": cpu <= TARGETS["master_cpu_fraction_of_one_core_max"],
        "rtt_p99_ms_max": TARGETS["rtt_p99_ms_max"],
        "rtt_p99_ms": p99,
        "rtt_p99_met": p99 is not None and p99 < TARGETS["rtt_p99_ms_max"],
        "silent_agent_lost_s_max": TARGETS["silent_agent_lost_s_max"],
        "silent_agent_lost_s_from_first_missed_heartbeat": lost,
        "silent_agent_lost_met": lost is not None and lost <= TARGETS["silent_agent_lost_s_max"],
        "silent_agent_lost_s_from_last_heartbeat": silent[
            "from_last_heartbeat_to_api_disconnected_s"
        ],
    }


def compare(
    result: dict[str, Any], naive: dict[str, Any], floor: dict[str, Any] | None
) -> dict[str, Any]:
    """Our measured master against the same master with the naive persistence swapped in,
    and against the bare gRPC floor."""
    window = result["window"]
    ours = window["server_cpu_us_per_heartbeat"]
    if ours is None:
        return {}
    ours_persist = naive["ours_buffer_and_bulk_insert"]["cpu_us_per_heartbeat"]
    naive_persist = naive["naive_one_transaction_per_heartbeat"]["cpu_us_per_heartbeat"]
    projected = max(ours - ours_persist, 0.0) + naive_persist
    rate = window["acks_received_per_s"]
    idle = result["idle_master_cpu_fraction_of_one_core"]
    offered = window["heartbeats_intended_per_s"]
    figures: dict[str, Any] = {
        "ours_master_cpu_us_per_heartbeat_measured": ours,
        "ours_master_cpu_us_per_heartbeat_above_idle": round(
            (window["server_cpu_fraction_of_one_core"] - idle) / rate * 1e6, 1
        )
        if rate
        else None,
        "naive_master_cpu_us_per_heartbeat_projected": round(projected, 1),
        "ours_master_core_fraction_at_the_offered_rate": round(ours * offered / 1e6, 4),
        "naive_master_core_fraction_at_the_offered_rate_projected": round(
            projected * offered / 1e6, 4
        ),
        "ratio_naive_over_ours_master_cpu": ratio(projected, ours),
        "naive_can_keep_up_at_the_offered_rate": naive["naive_one_transaction_per_heartbeat"][
            "max_heartbeats_per_s_one_writer"
        ]
        >= offered,
    }
    if floor is not None and floor["window"]["server_cpu_us_per_heartbeat"]:
        bare = floor["window"]["server_cpu_us_per_heartbeat"]
        figures["grpc_floor_cpu_us_per_heartbeat"] = bare
        figures["ours_master_over_grpc_floor"] = ratio(ours, bare)
    return figures


async def run(args: argparse.Namespace) -> dict[str, Any]:
    params = params_of(args)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    facts = host_facts(("grpcio", "protobuf", "sqlalchemy", "aiosqlite", "fastapi", "uvicorn"))
    progress(f"{common.mode_of(args)} run: {params}")
    floor: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="resolute-bench-hb-") as tmp:
        if common.mode_of(args) == "smoke":
            # No timing is judged in the smoke shape: both baselines fill the silent agent's
            # wait, which is otherwise idle.
            async with echo_server(params) as echo:

                async def baselines() -> tuple[dict[str, Any] | None, dict[str, Any]]:
                    bare = await grpc_floor(params, echo) if params.floor_window_s > 0 else None
                    return bare, await naive_comparison(params, Path(tmp))

                result = await against_master(params, Path(tmp), baselines())
                floor, naive = result.pop("while_silent")
        else:
            if params.floor_window_s > 0:
                async with echo_server(params) as echo:
                    result = await against_master(params, Path(tmp))
                    floor = await grpc_floor(params, echo)
            else:
                result = await against_master(params, Path(tmp))
            naive = await naive_comparison(params, Path(tmp))
    return {
        "benchmark": "resolute agent heartbeats: simulated agents, 8-GPU metrics at 1 Hz",
        "mode": common.mode_of(args),
        "command": " ".join(["python -m benchmarks.bench_heartbeats", *sys.argv[1:]]),
        "started_at": started_at,
        "total_seconds": round(seconds_since_start(), 1),
        "machine": facts,
        "parameters": asdict(params) | {"gpus_per_agent": GPUS_PER_AGENT},
        **result,
        "grpc_floor_bare_echo_server": floor,
        "persistence_naive_vs_ours": naive,
        "master_naive_vs_ours": compare(result, naive, floor),
        "targets": judge(result, params),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_heartbeats",
        description="Agent heartbeat benchmark; prints one JSON document on stdout.",
    )
    common.add_shape_flags(
        parser,
        quick="50 agents, a 5 s window",
        smoke="2 agents, a 1 s window, heartbeats every 0.25 s with 2 samples each",
    )
    parser.add_argument("--agents", type=int, help="simulated agents (default 1000)")
    parser.add_argument("--workers", type=int, help="client processes (default 2)")
    parser.add_argument("--window", type=float, help="measured seconds (default 30)")
    parser.add_argument("--warmup", type=float, help="seconds streaming before the window")
    parser.add_argument(
        "--heartbeat-interval-s",
        type=float,
        help=(
            "the master's agent_link.heartbeat_interval_s (default: the master's, 1; --smoke: "
            "0.25); metrics are still sampled every metrics period, so each heartbeat carries "
            "the interval's samples"
        ),
    )
    parser.add_argument(
        "--lost-after-s",
        type=float,
        help="the master's agent_link.lost_after_s (default: the master's, 10; --quick: 5 "
        "heartbeat intervals; --smoke: 2.5)",
    )
    parser.add_argument(
        "--metrics-period-s",
        type=float,
        help="the master's agent_link.metrics_period_s, how often agents sample (default: "
        "the master's, 1; --smoke: half the heartbeat interval)",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the bare gRPC floor")
    parser.add_argument("--seed", type=int, default=7, help="seeds phases and metric values")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    # Internal: the client processes and the bare echo server run this module too.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.worker is not None:
        asyncio.run(worker_main(json.loads(args.worker)))
        return
    if args.echo_server:
        params = params_of(args)
        asyncio.run(echo_main(params.heartbeat_interval_s, params.metrics_period_s))
        return
    result = asyncio.run(run(args))
    common.emit_report(result, args.out)


if __name__ == "__main__":
    main()
