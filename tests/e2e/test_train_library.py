"""The training library (`resolute`) in real trials: a det-master and a det-agent process,
trial scripts that import resolute, and the master's REST API to read back what arrived."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import AgentProcess
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment
from tests.e2e.conftest import BACKENDS, MasterProcess, running_master

pytestmark = pytest.mark.e2e


@pytest.fixture(params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    with running_master(request, tmp_path_factory, "library") as proc:
        yield proc


@pytest.fixture
def agent(master: MasterProcess, tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(master, "lib-agent", tmp_path / "lib-agent", slots=2).start()
    proc.wait_connected()
    yield proc
    proc.stop()


REPORTING_SCRIPT = """
import json, math, random
import resolute

with resolute.init() as ctx:
    print(f"RANK {ctx.rank}/{ctx.world_size} seed={ctx.trial_seed} draw={random.random()!r}")
    print("HPARAMS " + json.dumps(ctx.hparams, sort_keys=True))
    for step in range(1, 6):
        loss = 1.0 / step
        metrics = {"loss": loss, "odd": math.nan if step == 3 else float(step)}
        ctx.train.report_training_metrics(steps_completed=step, metrics=metrics)
        ctx.train.report_progress(step / 5)
    ctx.train.report_validation_metrics(steps_completed=5, metrics={"loss": 0.125})
    if ctx.is_chief:
        with ctx.checkpoint.store_path(5, {"note": "final"}) as (path, uuid):
            (path / "state.json").write_text(json.dumps({"step": 5}))
            (path / "sub").mkdir()
            (path / "sub" / "weights.bin").write_bytes(bytes(100))
        print("CHECKPOINT " + uuid)
    assert not ctx.preempt.should_preempt()
"""


def test_a_trial_reports_metrics_and_a_checkpoint_through_the_library(
    master: MasterProcess, agent: AgentProcess, tmp_path: Path
) -> None:
    config, model = write_experiment(
        tmp_path, REPORTING_SCRIPT, slots=2, extra={"hyperparameters": {"lr": 0.5}}
    )
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    logs = trial_logs(master, trial["id"])
    assert trial["state"] == "COMPLETED", logs
    tid = trial["id"]

    # Every rank got the trial's seed and hparams; ranks draw different numbers (seed + rank).
    ranks = re.findall(r"RANK (\d)/2 seed=(\d+) draw=(\S+)", logs)
    assert sorted(r[0] for r in ranks) == ["0", "1"]
    assert {int(r[1]) for r in ranks} == {trial["seed"]}
    assert len({r[2] for r in ranks}) == 2
    assert logs.count('HPARAMS {"lr": 0.5}') == 2

    # Only the chief's reports arrive, one row per step, NaN kept as NaN.
    training = master.api("GET", f"/api/v1/trials/{tid}/metrics?group=training")["metrics"]
    assert [row["stepsCompleted"] for row in training] == [1, 2, 3, 4, 5]
    assert [row["metrics"]["loss"] for row in training] == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert training[2]["metrics"]["odd"] == "NaN"
    validation = master.api("GET", f"/api/v1/trials/{tid}/metrics?group=validation")["metrics"]
    assert [(r["stepsCompleted"], r["metrics"]) for r in validation] == [(5, {"loss": 0.125})]

    (uuid,) = re.findall(r"^CHECKPOINT (\S+)$", logs, re.M)
    checkpoints = master.api("GET", f"/api/v1/trials/{tid}/checkpoints")["checkpoints"]
    assert [c["uuid"] for c in checkpoints] == [uuid]
    checkpoint = checkpoints[0]
    assert checkpoint["state"] == "STATE_COMPLETED"
    assert checkpoint["stepsCompleted"] == 5
    assert checkpoint["metadata"] == {"note": "final", "steps_completed": 5}
    assert checkpoint["resources"] == {"state.json": "11", "sub/weights.bin": "100"}
    # The default storage: shared_fs under the master's data directory.
    stored = Path(checkpoint["storagePath"])
    assert stored == master.data_dir / "checkpoints" / uuid
    assert sorted(p.name for p in stored.iterdir()) == ["state.json", "sub"]

    workloads = master.api("GET", f"/api/v1/trials/{tid}/workloads")["workloads"]
    kinds = [(next(iter(w)), next(iter(w.values()))) for w in workloads]
    assert [k for k, _ in kinds] == [*["training"] * 5, "validation", "checkpoint"]
    assert kinds[-1][1]["uuid"] == uuid and kinds[-1][1]["totalBatches"] == 5

    described = master.api("GET", f"/api/v1/trials/{tid}")["trial"]
    assert described["latestCheckpointUuid"] == uuid
    assert described["totalBatchesProcessed"] == 5
    assert described["progress"] == pytest.approx(1.0)


PREEMPTIBLE_SCRIPT = """
import json, os, sys, time
import resolute

