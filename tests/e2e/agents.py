"""Real `det-agent` processes for the e2e tests, and the trial scripts they run."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import MasterProcess, unique

BIN = Path(sys.executable).parent
DET_AGENT_BIN = BIN / "det-agent"


class AgentProcess:
    """One det-agent subprocess, optionally inside a network namespace (`netns`)."""

    def __init__(
        self,
        master: MasterProcess,
        agent_id: str,
        work_dir: Path,
        *,
        slots: int | None = 2,
        join_token: str | None = None,
        master_address: str | None = None,
        netns: str | None = None,
        pool: str | None = None,
    ) -> None:
        self.master = master
        self.id = agent_id
        self.work_dir = work_dir
        self.log = work_dir.parent / f"{work_dir.name}.log"
        self.command = [
            str(DET_AGENT_BIN),
            "--master",
            master_address or master.agent_address,
            "--id",
            agent_id,
            "--work-dir",
            str(work_dir),
        ]
        if slots is not None:
            self.command += ["--artificial-slots", str(slots)]
        if pool is not None:
            self.command += ["--resource-pool", pool]
        if join_token is None:
            self.command += ["--join-token-file", str(master.join_token_file)]
        elif join_token:
            self.command += ["--join-token", join_token]
        if netns is not None:
            self.command = ["ip", "netns", "exec", netns, *self.command]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
        env["PYTHONUNBUFFERED"] = "1"
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(
                self.command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        return self

    def wait_connected(self, timeout: float = 30.0) -> dict[str, Any]:
        def connected() -> dict[str, Any] | None:
            assert self.proc is not None and self.proc.poll() is None, (
                f"agent {self.id} exited with {self.proc and self.proc.poll()}:\n{self.output()}"
            )
            reply = self.master.http("GET", f"/api/v1/agents/{self.id}")
            if reply.status_code != 200:
                return None
            agent: dict[str, Any] = reply.json()["agent"]
            return agent if agent.get("connected") else None

        result: dict[str, Any] = self.master.wait_for(
            f"agent {self.id} to connect", connected, timeout
        )
        return result

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the agent process itself (not its process group): ranks must die with it."""
        if self.proc is not None and self.proc.poll() is None:
            # `ip netns exec` execs the agent, so under a namespace the pid is the agent's too.
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def output(self, tail: int = 6000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-tail:]
        except OSError:
            return "(no agent log)"


def write_experiment(
    directory: Path,
    script: str,
    *,
    slots: int = 1,
    max_restarts: int = 0,
    name: str | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """A config and a model directory whose entrypoint runs `script` (Python source)."""
    model = directory / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "train.py").write_text(textwrap.dedent(script), encoding="utf-8")
    config: dict[str, Any] = {
        "name": name or unique("agent-e2e"),
        "entrypoint": "python3 train.py",
        "resources": {"slots_per_trial": slots},
        "max_restarts": max_restarts,
        "searcher": {"name": "single", "metric": "loss", "max_length": 1},
    }
    for key, value in (extra or {}).items():
        if isinstance(value, dict):
            config.setdefault(key, {}).update(value)
        else:
            config[key] = value
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path, model


def create_experiment(master: MasterProcess, config: Path, model: Path) -> int:
    result = master.det("experiment", "create", str(config), str(model))
    assert result.returncode == 0, result.stderr + result.stdout
    return int(result.stdout.split("Created experiment")[1].split()[0])


def trial_of(master: MasterProcess, experiment_id: int) -> dict[str, Any]:
    trials = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
    assert len(trials) == 1, trials
    trial: dict[str, Any] = trials[0]
    return trial


def wait_trial_state(
    master: MasterProcess, experiment_id: int, states: set[str], timeout: float = 60.0
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        trial = trial_of(master, experiment_id)
        trial["state"] = trial["state"].removeprefix("STATE_")
        return trial if trial["state"] in states else None

    result: dict[str, Any] = master.wait_for(
        f"experiment {experiment_id}'s trial to reach {sorted(states)}", reached, timeout
    )
    return result


def trial_logs(master: MasterProcess, trial_id: int) -> str:
    reply = master.http("GET", f"/api/v1/trials/{trial_id}/logs")
    assert reply.status_code == 200, reply.text
    return "".join(
        json.loads(line)["result"]["message"] for line in reply.text.splitlines() if line.strip()
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


# A rank that appends "<CLOCK_MONOTONIC> <pid>" to a file every 50 ms for `run_s` seconds:
# the file shows, on the one clock every process of the machine shares, whether the rank
# ran on through a fault, and which process it was.
TICK_SCRIPT = """
import os, time
TICKS = %(ticks)r
end = time.monotonic() + %(run_s)s
fd = os.open(TICKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
while time.monotonic() < end:
    os.write(fd, f"{time.monotonic():.3f} {os.getpid()}\\n".encode())
    time.sleep(0.05)
"""


def tick_rows(path: Path) -> list[tuple[float, int]]:
    """The lines of a TICK_SCRIPT file (one cut by a kill mid-write is skipped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2:
            rows.append((float(parts[0]), int(parts[1])))
    return rows


def longest_gap(rows: list[tuple[float, int]]) -> float:
    return max((b[0] - a[0] for a, b in itertools.pairwise(rows)), default=0.0)
