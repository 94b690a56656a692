"""Time from `det notebook start` to a page that answers, on an idle cluster.

`det-master` on SQLite in a temporary directory and one `det-agent` with one artificial CPU
slot, on this machine. Each run times our `det notebook start --no-browser` (which returns
once GET /proxy/<id>/ answers through the master) from the command's start to its exit,
after a run of bare JupyterLab on the same machine. The
peer, in the same run: JupyterLab started bare on this machine (`python -m jupyterlab`
with the same options), timed until its page answers; the ratio says what scheduling,
launch and the proxy add to Jupyter's own start. The target is under 3 s.

    python -m benchmarks.bench_interactive [--runs 5 | --smoke] [--out results.json]

`--smoke` (one run) is the smallest shape that still runs every path, for the smoke test; it
times nothing it judges, so its bare JupyterLab starts beside the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import emit_report, host_facts, progress
from harness.cluster import AgentProcess, MasterProcess, Process, free_port, wait_until
from harness.figures import ms_summary, percentile, ratio

BIN = Path(sys.executable).parent
READY_TIMEOUT_S = 120.0


def _wait(url: str, what: str, process: Process, headers: dict[str, str] | None = None) -> None:
    """Until `url` answers below 500 (polling every 20 ms, on one client: a new one per
    poll would cost the machine being measured about 40 ms of CPU each time)."""
    with httpx.Client(headers=headers, timeout=2.0) as client:

        def answers() -> bool:
            process.check_running(what)
            with contextlib.suppress(httpx.HTTPError):
                return client.get(url).status_code < 500
            return False

        wait_until(f"{what} to answer at {url}", answers, READY_TIMEOUT_S, 0.02, process.output)


def bare_jupyter(work: Path) -> float:
    """JupyterLab on its own: the floor every notebook start pays."""
    port = free_port()
    token = secrets.token_urlsafe(16)
    root = work / f"bare-{port}"
    root.mkdir()
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.base_url=/proxy/bare/",
        "--ServerApp.open_browser=False",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.allow_root=True",
    ]
    jupyter = Process(command, work / f"bare-jupyter-{port}.log", {"JUPYTER_TOKEN": token})
    started = time.perf_counter()
    jupyter.launch()
    try:
        _wait(
            f"http://127.0.0.1:{port}/proxy/bare/",
            "bare jupyter",
            jupyter,
            {"Authorization": f"token {token}"},
        )
        return time.perf_counter() - started
    finally:
        jupyter.stop()


def notebook_run(master: MasterProcess, client: httpx.Client, work: Path) -> float:
    """Seconds `det notebook start --no-browser` takes to return (a page answering through
    the proxy); the notebook is killed and ended before this returns."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env |= {"DET_MASTER": master.url, "XDG_CONFIG_HOME": str(work / "config")}
    started = time.perf_counter()
    result = subprocess.run(
        [str(BIN / "det"), "notebook", "start", "--no-browser", "--config", "resources.slots=1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=READY_TIMEOUT_S,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"det notebook start failed: {result.stderr}")
    notebook_id = result.stdout.strip().rstrip("/").rsplit("/", 1)[-1]
    client.post(f"/api/v1/notebooks/{notebook_id}/kill").raise_for_status()

    def ended() -> bool:
        reply = client.get(f"/api/v1/notebooks/{notebook_id}")
        return bool(reply.json()["notebook"]["state"] == "STATE_TERMINATED")

    master.wait_for("the notebook to end after its kill", ended, 60.0, 0.1)
    return elapsed


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    runs = parser.add_mutually_exclusive_group()
    runs.add_argument("--runs", type=int, default=5)
    runs.add_argument("--smoke", action="store_true", help="1 run, for the smoke test")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs = 1
    ours: list[float] = []
    bare: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-interactive-") as scratch:
        work = Path(scratch)
        master = MasterProcess(work / "data")
        agent = AgentProcess(master, "bench-agent", work / "agent", slots=1)
        # The smoke shape judges no timing: its one bare start overlaps the cluster's start.
        early = ThreadPoolExecutor(1).submit(bare_jupyter, work) if args.smoke else None
        try:
            master.start()
            agent.start().wait_connected()
            with master.client() as client:
                for run in range(args.runs):
                    bare.append(early.result() if early is not None else bare_jupyter(work))
                    ours.append(notebook_run(master, client, work))
                    progress(
                        f"run {run + 1}: det notebook start {ours[-1]:.2f} s, bare {bare[-1]:.2f} s"
                    )
        finally:
            agent.stop()
            master.stop()
    p50_ours = percentile(sorted(ours), 50)
    p50_bare = percentile(sorted(bare), 50)
    report: dict[str, Any] = {
        "benchmark": "bench_interactive",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": host_facts(["jupyterlab", "jupyter_server", "websockets", "httpx"]),
        "runs": args.runs,
        "det_notebook_start_to_page_ms": ms_summary(ours, mean=True),
        "bare_jupyterlab_start_to_page_ms": ms_summary(bare, mean=True),
        "added_by_scheduling_launch_and_proxy_ms_p50": round((p50_ours - p50_bare) * 1000, 1),
        "ratio_ours_to_bare_p50": ratio(p50_ours, p50_bare),
        "target_ms": 3000,
        "target_met_p50": p50_ours < 3.0,
    }
    emit_report(report, args.out)


if __name__ == "__main__":
    main()
