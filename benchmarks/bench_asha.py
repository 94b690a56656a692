"""ASHA searcher benchmark (issue 12).

    .venv/bin/python -m benchmarks.bench_asha [--quick | --smoke] [--postgres DSN] [--seed N]

Prints one JSON document on stdout (progress on stderr): the machine, and

- `decision`: the time the searcher takes to decide one validation report, with 10,000
  trials in flight (async_halving, max_trials = max_concurrent_trials = 10,000) each
  reporting once at rung 0 in random order, so the rung grows from 0 to 10,000 entries:
  - `core`: master.core.asha.MemorySearch.validation (sorted rungs, bisect), against the
    naive way of sorting the rung again for every report;
  - `sqlite` / `postgres`: master.services.search.on_validation on a real database (the
    path a report takes: lock the experiment row, count the rung over its index, insert
    the entry, update the trial, stop it if need be), alone and with its commit, against
    the naive way of reading the whole rung back into Python for every report.
- `compute`: batches trained by whole searches with the stops honoured (resolute) and
  ignored (Determined 0.38, which never delivered them), on the same configs and the same
  simulated trials: every live trial trains `step` batches per tick and reports a
  validation; a stopped trial exits at the end of its tick, an ignoring one trains on to
  max_time. The ratio is honoured / ignored.

`--quick` uses 1,000 trials instead of 10,000; `--smoke`, 100 (the smoke test's shape).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import logging
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from benchmarks import common
from benchmarks.common import host_facts, progress
from harness.figures import ms_summary, ratio
from master.app import create_app
from master.core import asha
from master.db.models import (
    ExperimentModel,
    ExperimentState,
    ProjectModel,
    SearcherRungEntryModel,
    TrialModel,
    TrialState,
    UserModel,
)
from master.services import search
from master.settings import DatabaseSettings, MasterSettings

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


def searcher_config(trials: int) -> dict[str, Any]:
    return {
        "name": "async_halving",
        "metric": "loss",
        "num_rungs": 4,
        "divisor": 4,
        "max_time": 64,
        "time_metric": "batches",
        "max_trials": trials,
        "max_concurrent_trials": trials,
    }


def summary(samples_s: Sequence[float]) -> dict[str, Any]:
    """ms_summary's figures to 0.1 us, its `n` named `reports`."""
    figures = ms_summary(samples_s, digits=4)
    return {"reports": figures.pop("n"), **figures}


# --- the pure core -------------------------------------------------------------------------


def core_decisions(trials: int, seed: int) -> dict[str, Any]:
    cfg = asha.parse_config(searcher_config(trials))
    losses = random.Random(seed).sample(range(trials * 10), trials)
    memory = asha.MemorySearch(cfg)
    keys = memory.take_creates()
    assert len(keys) == trials  # every trial in flight at once
    ours = []
    for key in keys:
        started = time.perf_counter()
        memory.validation(key, {"loss": losses[key], "batches": 1})
        ours.append(time.perf_counter() - started)
    # The naive way: keep the rung unsorted and sort it again for every report.
    rung: list[float] = []
    naive = []
    divisor = cfg.divisor
    for key in keys:
        started = time.perf_counter()
        value = float(losses[key])
        rung.append(value)
        ordered = sorted(rung)
        place = bisect.bisect_left(ordered, value)
        _stop = place >= max(int(len(ordered) / divisor), 1)
        naive.append(time.perf_counter() - started)
    result: dict[str, Any] = {"ours": summary(ours), "naive_sort_per_report": summary(naive)}
    result["p99_ratio_naive_over_ours"] = ratio(
        result["naive_sort_per_report"]["p99_ms"], result["ours"]["p99_ms"]
    )
    return result


# --- the database path ---------------------------------------------------------------------


