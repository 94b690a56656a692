"""Webhook deliveries (issue 32): how fast the master delivers events to a local receiver,
and whether the scheduling passes notice.

    .venv/bin/python -m benchmarks.bench_webhooks [--quick | --smoke] [--clients N] [--out PATH]

Prints one JSON document on stdout (progress on stderr). A `det-master` on SQLite in a
temporary directory, no agents, one experiment (its trials stay queued, so the scheduler
has passes to run) whose config names a CUSTOM webhook, and a receiver on 127.0.0.1 (a
threaded http.server in this process). N clients post the events as a trial's alerts
(POST /api/v1/webhooks/custom; each is committed to the master's queue when its request
returns). Reported: events per second from the first post to the last delivery, each
event's delivery latency (its post's reply to its arrival) p50 / p99, deliveries seen
twice, and the master's mean scheduling pass time over a quiet window before and while the
events are delivered (from GET /metrics; in both, an experiment is submitted every 0.25 s
so that there are passes to time).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import re
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks import common
from harness.cluster import MasterProcess, wait_until
from harness.figures import ms_summary
from harness.webhook_receiver import Receiver

SHAPES = {"full": 1000, "quick": 300, "smoke": 20}
QUIET_WINDOW_S = {"full": 5.0, "quick": 3.0, "smoke": 1.0}

CONFIG = """\
name: webhook-bench
entrypoint: python3 train.py
searcher: {name: random, metric: loss, max_trials: 4, max_length: {batches: 10}}
hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}
integrations: {webhooks: {webhook_name: [bench]}}
"""

TRAIN_PY = {
    "path": "train.py",
    "type": 48,  # a regular file, as Determined's client encodes it
    "content": base64.b64encode(b"print('hi')\n").decode(),
    "mtime": "1700000000",
    "mode": 0o644,
    "uid": 0,
    "gid": 0,
}
SUBMIT_EVERY_S = 0.25
TICK_CONFIG = """\
name: tick
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""
_PASS = re.compile(r"^resolute_scheduler_pass_seconds_(sum|count) ([0-9.e+-]+)$", re.M)


def pass_totals(client: httpx.Client) -> tuple[float, int]:
    text = client.get("/metrics").text
    found = {k: float(v) for k, v in _PASS.findall(text)}
    return found.get("sum", 0.0), int(found.get("count", 0))


def mean_pass_ms(before: tuple[float, int], after: tuple[float, int]) -> dict[str, Any]:
    passes = after[1] - before[1]
    mean = (after[0] - before[0]) / passes * 1000 if passes else None
    return {"passes": passes, "mean_ms": round(mean, 3) if mean is not None else None}


class Submitter:
    """Submits an experiment every SUBMIT_EVERY_S while running: with no agents a pass that
    has nothing new to consider is skipped, so this gives both windows passes to time."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"activate": True, "config": TICK_CONFIG, "modelDefinition": [TRAIN_PY]}
        while not self._stop.wait(SUBMIT_EVERY_S):
            self.client.post("/api/v1/experiments", json=body).raise_for_status()

    def __enter__(self) -> Submitter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    events = SHAPES[mode]
    facts = common.host_facts(("fastapi", "uvicorn", "sqlalchemy", "httpx"))
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="resolute-hooks-")))
        receiver = Receiver()
        stack.callback(receiver.close)
        master = MasterProcess(tmp / "master")
        stack.callback(master.stop)
        master.start()
        admin = stack.enter_context(master.client(master.login("admin")))
        reply = admin.post(
            "/api/v1/webhooks",
            json={
                "name": "bench",
                "url": receiver.url,
                "webhookType": "WEBHOOK_TYPE_DEFAULT",
                "mode": "WEBHOOK_MODE_SPECIFIC",
                "triggers": [{"triggerType": "TRIGGER_TYPE_CUSTOM", "condition": {}}],
            },
        )
        reply.raise_for_status()
        experiment = master.api(
            "POST",
            "/api/v1/experiments",
            json={"activate": True, "config": CONFIG, "modelDefinition": [TRAIN_PY]},
        )["experiment"]
        trials = master.api("GET", f"/api/v1/experiments/{experiment['id']}/trials")["trials"]
        trial_id = trials[0]["id"]
        clients = [stack.enter_context(master.client()) for _ in range(args.clients)]

        common.progress(f"quiet window of {QUIET_WINDOW_S[mode]} s")
        submitter = master.client()
        stack.callback(submitter.close)
        with Submitter(submitter):
            quiet_before = pass_totals(admin)
            time.sleep(QUIET_WINDOW_S[mode])  # the baseline is a span of time, not a wait
            quiet = mean_pass_ms(quiet_before, pass_totals(admin))

        committed: dict[str, float] = {}
        lock = threading.Lock()

        def post(client: httpx.Client, indexes: range) -> None:
            for i in indexes:
                body = {
                    "data": {"title": f"e{i}", "description": "", "level": "LOG_LEVEL_INFO"},
                    "experimentId": experiment["id"],
                    "trialId": trial_id,
                }
                client.post("/api/v1/webhooks/custom", json=body).raise_for_status()
                with lock:
                    committed[f"e{i}"] = time.monotonic()

        common.progress(f"{events} events from {args.clients} clients")
        with Submitter(submitter):
            busy_before = pass_totals(admin)
            started = time.monotonic()
            threads = [
                threading.Thread(target=post, args=(c, range(n, events, len(clients))))
                for n, c in enumerate(clients)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wait_until(
                f"{events} deliveries",
                lambda: len(receiver.received()) >= events,
                300,
                interval=0.05,
            )
            busy = mean_pass_ms(busy_before, pass_totals(admin))
        deliveries = receiver.received()
        finished = max(d.received_at for d in deliveries)
        titles = [d.json["event_data"]["custom_data"]["title"] for d in deliveries]
        latencies = [d.received_at - committed[t] for d, t in zip(deliveries, titles, strict=True)]
    return {
        "benchmark": "webhooks",
        "mode": mode,
        "machine": facts,
        "parameters": {"events": events, "clients": args.clients, "database": "sqlite"},
        "events_per_s": round(events / (finished - started), 1),
        "delivery_latency": ms_summary(latencies),
        "delivered": len(deliveries),
        "duplicates_by_event_id": len(deliveries) - len({d.event_id for d in deliveries}),
        "scheduling_pass_quiet": quiet,
        "scheduling_pass_while_delivering": busy,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_webhooks",
        description="Webhook delivery throughput and latency; prints one JSON document.",
    )
    common.add_shape_flags(parser, quick="300 events", smoke="20 events")
    parser.add_argument("--clients", type=int, default=4, help="concurrent posters (default 4)")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    common.emit_report(run(args), args.out)


if __name__ == "__main__":
    main()
