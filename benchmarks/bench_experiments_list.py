"""Experiments list benchmark (issue 28 part 5): the list's new columns, sorts and filters
with 10,000 experiments stored.

    .venv/bin/python -m benchmarks.bench_experiments_list [--quick | --smoke]
        [--experiments N] [--repeats N] [--postgres DSN] [--out FILE]

Prints one JSON document on stdout (progress goes to stderr): the machine, and for SQLite
(a file, WAL, as `det-master` runs by default) and PostgreSQL (skipped, and said so, when
the server at --postgres does not answer) the p50 and p99 of GET /ui/experiments, signed
in, over an in-process ASGI client (server-side time: cookie check, the service's two
queries, the Jinja2 render of 50 rows), for the first page, the list sorted by best
metric both ways, by number of trials and by searcher, and filtered by text (a name
prefix, a word of the description, an exact id), by searcher, by user and by label (a
common one, a rare one, one with the best-metric sort).

Setup is excluded: one experiment is created through the real service and its stored row
copied N-1 times in bulk inserts, each with 3 trials and 2 validation reports per trial;
`best_metric` is written as the report path would have left it (the searcher metric's
best finite value). Each experiment has 0-3 labels from a pool of 8 (about a fifth carry
any one of them), and one in a hundred the label `rare`. The target is p99 < 300 ms;
`target_met` compares each scenario's p99 with it. `--smoke` (150 experiments, 1 timed
request per scenario) runs every path.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import insert, select, text

from benchmarks import common
from benchmarks.bench_dashboard import (
    DEFAULT_ADMIN_DSN,
    database,
    master_app,
    postgres_reachable,
    sign_in,
)
from benchmarks.common import host_facts, progress, seconds_since_start
from harness.figures import ms_summary
from master.db.models import (
    ExperimentModel,
    ExperimentState,
    TrialMetricModel,
    TrialModel,
    TrialState,
    UserModel,
)
from master.db.session import session_scope
from master.services import experiments
from master.services.experiments import ExperimentRequest

TARGET_MS = 300.0
INSERT_CHUNK = 1_000
TRIALS_PER_EXPERIMENT = 3
VALIDATIONS_PER_TRIAL = 2
CONFIG = """\
name: bench
entrypoint: python3 train.py
hyperparameters:
  global_batch_size: 64
  lr: {type: log, minval: -4, maxval: -1}