@asynccontextmanager
async def master(url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    with tempfile.TemporaryDirectory(prefix="resolute-bench-asha-") as data_dir:
        settings = MasterSettings(
            data_dir=Path(data_dir),
            db=DatabaseSettings(url=url or f"sqlite+aiosqlite:///{data_dir}/master.db"),
            run_loops=False,
            migrate_on_start=True,
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            factory: async_sessionmaker[AsyncSession] = app.state.session_factory
            yield factory


async def seed_search(factory: async_sessionmaker[AsyncSession], trials: int) -> list[int]:
    """An ASHA experiment with `trials` RUNNING trials, written directly (setup only)."""
    async with factory() as session, session.begin():
        owner = await session.scalar(select(UserModel.id).limit(1))
        project = await session.scalar(select(ProjectModel.id).limit(1))
        experiment = ExperimentModel(
            name="bench-asha",
            state=ExperimentState.ACTIVE,
            config={"searcher": searcher_config(trials), "hyperparameters": {}},
            original_config="",
            experiment_seed=1,
            searcher_type="async_halving",
            owner_id=owner,
            project_id=project,
            job_id=str(uuid.uuid4()),
        )
        session.add(experiment)
        await session.flush()
        await session.execute(
            insert(TrialModel),
            [
                {
                    "experiment_id": experiment.id,
                    "request_id": str(uuid.uuid4()),
                    "state": TrialState.RUNNING,
                    "hparams": {},
                    "seed": i,
                    "run_id": 1,
                    "searcher_bracket": 0,
                    "searcher_rung": 0,
                }
                for i in range(trials)
            ],
        )
        ids = await session.scalars(
            select(TrialModel.id).where(TrialModel.experiment_id == experiment.id)
        )
        return list(ids)


async def naive_standing(
    session: AsyncSession, experiment_id: int, bracket: int, rung: int, value: float
) -> asha.Standing:
    """The naive way: the whole rung read back into Python for every report."""
    values = sorted(
        (
            await session.scalars(
                select(SearcherRungEntryModel.value).where(
                    SearcherRungEntryModel.experiment_id == experiment_id,
                    SearcherRungEntryModel.bracket == bracket,
                    SearcherRungEntryModel.rung == rung,
                )
            )
        ).all()
    )
    return asha.Standing(better=bisect.bisect_left(values, value), size=len(values))


async def database_decisions(url: str, trials: int, seed: int, naive: bool) -> dict[str, Any]:
    async with master(url) as factory:
        ids = await seed_search(factory, trials)
        losses = random.Random(seed).sample(range(trials * 10), trials)
        order = list(range(trials))
        random.Random(seed + 1).shuffle(order)
        original = search._standing
        if naive:
            search._standing = naive_standing
        decide, whole, stops = [], [], 0
        try:
            for index in order:
                started = time.perf_counter()
                async with factory() as session, session.begin():
                    trial = await session.get(TrialModel, ids[index])
                    assert trial is not None
                    before = time.perf_counter()
                    stopped = await search.on_validation(
                        session, trial, {"loss": losses[index], "batches": 1}, 1
                    )
                    decide.append(time.perf_counter() - before)
                    stops += trial.searcher_stopped_rung is not None
                    del stopped
                whole.append(time.perf_counter() - started)
        finally:
            search._standing = original
        return {
            "decision": summary(decide),
            "report_transaction_with_commit": summary(whole),
            "trials_stopped_at_rung_0": stops,
        }


async def postgres_database(admin_dsn: str) -> tuple[str, str]:
    name = f"bench_asha_{uuid.uuid4().hex[:8]}"
    connection = await asyncpg.connect(admin_dsn)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    base = admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    return name, f"{base}/{name}"


async def drop_database(admin_dsn: str, name: str) -> None:
    connection = await asyncpg.connect(admin_dsn)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


async def backend_decisions(
    label: str, admin_dsn: str | None, trials: int, seed: int
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for variant, naive in (("ours", False), ("naive_read_rung_per_report", True)):
        progress(f"{label}: {variant}, {trials} trials")
        if admin_dsn is None:
            result[variant] = await database_decisions("", trials, seed, naive)
            continue
        name, url = await postgres_database(admin_dsn)
        try:
            result[variant] = await database_decisions(url, trials, seed, naive)
        finally:
            await drop_database(admin_dsn, name)
    result["decision_p99_ratio_naive_over_ours"] = ratio(
        result["naive_read_rung_per_report"]["decision"]["p99_ms"],
        result["ours"]["decision"]["p99_ms"],
    )
    return result


# --- compute saved -------------------------------------------------------------------------


def simulate(searcher: dict[str, Any], honour: bool, step: int, seed: int) -> dict[str, Any]:
    """A whole search in ticks; each trial's quality is drawn once from `seed`."""
    cfg = asha.parse_config(searcher)
    memory = asha.MemorySearch(cfg)
    quality = random.Random(seed)
    qualities: dict[int, float] = {}
    trained: dict[int, int] = {}
    live: list[int] = []
    peak = trained_total = 0
    live.extend(memory.take_creates())
    while live:
        peak = max(peak, len(live))
        leaving = []
        for key in live:
            qualities.setdefault(key, quality.random())
            trained[key] = trained.get(key, 0) + step
            trained_total += step
            time_now = trained[key]
            loss = qualities[key] + 1.0 / time_now
            stop = memory.validation(key, {"loss": loss, "batches": time_now}).stop
            stopped = memory.trials[key].stopped_at is not None
            if time_now >= cfg.max_time or (honour and (stop or stopped)):
                leaving.append(key)
        for key in leaving:
            live.remove(key)
            memory.closed(
                key, "stopped" if memory.trials[key].stopped_at is not None else "completed"
            )
        live.extend(memory.take_creates())
    rungs = [[len(memory.rung(b.index, r)) for r in range(b.num_rungs)] for b in cfg.brackets]
    return {
        "batches_trained": trained_total,
        "trials": len(memory.trials),
        "peak_concurrent_trials": peak,
        "rung_sizes_per_bracket": rungs,
    }


COMPUTE_CONFIGS: dict[str, tuple[dict[str, Any], int]] = {
    # The reference's example (determined-asha.md §3): Determined 0.38 trained 1,024.
    "reference_aggressive_16_trials": (
        {
            "name": "adaptive_asha",
            "metric": "loss",
            "mode": "aggressive",
            "max_trials": 16,
            "max_concurrent_trials": 4,
            "max_time": 64,
            "time_metric": "batches",
            "divisor": 4,
        },
        4,
    ),
    # Determined's core_api/3_hpsearch.yaml (defaults: standard, divisor 4, mct 16).
    "core_api_3_hpsearch": (
        {
            "name": "adaptive_asha",
            "metric": "x",
            "max_trials": 10,
            "time_metric": "batches",
            "max_time": 100,
        },
        10,
    ),
    "standard_100_trials": (
        {
            "name": "adaptive_asha",
            "metric": "loss",
            "max_trials": 100,
            "max_time": 1000,
            "time_metric": "batches",
        },
        10,
    ),
}


def compute_saved(seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (searcher, step) in COMPUTE_CONFIGS.items():
        honoured = simulate(searcher, True, step, seed)
        ignored = simulate(searcher, False, step, seed)
        out[name] = {
            "searcher": searcher,
            "batches_per_tick": step,
            "stops_honoured": honoured,
            "stops_ignored_as_determined_0_38": ignored,
            "ratio_honoured_over_ignored": ratio(
                honoured["batches_trained"], ignored["batches_trained"]
            ),
        }
    return out


# --- main ----------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    trials = {"full": 10_000, "quick": 1000, "smoke": 100}[common.mode_of(args)]
    parameters = {"trials_in_flight": trials, "seed": args.seed, "quick": args.quick}
    if args.smoke:
        parameters["smoke"] = True
    report: dict[str, Any] = {
        "benchmark": "asha",
        "machine": host_facts(["sqlalchemy", "aiosqlite", "asyncpg"]),
        "parameters": parameters,
    }
    progress("core decisions")
    report["decision"] = {"core": core_decisions(trials, args.seed)}
    report["decision"]["sqlite"] = await backend_decisions("sqlite", None, trials, args.seed)
    if args.postgres:
        try:
            report["decision"]["postgres"] = await backend_decisions(
                "postgres", args.postgres, trials, args.seed
            )
        except (OSError, asyncpg.PostgresError) as exc:
            report["decision"]["postgres"] = {"skipped": f"{type(exc).__name__}: {exc}"}
    progress("compute saved")
    report["compute"] = compute_saved(args.seed)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_shape_flags(
        parser, quick="1,000 trials instead of 10,000", smoke="100 trials, for the smoke test"
    )
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="admin DSN ('' to skip)")
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
