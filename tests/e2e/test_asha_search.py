"""ASHA searches with real trials: a det-master and a det-agent process, trial scripts on
the `resolute` library. The same search is run with the searcher's stops honoured and
ignored (what Determined 0.38 did: it never delivered them), and the batches trained are
compared; then a master is killed with SIGKILL mid-search and restarted.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import AgentProcess
from master.core import asha
from master.core.searcher import sample_trials
from master.core.seeds import LegacyRandom
from tests.e2e.agents import create_experiment, trial_logs, write_experiment
from tests.e2e.conftest import MasterProcess

pytestmark = pytest.mark.e2e

# Trains up to max_time batches, validating every PERIOD; the loss only depends on lr,
# so the searcher's decisions can be predicted. With `ignore_stops` it polls the signal
# (so it counts as listening) but trains on, as every trial did under Determined 0.38.
SCRIPT = """
import json, sys, time
import resolute

PERIOD = 8
with resolute.init() as ctx:
    lr = ctx.hparams["lr"]
    ignore = ctx.hparams["ignore_stops"]
    step = ctx.steps_completed
    while step < ctx.max_length:
        time.sleep(ctx.hparams["batch_s"])
        step += 1
        loss = abs(lr - 0.05) + 1.0 / step
        ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
        if step % PERIOD == 0:
            ctx.train.report_validation_metrics(
                steps_completed=step, metrics={"loss": loss, "batches": step}
            )
        if ctx.preempt.should_preempt() and not ignore:
            with ctx.checkpoint.store_path(step) as (path, uuid):
                (path / "state.json").write_text(json.dumps({"step": step}))
            print(f"STOPPED at {step}", flush=True)
            sys.exit(0)
    print(f"TRAINED {step}", flush=True)
