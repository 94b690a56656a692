"""`det experiment describe --metrics`, `det trial describe`, `det checkpoint` and
`det experiment wait`, ours and Determined's official client, against a real master and agent
running a trial that reports its metrics and checkpoints over REST as the training library does."""

from __future__ import annotations

import asyncio
import csv
import html
import io
import json
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from harness.cluster import AgentProcess, wait_until
from master.db.models import AllocationModel
from master.db.session import create_engine, create_session_factory, session_scope
from master.settings import async_database_url
from tests.conftest import require
from tests.e2e.agents import create_experiment, trial_logs, write_experiment
from tests.e2e.conftest import (
    BACKENDS,
    OUR_DET,
    MasterProcess,
    client_env,
    describe_run,
    lines,
    official_client_path,
    ok,
    running_master,
)

pytestmark = pytest.mark.e2e

# Exact in binary and short in %g, so every client prints them as written here; but for
# two at step 5 that our `det` shows to 6 significant digits (0.136789, 1.23457e-05).
TRAINING: dict[int, dict[str, float]] = {
    5: {"loss": 0.9375, "accuracy": 0.125, "grad_norm": 0.13678912345, "lr": 1.2345678e-05},
    10: {"loss": 0.8125, "accuracy": 0.25},
}
TRAINING[20] = {"loss": 0.4375, "accuracy": 0.5}
VALIDATION = {10: {"loss": 0.5625}, 20: {"loss": 0.390625}}
CHECKPOINT_STEPS = (10, 20)

# No `resolute` import: the trial speaks the REST contract itself (DET_* from the agent).
REPORTING_SCRIPT = """
import json, os, time, urllib.request, uuid

MASTER = os.environ["DET_MASTER"].rstrip("/")
TOKEN = os.environ["DET_SESSION_TOKEN"]
TRIAL = int(os.environ["DET_TRIAL_ID"])
RUN = int(os.environ["DET_TRIAL_RUN_ID"])
TRAINING = {int(k): v for k, v in json.loads(%(training)r).items()}
VALIDATION = {int(k): v for k, v in json.loads(%(validation)r).items()}
CHECKPOINTS = %(checkpoints)r


def post(path, body):
    request = urllib.request.Request(
        MASTER + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read() or b"{}")


def report(group, steps, metrics):
    body = {
        "trialId": TRIAL,
        "trialRunId": RUN,
        "stepsCompleted": steps,
        "metrics": {"avgMetrics": metrics, "batchMetrics": None},
        "reportTime": None,
    }
    post(f"/api/v1/trials/{TRIAL}/metrics", {"group": group, "metrics": body})


def checkpoint(steps):
    ident = str(uuid.uuid4())
    storage = json.loads(os.environ["DET_EXPERIMENT_CONFIG"])["checkpoint_storage"]
    directory = os.path.join(storage["host_path"], ident)
    os.makedirs(directory)
    data = f"weights at {steps}\\n".encode()
    with open(os.path.join(directory, "model.bin"), "wb") as sink:
        sink.write(data)
    post("/api/v1/checkpoints", {
        "uuid": ident,
        "state": "STATE_COMPLETED",
        "metadata": {"steps_completed": steps, "framework": "none"},
        "resources": {"model.bin": str(len(data))},
        "training": {},
        "taskId": os.environ["DET_TASK_ID"],
        "allocationId": os.environ["DET_ALLOCATION_ID"],
        "reportTime": None,
        "storageId": None,
    })
    print("CHECKPOINT", steps, ident, flush=True)


time.sleep(2)  # long enough for `det e wait` to find the experiment still running
for steps in sorted(TRAINING):
    report("training", steps, TRAINING[steps])
    if steps in VALIDATION:
        report("validation", steps, VALIDATION[steps])
    if steps in CHECKPOINTS:
        checkpoint(steps)
post(f"/api/v1/trials/{TRIAL}/progress", {"progress": 1.0, "is_raw": True})
print("reported everything", flush=True)
"""

