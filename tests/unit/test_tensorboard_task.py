"""resolute.tensorboard_task against a fake master on a real loopback socket: the event files
it writes, read back by TensorBoard's own reader, its refreshes, its fatal errors, and one
run of the whole task with a real TensorBoard."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.cluster import free_port
from master.schemas.common import Pagination
from master.schemas.experiments import (
    Experiment,
    ExperimentResponse,
    MetricRow,
    MetricRows,
    Trial,
    TrialList,
    TrialResponse,
)
from resolute import tensorboard_task
from resolute.tensorboard_task import (
    LogDir,
    Master,
    MasterError,
    serve,
    sources,
    sync_experiment,
)
from resolute.tfevents import EventFileWriter
from tests.conftest import require

TOKEN = "tensorboard-task-token"
T0 = datetime(2025, 11, 21, 10, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


# --- a master that speaks the real schemas ----------------------------------------------------


def _reply(model: Any) -> bytes:
    """As FastAPI sends a response model: camelCase, JSON types."""
    return json.dumps(model.model_dump(mode="json", by_alias=True)).encode()


def _error(status: int, code: int, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"code": code, "message": message, "details": []}).encode()


def row(group: str, steps: int, metrics: dict[str, Any], run: int = 1) -> MetricRow:
    return MetricRow(
        group=group,
        steps_completed=steps,
        trial_run_id=run,
        report_time=T0 + timedelta(seconds=steps),
        metrics=metrics,
    )


class FakeMaster:
    """The three routes the task reads, with the bearer token checked on each. Experiments
    map to a config and their trials' metric rows; tests change them between requests."""

    def __init__(self) -> None:
        self.configs: dict[int, dict[str, Any]] = {}
        self.trials: dict[int, dict[int, list[MetricRow]]] = {}
        self.requests: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with fake.lock:
                    fake.requests.append(self.path)
                    status, body = fake.answer(self.path, self.headers.get("Authorization"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, experiment_id: int, trial_id: int, *rows: MetricRow, **config: Any) -> None:
        with self.lock:
            self.configs.setdefault(experiment_id, {"name": f"exp {experiment_id}"}).update(config)
            trials = self.trials.setdefault(experiment_id, {})
            trials.setdefault(trial_id, []).extend(rows)

    def answer(self, target: str, authorization: str | None) -> tuple[int, bytes]:
        if authorization != f"Bearer {TOKEN}":
            return _error(401, 16, "invalid credentials")
        url = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(url.query))
        if match := re.fullmatch(r"/api/v1/experiments/(\d+)", url.path):
            eid = int(match[1])
            if eid not in self.configs:
                return _error(404, 5, f"experiment {eid} not found")
            return 200, _reply(ExperimentResponse(experiment=self._experiment(eid)))
        if match := re.fullmatch(r"/api/v1/experiments/(\d+)/trials", url.path):
            eid = int(match[1])
            if eid not in self.configs:
                return _error(404, 5, f"experiment {eid} not found")
            ids = sorted(self.trials[eid])
            offset, limit = int(query.get("offset", 0)), int(query.get("limit", 0))
            page = ids[offset : offset + limit] if limit else ids[offset:]
            return 200, _reply(
                TrialList(
                    trials=[self._trial(eid, t) for t in page],
                    pagination=Pagination.of(offset, limit, len(page), len(ids)),
                )
            )
        if match := re.fullmatch(r"/api/v1/trials/(\d+)", url.path):
            tid = int(match[1])
            for eid, trials in self.trials.items():
                if tid in trials:
                    return 200, _reply(TrialResponse(trial=self._trial(eid, tid)))
            return _error(404, 5, f"trial {tid} not found")
        if match := re.fullmatch(r"/api/v1/trials/(\d+)/metrics", url.path):
            tid = int(match[1])
            for trials in self.trials.values():
                if tid in trials:
                    return 200, _reply(MetricRows(metrics=list(trials[tid])))
            return _error(404, 5, f"trial {tid} not found")
        return _error(404, 5, "Not Found")

    def _experiment(self, eid: int) -> Experiment:
        return Experiment(
            id=eid,
            name=f"exp {eid}",
            archived=False,
            config=self.configs[eid],
            original_config="",
            job_id=f"job-{eid}",
            num_trials=len(self.trials[eid]),
            project_id=1,
            project_owner_id=1,
            searcher_type="single",
            start_time=T0,
            state="STATE_ACTIVE",
            username="alice",
            description="",
            end_time=None,
            progress=None,
            resource_pool="default",
            user_id=1,
            display_name="alice",
            labels=[],
            template_name=None,
            experiment_seed=1,
        )

    def _trial(self, eid: int, tid: int) -> Trial:
        return Trial(
            id=tid,
            experiment_id=eid,
            hparams={},
            restarts=0,
            start_time=T0,
            state="STATE_ACTIVE",
            total_batches_processed=0,
            end_time=None,
            request_id=f"req-{tid}",
            seed=tid,
            task_id=f"{eid}.req-{tid}",
            runner_state="",
            latest_training=None,
            latest_validation=None,
            best_validation=None,
        )