"""

SEARCHER = {
    "name": "async_halving",
    "metric": "loss",
    "num_rungs": 3,
    "divisor": 2,
    "max_time": 32,
    "time_metric": "batches",
    "max_trials": 6,
    "max_concurrent_trials": 1,
}
HPARAMS = {"lr": {"type": "double", "minval": 0.0, "maxval": 0.1}}
SEED = 20261124
# A batch's time: a stop decided at one rung must reach the trial (the master's next hub
# tick, a quarter second apart, then the long-poll's answer) before the next rung, 8
# batches later. 0.05 s left that under half a second, which a loaded machine can miss.
BATCH_S = 0.1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MasterProcess, Path]]:
    work = tmp_path_factory.mktemp("asha")
    master = MasterProcess(work / "data", label="asha")
    master.start()
    agent = AgentProcess(master, "asha-agent", work / "agent", slots=2).start()
    try:
        agent.wait_connected()
        yield master, work
    finally:
        agent.stop()
        master.stop()
        shutil.rmtree(master.scratch, ignore_errors=True)


def run_search(
    master: MasterProcess, directory: Path, *, ignore_stops: bool, searcher: dict[str, Any]
) -> int:
    extra: dict[str, Any] = {
        "searcher": searcher,
        "hyperparameters": {**HPARAMS, "ignore_stops": ignore_stops, "batch_s": BATCH_S},
        "reproducibility": {"experiment_seed": SEED},
        # Long enough for a trial that ignores its stop to train to the end.
        "preemption_timeout": 600,
    }
    config, model = write_experiment(directory, SCRIPT, extra=extra)
    return create_experiment(master, config, model)


def wait_done(master: MasterProcess, experiment_id: int, timeout: float = 240) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        experiment = master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
        ended = experiment["state"] in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED")
        return experiment if ended else None

    result: dict[str, Any] = master.wait_for(f"experiment {experiment_id}", ended, timeout, 0.5)
    return result


def trials_of(master: MasterProcess, experiment_id: int) -> list[dict[str, Any]]:
    trials: list[dict[str, Any]] = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")[
        "trials"
    ]
    return trials


def expected_stops(searcher: dict[str, Any]) -> list[int]:
    """The rung each trial stops at, by Determined's rule, for trials run one at a time in
    creation order, with the hyperparameters the experiment seed gives them."""
    search = asha.MemorySearch(asha.parse_config(searcher))
    rng = LegacyRandom(SEED)
    hparams = {**HPARAMS, "ignore_stops": True, "batch_s": BATCH_S}
    stops: list[int] = []
    queue = search.take_creates()
    while queue:
        key = queue.pop(0)
        (plan,) = sample_trials(hparams, rng, 1)
        lr = plan.hparams["lr"]
        for step in range(8, 33, 8):
            decision = search.validation(
                key, {"loss": abs(lr - 0.05) + 1.0 / step, "batches": step}
            )
            if decision.stop:
                assert decision.climb is not None and decision.climb.stopped_at is not None
                stops.append(decision.climb.stopped_at)
                break
        search.closed(key, "stopped")
        queue.extend(search.take_creates())
    return stops


def test_honoured_stops_save_the_batches_determined_trained(
    cluster: tuple[MasterProcess, Path],
) -> None:
    master, work = cluster
    expected = expected_stops(SEARCHER)
    units = asha.parse_config(SEARCHER).brackets[0].rung_units

    # The two searches run side by side, one slot each (each runs one trial at a time).
    honoured = run_search(master, work / "honoured", ignore_stops=False, searcher=SEARCHER)
    ignored = run_search(master, work / "ignored", ignore_stops=True, searcher=SEARCHER)
    assert wait_done(master, honoured)["state"] == "STATE_COMPLETED"
    trials = trials_of(master, honoured)
    assert len(trials) == SEARCHER["max_trials"]
    assert [t["searcher"]["stoppedAtRung"] for t in trials] == expected
    late_by = []  # batches trained after the rung where the stop was decided
    for trial, rung in zip(trials, expected, strict=True):
        logs = trial_logs(master, trial["id"])
        assert trial["state"] == "STATE_COMPLETED" and trial["restarts"] == 0, logs
        if rung < len(units) - 1:
            # It heard the stop at the check right after the validation that decided it
            # (should_preempt() asks the master once after a validation), checkpointed
            # and exited: not one batch trained past its rung.
            stopped = int(re.findall(r"STOPPED at (\d+)", logs)[0])
            late_by.append(stopped - units[rung])
            assert stopped == units[rung], logs
            assert trial["endReason"].startswith(f"stopped by the searcher at rung {rung}")
            assert trial["latestCheckpointUuid"], trial

    assert wait_done(master, ignored)["state"] == "STATE_COMPLETED"
    ignored_trials = trials_of(master, ignored)
    # The same trials from the same seed; the same decisions, which nobody obeyed.
    assert [t["requestId"] for t in ignored_trials] == [t["requestId"] for t in trials]
    assert [t["searcher"]["stoppedAtRung"] for t in ignored_trials] == expected
    # A stopped trial's later reports entered no rung.
    for trial, rung in zip(ignored_trials, expected, strict=True):
        assert [r["rung"] for r in trial["searcher"]["rungs"]] == list(range(rung + 1))

    trained_honoured = sum(t["totalBatchesProcessed"] for t in trials)
    trained_ignored = sum(t["totalBatchesProcessed"] for t in ignored_trials)
    assert trained_ignored == SEARCHER["max_trials"] * SEARCHER["max_time"]
    assert trained_honoured < 0.75 * trained_ignored
    print(
        json.dumps(
            {
                "batches_trained_stops_honoured": trained_honoured,
                "batches_trained_stops_ignored": trained_ignored,
                "ratio": round(trained_honoured / trained_ignored, 3),
                "stops_heard_after_batches": late_by,
            }
        )
    )

    # What users read: describe shows each trial's rung; preview-search the plan.
    describe = master.det("experiment", "describe", str(honoured))
    assert describe.returncode == 0, describe.stderr
    assert "Rungs entered (metric)" in describe.stdout
    first = trials[0]
    entered = first["searcher"]["rungs"][0]
    assert f"0 at {entered['units']} batches: {entered['metric']:.6g}" in describe.stdout
    # Each trial's end as the searcher decided it, agreeing with its end reason: stopped at
    # a rung below the top, or the top rung having trained the full max_time.
    as_csv = master.det("experiment", "describe", str(honoured), "--csv")
    assert as_csv.returncode == 0, as_csv.stderr
    tables = [list(csv.reader(io.StringIO(t))) for t in as_csv.stdout.split("\n\n")]
    (rungs,) = [t for t in tables if t and t[0][-1] == "Searcher's end"]
    top = len(units) - 1
    assert {row[0]: row[-1] for row in rungs[1:]} == {
        str(trial["id"]): (
            f"top rung {top}: full max_time" if rung == top else f"stopped at rung {rung}"
        )
        for trial, rung in zip(trials, expected, strict=True)
    }
    assert [t["searcher"]["reachedTop"] for t in trials] == [r == top for r in expected]
    preview = master.det("preview-search", str(work / "honoured" / "config.yaml"))
    assert preview.returncode == 0, preview.stderr
    assert "train for 8 batches" in preview.stdout and "Budget: 6 trials" in preview.stdout


def test_a_search_survives_a_master_killed_with_sigkill(
    cluster: tuple[MasterProcess, Path],
) -> None:
    master, work = cluster
    searcher = {**SEARCHER, "max_concurrent_trials": 2, "max_trials": 8}
    experiment_id = run_search(master, work / "killed", ignore_stops=False, searcher=searcher)

    def decided() -> bool:
        trials = trials_of(master, experiment_id)
        closed = [t for t in trials if t["state"] == "STATE_COMPLETED"]
        return len(closed) >= 2 and len(trials) >= 4

    master.wait_for("the search to be under way", decided, 240, 0.2)
    before_kill = {t["id"] for t in trials_of(master, experiment_id)}
    master.kill()  # SIGKILL: no shutdown, whatever was in flight is lost
    master.start()

    assert wait_done(master, experiment_id)["state"] == "STATE_COMPLETED"
    trials = trials_of(master, experiment_id)
    # No trial lost or duplicated: exactly max_trials, the seed's trials in order.
    assert len(trials) == searcher["max_trials"]
    rng = LegacyRandom(SEED)
    hparams = {**HPARAMS, "ignore_stops": False, "batch_s": BATCH_S}
    planned = sample_trials(hparams, rng, searcher["max_trials"])
    assert [t["requestId"] for t in trials] == [str(p.request_id) for p in planned]
    units = asha.parse_config(searcher).brackets[0].rung_units
    for trial in trials:
        assert trial["state"] == "STATE_COMPLETED", trial
        rung = trial["searcher"]["stoppedAtRung"]
        assert rung is not None, trial
        # A stopped trial's later reports entered no rung.
        assert [r["rung"] for r in trial["searcher"]["rungs"]] == list(range(rung + 1)), trial
        # Trials created after the restart heard their stop from the new master: they ended
        # before max_time. (How soon is the honoured test's check, one trial at a time: here
        # two trials report at once to a master that just started, and on a loaded machine
        # the stop can arrive a validation period late.) One running across the kill could
        # not hear it while no master was up, and may have trained on.
        if rung < len(units) - 1 and trial["id"] not in before_kill:
            assert trial["totalBatchesProcessed"] < searcher["max_time"], trial
        runs = [line for line in trial_logs(master, trial["id"]).splitlines() if "STOPPED" in line]
        assert len(runs) <= 1, runs