searcher: {name: single, metric: validation_loss, max_length: {batches: 1000}}
reproducibility: {experiment_seed: 7}
"""
SEARCHERS = ["single", "random", "grid", "adaptive_asha"]
STATES = [ExperimentState.COMPLETED] * 6 + [
    ExperimentState.CANCELED,
    ExperimentState.ERROR,
    ExperimentState.ACTIVE,
    ExperimentState.PAUSED,
]
DESCRIPTIONS = ["", "", "baseline run", "ablation: no dropout", "Tuned by hand"]
LABELS = ["vision", "nlp", "baseline", "ablation", "sweep", "prod", "v2", "long-run"]


async def seed(app: FastAPI, count: int) -> dict[str, Any]:
    """`count` experiments, a few owned by a second user, with trials and validations."""
    started = time.perf_counter()
    factory = app.state.session_factory
    async with session_scope(factory) as session:
        owner = await session.scalar(select(UserModel).where(UserModel.username == "determined"))
        other = await session.scalar(select(UserModel).where(UserModel.username == "admin"))
        assert owner is not None and other is not None
        view, _prepared = await experiments.create_experiment(
            session, ExperimentRequest(config=CONFIG), owner, app.state.settings
        )
        assert view is not None
        model = view.experiment
        owner_ids = (owner.id, other.id)
    rng = random.Random(28)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for first in range(1, count, INSERT_CHUNK):
        rows = []
        losses: list[list[list[float]]] = []
        for index in range(first, min(first + INSERT_CHUNK, count)):
            state = rng.choice(STATES)
            # Some experiments have no validation yet: their best metric stays NULL.
            per_trial = (
                [
                    [rng.uniform(0.05, 2.0) for _ in range(VALIDATIONS_PER_TRIAL)]
                    for _ in range(TRIALS_PER_EXPERIMENT)
                ]
                if rng.random() < 0.9
                else []
            )
            losses.append(per_trial)
            labels = rng.sample(LABELS, rng.randint(0, 3)) + (["rare"] if index % 100 == 0 else [])
            rows.append(
                {
                    "name": f"{rng.choice(['mnist', 'cifar', 'bert', 'resnet'])}-{index:05d}",
                    "description": rng.choice(DESCRIPTIONS),
                    "state": state.value,
                    "config": {**model.config, "labels": labels},
                    "labels": labels,
                    "original_config": model.original_config,
                    "template_name": None,
                    "template_config": None,
                    "experiment_seed": index,
                    "searcher_type": rng.choice(SEARCHERS),
                    "resource_pool": model.resource_pool,
                    "priority": 42,
                    "owner_id": owner_ids[0] if index % 10 else owner_ids[1],
                    "project_id": model.project_id,
                    "job_id": str(uuid.uuid4()),
                    "archived": False,
                    "progress": 1.0 if state == ExperimentState.COMPLETED else rng.random(),
                    "start_time": base + timedelta(minutes=index),
                    "end_time": None,
                    "best_metric": min(min(t) for t in per_trial) if per_trial else None,
                }
            )
        async with session_scope(factory) as session:
            ids = (
                await session.scalars(
                    insert(ExperimentModel).returning(
                        ExperimentModel.id, sort_by_parameter_order=True
                    ),
                    rows,
                )
            ).all()
            trial_rows = [
                {
                    "experiment_id": experiment_id,
                    "request_id": str(uuid.uuid4()),
                    "state": TrialState.COMPLETED.value,
                    "hparams": {"global_batch_size": 64, "lr": 0.01},
                    "seed": experiment_id * 10 + n,
                    "restarts": 0,
                    "run_id": 1,
                    "total_batches_processed": 1000,
                    "runner_state": "",
                    "start_time": base,
                }
                for experiment_id in ids
                for n in range(TRIALS_PER_EXPERIMENT)
            ]
            trial_ids = (
                await session.scalars(
                    insert(TrialModel).returning(TrialModel.id, sort_by_parameter_order=True),
                    trial_rows,
                )
            ).all()
            metric_rows = [
                {
                    "trial_id": trial_ids[e * TRIALS_PER_EXPERIMENT + t],
                    "group_name": "validation",
                    "steps_completed": (v + 1) * 500,
                    "trial_run_id": 1,
                    "metrics": {"validation_loss": loss, "accuracy": 1 - loss / 2},
                    "report_time": base,
                }
                for e, per_trial in enumerate(losses)
                for t, trial_losses in enumerate(per_trial)
                for v, loss in enumerate(trial_losses)
            ]
            if metric_rows:
                await session.execute(insert(TrialMetricModel), metric_rows)
    if app.state.engine.dialect.name == "postgresql":
        # As autovacuum would after a bulk load (see bench_dashboard).
        async with app.state.engine.begin() as conn:
            await conn.execute(text("ANALYZE"))
    return {"seed_seconds": round(time.perf_counter() - started, 2), "some_id": ids[-1]}


async def time_page(client: httpx.AsyncClient, path: str, repeats: int) -> dict[str, Any]:
    for _ in range(2):  # warm-up: template compilation, statement caches
        await client.get(path)
    samples = []
    rows = 0
    for _ in range(repeats):
        started = time.perf_counter()
        reply = await client.get(path)
        samples.append(time.perf_counter() - started)
        assert reply.status_code == 200, (path, reply.status_code, reply.text[:300])
        rows = reply.text.count("<tr data-experiment-id=")
    return {"path": path, "rows": rows, **ms_summary(samples)}


async def measure(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    async with database(backend, args.postgres) as url, master_app(url) as app:
        progress(f"{backend}: seeding {args.experiments} experiments")
        setup = await seed(app, args.experiments)
        progress(f"{backend}: seeded in {setup['seed_seconds']} s; measuring")
        scenarios = {
            "first_page": "/ui/experiments",
            "by_best_metric": "/ui/experiments?sort=best",
            "by_best_metric_descending": "/ui/experiments?sort=best&order=desc",
            "by_trials": "/ui/experiments?sort=trials",
            "by_searcher": "/ui/experiments?sort=searcher",
            "text_name": "/ui/experiments?text=bert-0",
            "text_description": "/ui/experiments?text=ABLATION",
            "text_exact_id": f"/ui/experiments?text={setup['some_id']}",
            "searcher_filter": "/ui/experiments?searcher=grid",
            "user_filter_and_best": "/ui/experiments?user=admin&sort=best",
            "label_filter": "/ui/experiments?label=vision",
            "label_filter_rare": "/ui/experiments?label=rare",
            "label_filter_and_best": "/ui/experiments?label=ablation&sort=best",
        }
        pages = {}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
            await sign_in(client)
            for label, path in scenarios.items():
                pages[label] = await time_page(client, path, args.repeats)
                progress(f"{backend}: {label} p99 {pages[label]['p99_ms']} ms")
        worst = max(p["p99_ms"] for p in pages.values())
        return {
            "setup": setup,
            "page": pages,
            "worst_p99_ms": worst,
            "target_met": worst < TARGET_MS,
        }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    report: dict[str, Any] = {
        "benchmark": "resolute dashboard, issue 28 part 5 (experiments list columns and filters)",
        "mode": mode,
        "command": "python -m benchmarks.bench_experiments_list"
        + ("" if mode == "full" else f" --{mode}"),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": host_facts(["sqlalchemy", "aiosqlite", "asyncpg", "fastapi", "jinja2"]),
        "parameters": {
            "experiments": args.experiments,
            "trials_per_experiment": TRIALS_PER_EXPERIMENT,
            "validations_per_trial": VALIDATIONS_PER_TRIAL,
            "rows_per_page": 50,
            "repeats": args.repeats,
            "target_p99_ms": TARGET_MS,
        },
    }
    report["sqlite"] = await measure("sqlite", args)
    # The smoke checks every path once, on SQLite: the same queries, without the seconds a
    # Postgres database costs to create (the full and quick runs measure both).
    problem = (
        "the smoke runs SQLite only"
        if common.mode_of(args) == "smoke"
        else await postgres_reachable(args.postgres)
    )
    if problem is None:
        report["postgres"] = await measure("postgres", args)
    else:
        report["postgres"] = {"skipped": f"PostgreSQL at {args.postgres}: {problem}"}
    report["total_seconds"] = round(seconds_since_start(), 1)
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    common.add_shape_flags(
        parser,
        quick="1,000 experiments, 10 requests per scenario",
        smoke="150 experiments, 1 request per scenario",
    )
    parser.add_argument("--experiments", type=int, default=None, help="default 10,000")
    parser.add_argument("--repeats", type=int, default=None, help="timed requests per scenario")
    parser.add_argument("--postgres", default=DEFAULT_ADMIN_DSN, help="admin DSN")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    experiments_count, repeats = {"full": (10_000, 40), "quick": (1_000, 10), "smoke": (150, 1)}[
        common.mode_of(args)
    ]
    if args.experiments is None:
        args.experiments = experiments_count
    if args.repeats is None:
        args.repeats = repeats
    if args.experiments < 2 or args.repeats < 1:
        parser.error("--experiments must be at least 2 and --repeats at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = asyncio.run(run(args))
    common.emit_report(result, args.out)


if __name__ == "__main__":
    main()