FAILING_SCRIPT = """
import sys
print("giving up", flush=True)
sys.exit(3)
"""


@dataclass
class Reported:
    """The experiment whose trial reported TRAINING, VALIDATION and two checkpoints."""

    master: MasterProcess
    experiment_id: int
    trial: dict[str, Any]
    checkpoints: dict[int, str]  # steps -> uuid, as the trial printed them
    storage: Path
    waited: subprocess.CompletedProcess[str]  # `det e wait`, started while it ran
    waited_s: float


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[MasterProcess, Path]]:
    """A master and one two-slot agent, shared by this module's tests."""
    with running_master(request, tmp_path_factory, "trial-cli") as master:
        work = tmp_path_factory.mktemp("trial-cli-agent")
        agent = AgentProcess(master, "reporter", work / "agent", slots=2)
        agent.start()
        try:
            agent.wait_connected()
            yield master, work
        finally:
            agent.stop()


@pytest.fixture(scope="module")
def reported(cluster: tuple[MasterProcess, Path]) -> Reported:
    master, work = cluster
    storage = work / "checkpoints"
    storage.mkdir()
    script = REPORTING_SCRIPT % {
        "training": json.dumps(TRAINING),
        "validation": json.dumps(VALIDATION),
        "checkpoints": list(CHECKPOINT_STEPS),
    }
    config, model = write_experiment(
        work / "reporting",
        script,
        extra={
            # Both checkpoints kept: these tests read them back (retention is tested apart).
            "checkpoint_storage": {
                "type": "shared_fs",
                "host_path": str(storage),
                "save_trial_latest": 2,
            },
            "searcher": {"max_length": 20},
        },
    )
    experiment_id = create_experiment(master, config, model)
    started = time.monotonic()
    waited = master.det("experiment", "wait", str(experiment_id), "--interval", "0.5", timeout=240)
    waited_s = time.monotonic() - started
    trials = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
    assert len(trials) == 1, trials
    trial: dict[str, Any] = trials[0]
    logs = trial_logs(master, trial["id"])
    assert trial["state"] == "STATE_COMPLETED", f"{trial}\n--- trial logs ---\n{logs}"
    printed = re.findall(r"^CHECKPOINT (\d+) (\S+)$", logs, re.M)
    checkpoints = {int(steps): uuid for steps, uuid in printed}
    assert sorted(checkpoints) == list(CHECKPOINT_STEPS), logs
    return Reported(master, experiment_id, trial, checkpoints, storage, waited, waited_s)


def fields(output: str) -> dict[str, str]:
    """A two-column `Field  Value` table as a dict (an empty value reads as "")."""
    table: dict[str, str] = {}
    for line in lines(output)[1:]:
        name, *value = re.split(r"\s{2,}", line, maxsplit=1)
        table[name] = value[0] if value else ""
    return table


def row_for(output: str, trial_id: int, batches: int) -> str:
    found = [
        line
        for line in lines(output)
        if re.match(rf"^{trial_id}\s+{batches}(\s|$)", line) is not None
    ]
    assert len(found) == 1, f"one row for trial {trial_id} at {batches} batches:\n{output}"
    return found[0]


def det_columns(
    master: MasterProcess, columns: int, *args: str
) -> subprocess.CompletedProcess[str]:
    """Our `det` on a terminal `columns` wide."""
    return subprocess.run(
        [str(OUR_DET), *args],
        capture_output=True,
        text=True,
        env=client_env(master.url, COLUMNS=str(columns)),
        timeout=60,
        check=False,
    )


