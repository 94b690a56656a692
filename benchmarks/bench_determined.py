"""Determined workloads: what running a Core API script costs against a `resolute` one.

    .venv/bin/python -m benchmarks.bench_determined [--quick | --smoke] [--runs N]
        [--trial-venv DIR] [--out PATH]

Prints one JSON document on stdout (progress on stderr): the machine, the figures, the
target and whether it was met. It starts its own local cluster (bench_trial_runtime's,
without the API-only master: a `det-master` on SQLite and one `det-agent`, 1 artificial CPU
slot) and needs an interpreter with `determined==0.38.1`, torch and tensorboard (`make test`
builds `.venv-trial`).

Each run submits on an idle cluster, interleaving the variants so drift hits all alike:
- core_api: a Core API script (`import determined as det; with det.core.init() as core:`
  one training metric) under Determined's per-agent layout: namespaces, bootstrap files,
  the interpreter check, then Determined's own start-up (it imports torch and tensorboard);
- resolute: the same metric from a `resolute` library script, one process per slot;
  both timed from just before POST /api/v1/experiments to the metric's arrival at the
  master (GET /api/v1/trials/{id}/metrics polled every 10 ms);
- stamp_per_agent and stamp_per_slot: an entrypoint that only writes `date +%s.%N`, run with
  `launch_layout: per_agent` and `per_slot`; the difference of their p50s is what the
  bootstrap itself adds (the target: at most 0.5 s), without any user import.
Beside them: the time the trial interpreter takes to `import determined` and torch's
TensorBoard writer, which every Core API script pays and a `resolute` script does not.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks import common
from benchmarks.bench_trial_runtime import (
    Cluster,
    local_cluster,
    read_stamps,
    summary,
    wait_ended,
)
from benchmarks.common import host_facts, progress, seconds_since_start

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP_TARGET_S = 0.5
METRIC_TIMEOUT_S = 120.0
METRIC_POLL_S = 0.01
SMOKE_METRIC_POLL_S = 0.05
STATE_POLL_S = 0.5

CORE_API_SCRIPT = """\
import determined as det

with det.core.init() as core_context:
    core_context.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
"""
RESOLUTE_SCRIPT = """\
import resolute

with resolute.init() as ctx:
    ctx.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
"""


def files(name: str, text: str) -> list[dict[str, Any]]:
    content = base64.b64encode(text.encode()).decode()
    return [{"path": name, "type": 48, "content": content, "mode": 0o644, "mtime": 0}]


def submit(client: httpx.Client, config: dict[str, Any], model: list[dict[str, Any]]) -> int:
    body = {"config": yaml.safe_dump(config), "modelDefinition": model, "activate": True}
    reply = client.post("/api/v1/experiments", json=body)
    if reply.status_code != 200:
        raise RuntimeError(f"POST /api/v1/experiments -> {reply.status_code}: {reply.text}")
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


def first_metric(
    client: httpx.Client, experiment_id: int, cluster: Cluster, poll_s: float
) -> float:
    """Wall time at which the experiment's first training metric is on the master (polled
    every `poll_s`; the trial's state, to fail fast, every half second: each request is the
    master's CPU, taken from the trial being timed)."""
    trial_id = None
    deadline = time.monotonic() + METRIC_TIMEOUT_S
    state_checked = time.monotonic()
    while time.monotonic() < deadline:
        if trial_id is None:
            trials = client.get(f"/api/v1/experiments/{experiment_id}/trials").json()["trials"]
            trial_id = trials[0]["id"] if trials else None
        if trial_id is not None:
            rows = client.get(f"/api/v1/trials/{trial_id}/metrics").json()["metrics"]
            if rows:
                return time.time()
            if time.monotonic() - state_checked >= STATE_POLL_S:
                state_checked = time.monotonic()
                state = client.get(f"/api/v1/trials/{trial_id}").json()["trial"]["state"]
                if state.removeprefix("STATE_") in ("ERROR", "CANCELED", "COMPLETED"):
                    raise RuntimeError(
                        f"trial {trial_id} ended {state} without a metric:\n"
                        f"{cluster.agent.output()}"
                    )
        time.sleep(poll_s)
    raise RuntimeError(f"no metric from experiment {experiment_id}:\n{cluster.agent.output()}")


def metric_run(cluster: Cluster, variant: str, path_env: str, poll_s: float) -> float:
    if variant == "core_api":
        name, script = "train.py", CORE_API_SCRIPT
        env = [f"PATH={path_env}"]
    else:
        name, script = "train.py", RESOLUTE_SCRIPT
        env = []
    config = {
        "name": f"bench-{variant}",
        "entrypoint": f"python3 {name}",
        "searcher": {"name": "single", "metric": "loss"},
        "environment": {"environment_variables": env},
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(cluster.tmp / "ckpt")},
        "max_restarts": 0,
    }
    started = time.time()
    experiment_id = submit(cluster.ours, config, files(name, script))
    arrived = first_metric(cluster.ours, experiment_id, cluster, poll_s)
    state = wait_ended(cluster.ours, experiment_id, cluster)
    if state != "COMPLETED":
        raise RuntimeError(f"{variant} experiment {experiment_id} ended {state}")
    return arrived - started


