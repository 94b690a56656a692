"""Time from `det notebook start` to a page that answers, on an idle cluster.

`det-master` on SQLite in a temporary directory and one `det-agent` with one artificial CPU
slot, on this machine. Each run times our `det notebook start --no-browser` (which returns
once GET /proxy/<id>/ answers through the master) from the command's start to its exit,
after a run of bare JupyterLab on the same machine. The
peer, in the same run: JupyterLab started bare on this machine (`python -m jupyterlab`
with the same options), timed until its page answers; the ratio says what scheduling,
launch and the proxy add to Jupyter's own start. The target is under 3 s.

    python -m benchmarks.bench_interactive [--runs 5] [--out results.json]
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import (
    emit_report,
    free_port,
    host_facts,
    log_tail,
    ms_summary,
    progress,
    ratio,
    stop_process,
)

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 120.0


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _wait(url: str, what: str, log: Path, headers: dict[str, str] | None = None) -> float:
    """Seconds until `url` answers below 500 (polling every 20 ms)."""
    started = time.perf_counter()
    deadline = started + READY_TIMEOUT_S
    while time.perf_counter() < deadline:
        try:
            if httpx.get(url, headers=headers, timeout=2.0).status_code < 500:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not answer at {url}:\n{log_tail(log)}")


def bare_jupyter(work: Path) -> float:
    """JupyterLab on its own: the floor every notebook start pays."""
    port = free_port()
    token = secrets.token_urlsafe(16)
    log = work / f"bare-jupyter-{port}.log"
    root = work / f"bare-{port}"
    root.mkdir()
    env = {**os.environ, "JUPYTER_TOKEN": token}
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
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=root
    )
    try:
        _wait(
            f"http://127.0.0.1:{port}/proxy/bare/",
            "bare jupyter",
            log,
            {"Authorization": f"token {token}"},
        )
        return time.perf_counter() - started
    finally:
        stop_process(proc)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-interactive-"))
    port, agent_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["PYTHONUNBUFFERED"] = "1"
    master_log, agent_log = work / "master.log", work / "agent.log"
    master = _start(
        [
            str(BIN / "det-master"),
            "--port",
            str(port),
            "--agent-port",
            str(agent_port),
            "--data-dir",
            str(work / "data"),
        ],
        master_log,
        env,
    )
    agent = None
    ours: list[float] = []
    bare: list[float] = []
    try:
        _wait(f"{url}/info", "det-master", master_log)
        agent = _start(
            [
                str(BIN / "det-agent"),
                "--master",
                f"127.0.0.1:{agent_port}",
                "--id",
                "bench-agent",
                "--work-dir",
                str(work / "agent"),
                "--artificial-slots",
                "1",
                "--join-token-file",
                str(work / "data" / "agent_join_token"),
            ],
            agent_log,
            env,
        )
        token = httpx.post(
            f"{url}/api/v1/auth/login", json={"username": "determined", "password": ""}
        ).json()["token"]
        headers = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + START_TIMEOUT_S
        while not httpx.get(f"{url}/api/v1/agents", headers=headers).json().get("agents"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not connect:\n{log_tail(agent_log)}")
            time.sleep(0.1)
        client_env = {**env, "DET_MASTER": url, "XDG_CONFIG_HOME": str(work / "config")}
        for run in range(args.runs):
            bare.append(bare_jupyter(work))
            started = time.perf_counter()
            result = subprocess.run(
                [
                    str(BIN / "det"),
                    "notebook",
                    "start",
                    "--no-browser",
                    "--config",
                    "resources.slots=1",
                ],
                capture_output=True,
                text=True,
                env=client_env,
                timeout=READY_TIMEOUT_S,
                check=False,
            )
            elapsed = time.perf_counter() - started
            if result.returncode != 0:
                raise RuntimeError(f"det notebook start failed: {result.stderr}")
            notebook_id = result.stdout.strip().rstrip("/").rsplit("/", 1)[-1]
            ours.append(elapsed)
            progress(f"run {run + 1}: det notebook start {elapsed:.2f} s, bare {bare[-1]:.2f} s")
            httpx.post(f"{url}/api/v1/notebooks/{notebook_id}/kill", headers=headers)
            deadline = time.monotonic() + 60
            while (
                httpx.get(f"{url}/api/v1/notebooks/{notebook_id}", headers=headers).json()[
                    "notebook"
                ]["state"]
                != "STATE_TERMINATED"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the notebook did not end after its kill")
                time.sleep(0.1)
    finally:
        stop_process(agent)
        stop_process(master)
    p50_ours = sorted(ours)[len(ours) // 2]
    p50_bare = sorted(bare)[len(bare) // 2]
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