def wide_det(master: MasterProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """Our `det` on a terminal wide enough that no cell of a long path is cut."""
    return det_columns(master, 400, *args)


def not_found(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 1, describe_run(result)
    assert lines(result.stderr) == [f"Error: {message}"], describe_run(result)
    assert result.stdout == "", describe_run(result)


# -- det experiment wait -----------------------------------------------------------------------


def test_wait_polls_until_the_experiment_completes(reported: Reported) -> None:
    result = ok(reported.waited)
    assert lines(result.stdout) == [f"Experiment {reported.experiment_id} ended: COMPLETED"], (
        describe_run(result)
    )
    # The trial sleeps 2 s before reporting, so the command really waited for it.
    assert reported.waited_s >= 2, reported.waited_s
    again = ok(reported.master.det("e", "wait", str(reported.experiment_id)))
    assert lines(again.stdout) == lines(result.stdout)


def test_wait_exits_1_on_error_paused_and_canceled_experiments(
    cluster: tuple[MasterProcess, Path], tmp_path: Path
) -> None:
    master, _ = cluster
    config, model = write_experiment(tmp_path / "failing", FAILING_SCRIPT)
    failing = create_experiment(master, config, model)
    result = master.det("e", "wait", str(failing), "--interval", "0.5", timeout=240)
    assert result.returncode == 1, describe_run(result)
    assert lines(result.stdout) == [f"Experiment {failing} ended: ERROR"], describe_run(result)

    # Three slots never fit two-slot agents: the trial stays queued while we pause and kill it.
    config, model = write_experiment(tmp_path / "stuck", "print('never runs')\n", slots=3)
    stuck = create_experiment(master, config, model)
    ok(master.det("e", "pause", str(stuck)))
    paused = master.det("e", "wait", str(stuck), "--interval", "0.2")
    assert paused.returncode == 1, describe_run(paused)
    assert lines(paused.stderr) == [
        f"Error: experiment {stuck} is paused; activate it, then wait again"
    ], describe_run(paused)

    ok(master.det("e", "kill", str(stuck)))
    killed = master.det("e", "wait", str(stuck), "--interval", "0.2", timeout=240)
    assert killed.returncode == 1, describe_run(killed)
    assert lines(killed.stdout) == [f"Experiment {stuck} ended: CANCELED"], describe_run(killed)


def test_wait_on_an_unknown_experiment_is_an_error(cluster: tuple[MasterProcess, Path]) -> None:
    master, _ = cluster
    not_found(master.det("e", "wait", "987654"), "experiment 987654 not found")


# -- det experiment describe --metrics ---------------------------------------------------------


def test_describe_metrics_shows_one_row_per_batch_count(reported: Reported) -> None:
    master, trial_id = reported.master, reported.trial["id"]
    result = ok(master.det("e", "describe", str(reported.experiment_id), "--metrics"))
    out = result.stdout
    assert f"Workloads of trial {trial_id}:" in out, describe_run(result)
    shown = lines(out)
    header = shown[shown.index(f"Workloads of trial {trial_id}:") + 1]
    assert re.split(r"\s{2,}", header) == [
        "Trial ID",
        "Batches",
        "Training metrics",
        "Validation metrics",
        "Checkpoint",
        "End time",
    ]
    # Training, validation and checkpoint reports at the same batch count merge into one row.
    five = row_for(out, trial_id, 5)
    shown_five = "accuracy=0.125, grad_norm=0.136789, loss=0.9375, lr=1.23457e-05"
    assert shown_five in five and "loss=0.5625" not in five, five
    ten = row_for(out, trial_id, 10)
    assert re.search(
        rf"accuracy=0\.25, loss=0\.8125\s+loss=0\.5625\s+{reported.checkpoints[10]}\s+\d{{4}}-",
        ten,
    ), ten
    twenty = row_for(out, trial_id, 20)
    assert re.search(
        rf"accuracy=0\.5, loss=0\.4375\s+loss=0\.390625\s+{reported.checkpoints[20]}\s", twenty
    ), twenty

    # Without --metrics the workloads stay out of the way.
    plain = ok(master.det("e", "describe", str(reported.experiment_id)))
    assert "Workloads" not in plain.stdout and "loss=" not in plain.stdout


def test_describe_metrics_json_carries_each_trials_workloads(reported: Reported) -> None:
    master = reported.master
    result = ok(master.det("e", "describe", str(reported.experiment_id), "--metrics", "--json"))
    data = json.loads(result.stdout)
    (trial,) = data["trials"]
    by_kind: dict[str, list[dict[str, Any]]] = {"training": [], "validation": [], "checkpoint": []}
    for workload in trial["workloads"]:
        ((kind, item),) = ((k, v) for k, v in workload.items() if v)
        by_kind[kind].append(item)
    training = {w["totalBatches"]: w["metrics"]["avgMetrics"] for w in by_kind["training"]}
    assert training == TRAINING  # every digit, as reported
    assert training[5]["grad_norm"] == 0.13678912345 and training[5]["lr"] == 1.2345678e-05
    assert {
        w["totalBatches"]: w["metrics"]["avgMetrics"] for w in by_kind["validation"]
    } == VALIDATION
    assert {w["totalBatches"]: w["uuid"] for w in by_kind["checkpoint"]} == reported.checkpoints

    plain = json.loads(
        ok(master.det("e", "describe", str(reported.experiment_id), "--json")).stdout
    )
    assert "workloads" not in plain["trials"][0]


# -- det trial describe ------------------------------------------------------------------------


def test_trial_describe_shows_progress_checkpoint_and_validations(reported: Reported) -> None:
    master, trial = reported.master, reported.trial
    result = ok(master.det("trial", "describe", str(trial["id"])))
    shown = fields(result.stdout)
    assert shown["ID"] == str(trial["id"]), describe_run(result)
    assert shown["Experiment"] == str(reported.experiment_id)
    assert shown["State"] == "COMPLETED"
    assert shown["Trial seed"] == str(trial["seed"])
    assert shown["Restarts"] == "0"
    assert shown["Batches"] == "20"
    assert shown["Progress"] == "100.0%"
    assert shown["Latest checkpoint"] == reported.checkpoints[20]
    assert shown["Best validation"] == "loss=0.390625 (batches 20)"
    assert shown["Latest validation"] == "loss=0.390625 (batches 20)"
    assert shown["Pending reason"] == ""
    assert "Workloads" not in result.stdout

    with_metrics = ok(master.det("t", "describe", str(trial["id"]), "--metrics"))
    assert "loss=0.8125" in row_for(with_metrics.stdout, trial["id"], 10)

    data = json.loads(ok(master.det("trial", "describe", str(trial["id"]), "--json")).stdout)
    assert set(data) == {"trial"}
    assert data["trial"]["latestCheckpointUuid"] == reported.checkpoints[20]
    assert data["trial"]["bestValidation"]["metrics"]["avgMetrics"] == VALIDATION[20]
    data = json.loads(
        ok(master.det("trial", "describe", str(trial["id"]), "--json", "--metrics")).stdout
    )
    assert len(data["workloads"]) == len(TRAINING) + len(VALIDATION) + len(CHECKPOINT_STEPS)


def test_trial_describe_says_why_a_trial_waits(
    cluster: tuple[MasterProcess, Path], tmp_path: Path
) -> None:
    master, _ = cluster
    config, model = write_experiment(tmp_path, "print('never runs')\n", slots=3)
    experiment_id = create_experiment(master, config, model)
    try:
        trial_id = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"][0][
            "id"
        ]

        def reason() -> str:
            shown = fields(ok(master.det("trial", "describe", str(trial_id))).stdout)
            return shown["Pending reason"] if shown["State"] == "QUEUED" else ""

        shown = master.wait_for("a pending reason", reason, 180)
        assert shown.startswith("NEVER_FITS: "), shown
        assert "multiple of 2" in shown, shown
    finally:
        ok(master.det("e", "kill", str(experiment_id)))


def test_trial_describe_unknown_trial_is_a_404(cluster: tuple[MasterProcess, Path]) -> None:
    master, _ = cluster
    not_found(master.det("trial", "describe", "987654"), "trial 987654 not found")
    not_found(master.det("trial", "describe", "987654", "--json"), "trial 987654 not found")


# -- det checkpoint ----------------------------------------------------------------------------


def test_checkpoint_list_shows_steps_uuid_metric_and_files(reported: Reported) -> None:
    master, trial_id = reported.master, reported.trial["id"]
    result = ok(wide_det(master, "checkpoint", "list", str(reported.experiment_id)))
    header, *rows = lines(result.stdout)
    assert re.split(r"\s{2,}", header) == [
        "Trial ID",
        "Steps",
        "UUID",
        "Validation metric",
        "State",
        "Report time",
        "Resources",
        "Storage path",
    ], describe_run(result)
    assert len(rows) == 2, describe_run(result)
    for row, steps in zip(rows, CHECKPOINT_STEPS, strict=True):
        uuid = reported.checkpoints[steps]
        metric = VALIDATION[steps]["loss"]
        pattern = (
            rf"^{trial_id}\s+{steps}\s+{uuid}\s+{metric}\s+ACTIVE\s+\d{{4}}-\d\d-\d\d "
            rf"\d\d:\d\d:\d\d\s+1 file, 14 B\s+{re.escape(str(reported.storage / uuid))}$"
        )
        assert re.match(pattern, row), f"{row!r} !~ {pattern!r}"
        assert (reported.storage / uuid / "model.bin").read_text() == f"weights at {steps}\n"

    # --best keeps the lowest loss (smaller_is_better defaults to true), best first.
    best = ok(wide_det(master, "c", "list", str(reported.experiment_id), "--best", "1"))
    assert [row.split()[2] for row in lines(best.stdout)[1:]] == [reported.checkpoints[20]]
    listed = json.loads(
        ok(master.det("c", "list", str(reported.experiment_id), "--best", "2", "--json")).stdout
    )
    assert [c["uuid"] for c in listed] == [reported.checkpoints[20], reported.checkpoints[10]]
    assert [c["training"]["searcherMetric"] for c in listed] == [0.390625, 0.5625]
    # Determined's spelling of the same listing.
    same = ok(master.det("e", "lc", str(reported.experiment_id), "--best", "2", "--json"))
    assert json.loads(same.stdout) == listed


def test_trial_download_takes_its_best_its_latest_or_one_by_uuid(
    reported: Reported, tmp_path: Path
) -> None:
    """Determined's `det trial download`: validation loss is the searcher's metric (smaller
    is better), so the best is the latest here; ranking by loss the other way picks the
    first checkpoint."""
    master, trial = reported.master, str(reported.trial["id"])

    def weights(*args: str) -> str:
        target = tmp_path / "-".join(a.strip("-") for a in args)
        result = ok(master.det("trial", "download", trial, *args, "-o", str(target), "-q"))
        assert lines(result.stdout) == [str(target)], describe_run(result)
        return (target / "model.bin").read_text()

    assert weights("--latest") == "weights at 20\n"
    assert weights("--best") == "weights at 20\n"
    assert weights("--best", "--sort-by", "loss", "--smaller-is-better", "false") == (
        "weights at 10\n"
    )
    assert weights("--uuid", reported.checkpoints[10]) == "weights at 10\n"
    refused = master.det("trial", "download", trial, "--best", "--latest")
    assert refused.returncode == 1, describe_run(refused)
    assert lines(refused.stderr) == ["Error: give exactly one of --best, --latest or --uuid"]


def test_the_official_clients_trial_download(reported: Reported, tmp_path: Path) -> None:
    """Determined 0.38.1's `det trial download` against us. It asks for the trial's
    checkpoints in the order its flags name (`--latest`: sortByAttr=BATCH_NUMBER,
    orderBy=DESC; `--best --sort-by M`: sortByMetric=M, ASC when smaller is better) and then
    takes the list's last element, so it downloads the oldest, or the worst. We serve the
    order it asks for, so it gets what Determined's master would give it; ours (above) gives
    the newest and the best. (Its `--uuid` is refused by the client itself: it counts the
    flags that are `True`, and a UUID is a string.)"""
    master, trial = reported.master, str(reported.trial["id"])

    def weights(*args: str) -> str:
        target = tmp_path / "official" / "-".join(a.strip("-") for a in args)
        ok(master.official("trial", "download", trial, *args, "-o", str(target)))
        return (target / "model.bin").read_text()

    assert weights("--latest") == "weights at 10\n"
    best = ("--best", "--sort-by", "loss", "--smaller-is-better")
    assert weights(*best, "true") == "weights at 10\n"
    assert weights(*best, "false") == "weights at 20\n"


@pytest.mark.parametrize("columns", [80, 150])
def test_checkpoint_list_on_a_narrow_terminal_keeps_uuids_and_states_whole(
    reported: Reported, columns: int
) -> None:
    """Each row stays one line with its UUID and state whole; the long storage path is cut
    with an ellipsis, and --csv and --json carry it in full."""
    master, experiment = reported.master, str(reported.experiment_id)
    result = ok(det_columns(master, columns, "checkpoint", "list", experiment))
    header, *rows = lines(result.stdout)
    assert header.startswith("Trial ID") and len(rows) == 2, describe_run(result)
    for row, steps in zip(rows, CHECKPOINT_STEPS, strict=True):
        uuid = reported.checkpoints[steps]
        assert re.match(rf"^{reported.trial['id']}\s+{steps}\s+{uuid}\s+\S+\s+ACTIVE\s", row), (
            describe_run(result)
        )
    path = str(reported.storage / reported.checkpoints[10])
    if len(path) > 20 and columns == 80:
        assert path not in result.stdout and "…" in rows[0], describe_run(result)

    as_csv = ok(det_columns(master, columns, "checkpoint", "list", experiment, "--csv"))
    table = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert table[0][:3] == ["Trial ID", "Steps", "UUID"], describe_run(as_csv)
    assert [(r[2], r[4], r[-1]) for r in table[1:]] == [
        (reported.checkpoints[s], "ACTIVE", str(reported.storage / reported.checkpoints[s]))
        for s in CHECKPOINT_STEPS
    ]
    listed = json.loads(ok(master.det("checkpoint", "list", experiment, "--json")).stdout)
    assert [c["storagePath"] for c in listed] == [r[-1] for r in table[1:]]

    both = master.det("checkpoint", "list", experiment, "--json", "--csv")
    not_found(both, "--json and --csv cannot be used together")


def test_checkpoints_removed_by_retention_say_why_in_the_listing_and_on_the_dashboard(
    cluster: tuple[MasterProcess, Path],
) -> None:
    """Default retention keeps each trial's best and latest: step 20's checkpoint is both
    (lower loss), so step 10's goes when the experiment ends; `det checkpoint list` and the
    experiment's page say why, where users used to see it vanish with no reason."""
    master, work = cluster
    storage = work / "retained"
    storage.mkdir()
    script = REPORTING_SCRIPT % {
        "training": json.dumps(TRAINING),
        "validation": json.dumps(VALIDATION),
        "checkpoints": list(CHECKPOINT_STEPS),
    }
    config, model = write_experiment(
        work / "retention",
        script,
        extra={
            "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)},
            "searcher": {"max_length": 20},
        },
    )
    experiment = str(create_experiment(master, config, model))
    ok(master.det("experiment", "wait", experiment, "--interval", "0.5", timeout=240))
    reason = "retention: not among save_experiment_best=0, save_trial_best=1 or save_trial_latest=1"

    def listed() -> list[dict[str, Any]] | None:
        found = json.loads(ok(master.det("checkpoint", "list", experiment, "--json")).stdout)
        return found if any(c.get("stateReason") for c in found) else None

    checkpoints = wait_until("retention to mark step 10's checkpoint", listed, timeout=60)
    by_steps = {c["metadata"]["steps_completed"]: c for c in checkpoints}
    assert by_steps[10]["stateReason"] == reason and by_steps[10]["storageState"] in (
        "DELETING",
        "DELETED",
    )
    assert by_steps[20]["storageState"] == "ACTIVE" and not by_steps[20].get("stateReason")

    table = ok(det_columns(master, 250, "checkpoint", "list", experiment))
    header, *rows = lines(table.stdout)
    assert header.rstrip().endswith("State reason"), describe_run(table)
    kept = next(r for r in rows if by_steps[20]["uuid"] in r)
    # A long reason wraps at spaces inside its column, every word whole.
    assert reason in " ".join(table.stdout.split()) and "retention" not in kept, describe_run(table)
    as_csv = list(csv.reader(io.StringIO(ok(master.det("c", "list", experiment, "--csv")).stdout)))
    assert {r[2]: r[-1] for r in as_csv[1:]} == {
        by_steps[10]["uuid"]: reason,
        by_steps[20]["uuid"]: "",
    }

    with httpx.Client(base_url=master.url, timeout=30) as browser:
        signed_in = browser.post(
            "/ui/login",
            data={"username": "determined", "password": ""},
            headers={"Origin": master.url},
        )
        assert signed_in.status_code == 303, signed_in.text
        page = html.unescape(browser.get(f"/ui/experiments/{experiment}").text)
    row = next(r for r in page.split("</tr>") if f'title="{by_steps[10]["uuid"]}"' in r)
    assert reason in row, row


def test_max_slots_caps_a_search_on_real_agents(
    cluster: tuple[MasterProcess, Path],
) -> None:
    """resources.max_slots 4 on a 16-trial search, with 10 slots free over two agents: from
    the allocations' history (placed when committed, freed when released), the experiment
    never held more than 4 slots at once, and did hold 4."""
    master, work = cluster
    wide = AgentProcess(master, "wide", work / "wide-agent", slots=8).start()
    try:
        wide.wait_connected()
        config, model = write_experiment(
            work / "capped",
            "import time\ntime.sleep(0.5)\n",
            extra={
                "resources": {"max_slots": 4},
                "hyperparameters": {"x": {"type": "int", "minval": 1, "maxval": 100}},
                "searcher": {"name": "random", "max_trials": 16, "max_length": 1},
            },
        )
        experiment = create_experiment(master, config, model)
        ok(master.det("experiment", "wait", str(experiment), "--interval", "0.5", timeout=240))
    finally:
        wide.stop()
    spans = allocation_spans(master, experiment)
    assert len(spans) == 16, spans
    # Releases before placements at the same instant: a freed slot is not held twice.
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    held, most = 0, 0
    for _, step in events:
        held += step
        most = max(most, held)
    assert most == 4, spans


def allocation_spans(master: MasterProcess, experiment_id: int) -> list[tuple[float, float]]:
    """Each of the experiment's allocations: (placed, released), from the master's records."""

    async def read() -> list[tuple[float, float]]:
        engine = create_engine(async_database_url(master.db_url, master.data_dir))
        try:
            async with session_scope(create_session_factory(engine)) as session:
                rows = await session.execute(
                    select(AllocationModel.assigned_at, AllocationModel.ended_at).where(
                        AllocationModel.experiment_id == experiment_id
                    )
                )
                return [(a.timestamp(), e.timestamp()) for a, e in rows.all()]
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, read()).result()