def stamp_run(cluster: Cluster, layout: str, path_env: str) -> float:
    stamps = cluster.tmp / "stamps" / f"{layout}-{uuid.uuid4().hex[:8]}"
    stamps.mkdir(parents=True)
    config = {
        "name": f"bench-stamp-{layout}",
        # Rank 0's name either way: per_agent sets no RANK, so the file is "0" explicitly.
        "entrypoint": ["sh", "-c", f'date +%s.%N > "{stamps}/0"'],
        "launch_layout": layout,
        "searcher": {"name": "single", "metric": "loss"},
        "environment": {"environment_variables": [f"PATH={path_env}"]},
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(cluster.tmp / "ckpt")},
        "max_restarts": 0,
    }
    started = time.time()
    experiment_id = submit(cluster.ours, config, [])
    stamp = read_stamps(stamps, 1, time.monotonic() + METRIC_TIMEOUT_S)[0]
    state = wait_ended(cluster.ours, experiment_id, cluster)
    if state != "COMPLETED":
        raise RuntimeError(f"stamp experiment {experiment_id} ({layout}) ended {state}")
    return stamp - started


def import_time(python: Path, repeats: int) -> float:
    """What a Core API script pays before its first line: importing determined and the
    TensorBoard writer core.init() builds (the median of `repeats`, warm page cache)."""
    code = "import determined, torch.utils.tensorboard"
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        subprocess.run([str(python), "-c", code], check=True, capture_output=True)
        times.append(time.monotonic() - started)
    return statistics.median(times)


def trial_venv(given: Path | None) -> Path:
    venv = given or Path(os.environ.get("DET_TRIAL_VENV") or ROOT / ".venv-trial")
    if not (venv / "bin" / "python3").exists():
        raise SystemExit(
            f"no trial interpreter at {venv}/bin/python3: run `make test` (it builds "
            ".venv-trial) or pass --trial-venv DIR"
        )
    return venv


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    # The smoke shape: one run of each variant and one timed import.
    runs = args.runs or {"full": 10, "quick": 3, "smoke": 1}[mode]
    import_repeats = 1 if mode == "smoke" else 3
    # The first metric's arrival to 10 ms; the smoke's figures mean nothing, so 50 ms.
    poll_s = SMOKE_METRIC_POLL_S if mode == "smoke" else METRIC_POLL_S
    venv = trial_venv(args.trial_venv)
    # The trial's PATH: the Determined venv first, then the system's (sh, date).
    path_env = f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    facts = host_facts(("fastapi", "uvicorn", "sqlalchemy", "aiosqlite", "grpcio", "httpx"))
    figures: dict[str, list[float]] = {
        "core_api": [],
        "resolute": [],
        "stamp_per_agent": [],
        "stamp_per_slot": [],
    }
    # The smoke shape times its one import while the cluster starts (its figures mean
    # nothing; it proves the path runs); the others time it alone, after the runs.
    background = ThreadPoolExecutor(1)
    importing = (
        background.submit(import_time, venv / "bin" / "python3", import_repeats)
        if mode == "smoke"
        else None
    )
    background.shutdown(wait=False)  # what was submitted still runs
    # Not under /tmp: a per-agent trial has a private /tmp, so its stamps must go elsewhere.
    with (
        tempfile.TemporaryDirectory(prefix="resolute-bench-det-", dir="/var/tmp") as tmp,
        local_cluster(Path(tmp), 1, with_api_only=False) as cluster,
    ):
        progress(f"cluster up; {runs} runs of each variant")
        for index in range(runs):
            figures["core_api"].append(metric_run(cluster, "core_api", path_env, poll_s))
            figures["resolute"].append(metric_run(cluster, "resolute", path_env, poll_s))
            figures["stamp_per_agent"].append(stamp_run(cluster, "per_agent", path_env))
            figures["stamp_per_slot"].append(stamp_run(cluster, "per_slot", path_env))
            progress(
                f"run {index + 1}/{runs}: "
                + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in figures.items())
            )
    summaries = {name: summary(values) for name, values in figures.items()}
    bootstrap = summaries["stamp_per_agent"]["p50_s"] - summaries["stamp_per_slot"]["p50_s"]
    return {
        "benchmark": "resolute: Determined Core API workloads against resolute library ones",
        "mode": mode,
        "command": " ".join(["python -m benchmarks.bench_determined", *sys.argv[1:]]),
        "started_at": started_at,
        "total_seconds": round(seconds_since_start(), 1),
        "machine": facts,
        "trial_interpreter": str(venv / "bin" / "python3"),
        "post_to_first_metric": {
            "core_api": summaries["core_api"],
            "resolute": summaries["resolute"],
            "core_api_over_resolute_p50_s": round(
                summaries["core_api"]["p50_s"] - summaries["resolute"]["p50_s"], 4
            ),
        },
        "post_to_entrypoint_started": {
            "per_agent": summaries["stamp_per_agent"],
            "per_slot": summaries["stamp_per_slot"],
        },
        "import_determined_and_tensorboard_s": round(
            importing.result()
            if importing is not None
            else import_time(venv / "bin" / "python3", import_repeats),
            4,
        ),
        "raw_seconds": {k: [round(v, 4) for v in values] for k, values in figures.items()},
        "targets": {
            "bootstrap_added_p50_s": round(bootstrap, 4),
            "bootstrap_target_s": BOOTSTRAP_TARGET_S,
            "bootstrap_met": bootstrap <= BOOTSTRAP_TARGET_S,
        },
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_determined",
        description="Determined workload benchmark; prints one JSON document on stdout.",
    )
    common.add_shape_flags(
        parser, quick="3 runs of each variant", smoke="1 run of each variant, 1 timed import"
    )
    parser.add_argument("--runs", type=int, help="runs of each variant (default 10)")
    parser.add_argument("--trial-venv", type=Path, help="venv with determined (.venv-trial)")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    common.emit_report(result, args.out)


if __name__ == "__main__":
    main()
