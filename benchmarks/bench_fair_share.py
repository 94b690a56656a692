"""Fair-sharing benchmark (issue 30): what quotas and the fair order cost the scheduling pass.

    .venv/bin/python -m benchmarks.bench_fair_share [--quick | --smoke] [--repetitions N]

Prints one JSON document on stdout: the machine, then the pure placement core
(master.core.placement.schedule) on one pool of 1,000 eight-slot agents, half of their slots
held by running work, with 10,000 one-slot trials pending from 50 workspaces (4 users and 20
experiments each), timed three ways on the same snapshot, alternating:

- plain: the queue in (priority, submit order), no quotas (the pass before issue 30);
- fair: the fair order (users, then experiments by decayed usage per weight, start charges
  applied as the pass places work), no quotas;
- quotas: the fair order with a quota for every workspace (nominal 160 slots, every fifth
  with a borrowing limit of 0, every seventh lending at most half).

Also the usage sums the pass reads first (ClusterView.fair_share over the held work and 50,000
stored usage rows). The target: the pass with quotas at most 1.2x the pass without (fair).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import common
from harness.figures import percentile
from master.core import cluster_view, fair_share, placement

TARGET_RATIO = 1.2


@dataclass(frozen=True)
class Shape:
    agents: int
    slots: int
    pending: int
    workspaces: int
    users: int
    experiments: int  # per workspace
    stored_rows: int

    @staticmethod
    def of(mode: str) -> Shape:
        if mode == "smoke":
            return Shape(16, 8, 200, 5, 2, 3, 100)
        if mode == "quick":
            return Shape(100, 8, 1000, 10, 4, 5, 5000)
        return Shape(1000, 8, 10_000, 50, 4, 20, 50_000)


@dataclass
class Snapshot:
    agents: list[placement.AgentState]
    requests: list[placement.Request]
    running: list[placement.Running]
    quotas: dict[int, fair_share.Quota]
    view: cluster_view.ClusterView


def build(shape: Shape, seed: int) -> Snapshot:
    rng = random.Random(seed)
    now = time.time()
    running: list[placement.Running] = []
    held: list[cluster_view.HeldEntry] = []
    used: dict[str, set[int]] = {}
    n = 0
    for a in range(shape.agents):
        agent = f"agent-{a:05d}"
        for slot in range(shape.slots // 2):
            ws = 1 + n % shape.workspaces
            run = placement.Running(
                id=f"run-{n}",
                job_id=ws * 1000 + rng.randrange(shape.experiments),
                priority=42,
                order=(now - 3600 + n, n),
                slots=((agent, (slot,)),),
                workspace_id=ws,
                started=now - rng.uniform(0, 3600),
            )
            running.append(run)
            held.append(
                cluster_view.HeldEntry(run, "default", rng.randrange(shape.users), run.started)
            )
            used.setdefault(agent, set()).add(slot)
            n += 1
    agents = [
        placement.AgentState(
            id=f"agent-{a:05d}",
            slot_ids=tuple(range(shape.slots)),
            used_slot_ids=frozenset(used.get(f"agent-{a:05d}", ())),
        )
        for a in range(shape.agents)
    ]
    requests = []
    for i in range(shape.pending):
        ws = 1 + rng.randrange(shape.workspaces)
        job = ws * 1000 + rng.randrange(shape.experiments)
        requests.append(
            placement.Request(
                id=f"req-{i:06d}",
                job_id=job,
                slots=1,
                priority=rng.choice([42, 42, 42, 30]),
                order=(now - shape.pending + i, i),
                workspace_id=ws,
                user_id=rng.randrange(shape.users),
                weight=rng.choice([1.0, 1.0, 2.0, 3.0]),
            )
        )
    nominal = shape.agents * shape.slots // shape.workspaces
    quotas = {
        ws: fair_share.Quota(
            f"ws-{ws}",
            nominal,
            borrowing_limit=0 if ws % 5 == 0 else None,
            lending_limit=nominal // 2 if ws % 7 == 0 else None,
        )
        for ws in range(1, shape.workspaces + 1)
    }
    stored = [
        cluster_view.StoredUsage(
            "default",
            1 + rng.randrange(shape.workspaces),
            rng.randrange(shape.users),
            rng.randrange(shape.workspaces * 1000),
            rng.uniform(0, 1e6),
            now - rng.uniform(0, 7 * 86400),
        )
        for _ in range(shape.stored_rows)
    ]
    view = cluster_view.ClusterView()
    view.load(0, [], [], held, stored_usage=stored)
    return Snapshot(agents, requests, running, quotas, view)


def timed(call: Callable[[], Any], repetitions: int) -> tuple[list[float], Any]:
    times: list[float] = []
    result = None
    for _ in range(repetitions):
        gc.disable()  # as the scheduler's pass does (master.services.scheduler._gc_paused)
        try:
            started = time.perf_counter()
            result = call()
            times.append(time.perf_counter() - started)
        finally:
            gc.enable()
    return times, result


def figures(times: Sequence[float]) -> dict[str, float]:
    ms = sorted(t * 1000 for t in times)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    shape = Shape.of(mode)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    snap = build(shape, args.seed)
    policy = placement.PoolPolicy("default")
    decay = fair_share.Decay()
    now = time.time()
    share = snap.view.share_of("default", now, decay)
    variants: dict[str, Callable[[], placement.Plan]] = {
        "plain": lambda: placement.schedule(policy, snap.agents, snap.requests, snap.running),
        "fair": lambda: placement.schedule(
            policy, snap.agents, snap.requests, snap.running, share=share
        ),
        "quotas": lambda: placement.schedule(
            policy, snap.agents, snap.requests, snap.running, quotas=snap.quotas, share=share
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    plans: dict[str, placement.Plan] = {}
    repetitions = 1 if mode == "smoke" else args.repetitions
    for _ in range(repetitions):  # alternating, so that the machine's load falls on all
        for name, call in variants.items():
            spent, plans[name] = timed(call, 1)
            times[name].extend(spent)
    usage_times, _ = timed(lambda: snap.view.share_of("default", now, decay), repetitions)
    report = {
        name: {**figures(times[name]), "placed": len(plans[name].assignments)} for name in variants
    }
    ratio = statistics.median(times["quotas"]) / statistics.median(times["fair"])
    fair_ratio = statistics.median(times["fair"]) / statistics.median(times["plain"])
    return {
        "benchmark": "resolute fair sharing: the placement pass with quotas and the fair order",
        "mode": mode,
        "command": " ".join(["python -m benchmarks.bench_fair_share", *sys.argv[1:]]),
        "started_at": started_at,
        "machine": common.host_facts(()),
        "shape": shape.__dict__,
        "pass": report,
        "usage_sums": {
            **figures(usage_times),
            "held": len(snap.running),
            "stored_rows": shape.stored_rows,
        },
        "ratio_quotas_over_fair_p50": round(ratio, 3),
        "ratio_fair_over_plain_p50": round(fair_ratio, 3),
        "targets": {
            "quotas_over_fair_max": TARGET_RATIO,
            "quotas_over_fair_met": ratio <= TARGET_RATIO,
        },
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_fair_share",
        description="Fair-sharing benchmark (issue 30); prints one JSON document on stdout.",
    )
    common.add_shape_flags(
        parser, quick="100 agents, 1,000 pending", smoke="16 agents, 200 pending: seconds"
    )
    parser.add_argument("--repetitions", type=int, default=15, help="passes per variant")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    common.emit_report(run(args), args.out)


if __name__ == "__main__":
    main()