def test_checkpoint_describe(reported: Reported) -> None:
    master, uuid = reported.master, reported.checkpoints[10]
    result = ok(master.det("checkpoint", "describe", uuid))
    shown = fields(result.stdout)
    assert shown["UUID"] == uuid, describe_run(result)
    assert shown["Experiment ID"] == str(reported.experiment_id)
    assert shown["Trial ID"] == str(reported.trial["id"])
    assert shown["Steps completed"] == "10"
    assert shown["State"] == "ACTIVE"
    assert shown["Storage path"] == str(reported.storage / uuid)
    assert shown["Resources"] == "1 file, 14 B"
    assert shown["Searcher metric"] == "0.5625"
    assert shown["Validation metrics"] == "loss=0.5625"
    assert json.loads(shown["Metadata"]) == {"framework": "none", "steps_completed": 10}

    data = json.loads(ok(master.det("c", "describe", uuid, "--json")).stdout)
    assert data["uuid"] == uuid and data["metadata"]["steps_completed"] == 10


def test_checkpoint_commands_on_unknown_ids_fail_with_the_masters_message(
    cluster: tuple[MasterProcess, Path],
) -> None:
    master, _ = cluster
    missing = "00000000-0000-4000-8000-000000000000"
    result = master.det("checkpoint", "describe", missing)
    assert result.returncode == 1 and result.stdout == "", describe_run(result)
    assert lines(result.stderr)[0].startswith("Error: ") and missing in result.stderr
    not_found(master.det("checkpoint", "list", "987654"), "experiment 987654 not found")


