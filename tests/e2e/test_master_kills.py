"""A master killed with SIGKILL again and again while it places and launches gangs.

Two agents with two slots each; eight two-rank trials submitted at once, so passes,
prepares and starts are in flight; the master is killed at random moments (the delays
come from a fixed seed and are printed) and started again at once, five times. Every
trial must end COMPLETED with no restart, and each must have run exactly once: its two
ranks' pids, never a third (a second launch of the same trial would add some).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import AgentProcess
from tests.e2e.agents import (
    TICK_SCRIPT,
    create_experiment,
    tick_rows,
    wait_trial_state,
    write_experiment,
)
from tests.e2e.conftest import MasterProcess

pytestmark = pytest.mark.e2e

TRIALS = 8
KILLS = 5
SEED = 20261125


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterProcess]:
    # The default lost_after_s: while the master is down, its agent port refuses
    # connections, and a refusal keeps the agents' lease (agent/link.py), however long the
    # restart takes.
    process = MasterProcess(tmp_path / "data", label="kills")
    try:
        yield process
    finally:
        process.stop()
        shutil.rmtree(process.scratch, ignore_errors=True)


def test_a_master_killed_mid_placement_runs_no_trial_twice_and_loses_none(
    master: MasterProcess, tmp_path: Path
) -> None:
    master.start()
    agents = [
        AgentProcess(master, f"kills-{i}", tmp_path / f"agent-{i}", slots=2).start()
        for i in range(2)
    ]
    try:
        for agent in agents:
            agent.wait_connected()
        _kill_while_placing(master, tmp_path)
    finally:
        for agent in agents:
            agent.stop()


def _kill_while_placing(master: MasterProcess, tmp_path: Path) -> None:
    runs = []
    for i in range(TRIALS):
        ticks = tmp_path / f"ticks-{i}"
        script = TICK_SCRIPT % {"ticks": str(ticks), "run_s": 4}
        config, model = write_experiment(tmp_path / f"trial-{i}", script, slots=2)
        runs.append((create_experiment(master, config, model), ticks))

    rng = random.Random(SEED)
    delays = [round(rng.uniform(0.05, 1.5), 3) for _ in range(KILLS)]
    for delay in delays:
        time.sleep(delay)  # a random moment (the fault), not a wait for anything
        master.kill()
        master.start()

    for experiment_id, ticks in runs:
        trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR", "CANCELED"}, 240)
        assert trial["state"] == "COMPLETED" and trial["restarts"] == 0, trial
        pids = {pid for _, pid in tick_rows(ticks)}
        assert len(pids) == 2, f"trial {trial['id']} ran {len(pids)} rank processes, not 2"
    print(json.dumps({"trials": TRIALS, "kills": KILLS, "kill_delays_s": delays}))
