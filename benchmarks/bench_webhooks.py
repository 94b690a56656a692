"""Webhook deliveries (issue 32): how fast the master delivers events to a local receiver,
and whether the scheduling passes notice.

    .venv/bin/python -m benchmarks.bench_webhooks [--quick | --smoke] [--clients N]
        [--postgres DSN] [--out PATH]

Prints one JSON document on stdout (progress on stderr). A `det-master` on SQLite in a
temporary directory, no agents, one experiment (its trials stay queued, so the scheduler
has passes to run) whose config names a CUSTOM webhook, and a receiver on 127.0.0.1 (a
threaded http.server in this process). Events are a trial's alerts
(POST /api/v1/webhooks/custom; each is committed to the master's queue when its request
returns). With --postgres the master uses a fresh database on that server (dropped at the
end) instead of SQLite. Three phases of N events each:

- control: N clients post alerts of an experiment that names no webhook (logged, nothing
  to deliver): the scheduling passes under the posts alone, the baseline for live.

- live: N clients post while the receiver is up. Events per second from the first post
  to the last delivery; each event's delivery latency (its post's reply to its arrival)
  p50 / p99.
- backlog: the receiver is down while the events are posted, then comes up; the drain's
  events per second, and the scheduling passes while the master does nothing but deliver.

Both report deliveries seen twice by event id. Scheduling passes (mean time, from GET
/metrics) are timed over a quiet window first, then over each phase; throughout, an
experiment is submitted and killed every 0.25 s so that there are passes to time (with no
agents, a pass with nothing new is skipped). Retries are capped at 1 s for the backlog
(DET_MASTER_WEBHOOKS__RETRY_MAX_S). The live phase's passes share the master with the
posts; the backlog's show what sending alone costs them.
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
from benchmarks.bench_gangs import fresh_database
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


def first_trial(master: MasterProcess, experiment_id: int) -> int:
    trials = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
    return int(trials[0]["id"])


def mean_pass_ms(before: tuple[float, int], after: tuple[float, int]) -> dict[str, Any]:
    passes = after[1] - before[1]
    mean = (after[0] - before[0]) / passes * 1000 if passes else None
    return {"passes": passes, "mean_ms": round(mean, 3) if mean is not None else None}


class Submitter:
    """Submits an experiment every SUBMIT_EVERY_S while running, and kills it at once: with
    no agents a pass with nothing new to consider is skipped, so this gives both windows
    passes to time, over a queue that stays the same size."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"activate": True, "config": TICK_CONFIG, "modelDefinition": [TRAIN_PY]}
        while not self._stop.wait(SUBMIT_EVERY_S):
            reply = self.client.post("/api/v1/experiments", json=body)
            reply.raise_for_status()
            killed = reply.json()["experiment"]["id"]
            self.client.post(f"/api/v1/experiments/{killed}/kill").raise_for_status()

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
        db_url = stack.enter_context(fresh_database(args.postgres)) if args.postgres else ""
        master = MasterProcess(
            tmp / "master", db_url=db_url, env={"DET_MASTER_WEBHOOKS__RETRY_MAX_S": "1"}
        )
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
        trial_id = first_trial(master, experiment["id"])
        silent = master.api(
            "POST",
            "/api/v1/experiments",
            json={
                "activate": True,
                "config": CONFIG.replace("integrations: {webhooks: {webhook_name: [bench]}}", ""),
                "modelDefinition": [TRAIN_PY],
            },
        )["experiment"]
        silent_trial_id = first_trial(master, silent["id"])
        clients = [stack.enter_context(master.client()) for _ in range(args.clients)]

        common.progress(f"quiet window of {QUIET_WINDOW_S[mode]} s")
        submitter = master.client()
        stack.callback(submitter.close)
        with Submitter(submitter):
            quiet_before = pass_totals(admin)
            time.sleep(QUIET_WINDOW_S[mode])  # the baseline is a span of time, not a wait
            quiet = mean_pass_ms(quiet_before, pass_totals(admin))

        committed: dict[str, float] = {}
        refused_503 = [0]
        lock = threading.Lock()

        def post(client: httpx.Client, indexes: range, to: tuple[int, int]) -> None:
            for i in indexes:
                body = {
                    "data": {"title": f"e{i}", "description": "", "level": "LOG_LEVEL_INFO"},
                    "experimentId": to[0],
                    "trialId": to[1],
                }
                while True:
                    reply = client.post("/api/v1/webhooks/custom", json=body)
                    if reply.status_code != 503:
                        break
                    # SQLite refused a write under contention: retry as Retry-After says.
                    with lock:
                        refused_503[0] += 1
                    time.sleep(float(reply.headers.get("Retry-After", "1")))
                reply.raise_for_status()
                with lock:
                    committed[f"e{i}"] = time.monotonic()

        def post_all(offset: int, to: tuple[int, int] = (experiment["id"], trial_id)) -> float:
            threads = [
                threading.Thread(
                    target=post, args=(c, range(offset + n, offset + events, len(clients)), to)
                )
                for n, c in enumerate(clients)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return time.monotonic()

        def delivered(count: int) -> None:
            wait_until(
                f"{count} deliveries",
                lambda: len(receiver.received()) >= count,
                300,
                interval=0.05,
            )

        common.progress(f"control: {events} events to no webhook from {args.clients} clients")
        with Submitter(submitter):
            control_before = pass_totals(admin)
            control_started = time.monotonic()
            post_all(-events, (silent["id"], silent_trial_id))
            control_s = time.monotonic() - control_started
            control_passes = mean_pass_ms(control_before, pass_totals(admin))

        common.progress(f"live: {events} events from {args.clients} clients")
        with Submitter(submitter):
            live_before = pass_totals(admin)
            started = time.monotonic()
            post_all(0)
            delivered(events)
            live_passes = mean_pass_ms(live_before, pass_totals(admin))
        live = receiver.received()
        live_end = max(d.received_at for d in live)
        titles = [d.json["event_data"]["custom_data"]["title"] for d in live]
        latencies = [d.received_at - committed[t] for d, t in zip(live, titles, strict=True)]

        common.progress(f"backlog: {events} events posted while the receiver is down")
        receiver.down()
        post_all(events)
        with Submitter(submitter):
            backlog_before = pass_totals(admin)
            receiver.up()
            up_at = time.monotonic()
            delivered(2 * events)
            backlog_passes = mean_pass_ms(backlog_before, pass_totals(admin))
        everything = receiver.received()
        drained = everything[len(live) :]
        drain_end = max(d.received_at for d in drained)
    return {
        "benchmark": "webhooks",
        "mode": mode,
        "machine": facts,
        "parameters": {
            "events": events,
            "clients": args.clients,
            "database": "postgres" if args.postgres else "sqlite",
        },
        "scheduling_pass_quiet": quiet,
        "control_no_webhook": {
            "posts_per_s": round(events / control_s, 1),
            "scheduling_pass": control_passes,
        },
        "live": {
            "events_per_s": round(events / (live_end - started), 1),
            "delivery_latency": ms_summary(latencies),
            "delivered": len(live),
            "scheduling_pass": live_passes,
        },
        "backlog": {
            "drain_events_per_s": round(events / (drain_end - up_at), 1),
            "delivered": len(drained),
            "scheduling_pass": backlog_passes,
        },
        "duplicates_by_event_id": len(everything) - len({d.event_id for d in everything}),
        "posts_refused_503_then_retried": refused_503[0],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_webhooks",
        description="Webhook delivery throughput and latency; prints one JSON document.",
    )
    common.add_shape_flags(parser, quick="300 events", smoke="20 events")
    parser.add_argument("--clients", type=int, default=4, help="concurrent posters (default 4)")
    parser.add_argument(
        "--postgres", metavar="DSN", help="admin DSN of a PostgreSQL server (default: SQLite)"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    common.emit_report(run(args), args.out)


if __name__ == "__main__":
    main()