# -- Determined's official client --------------------------------------------------------------


@pytest.mark.official_client
def test_official_describe_metrics_and_wait(reported: Reported) -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )
    master, experiment_id = reported.master, str(reported.experiment_id)
    result = ok(master.official("experiment", "describe", experiment_id, "--metrics"))
    assert "Traceback" not in result.stderr, describe_run(result)
    out = result.stdout
    for header in ("Training Metric: loss", "Training Metric: accuracy", "Validation Metric: loss"):
        assert header in out, describe_run(result)
    shown = lines(out)
    workloads = shown[shown.index("Workloads:") + 1 :]
    rows = {
        int(cells[1]): cells
        for cells in ([c.strip() for c in line.split("|")] for line in workloads)
        if cells[0] == str(reported.trial["id"])
    }
    assert sorted(rows) == [5, 10, 20], describe_run(result)
    for steps, metrics in TRAINING.items():
        assert str(metrics["loss"]) in rows[steps], rows[steps]
    for steps, metrics in VALIDATION.items():
        assert str(metrics["loss"]) in rows[steps], rows[steps]

    waited = ok(master.official("experiment", "wait", experiment_id))
    assert "Traceback" not in waited.stderr, describe_run(waited)


@pytest.mark.official_client
def test_official_checkpoint_listing_and_describe(reported: Reported) -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )
    master, experiment_id = reported.master, str(reported.experiment_id)
    listed = ok(master.official("experiment", "list-checkpoints", experiment_id))
    assert "Traceback" not in listed.stderr, describe_run(listed)
    for steps, uuid in reported.checkpoints.items():
        row = next(line for line in lines(listed.stdout) if uuid in line)
        cells = [cell.strip() for cell in row.split("|")]
        # Trial ID | # of Batches | State | Validation Metric | UUID | ...
        assert cells[1:4] == [str(steps), "COMPLETED", str(VALIDATION[steps]["loss"])], row

    # --best asks the master for the best checkpoint by searcher.metric (loss, smaller).
    best = ok(master.official("experiment", "list-checkpoints", experiment_id, "--best", "1"))
    shown = [
        line for line in lines(best.stdout) if any(u in line for u in reported.checkpoints.values())
    ]
    assert len(shown) == 1 and reported.checkpoints[20] in shown[0], describe_run(best)

    described = ok(master.official("checkpoint", "describe", reported.checkpoints[10]))
    assert "Traceback" not in described.stderr, describe_run(described)
    assert reported.checkpoints[10] in described.stdout, describe_run(described)
    assert "0.5625" in described.stdout, describe_run(described)
