"""What one experiment submit costs the master (issue 27), beside what the same master's
cheapest authenticated request costs in the same run.

    .venv/bin/python -m benchmarks.bench_submit [--quick | --smoke] [--clients N]
        [--postgres DSN] [--out PATH]

Prints one JSON document on stdout (progress on stderr). A `det-master` on a fresh
PostgreSQL database (fsync on; dropped at the end) and no agents, so nothing but the submit
path and the scheduling passes it wakes run. N clients (default 8), each on its own
kept-alive connection, post their shares of the submits at once (bench_gangs' one-agent
gang body: an 8-slot `single` experiment with a one-file model definition); then the same
clients send as many GET /api/v1/me. Per variant: the master's CPU per request (psutil,
user + system, every thread), requests per second and the reply's p50 / p99. The GET is
the floor of this stack (routing, the token check, one SELECT, JSON); the submit's excess
over it is the submit's own work. Every submit is queued behind the previous ones, so the
passes grow with the queue: the figures are for a queue up to the run's submits.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks import common
from benchmarks.bench_gangs import DEFAULT_POSTGRES, Scenario, experiment_body, fresh_database
from harness.cluster import MasterProcess
from harness.figures import ms_summary

# (warm-up submits, measured submits) per shape.
SHAPES = {"full": (40, 400), "quick": (20, 100), "smoke": (2, 6)}
GANG = Scenario("one_agent_gangs", 8, 8, 1)


Request = tuple[str, str, dict[str, Any] | None]  # method, path, JSON body


def send_all(clients: list[httpx.Client], requests: Sequence[Request]) -> list[tuple[float, int]]:
    """Client i sends requests i, i+n, ... in order, all clients at once (threads, each its
    own connection); per request, its seconds and its status."""
    results: list[tuple[float, int] | None] = [None] * len(requests)

    def send(offset: int) -> None:
        for index in range(offset, len(requests), len(clients)):
            method, path, body = requests[index]
            started = time.perf_counter()
            reply = clients[offset].request(method, path, json=body)
            results[index] = (time.perf_counter() - started, reply.status_code)

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(result is None for result in results):
        raise RuntimeError("a client failed (its exception is above)")
    return [result for result in results if result is not None]


MAX_REPEATS = 50


def measure(
    master: MasterProcess, clients: list[httpx.Client], requests: Sequence[Request]
) -> dict[str, Any]:
    process = psutil.Process(master.pid)
    cpu0, t0 = sum(process.cpu_times()[:2]), time.perf_counter()
    results = send_all(clients, requests)
    # The kernel counts a process's CPU in clock ticks (10 ms here): a few cheap requests
    # (the smoke run's 6 GET /api/v1/me) may not reach one. Send them again until they do.
    for _ in range(MAX_REPEATS):
        if sum(process.cpu_times()[:2]) > cpu0:
            break
        results += send_all(clients, requests)
    wall, cpu = time.perf_counter() - t0, sum(process.cpu_times()[:2]) - cpu0
    failed = sorted({status for _, status in results if status != 200})
    if failed:
        raise RuntimeError(f"requests failed with {failed}")
    n = len(results)
    return {
        "requests": n,
        "master_cpu_ms_per_request": round(cpu / n * 1000, 2),
        "requests_per_s": round(n / wall, 1),
        "reply": ms_summary([seconds for seconds, _ in results]),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    warm, measured = SHAPES[mode]
    facts = common.host_facts(("fastapi", "uvicorn", "uvloop", "httptools", "sqlalchemy"))
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="resolute-submit-")))
        url = stack.enter_context(fresh_database(args.postgres))
        master = MasterProcess(tmp / "master", db_url=url)
        stack.callback(master.stop)
        master.start()
        clients = [stack.enter_context(master.client()) for _ in range(args.clients)]

        def submits(count: int) -> list[Request]:
            return [
                ("POST", "/api/v1/experiments", experiment_body(GANG, tmp / "ranks", i))
                for i in range(count)
            ]

        send_all(clients, submits(warm))
        common.progress(f"{measured} submits from {args.clients} clients")
        submit = measure(master, clients, submits(measured))
        common.progress(f"{measured} GET /api/v1/me from {args.clients} clients")
        floor = measure(master, clients, [("GET", "/api/v1/me", None)] * measured)
    return {
        "benchmark": "submit",
        "mode": mode,
        "machine": facts,
        "parameters": {"clients": args.clients, "warm_up_submits": warm, "submits": measured},
        "submit": submit,
        "floor_get_me": floor,
        "submit_over_floor_cpu": round(
            submit["master_cpu_ms_per_request"] / floor["master_cpu_ms_per_request"], 2
        ),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_submit",
        description="What a submit costs the master; prints one JSON document.",
    )
    common.add_shape_flags(parser, quick="100 submits", smoke="6 submits")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="admin DSN of the server")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    common.emit_report(run(args), args.out)


if __name__ == "__main__":
    main()