with resolute.init() as ctx:
    step = 0
    if ctx.latest_checkpoint:
        with ctx.checkpoint.restore_path(ctx.latest_checkpoint) as path:
            step = json.loads((path / "state.json").read_text())["step"]
        print(f"RESUMED {ctx.latest_checkpoint} step={step} "
              f"steps_completed={ctx.steps_completed} run={ctx.run_id}", flush=True)
        for _ in range(3):
            step += 1
            ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": 1.0})
        print("FINISHED", flush=True)
        sys.exit(0)
    while step < 600:  # about two minutes: the test pauses long before
        time.sleep(0.2)
        step += 1
        ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": 1.0})
        if ctx.preempt.should_preempt():
            with ctx.checkpoint.store_path(step) as (path, uuid):
                (path / "state.json").write_text(json.dumps({"step": step}))
            print(f"PREEMPTED at step={step} checkpoint={uuid}", flush=True)
            sys.exit(0)
    print("NEVER PREEMPTED", flush=True)
"""


def test_a_paused_trial_checkpoints_exits_and_resumes_from_that_checkpoint(
    master: MasterProcess, agent: AgentProcess, tmp_path: Path
) -> None:
    storage = tmp_path / "checkpoints"
    config, model = write_experiment(
        tmp_path,
        PREEMPTIBLE_SCRIPT,
        extra={"checkpoint_storage": {"type": "directory", "container_path": str(storage)}},
    )
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"RUNNING", "ERROR", "COMPLETED"})
    tid = trial["id"]

    def training_rows() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = master.api(
            "GET", f"/api/v1/trials/{tid}/metrics?group=training"
        )["metrics"]
        return rows

    master.wait_for("the trial to train a few steps", lambda: len(training_rows()) >= 3, 180)
    master.api("POST", f"/api/v1/experiments/{experiment_id}/pause")
    paused = wait_trial_state(master, experiment_id, {"PAUSED", "COMPLETED", "ERROR"})
    logs = trial_logs(master, tid)
    assert paused["state"] == "PAUSED", logs
    assert paused["restarts"] == 0
    found = re.findall(r"PREEMPTED at step=(\d+) checkpoint=(\S+)", logs)
    assert len(found) == 1, logs
    step, uuid = int(found[0][0]), found[0][1]
    checkpoints = master.api("GET", f"/api/v1/trials/{tid}/checkpoints")["checkpoints"]
    assert [(c["uuid"], c["stepsCompleted"]) for c in checkpoints] == [(uuid, step)]
    assert (storage / uuid / "state.json").is_file()
    assert paused["latestCheckpointUuid"] == uuid

    master.api("POST", f"/api/v1/experiments/{experiment_id}/activate")
    done = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    logs = trial_logs(master, tid)
    assert done["state"] == "COMPLETED", logs
    resumed = re.findall(r"RESUMED (\S+) step=(\d+) steps_completed=(\d+) run=(\d+)", logs)
    assert resumed == [(uuid, str(step), str(step), "2")], logs
    assert "FINISHED" in logs and "NEVER PREEMPTED" not in logs
    assert "preemption watcher" not in logs  # the polls and the acknowledgement all worked
    rows = training_rows()
    assert rows[-1]["stepsCompleted"] == step + 3
    assert rows[-1]["trialRunId"] == 2
