"""The trial scripts the e2e tests run, and how they read back what happened."""

from __future__ import annotations

import itertools
import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import MasterProcess, unique


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


# For "eventually": what takes 20 s on an idle machine has taken a minute and more on a
# loaded one at half speed; a generous deadline costs nothing when all goes well.
TRIAL_STATE_TIMEOUT_S = 180.0


def wait_trial_state(
    master: MasterProcess,
    experiment_id: int,
    states: set[str],
    timeout: float = TRIAL_STATE_TIMEOUT_S,
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


def scheduling_passes(master: MasterProcess) -> int:
    """How many scheduling passes the master has run (the count of its /metrics histogram)."""
    text = master.http("GET", "/metrics").text
    found = re.search(r"^resolute_scheduler_pass_seconds_count (\d+)$", text, re.M)
    assert found, text[-2000:]
    return int(found.group(1))


def wait_scheduling_pass(master: MasterProcess, timeout: float = 120.0) -> None:
    """Return once a scheduling pass has ended after this call: a state that outlives it
    outlived a pass that considered it, however fast the machine (a pass runs when
    something changes, and at least every 10 s)."""
    before = scheduling_passes(master)
    master.wait_for(
        "the next scheduling pass", lambda: scheduling_passes(master) > before, timeout, 0.2
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


# TICK_SCRIPT that ticks until the test creates `stop` (or `max_s` passes, should the test
# fail before it does): a rank that must run on through a fault, ended once the test has
# seen what it waits for rather than after a duration sized for a loaded machine.
TICK_UNTIL_SCRIPT = """
import os, time
TICKS, STOP = %(ticks)r, %(stop)r
end = time.monotonic() + %(max_s)s
fd = os.open(TICKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
while time.monotonic() < end and not os.path.exists(STOP):
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
