"""resolute's HTTP side against a scripted stdlib server: auth header, one kept-alive
connection, retries of transient failures, clear errors, the shipper and the preemption
watcher. (tests/e2e/test_train_library.py runs the same library against a real master.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import resolute
from harness.cluster import free_port
from resolute._api import MasterError, Session
from resolute._metrics import Shipper, ShippingError
from resolute.preempt import PreemptContext

Reply = tuple[int, Any]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    client_port: int


@dataclass
class FakeMaster:
    """Answers each request with `route(method, path, body)`; records what it saw."""

    route: Callable[[str, str, Any], Reply] = lambda m, p, b: (200, {})
    seen: list[Seen] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def paths(self, prefix: str = "") -> list[str]:
        return [f"{s.method} {s.path}" for s in self.seen if s.path.startswith(prefix)]


def serve(fake: FakeMaster, port: int = 0) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            fake.seen.append(
                Seen(self.command, self.path, dict(self.headers), body, self.client_address[1])
            )
            status, reply = fake.route(self.command, self.path, body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _handle

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that hangs up mid-long-poll is expected here

    server = Server(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fake.server = server
    return server


@pytest.fixture
def fake() -> Iterator[FakeMaster]:
    master = FakeMaster()
    server = serve(master)
    yield master
    server.shutdown()
    server.server_close()


def test_requests_carry_the_token_over_one_kept_alive_connection(fake: FakeMaster) -> None:
    fake.route = lambda m, p, b: (200, {"ok": p})
    session = Session(fake.url, "secret")
    for i in range(5):
        assert session.request("POST", f"/api/v1/x/{i}", {"i": i}) == {"ok": f"/api/v1/x/{i}"}
    session.close()
    assert {s.headers["Authorization"] for s in fake.seen} == {"Bearer secret"}
    assert len({s.client_port for s in fake.seen}) == 1
    assert [s.body for s in fake.seen] == [{"i": i} for i in range(5)]


def test_transient_answers_are_retried(fake: FakeMaster) -> None:
    answers = iter([(503, {"message": "busy"}), (502, {}), (200, {"fine": True})])
    fake.route = lambda m, p, b: next(answers)
    with closing(Session(fake.url, "t")) as session:
        assert session.request("GET", "/api/v1/y") == {"fine": True}
    assert len(fake.seen) == 3


def test_a_refusal_names_the_call_and_the_masters_message(fake: FakeMaster) -> None:
    fake.route = lambda m, p, b: (400, {"code": 3, "message": "trialRunId 1 is stale"})
    session = Session(fake.url, "t")
    with (
        closing(session),
        pytest.raises(MasterError, match="report it: the master answered 400: tri") as e,
    ):
        session.request("POST", "/api/v1/z", {}, call="report it")
    assert e.value.status == 400
    assert len(fake.seen) == 1  # never retried


def test_an_unreachable_master_is_retried_for_a_bounded_time() -> None:
    port = free_port()
    session = Session(f"http://127.0.0.1:{port}", "t", retry_for_s=0.5)
    started = time.monotonic()
    with pytest.raises(MasterError, match=r"poke: master at .* still failing after 0 s"):
        session.request("GET", "/api/v1/a", call="poke")
    assert time.monotonic() - started < 5


def test_a_master_that_comes_back_is_reached() -> None:
    port = free_port()
    master = FakeMaster()
    timer = threading.Timer(0.3, serve, args=(master, port))
    timer.start()
    try:
        with closing(Session(f"http://127.0.0.1:{port}", "t")) as session:
            assert session.request("GET", "/api/v1/a") == {}
    finally:
        timer.join()
        assert master.server is not None
        master.server.shutdown()
        master.server.server_close()


# -- the shipper -----------------------------------------------------------------------------


def test_the_shipper_sends_in_order_and_reports_failures(fake: FakeMaster) -> None:
    fake.route = lambda m, p, b: (400, {"message": "no"}) if p.endswith("/3") else (200, {})
    shipper = Shipper(Session(fake.url, "t"))
    for i in range(6):
        shipper.submit("POST", f"/api/v1/r/{i}", {"i": i}, call=f"report {i}")
    with pytest.raises(ShippingError, match=r"report 3: the master answered 400: no; 2 later"):
        shipper.flush()
    assert fake.paths() == [f"POST /api/v1/r/{i}" for i in range(4)]
    with pytest.raises(ShippingError):
        shipper.submit("POST", "/api/v1/r/9", {}, call="late")
    with pytest.raises(ShippingError):
        shipper.close()
    shipper.close()  # idempotent


# -- a whole trial-side context against the fake master ---------------------------------------


@pytest.fixture
def cluster_env(fake: FakeMaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    storage = tmp_path / "storage"
    config = {
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)},
        "searcher": {"max_length": 10},
    }
    env = {
        "DET_MASTER": fake.url,
        "DET_SESSION_TOKEN": "trial-token",
        "DET_TRIAL_ID": "7",
        "DET_EXPERIMENT_ID": "2",
        "DET_TRIAL_RUN_ID": "1",
        "DET_TRIAL_SEED": "5",
        "DET_HPARAMS": "{}",
        "DET_EXPERIMENT_CONFIG": json.dumps(config),
        "DET_ALLOCATION_ID": "7.1",
        "DET_TASK_ID": "7",
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return storage


def test_a_cluster_context_reports_metrics_checkpoints_and_progress(
    fake: FakeMaster, cluster_env: Path
) -> None:
    with resolute.init(seed_everything=False) as ctx:
        assert not ctx.local and ctx.max_length == 10
        ctx.train.report_training_metrics(steps_completed=1, metrics={"loss": float("inf")})
        ctx.train.report_validation_metrics(steps_completed=1, metrics={"loss": 0.5})
        ctx.train.report_progress(0.1)
        ctx.train.set_status("training")
        with ctx.checkpoint.store_path(1, {"framework": "torch"}) as (path, uuid):
            (path / "state.pt").write_bytes(b"x" * 10)
        # Reported before store_path returned.
        checkpoint = [s for s in fake.seen if s.path == "/api/v1/checkpoints"]
        assert len(checkpoint) == 1
    assert path == cluster_env / uuid
    body = checkpoint[0].body
    assert body["uuid"] == uuid and body["state"] == "STATE_COMPLETED"
    assert body["metadata"] == {"framework": "torch", "steps_completed": 1}
    assert body["resources"] == {"state.pt": "10"}
    assert body["allocationId"] == "7.1" and body["taskId"] == "7"
    assert body["training"] == {"trialId": 7}
    metrics = [s.body for s in fake.seen if s.path == "/api/v1/trials/7/metrics"]
    assert metrics[0] == {
        "group": "training",
        "metrics": {
            "trialId": 7,
            "trialRunId": 1,
            "stepsCompleted": 1,
            "metrics": {"avgMetrics": {"loss": "Infinity"}, "batchMetrics": None},
            "reportTime": None,
        },
    }
    assert metrics[1]["group"] == "validation"
    progress = [s.body for s in fake.seen if s.path == "/api/v1/trials/7/progress"]
    assert progress == [{"progress": 0.1, "is_raw": True}]
    assert {s.headers.get("Authorization") for s in fake.seen} == {"Bearer trial-token"}


def refuse_metrics(method: str, path: str, body: Any) -> Reply:
    """A master that refuses every metrics report (a stale run id) and answers the rest."""
    if path.endswith("/metrics"):
        return 400, {"code": 3, "message": "trialRunId 1 is not the trial's current run"}
    return 200, {"preempt": False}


def test_close_raises_when_metrics_could_not_be_delivered(
    fake: FakeMaster, cluster_env: Path
) -> None:
    fake.route = refuse_metrics
    ctx = resolute.init(seed_everything=False)
    ctx.train.report_training_metrics(1, {"loss": 1.0})
    with pytest.raises(ShippingError, match="not the trial's current run"):
        ctx.close()


def test_context_reraises_the_training_error_not_a_close_error(
    fake: FakeMaster, cluster_env: Path
) -> None:
    fake.route = refuse_metrics
    # Closing fails too (the report is refused), but the training code's error is the one
    # the user must see.
    with pytest.raises(ZeroDivisionError), resolute.init(seed_everything=False) as ctx:
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        _ = 1 / 0


def test_restore_asks_the_master_where_a_foreign_checkpoint_lives(
    fake: FakeMaster, cluster_env: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "other" / "u-1"
    elsewhere.mkdir(parents=True)

    def route(method: str, path: str, body: Any) -> Reply:
        if path == "/api/v1/checkpoints/u-1":
            return 200, {"checkpoint": {"uuid": "u-1", "storagePath": str(elsewhere)}}
        if path.startswith("/api/v1/checkpoints/"):
            return 404, {"code": 5, "message": "not found"}
        return 200, {"preempt": False}

    fake.route = route
    with resolute.init(seed_everything=False) as ctx:
        with ctx.checkpoint.restore_path("u-1") as path:
            assert path == elsewhere
        missing = ctx.checkpoint.restore_path("u-2")
        with pytest.raises(FileNotFoundError, match="checkpoint u-2 not found"), missing:
            pass


# -- preemption ------------------------------------------------------------------------------


def test_the_watcher_latches_preemption_and_acknowledges_once(fake: FakeMaster) -> None:
    stop = threading.Event()

    def route(method: str, path: str, body: Any) -> Reply:
        if "ack_preemption" in path:
            return 200, {}
        if path.endswith("timeout_seconds=0"):
            return 200, {"preempt": False}
        return 200, {"preempt": stop.wait(10)}

    fake.route = route
    preempt = PreemptContext(Session(fake.url, "t", timeout_s=70), "9.1")
    time.sleep(0.2)
    assert preempt.should_preempt() is False
    stop.set()
    deadline = time.monotonic() + 5
    while not preempt.should_preempt() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert preempt.should_preempt() is True
    time.sleep(0.2)
    polls = fake.paths("/api/v1/allocations/9.1/signals/preemption")
    assert polls[:2] == [
        "GET /api/v1/allocations/9.1/signals/preemption?timeout_seconds=0",
        "GET /api/v1/allocations/9.1/signals/preemption?timeout_seconds=60",
    ]
    assert fake.paths("/api/v1/allocations/9.1/signals/ack") == [
        "POST /api/v1/allocations/9.1/signals/ack_preemption"
    ]
    assert preempt.should_preempt() is True  # latched
    preempt.close()


COLLECTIVE = """
import sys
import torch.distributed as dist
from resolute.preempt import PreemptContext

dist.init_process_group("gloo")
preempt = PreemptContext(None, None)
first = preempt.should_preempt()
if dist.get_rank() == 0:
    preempt._flag.set()  # what the chief's watcher does when the master says stop
print(first, preempt.should_preempt())
dist.destroy_process_group()
"""


def test_should_preempt_agrees_on_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "collective.py"
    script.write_text(textwrap.dedent(COLLECTIVE))
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    env["MASTER_PORT"] = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [out.split() for out, _ in outputs] == [["False", "True"], ["False", "True"]]
