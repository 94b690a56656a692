"""Trial runtime benchmark: how long a submitted experiment takes to start its ranks, and
what the training library costs a training loop.

    .venv/bin/python -m benchmarks.bench_trial_runtime [--quick | --smoke] [--experiments N]
        [--slots N] [--steps N] [--out PATH]

Prints one JSON document on stdout (progress goes to stderr): the machine, the parameters,
the figures, the targets and whether each was met. It starts its own local cluster: a
`det-master` on SQLite in a temporary directory and one `det-agent` with artificial CPU
slots, on free ports.

(a) Launch latency. Each experiment's entrypoint is `sh -c 'date +%s.%N > DIR/$RANK'`, so
the user's imports do not count. Measured per experiment, against the wall clock the ranks'
`date` reads too: from just before POST /api/v1/experiments to the last rank's stamp (every
rank started), with the POST's own reply time and the first rank's stamp beside it. The
benchmark waits for each trial to end, so every submit finds the cluster idle.
Naive comparison, in the same run: a scheduler that relies only on its periodic pass. Our
master runs a pass as soon as a submit commits (it wakes its own loop) and otherwise checks
every scheduler_interval_s (0.5 s) whether any process committed a change. A second
`det-master` on the same database with its loops off (DET_MASTER_RUN_LOOPS=false, API only)
takes the naive experiments: their submit wakes nothing, so the first master sees them on
its periodic check, exactly as a periodic-only scheduler would. Same code, same database,
same agent: the difference is the wake-up alone. The floor, also reported: the same `sh -c`
ranks spawned straight from this process (what any launcher pays to fork and exec them).

(b) Per-step overhead of the library, inside a real trial on that cluster (so with the
master's token, run id and the preemption long-poll live): a loop of 100 ms steps (10 steps
per second) run three ways, interleaved in rounds so drift hits all three alike:
- bare: the step alone;
- library: the step, then ctx.train.report_training_metrics(...) and
  ctx.preempt.should_preempt(), as examples/ddp_synthetic/train.py calls them every step;
- library to a stub master: the same, from a second library context whose master is a
  minimal HTTP server in a process of its own (it answers `{}` at once and holds the
  preemption long-poll), so the master's own work, which shares this machine's cores with
  the loop here, is left out;
- naive: the step, then a synchronous HTTP POST of the same metrics and a synchronous GET of
  the preemption signal (timeout_seconds=0), each on a new connection (urllib), the way a
  loop without a client library would report.
Twice: with steps that sleep (an I/O- or accelerator-bound loop, where the library's sender
thread runs while the loop waits) and with steps of pure-Python busy work calibrated to
100 ms (a CPU-bound loop, where that thread competes for the GIL). Overhead = step time
over the bare one, minus 1 (mean and median); also the calls' own time on the loop's thread
plus the CPU the process's other threads add per step, over the step's length (`cost`): what
the library takes from a CPU-bound loop, without the noise of the loop's own work on a
shared machine. The master's CPU per step is reported beside each variant.

`--smoke` (one launch per variant and no warm-up, two steps of 20 ms per loop variant) is the
smallest shape that still runs every path, for the smoke test; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks import common
from benchmarks.common import host_facts, progress, seconds_since_start
from harness.cluster import AgentProcess, MasterProcess
from harness.figures import percentile, ratio

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
STAMP_POLL_S = 0.002
TRIAL_TIMEOUT_S = 120.0
SCHEDULER_INTERVAL_S = 0.5  # the master's default scheduler_interval_s
# Nothing is read from the masters once the run is over, and an ended trial's preemption
# long-poll keeps a master's graceful shutdown waiting its 5 s limit: SIGKILL after 1 s.
MASTER_STOP_GRACE_S = 1.0
TARGETS = {"launch_p50_s_max": 1.0, "library_overhead_fraction_max": 0.01}


@dataclass(frozen=True)
class Params:
    experiments: int  # per variant (ours, naive)
    slots: int  # artificial slots of the agent = ranks per experiment
    steps: int  # per variant and step kind
    rounds: int  # the steps are split into this many interleaved rounds
    step_s: float
    seed: int  # of the launches' random phases
    warmup_launches: int = 1  # per variant, unmeasured, before the measured ones


# --- the local cluster -----------------------------------------------------------------------


@dataclass
class Cluster:
    tmp: Path
    master: MasterProcess
    agent: AgentProcess
    ours: httpx.Client  # the master that schedules (woken by its own submits)
    # The API-only master on the same database (wakes nothing) and a client of it; None
    # in a cluster made without it.
    api_only: MasterProcess | None = None
    naive: httpx.Client | None = None


@contextlib.contextmanager
def local_cluster(tmp: Path, slots: int, *, with_api_only: bool = True) -> Iterator[Cluster]:
    data = tmp / "data"
    with contextlib.ExitStack() as stack:
        master = MasterProcess(data, label="master")
        stack.callback(master.stop, MASTER_STOP_GRACE_S)
        master.start()
        agent = AgentProcess(master, "bench-agent", tmp / "agent", slots=slots)
        stack.callback(agent.stop)
        agent.start()
        cluster = Cluster(tmp, master, agent, stack.enter_context(master.client()))
        if with_api_only:
            # The API-only master: no scheduler, no agent link, no loops; same data dir. It
            # starts once the first has migrated the database (meanwhile the agent connects).
            api_only = MasterProcess(
                data, label="master-api-only", env={"DET_MASTER_RUN_LOOPS": "false"}
            )
            stack.callback(api_only.stop, MASTER_STOP_GRACE_S)
            api_only.start()
            cluster.api_only = api_only
            cluster.naive = stack.enter_context(api_only.client())
        agent.wait_connected(START_TIMEOUT_S)
        yield cluster


def submit(client: httpx.Client, config: dict[str, Any]) -> int:
    body = {"config": yaml.safe_dump(config), "modelDefinition": [], "activate": True}
    reply = client.post("/api/v1/experiments", json=body)
    if reply.status_code != 200:
        raise RuntimeError(f"POST /api/v1/experiments -> {reply.status_code}: {reply.text}")
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


def wait_ended(client: httpx.Client, experiment_id: int, cluster: Cluster) -> str:
    deadline = time.monotonic() + TRIAL_TIMEOUT_S
    while time.monotonic() < deadline:
        state: str = client.get(f"/api/v1/experiments/{experiment_id}").json()["experiment"][
            "state"
        ]
        if state.removeprefix("STATE_") in ("COMPLETED", "CANCELED", "ERROR"):
            return state.removeprefix("STATE_")
        time.sleep(0.05)
    raise RuntimeError(
        f"experiment {experiment_id} did not end in {TRIAL_TIMEOUT_S:.0f} s:\n"
        f"{cluster.master.output(4000)}\n{cluster.agent.output(4000)}"
    )


# --- (a) launch latency ----------------------------------------------------------------------


def stamp_config(stamps: Path, slots: int) -> dict[str, Any]:
    return {
        "name": f"launch-{stamps.name}",
        "entrypoint": ["sh", "-c", f'date +%s.%N > "{stamps}/$RANK"'],
        "resources": {"slots_per_trial": slots},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
        "max_restarts": 0,
    }


def read_stamps(stamps: Path, ranks: int, deadline: float) -> list[float]:
    while True:
        found: list[float] = []
        for rank in range(ranks):
            with contextlib.suppress(OSError, ValueError):
                found.append(float((stamps / str(rank)).read_text().strip()))
        if len(found) == ranks:
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(found)} of {ranks} ranks started ({stamps})")
        time.sleep(STAMP_POLL_S)


def launch_once(
    cluster: Cluster, client: httpx.Client, label: str, slots: int, phase_s: float
) -> dict[str, Any]:
    stamps = cluster.tmp / "stamps" / f"{label}-{uuid.uuid4().hex[:8]}"
    stamps.mkdir(parents=True)
    config = stamp_config(stamps, slots)
    # A random moment within the scheduler's period: right after the previous trial's
    # release (which ran a pass) a periodic-only scheduler would always wait the full period.
    time.sleep(phase_s)
    started = time.time()
    experiment_id = submit(client, config)
    replied = time.time()
    times = read_stamps(stamps, slots, time.monotonic() + TRIAL_TIMEOUT_S)
    state = wait_ended(cluster.ours, experiment_id, cluster)
    if state != "COMPLETED":
        raise RuntimeError(f"launch experiment {experiment_id} ended {state}")
    return {
        "experiment": experiment_id,
        "post_reply_s": round(replied - started, 4),
        "first_rank_s": round(min(times) - started, 4),
        "every_rank_s": round(max(times) - started, 4),
    }


def floor_spawn(tmp: Path, slots: int) -> float:
    """The same ranks spawned straight from here (through setpriv, as the agent does)."""
    stamps = tmp / "stamps" / f"floor-{uuid.uuid4().hex[:8]}"
    stamps.mkdir(parents=True)
    setpriv = ["setpriv", "--pdeathsig", "KILL"] if _has("setpriv") else []
    started = time.time()
    procs = [
        subprocess.Popen(
            [*setpriv, "sh", "-c", f'date +%s.%N > "{stamps}/{rank}"'],
            env={**os.environ, "RANK": str(rank)},
            start_new_session=True,
        )
        for rank in range(slots)
    ]
    times = read_stamps(stamps, slots, time.monotonic() + 30)
    for proc in procs:
        proc.wait(timeout=30)
    return max(times) - started


def _has(tool: str) -> bool:
    return any((Path(p) / tool).exists() for p in os.environ.get("PATH", "").split(os.pathsep))


def summary(values: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50_s": round(percentile(ordered, 50), 4),
        "mean_s": round(statistics.fmean(ordered), 4),
        "max_s": round(ordered[-1], 4),
        "min_s": round(ordered[0], 4),
    }


def launch_latency(cluster: Cluster, params: Params) -> dict[str, Any]:
    assert cluster.naive is not None, "launch latency needs the API-only master"
    ours: list[dict[str, Any]] = []
    naive: list[dict[str, Any]] = []
    floor: list[float] = []
    rng = random.Random(params.seed)

    def phase() -> float:
        return rng.uniform(0.0, SCHEDULER_INTERVAL_S)

    # Warm-up: the first launch pays for imports and caches on both masters and the agent.
    for i in range(params.warmup_launches):
        launch_once(cluster, cluster.ours, f"warmup-{i}", params.slots, phase())
        launch_once(cluster, cluster.naive, f"warmup-naive-{i}", params.slots, phase())
    for i in range(params.experiments):
        # Alternate, so that drift of this shared machine hits both alike.
        ours.append(launch_once(cluster, cluster.ours, f"ours-{i}", params.slots, phase()))
        naive.append(launch_once(cluster, cluster.naive, f"naive-{i}", params.slots, phase()))
        floor.append(floor_spawn(cluster.tmp, params.slots))
        progress(
            f"launch {i + 1}/{params.experiments}: ours {ours[-1]['every_rank_s']:.3f} s, "
            f"periodic-only {naive[-1]['every_rank_s']:.3f} s"
        )
    ours_every = summary([r["every_rank_s"] for r in ours])
    naive_every = summary([r["every_rank_s"] for r in naive])
    return {
        "ranks_per_experiment": params.slots,
        "ours_woken_on_submit": {
            "every_rank_started": ours_every,
            "first_rank_started": summary([r["first_rank_s"] for r in ours]),
            "post_reply": summary([r["post_reply_s"] for r in ours]),
            "runs": ours,
        },
        "naive_periodic_pass_only": {
            "every_rank_started": naive_every,
            "post_reply": summary([r["post_reply_s"] for r in naive]),
            "runs": naive,
        },
        "floor_spawn_from_this_process": summary(floor),
        "ratio_naive_over_ours_p50": ratio(naive_every["p50_s"], ours_every["p50_s"]),
        "ratio_naive_over_ours_mean": ratio(naive_every["mean_s"], ours_every["mean_s"]),
    }


# --- (b) per-step overhead, inside a trial -----------------------------------------------------


def overhead_config(out: Path, params: Params, master_pid: int) -> dict[str, Any]:
    loop = {"out": str(out), "master_pid": master_pid, **asdict(params)}
    return {
        "name": "step-overhead",
        "entrypoint": [
            "python3",
            "-m",
            "benchmarks.bench_trial_runtime",
            "--step-loop",
            json.dumps(loop),
        ],
        "resources": {"slots_per_trial": 1},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": params.steps}},
        "max_restarts": 0,
        "environment": {"environment_variables": [f"PYTHONPATH={ROOT}"]},
    }


def step_overhead(cluster: Cluster, params: Params) -> dict[str, Any]:
    out = cluster.tmp / "step-loop.json"
    config = overhead_config(out, params, cluster.master.pid)
    experiment_id = submit(cluster.ours, config)
    state = wait_ended(cluster.ours, experiment_id, cluster)
    if state != "COMPLETED" or not out.exists():
        trial = cluster.ours.get(f"/api/v1/experiments/{experiment_id}/trials").json()
        trial_id = trial["trials"][0]["id"]
        logs = cluster.ours.get(f"/api/v1/trials/{trial_id}/logs").text[-4000:]
        raise RuntimeError(f"the step-loop trial ended {state}:\n{logs}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def calibrate(step_s: float) -> int:
    """Iterations of busy_work that take about `step_s` here (median of 5 probes)."""
    probe = 200_000
    seconds = []
    for _ in range(5):
        started = time.perf_counter()
        busy_work(probe)
        seconds.append(time.perf_counter() - started)
    return max(1, int(probe * step_s / statistics.median(seconds)))


def busy_work(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


class NaiveReporter:
    """A synchronous POST and GET per step, each on a new connection (urllib)."""

    def __init__(self) -> None:
        self.master = os.environ["DET_MASTER"].rstrip("/")
        self.trial_id = int(os.environ["DET_TRIAL_ID"])
        self.run_id = int(os.environ["DET_TRIAL_RUN_ID"])
        self.allocation_id = os.environ["DET_ALLOCATION_ID"]
        self.headers = {
            "Authorization": f"Bearer {os.environ['DET_SESSION_TOKEN']}",
            "Content-Type": "application/json",
        }

    def report(self, steps: int, metrics: dict[str, float]) -> bool:
        body = {
            "group": "training",
            "metrics": {
                "trialId": self.trial_id,
                "trialRunId": self.run_id,
                "stepsCompleted": steps,
                "metrics": {"avgMetrics": metrics, "batchMetrics": None},
                "reportTime": None,
            },
        }
        post = urllib.request.Request(
            f"{self.master}/api/v1/trials/{self.trial_id}/metrics",
            data=json.dumps(body).encode(),
            headers=self.headers,
            method="POST",
        )
        with urllib.request.urlopen(post, timeout=30) as reply:
            reply.read()
        signal_url = (
            f"{self.master}/api/v1/allocations/{self.allocation_id}/signals/preemption"
            "?timeout_seconds=0"
        )
        poll = urllib.request.Request(signal_url, headers=self.headers)
        with urllib.request.urlopen(poll, timeout=30) as reply:
            return bool(json.loads(reply.read()).get("preempt"))


@dataclass
class Block:
    """What one variant's steps cost: per step wall and call times, and CPU totals."""

    wall: list[float]
    calls: list[float]
    process_cpu_s: float = 0.0  # this trial process, every thread (the library's sender too)
    loop_thread_cpu_s: float = 0.0  # the loop's own thread
    master_cpu_s: float = 0.0  # the master process (it answers the reports)


def master_cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class StubHandler(http.server.BaseHTTPRequestHandler):
    """Answers what the library sends with the least work: `{}` to a POST, and the
    preemption long-poll only when its timeout ends (as the master does when it does not
    want the trial to stop)."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the master's server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._reply(b"{}")

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        time.sleep(min(float(query.get("timeout_seconds", ["0"])[0]), 60.0))
        self._reply(b'{"preempt": false}')

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_stub() -> None:
    """The stub master, in a process of its own so that it takes nothing from the loop's."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


@contextlib.contextmanager
def stub_server() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_trial_runtime", "--stub-server"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def stub_context(url: str) -> Iterator[Any]:
    """A second library context, the same trial's, whose master is the stub."""
    import resolute

    real = os.environ["DET_MASTER"]
    os.environ["DET_MASTER"] = url
    try:
        ctx = resolute.init(seed_everything=False)
    finally:
        os.environ["DET_MASTER"] = real
    with ctx:
        yield ctx


def step_loop(loop: dict[str, Any]) -> None:
    """Runs inside the trial (the experiment's entrypoint); writes its figures to loop["out"]."""
    import resolute  # the trial's own import, not counted

    params = Params(**{k: loop[k] for k in Params.__dataclass_fields__})
    master_pid = int(loop["master_pid"])
    iterations = calibrate(params.step_s)
    naive = NaiveReporter()
    per_round = max(1, params.steps // params.rounds)
    figures: dict[str, Any] = {
        "busy_work_iterations_per_step": iterations,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    with (
        resolute.init(seed_everything=False) as ctx,
        stub_server() as stub_url,
        stub_context(stub_url) as stub_ctx,
    ):
        step_number = 0

        def library(step: int, loss: float) -> None:
            ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
            ctx.preempt.should_preempt()

        def library_to_stub(step: int, loss: float) -> None:
            stub_ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
            stub_ctx.preempt.should_preempt()

        def naive_calls(step: int, loss: float) -> None:
            naive.report(step, {"loss": loss})

        variants: dict[str, Callable[[int, float], None] | None] = {
            "bare": None,
            "library": library,
            "library_to_stub_server": library_to_stub,
            "naive_sync_http": naive_calls,
        }
        for kind in ("sleep", "cpu"):
            blocks = {name: Block([], []) for name in variants}
            flushes: list[float] = []
            for round_index in range(params.rounds):
                names = list(variants)
                shift = round_index % len(names)  # rotate who goes first
                for name in names[shift:] + names[:shift]:
                    call, block = variants[name], blocks[name]
                    cpu_before = time.process_time()
                    thread_before = time.thread_time()
                    master_before = master_cpu_seconds(master_pid)
                    for _ in range(per_round):
                        step_number += 1
                        started = time.perf_counter()
                        if kind == "sleep":
                            time.sleep(params.step_s)
                        else:
                            busy_work(iterations)
                        worked = time.perf_counter()
                        if call is not None:
                            call(step_number, 1.0 / step_number)
                        ended = time.perf_counter()
                        block.wall.append(ended - started)
                        block.calls.append(ended - worked)
                    # Whatever the sender still has queued is this block's cost, not the
                    # next one's: wait for it (outside the timed steps).
                    flush_started = time.perf_counter()
                    ctx.train.flush()
                    stub_ctx.train.flush()
                    if call is library:
                        flushes.append(time.perf_counter() - flush_started)
                    block.process_cpu_s += time.process_time() - cpu_before
                    block.loop_thread_cpu_s += time.thread_time() - thread_before
                    block.master_cpu_s += master_cpu_seconds(master_pid) - master_before
            figures[kind] = describe_blocks(blocks, flushes)
        figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(loop["out"]).write_text(json.dumps(figures))


def describe_blocks(blocks: dict[str, Block], flushes: list[float]) -> dict[str, Any]:
    bare = blocks["bare"]
    steps = len(bare.wall)
    bare_wall = statistics.fmean(bare.wall)
    bare_p50 = percentile(sorted(bare.wall), 50)

    def other_threads_ms(block: Block) -> float:
        """CPU per step of the process's threads other than the loop's (the library's
        sender and preemption watcher): free of the noise in the loop's own work."""
        return (block.process_cpu_s - block.loop_thread_cpu_s) / len(block.wall) * 1e3

    figures: dict[str, Any] = {
        "steps_per_variant": steps,
        "bare_step_mean_ms": round(bare_wall * 1e3, 3),
        "bare_step_p50_ms": round(bare_p50 * 1e3, 3),
        "bare_other_threads_cpu_ms_per_step": round(other_threads_ms(bare), 4),
        "bare_master_cpu_ms_per_step": round(bare.master_cpu_s / steps * 1e3, 3),
        "library_flush_after_each_block_ms_max": round(max(flushes) * 1e3, 3),
    }
    for name in ("library", "library_to_stub_server", "naive_sync_http"):
        block = blocks[name]
        wall = statistics.fmean(block.wall)
        calls_ms = statistics.fmean(block.calls) * 1e3
        threads_ms = other_threads_ms(block) - other_threads_ms(bare)
        figures[name] = {
            "step_mean_ms": round(wall * 1e3, 3),
            "step_p50_ms": round(percentile(sorted(block.wall), 50) * 1e3, 3),
            "step_max_ms": round(max(block.wall) * 1e3, 3),
            "overhead_fraction_vs_bare_wall_mean": round(wall / bare_wall - 1, 5),
            "overhead_fraction_vs_bare_wall_p50": round(
                percentile(sorted(block.wall), 50) / bare_p50 - 1, 5
            ),
            "calls_on_loop_thread_mean_us": round(calls_ms * 1e3, 1),
            "calls_on_loop_thread_p99_us": round(percentile(sorted(block.calls), 99) * 1e6, 1),
            "added_other_threads_cpu_ms_per_step": round(threads_ms, 4),
            # What the reporting costs the trial per step (its calls on the loop's thread plus
            # the CPU its threads add), over the step's length: what it takes from a CPU-bound
            # loop, measured without the noise of the loop's own work on a shared machine.
            "cost_fraction_of_step": round((calls_ms + threads_ms) / (bare_wall * 1e3), 5),
            "master_cpu_ms_per_step": round(block.master_cpu_s / len(block.wall) * 1e3, 3),
        }
    return figures


# --- the report --------------------------------------------------------------------------------


# (experiments, slots, steps, rounds, step_s, warm-up launches) of each shape. The smoke
# shape: one launch per variant and no warm-up, two ranks, each loop variant's steps in one
# round of 20 ms steps.
SHAPES = {
    "full": (10, 4, 100, 20, 0.1, 1),
    "quick": (3, 2, 20, 4, 0.1, 1),
    "smoke": (1, 2, 2, 1, 0.02, 0),
}


def params_of(args: argparse.Namespace) -> Params:
    experiments, slots, steps, rounds, step_s, warmups = SHAPES[common.mode_of(args)]
    return Params(
        experiments=args.experiments or experiments,
        slots=args.slots or slots,
        steps=args.steps or steps,
        rounds=rounds,
        step_s=step_s,
        seed=args.seed,
        warmup_launches=warmups,
    )


def judge(launch: dict[str, Any], overhead: dict[str, Any]) -> dict[str, Any]:
    p50 = launch["ours_woken_on_submit"]["every_rank_started"]["p50_s"]
    most = TARGETS["library_overhead_fraction_max"]
    sleeping, busy = overhead["sleep"]["library"], overhead["cpu"]["library"]
    figures: dict[str, Any] = {
        "launch_p50_s_max": TARGETS["launch_p50_s_max"],
        "launch_every_rank_started_p50_s": p50,
        "launch_every_rank_started_max_s": launch["ours_woken_on_submit"]["every_rank_started"][
            "max_s"
        ],
        "launch_met": p50 < TARGETS["launch_p50_s_max"],
        "library_overhead_fraction_max": most,
    }
    judged = {
        "sleep_steps_wall_mean": sleeping["overhead_fraction_vs_bare_wall_mean"],
        "sleep_steps_wall_p50": sleeping["overhead_fraction_vs_bare_wall_p50"],
        "cpu_steps_cost": busy["cost_fraction_of_step"],
        # Also whatever else competes for this machine's cores meanwhile (the master that
        # answers each report runs here too): noisy on a shared machine.
        "cpu_steps_wall_p50": busy["overhead_fraction_vs_bare_wall_p50"],
        # The same with a stub master in its own process: the library's share alone.
        "cpu_steps_wall_p50_stub_master": overhead["cpu"]["library_to_stub_server"][
            "overhead_fraction_vs_bare_wall_p50"
        ],
    }
    for name, value in judged.items():
        figures[f"library_overhead_{name}"] = value
        figures[f"library_overhead_{name}_met"] = value < most
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    params = params_of(args)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    facts = host_facts(("fastapi", "uvicorn", "sqlalchemy", "aiosqlite", "grpcio", "httpx"))
    progress(f"{common.mode_of(args)} run: {params}")
    with (
        tempfile.TemporaryDirectory(prefix="resolute-bench-trial-") as tmp,
        local_cluster(Path(tmp), params.slots) as cluster,
    ):
        progress("cluster up; measuring launch latency")
        launch = launch_latency(cluster, params)
        progress("measuring the library's per-step overhead inside a trial")
        overhead = step_overhead(cluster, params)
    return {
        "benchmark": "resolute trial runtime: submit-to-ranks latency, per-step library overhead",
        "mode": common.mode_of(args),
        "command": " ".join(["python -m benchmarks.bench_trial_runtime", *sys.argv[1:]]),
        "started_at": started_at,
        "total_seconds": round(seconds_since_start(), 1),
        "machine": facts,
        "parameters": asdict(params),
        "launch_latency": launch,
        "step_overhead": overhead,
        "targets": judge(launch, overhead),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_trial_runtime",
        description="Trial runtime benchmark; prints one JSON document on stdout.",
    )
    common.add_shape_flags(
        parser,
        quick="3 launches of 2 ranks per variant, 20 steps",
        smoke="1 launch of 2 ranks per variant, 2 steps of 20 ms per loop variant",
    )
    parser.add_argument("--experiments", type=int, help="launches per variant (default 10)")
    parser.add_argument("--slots", type=int, help="ranks per launch (default 4)")
    parser.add_argument("--steps", type=int, help="steps per loop variant (default 100)")
    parser.add_argument("--seed", type=int, default=7, help="seeds the launches' phases")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    # Internal: the step loop runs as the entrypoint of a trial, with a stub master beside it.
    parser.add_argument("--step-loop", help=argparse.SUPPRESS)
    parser.add_argument("--stub-server", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.step_loop is not None:
        step_loop(json.loads(args.step_loop))
        return
    if args.stub_server:
        serve_stub()
        return
    result = run(args)
    common.emit_report(result, args.out)


if __name__ == "__main__":
    main()