@pytest.fixture
def fake() -> Iterator[FakeMaster]:
    master = FakeMaster()
    master.thread.start()
    yield master
    master.server.shutdown()
    master.server.server_close()


@pytest.fixture
def master(fake: FakeMaster) -> Iterator[Master]:
    client = Master(fake.url, TOKEN, timeout_s=5)
    yield client
    client.close()


def scalars(run: Path) -> dict[str, list[tuple[int, float, float]]]:
    """TensorBoard's own reader over one run: (step, value, wall time) by tag."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        require(False, "tensorboard is not installed (the test dependency group has it)")
    accumulator = EventAccumulator(str(run), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def task_env(fake: FakeMaster, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    return {**env, "DET_MASTER": fake.url, "DET_SESSION_TOKEN": TOKEN, **extra}


# --- rows to event files ------------------------------------------------------------------------


def test_each_trial_is_a_run_with_group_tags(
    fake: FakeMaster, master: Master, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tensorboard_task, "PAGE_SIZE", 2)  # three trials: two pages
    fake.add(
        1,
        10,
        row("training", 100, {"loss": 0.5, "note": "text", "lr": None, "ok": True}),
        row("validation", 100, {"accuracy": 0.75}),
        row("training", 200, {"loss": "NaN"}),
    )
    fake.add(1, 11, row("training", 50, {"loss": 2.0}))
    fake.add(1, 12)  # no reports yet
    fake.add(2, 20, row("training", 10, {"loss": 1.0}))
    logdir = LogDir(tmp_path / "tb")

    assert sync_experiment(master, logdir, 1) == (3, 4)
    assert sync_experiment(master, logdir, 2) == (1, 1)
    logdir.close()

    trial_pages = [p for p in fake.requests if p.startswith("/api/v1/experiments/1/trials")]
    assert [
        urllib.parse.parse_qs(urllib.parse.urlsplit(p).query)["offset"] for p in trial_pages
    ] == [
        ["0"],
        ["2"],
    ]
    runs = sorted(str(p.parent.relative_to(tmp_path / "tb")) for p in tmp_path.rglob("events.*"))
    assert runs == ["experiment_1/trial_10", "experiment_1/trial_11", "experiment_2/trial_20"]

    trial_10 = scalars(tmp_path / "tb" / "experiment_1" / "trial_10")
    assert sorted(trial_10) == ["training/loss", "validation/accuracy"]  # text, null, bool left out
    (s1, v1, w1), (s2, v2, _) = trial_10["training/loss"]
    assert (s1, v1, w1) == (100, 0.5, (T0 + timedelta(seconds=100)).timestamp())
    assert s2 == 200 and math.isnan(v2)  # the master's "NaN" string, plotted as NaN
    assert trial_10["validation/accuracy"] == [(100, 0.75, T0.timestamp() + 100)]
    assert scalars(tmp_path / "tb" / "experiment_2" / "trial_20") == {
        "training/loss": [(10, 1.0, T0.timestamp() + 10)]
    }


def test_a_refresh_writes_only_rows_not_yet_written(
    fake: FakeMaster, master: Master, tmp_path: Path
) -> None:
    fake.add(1, 10, row("training", 100, {"loss": 0.5}), row("validation", 100, {"acc": 0.1}))
    logdir = LogDir(tmp_path)
    assert sync_experiment(master, logdir, 1) == (1, 2)
    assert sync_experiment(master, logdir, 1) == (1, 0)  # nothing new: nothing written

    fake.add(
        1,
        10,
        row("training", 100, {"loss": 9.0}, run=2),  # a restarted run reports step 100 again
        row("training", 200, {"loss": 0.25}, run=2),
        row("validation", 200, {"acc": 0.2}, run=2),
    )
    fake.add(1, 11, row("training", 100, {"loss": 3.0}))  # a trial the search added
    assert sync_experiment(master, logdir, 1) == (2, 3)
    assert sync_experiment(master, logdir, 1) == (2, 0)
    logdir.close()

    trial_10 = scalars(tmp_path / "experiment_1" / "trial_10")
    assert [(s, v) for s, v, _ in trial_10["training/loss"]] == [(100, 0.5), (200, 0.25)]
    assert [s for s, _, _ in trial_10["validation/acc"]] == [100, 200]
    assert [
        (s, v) for s, v, _ in scalars(tmp_path / "experiment_1" / "trial_11")["training/loss"]
    ] == [(100, 3.0)]


def test_rows_are_new_once_per_trial_group_and_step(tmp_path: Path) -> None:
    logdir = LogDir(tmp_path)
    rows = [
        {
            "group": "training",
            "stepsCompleted": 1,
            "reportTime": "2025-11-21T10:00:00Z",
            "metrics": {},
        },
        {
            "group": "training",
            "stepsCompleted": 1,
            "reportTime": "2025-11-21T10:00:01Z",
            "metrics": {},
        },
        {
            "group": "validation",
            "stepsCompleted": 1,
            "reportTime": "2025-11-21T10:00:02Z",
            "metrics": {},
        },
    ]
    assert logdir.new_rows(7, rows) == [rows[0], rows[2]]
    assert logdir.add(1, 7, rows) == 0  # no numbers: no file, but the rows count as written
    assert logdir.new_rows(7, rows) == []
    assert logdir.new_rows(8, rows) == [rows[0], rows[2]]  # another trial's steps are its own
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("under_cluster_id", [True, False])
def test_event_files_a_trial_wrote_in_shared_fs_are_linked(
    fake: FakeMaster, master: Master, tmp_path: Path, under_cluster_id: bool
) -> None:
    store = tmp_path / "store"
    storage = {"type": "shared_fs", "host_path": str(store), "storage_path": "ckpts"}
    fake.add(1, 10, row("training", 1, {"loss": 1.0}), checkpoint_storage=storage)
    fake.add(1, 11)
    written = store / "ckpts" / ("cluster-1" if under_cluster_id else "") / "tensorboard"
    written = written / "experiment" / "1" / "trial" / "10"
    with EventFileWriter(written) as writer:
        writer.add_scalar("own/reward", 7.0, step=3, wall_time=T0.timestamp())

    logdir = LogDir(tmp_path / "tb")
    sync_experiment(master, logdir, 1, cluster_id="cluster-1")
    sync_experiment(master, logdir, 1, cluster_id="cluster-1")  # a refresh keeps the link
    logdir.close()

    link = tmp_path / "tb" / "experiment_1" / "trial_10" / "written"
    assert link.is_symlink() and link.resolve() == written.resolve()
    assert scalars(link) == {"own/reward": [(3, 7.0, T0.timestamp())]}
    assert not (tmp_path / "tb" / "experiment_1" / "trial_11").exists()  # nothing there: skipped


def test_single_trials_are_shown_beside_whole_experiments(
    fake: FakeMaster, master: Master, tmp_path: Path
) -> None:
    """Determined's `det tensorboard start 1 -t 21 -t 10`: experiment 1 whole, and trial 21
    of experiment 2 alone (trial 10 is in experiment 1 already)."""
    for eid, tid in ((1, 10), (1, 11), (2, 20), (2, 21)):
        fake.add(eid, tid, row("training", 5, {"loss": float(tid)}))
    shown = sources(master, [1], [21, 10, 21])
    assert shown == {1: None, 2: {21}}
    logdir = LogDir(tmp_path / "tb")
    assert [sync_experiment(master, logdir, e, only=o) for e, o in shown.items()] == [
        (2, 2),
        (1, 1),
    ]
    logdir.close()
    runs = sorted(str(p.parent.relative_to(tmp_path / "tb")) for p in tmp_path.rglob("events.*"))
    assert runs == ["experiment_1/trial_10", "experiment_1/trial_11", "experiment_2/trial_21"]
    # Only the trials asked for were read, never experiment 2's list of trials.
    assert "/api/v1/experiments/2/trials" not in {p.split("?")[0] for p in fake.requests}


def test_the_master_refusal_carries_its_message(fake: FakeMaster, tmp_path: Path) -> None:
    fake.add(1, 10)
    wrong = Master(fake.url, "not-the-token", timeout_s=5)
    with pytest.raises(MasterError, match="answered 401: invalid credentials") as refused:
        sync_experiment(wrong, LogDir(tmp_path), 1)
    assert refused.value.status == 401
    wrong.close()


def test_serve_outlives_failing_refreshes_and_returns_the_exit_code(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[float] = []

    def refresh() -> None:
        calls.append(time.monotonic())
        raise MasterError("cannot reach the master at http://127.0.0.1:1: refused")

    command = [sys.executable, "-c", "import sys, time; time.sleep(1.5); sys.exit(3)"]
    before = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.WARNING, logger="resolute.tensorboard_task"):
        assert serve(command, refresh, refresh_s=0.2) == 3
    assert len(calls) >= 3
    assert "refresh failed, retrying in 0.2 s: cannot reach the master" in caplog.text
    assert signal.getsignal(signal.SIGTERM) == before  # handlers put back


def test_serve_forwards_sigterm_and_counts_that_stop_as_clean() -> None:
    def refresh() -> None:  # runs inside serve, after its handlers are in place
        os.kill(os.getpid(), signal.SIGTERM)

    command = [sys.executable, "-c", "import time; time.sleep(30)"]  # dies of SIGTERM
    started = time.monotonic()
    assert serve(command, refresh, refresh_s=0.2) == 0
    assert time.monotonic() - started < 10
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert serve(killed, lambda: None, refresh_s=0.2) == 128 + signal.SIGKILL


# --- the task as a process -------------------------------------------------------------------


def run_task(
    fake: FakeMaster, tmp_path: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """The task to its exit; its own process group, so a TensorBoard it should not have
    started dies with it."""
    argv = [sys.executable, "-m", "resolute.tensorboard_task", "--logdir", str(tmp_path / "tb")]
    task = subprocess.Popen(
        [*argv, *args],
        cwd=REPO,
        env=task_env(fake, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = task.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(task.pid, signal.SIGKILL)
        task.wait()
    return subprocess.CompletedProcess(task.args, task.returncode, out, err)


def test_an_unknown_experiment_exits_1_before_tensorboard(fake: FakeMaster, tmp_path: Path) -> None:
    fake.add(1, 10, row("training", 1, {"loss": 1.0}))
    port = free_port()
    done = run_task(fake, tmp_path, "--port", str(port), "1", "99")
    assert done.returncode == 1, done.stderr
    assert "experiment 99" in done.stderr and "experiment 99 not found" in done.stderr
    assert "experiment 1: 1 trials, 1 metric points" in done.stdout
    assert "starting TensorBoard" not in done.stdout
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass


def test_an_unknown_trial_exits_1_before_tensorboard(fake: FakeMaster, tmp_path: Path) -> None:
    fake.add(1, 10)
    done = run_task(fake, tmp_path, "--port", str(free_port()), "--trial", "10", "--trial", "77")
    assert done.returncode == 1, done.stderr
    assert "trial 77 not found" in done.stderr
    assert "starting TensorBoard" not in done.stdout
    nothing = run_task(fake, tmp_path, "--port", str(free_port()))
    assert nothing.returncode == 2 and "at least one experiment or --trial" in nothing.stderr


def test_an_unreachable_master_is_fatal_with_its_url(fake: FakeMaster, tmp_path: Path) -> None:
    away = f"http://127.0.0.1:{free_port()}"
    done = run_task(fake, tmp_path, "--port", str(free_port()), "1", DET_MASTER=away)
    assert done.returncode == 1
    assert f"experiment 1: cannot reach the master at {away}" in done.stderr


def test_missing_variables_exit_2(fake: FakeMaster, tmp_path: Path) -> None:
    done = run_task(fake, tmp_path, "--port", str(free_port()), "1", DET_SESSION_TOKEN="")
    assert done.returncode == 2
    assert "DET_SESSION_TOKEN not set" in done.stderr


def test_an_unreadable_ca_bundle_exits_2_for_an_https_master(
    fake: FakeMaster, tmp_path: Path
) -> None:
    missing = tmp_path / "missing-ca.crt"
    args = ("--port", str(free_port()), "1")
    done = run_task(
        fake, tmp_path, *args, DET_MASTER="https://127.0.0.1:1", DET_MASTER_CERT_FILE=str(missing)
    )
    assert done.returncode == 2
    assert f"DET_MASTER_CERT_FILE={missing}" in done.stderr
    # Plain http does not read it: the task gets as far as the master (99 is unknown).
    plain = run_task(
        fake, tmp_path, "--port", str(free_port()), "99", DET_MASTER_CERT_FILE=str(missing)
    )
    assert plain.returncode == 1 and "experiment 99 not found" in plain.stderr


def test_tensorboard_serves_the_runs_and_stops_on_sigterm(fake: FakeMaster, tmp_path: Path) -> None:
    """The whole task: runs listed by the real TensorBoard under the proxy prefix, a trial
    added while it runs shows up, SIGTERM ends both processes."""
    require(
        subprocess.run([sys.executable, "-c", "import tensorboard"], check=False).returncode == 0,
        "tensorboard is not installed (the test dependency group has it)",
    )
    storage = {"type": "shared_fs", "host_path": str(tmp_path / "store")}
    fake.add(1, 10, row("training", 1, {"loss": 1.0}), checkpoint_storage=storage)
    fake.add(2, 20, row("validation", 1, {"accuracy": 0.5}))
    own = tmp_path / "store" / "tensorboard" / "experiment" / "1" / "trial" / "10"
    with EventFileWriter(own) as writer:
        writer.add_scalar("own/reward", 7.0, step=3, wall_time=T0.timestamp())
    port = free_port()
    output = (tmp_path / "out.log").open("w")
    task = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resolute.tensorboard_task",
            "--port",
            str(port),
            "--path-prefix",
            "/proxy/tb-1/",
            "--logdir",
            str(tmp_path / "tb"),
            "--refresh-s",
            "1",
            "1",
            "2",
        ],
        cwd=REPO,
        env=task_env(fake),
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    runs_url = f"http://127.0.0.1:{port}/proxy/tb-1/data/runs"

    def wait_for_runs(expected: set[str], timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        runs: list[str] = []
        while time.monotonic() < deadline:
            assert task.poll() is None, (tmp_path / "out.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                reply = httpx.get(runs_url, timeout=5)
                if reply.status_code == 200:
                    runs = reply.json()
                    if expected <= set(runs):
                        return runs
            time.sleep(0.5)
        pytest.fail(
            f"TensorBoard listed {runs}, not {expected}: {(tmp_path / 'out.log').read_text()}"
        )

    try:
        started = time.monotonic()
        wait_for_runs(
            {"experiment_1/trial_10", "experiment_1/trial_10/written", "experiment_2/trial_20"}, 90
        )
        print(f"TensorBoard answered after {time.monotonic() - started:.1f} s")
        fake.add(1, 11, row("training", 5, {"loss": 0.5}))  # a new trial, while it runs
        wait_for_runs({"experiment_1/trial_11"}, 60)
        task.send_signal(signal.SIGTERM)
        assert task.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(task.pid, signal.SIGKILL)  # TensorBoard too, whatever happened
        task.wait()
        output.close()
    log = (tmp_path / "out.log").read_text()
    assert "experiment 1: 1 trials, 1 metric points" in log
    assert "experiment 1: 1 new metric points" in log
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass
