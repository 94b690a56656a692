"""Trials-compared benchmark (issue 28): the compare page of 100 trials x 10,000 validation
reports each, drawn in headless Chromium.

    .venv/bin/python -m benchmarks.bench_compare_view [--quick | --smoke] [--trials N]
        [--reports N] [--repeats N] [--postgres [DSN]] [--no-naive] [--out FILE]

Prints one JSON document on stdout (progress goes to stderr). Setup, excluded from the
figures: a database (SQLite in the master's data folder by default; with --postgres a new
database on that server as well) migrated and seeded through an in-process master: one
experiment made by the real service, then N trials and their reports inserted with
SQLAlchemy Core executemany, each report numbered (ordinal, thinning level) as the report
path numbers it. Then a real `det-master` process serves it, and Debian's Chromium (through
Playwright) signs in and opens /ui/experiments/ID/compare with every trial named in the
address, `--repeats` times after one warm-up (none for --smoke), each in a new tab.
Measured per load, from the navigation's start: the page's first byte and last byte
(server time, transfer) and `compare-chart-drawn`, the performance mark app.js sets when
uPlot has drawn the chart.
The issue's target is under 2 s for 100 x 10,000; `target_met` compares the p95 with it.

`naive` is the old path for comparison, in-process on the same database: every report of
the trials read (trial, step, metrics JSON) and the metric picked out in Python, without
HTML or a browser; it is a lower bound of what the page cost before. `--smoke` (4 trials
of 3,000 reports, one load) runs every path in seconds, for the smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, text, update

from benchmarks import common
from benchmarks.bench_dashboard import (
    DEFAULT_ADMIN_DSN,
    database,
    master_app,
    postgres_reachable,
)
from benchmarks.common import host_facts, progress, seconds_since_start
from harness.cluster import MasterProcess
from harness.figures import ms_percentiles, ms_summary
from master.core import thinning
from master.db.models import (
    ExperimentModel,
    ExperimentState,
    TrialMetricModel,
    TrialModel,
    TrialState,
    UserModel,
)
from master.db.session import session_scope
from master.services import experiments, trial_compare, trial_reports
from master.services.experiments import ExperimentRequest

TARGET_MS = 2000.0
INSERT_CHUNK = 20_000
REPORT_PERIOD = 100  # batches between two validation reports
METRIC = "validation_loss"
CONFIG = f"""\
name: compare-bench
entrypoint: python3 train.py
hyperparameters:
  global_batch_size: 64
  lr: {{type: log, minval: -4, maxval: -1}}
searcher: {{name: random, metric: {METRIC}, max_trials: 1, max_length: {{batches: 1000}}}}
reproducibility: {{experiment_seed: 28}}
"""
SHAPES = {  # trials, reports per trial, timed loads
    "full": (100, 10_000, 9),
    "quick": (100, 2_000, 5),
    "smoke": (4, 3_000, 1),
}
DRAWN_MARK = "compare-chart-drawn"


# -- the data ----------------------------------------------------------------------------


async def seed(url: str, trials: int, reports: int, naive: bool) -> dict[str, Any]:
    """The experiment, its trials and reports; and, in the same app, the naive read."""
    async with master_app(url) as app:
        started = time.perf_counter()
        factory = app.state.session_factory
        async with session_scope(factory) as session:
            owner = await session.scalar(
                select(UserModel).where(UserModel.username == "determined")
            )
            assert owner is not None
            view, _prepared = await experiments.create_experiment(
                session, ExperimentRequest(config=CONFIG, activate=False), owner, app.state.settings
            )
            assert view is not None
            experiment_id = view.experiment.id
            # Finished, so the real master schedules nothing while it is measured.
            await session.execute(
                update(ExperimentModel)
                .where(ExperimentModel.id == experiment_id)
                .values(state=ExperimentState.COMPLETED.value)
            )
        base = datetime(2026, 11, 1, tzinfo=UTC)
        async with session_scope(factory) as session:
            trial_ids = list(
                (
                    await session.scalars(
                        insert(TrialModel).returning(TrialModel.id, sort_by_parameter_order=True),
                        [
                            {
                                "experiment_id": experiment_id,
                                "request_id": str(uuid.uuid4()),
                                "state": TrialState.COMPLETED.value,
                                "hparams": {"global_batch_size": 64, "lr": 10 ** (-1 - n % 3)},
                                "seed": n,
                                "restarts": 0,
                                "run_id": 1,
                                "total_batches_processed": reports * REPORT_PERIOD,
                                "runner_state": "",
                                "start_time": base,
                            }
                            for n in range(trials)
                        ],
                    )
                ).all()
            )
        rng = random.Random(28)
        rows: list[dict[str, Any]] = []
        for t, trial_id in enumerate(trial_ids):
            floor, speed = 0.05 + 0.1 * rng.random(), 0.5 + rng.random()
            for n in range(reports):
                loss = floor + math.exp(-speed * n / reports * 5) + rng.gauss(0, 0.01)
                rows.append(
                    {
                        "trial_id": trial_id,
                        "group_name": "validation",
                        "steps_completed": (n + 1) * REPORT_PERIOD,
                        "trial_run_id": 1,
                        "metrics": {METRIC: loss, "accuracy": 1 - loss / 2},
                        "report_time": base + timedelta(seconds=n),
                        "ordinal": n,
                        "thinning_level": thinning.thinning_level(n),
                    }
                )
                if len(rows) == INSERT_CHUNK:
                    await _insert(factory, rows)
                    rows = []
            if t % 10 == 9:
                progress(f"seeded {t + 1} of {trials} trials")
        if rows:
            await _insert(factory, rows)
        if app.state.engine.dialect.name == "postgresql":
            async with app.state.engine.connect() as conn:  # as autovacuum would after a load
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("ANALYZE"))
        setup = {
            "experiment_id": experiment_id,
            "trial_ids": trial_ids,
            "seed_seconds": round(time.perf_counter() - started, 1),
        }
        if naive:
            progress("the naive path: reading every report")
            setup["naive"] = await naive_read(factory, trial_ids)
        return setup


async def _insert(factory: Any, rows: list[dict[str, Any]]) -> None:
    async with session_scope(factory) as session:
        await session.execute(insert(TrialMetricModel), rows)


async def naive_read(factory: Any, trial_ids: list[int]) -> dict[str, Any]:
    """Every report of the trials, the metric picked out in Python and aligned by step: what
    the page did before thinning, less its HTML and the browser's work."""
    started = time.perf_counter()
    async with session_scope(factory) as session:
        rows = (
            await session.execute(
                select(
                    TrialMetricModel.trial_id,
                    TrialMetricModel.steps_completed,
                    TrialMetricModel.metrics,
                ).where(
                    TrialMetricModel.trial_id.in_(trial_ids),
                    TrialMetricModel.group_name == "validation",
                )
            )
        ).all()
    steps = sorted({s for _, s, m in rows if METRIC in m})
    at = {s: i for i, s in enumerate(steps)}
    series: dict[int, list[float | None]] = {t: [None] * len(steps) for t in trial_ids}
    for trial_id, s, m in rows:
        if METRIC in m:
            series[trial_id][at[s]] = trial_reports.numeric(m[METRIC])
    return {
        "reports_read": len(rows),
        "seconds": round(time.perf_counter() - started, 2),
        "what": "server side only: read and align every report (no HTML, no browser)",
    }


# -- the browser -------------------------------------------------------------------------


def chromium() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        raise SystemExit("Debian's chromium is needed (apt-get install chromium)")
    return path


LOAD_FIGURES = f"""() => {{
  const nav = performance.getEntriesByType('navigation')[0];
  const drawn = performance.getEntriesByName('{DRAWN_MARK}')[0];
  const el = document.querySelector(".chart[data-chart='compare']");
  return {{
    first_byte: nav.responseStart, last_byte: nav.responseEnd,
    dom_content_loaded: nav.domContentLoadedEventEnd, drawn: drawn ? drawn.startTime : null,
    html_bytes: nav.decodedBodySize, series: Number(el.dataset.series),
    steps: Number(el.dataset.points),
    thinned: document.querySelector('[data-thinned]')?.dataset.thinned || '',
  }};
}}"""


def measure_pages(master: MasterProcess, path: str, repeats: int, warm_ups: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    loads: list[dict[str, Any]] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium(),
            headless=True,
            args=["--disable-background-networking", "--no-sandbox"],
        )
        try:
            context = browser.new_context(
                viewport={"width": 1280, "height": 800}, base_url=master.url
            )
            context.set_default_timeout(120_000)
            page = context.new_page()
            page.goto("/ui/login")
            page.get_by_label("Username").fill("determined")
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url("**/ui/cluster")
            page.close()
            for n in range(warm_ups + repeats):  # warm-ups: the master's caches, the browser
                page = context.new_page()
                errors: list[str] = []

                def failed(exc: Any, errors: list[str] = errors) -> None:
                    errors.append(str(exc))

                page.on("pageerror", failed)
                page.goto(path)
                page.wait_for_selector(".chart[data-chart='compare'][data-drawn]")
                figures = page.evaluate(LOAD_FIGURES)
                page.close()
                if errors:
                    raise RuntimeError(f"the page failed: {errors}")
                if n >= warm_ups:
                    loads.append(figures)
                progress(f"load {n}: drawn at {figures['drawn']:.0f} ms")
        finally:
            browser.close()
    drawn = [f["drawn"] / 1000 for f in loads]
    return {
        "chart_drawn": ms_summary(drawn) | ms_percentiles(drawn, (95,)),
        "first_byte": ms_summary([f["first_byte"] / 1000 for f in loads]),
        "last_byte": ms_summary([f["last_byte"] / 1000 for f in loads]),
        "html_bytes": loads[-1]["html_bytes"],
        "series_drawn": loads[-1]["series"],
        "distinct_steps_drawn": loads[-1]["steps"],
        "thinned_strides": loads[-1]["thinned"],
        "loads_ms": [round(f["drawn"]) for f in loads],
    }


async def measure(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as folder:
        data_dir = Path(folder) / "data"
        data_dir.mkdir()
        async with database(backend, args.postgres or DEFAULT_ADMIN_DSN) as pg_url:
            url = f"sqlite:///{data_dir}/resolute.db" if backend == "sqlite" else pg_url
            template = MasterProcess.migrated_sqlite_schema()  # the test suite's, if any
            if backend == "sqlite" and template is not None:
                shutil.copyfile(template, data_dir / "resolute.db")  # a second less to migrate
            progress(f"{backend}: seeding {args.trials} trials x {args.reports} reports")
            setup = await seed(url, args.trials, args.reports, args.naive)
            progress(f"{backend}: seeded in {setup['seed_seconds']} s; starting det-master")
            master = MasterProcess(
                data_dir, db_url="" if backend == "sqlite" else url, label="bench"
            )
            master.start()
            try:
                query = "&".join(f"trial={t}" for t in setup["trial_ids"])
                path = f"/ui/experiments/{setup['experiment_id']}/compare?{query}"
                warm_ups = 0 if common.mode_of(args) == "smoke" else 1
                pages = await asyncio.to_thread(measure_pages, master, path, args.repeats, warm_ups)
            finally:
                master.stop()
    p95 = pages["chart_drawn"]["p95_ms"]
    result: dict[str, Any] = {
        "seed_seconds": setup["seed_seconds"],
        "page": pages,
        "target_met": p95 < TARGET_MS,
    }
    if "naive" in setup:
        result["naive"] = setup["naive"]
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    report: dict[str, Any] = {
        "benchmark": "resolute dashboard, issue 28 (trials compared, thinned)",
        "mode": mode,
        "command": "python -m benchmarks.bench_compare_view"
        + ("" if mode == "full" else f" --{mode}")
        + (" --postgres" if args.postgres else ""),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": host_facts(["sqlalchemy", "aiosqlite", "asyncpg", "fastapi", "playwright"]),
        "shape": {
            "trials": args.trials,
            "reports_per_trial": args.reports,
            "reports_stored": args.trials * args.reports,
            "max_points_per_trial": trial_compare.points_per_trial(args.trials),
            "timed_loads": args.repeats,
            "viewport": "1280x800",
            "target_p95_ms": TARGET_MS,
        },
    }
    report["sqlite"] = await measure("sqlite", args)
    if args.postgres:
        problem = await postgres_reachable(args.postgres)
        if problem is None:
            report["postgres"] = await measure("postgres", args)
        else:
            report["postgres"] = {"skipped": f"PostgreSQL at {args.postgres}: {problem}"}
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["total_seconds"] = round(seconds_since_start(), 1)
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    common.add_shape_flags(
        parser,
        quick="100 trials of 2,000 reports, 5 loads",
        smoke="4 trials of 3,000 reports, 1 load",
    )
    parser.add_argument("--trials", type=int, default=None, help="default 100")
    parser.add_argument("--reports", type=int, default=None, help="per trial; default 10,000")
    parser.add_argument("--repeats", type=int, default=None, help="timed page loads")
    parser.add_argument(
        "--postgres",
        nargs="?",
        const=DEFAULT_ADMIN_DSN,
        default=None,
        help=f"also measure PostgreSQL (admin DSN, default {DEFAULT_ADMIN_DSN})",
    )
    parser.add_argument(
        "--no-naive", dest="naive", action="store_false", help="skip reading every report"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    trials, reports, repeats = SHAPES[common.mode_of(args)]
    args.trials = args.trials or trials
    args.reports = args.reports or reports
    args.repeats = args.repeats or repeats
    if not 1 <= args.trials <= trial_compare.MAX_COMPARED or args.reports < 1:
        parser.error(f"--trials must be 1 to {trial_compare.MAX_COMPARED}, --reports at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = asyncio.run(run(args))
    common.emit_report(result, args.out)


if __name__ == "__main__":
    main()
