"""The dashboard benchmark still runs on its --smoke shape and its pages render every row
(timings are judged by the full run, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.web.conftest import chromium_path


def test_smoke_dashboard_benchmark_renders_full_pages(repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_dashboard", "--smoke"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["mode"] == "smoke"
    assert report["machine"]["cpu_model"]
    experiments = report["parameters"]["experiments"]
    assert experiments > 200, "more experiments than the largest page"
    last_page_rows = experiments - (experiments - 1) // 50 * 50
    assert last_page_rows < 50, "a short last page"
    for backend in ("sqlite", "postgres"):
        run = report[backend]
        if "skipped" in run:
            continue
        assert run["setup"]["seed_seconds"] > 0
        assert run["page"]["default_newest_first"]["rows"] == 50
        assert run["page"]["last_page"]["rows"] == last_page_rows
        assert run["page"]["per_page_200"]["rows"] == 200
        assert run["naive_every_experiment_in_one_page"]["rows"] == experiments


def test_smoke_experiments_list_benchmark_runs_every_scenario(repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_experiments_list", "--smoke"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["mode"] == "smoke" and report["machine"]["cpu_model"]
    assert "skipped" not in report["sqlite"]
    for backend in ("sqlite", "postgres"):
        run = report[backend]
        if "skipped" in run:
            continue  # the smoke runs SQLite only; the full run measures Postgres too
        pages = run["page"]
        assert pages["first_page"]["rows"] == 50
        assert pages["by_best_metric"]["rows"] == 50
        assert pages["text_exact_id"]["rows"] == 1
        assert 0 < pages["text_name"]["rows"] <= 50
        assert 0 < pages["user_filter_and_best"]["rows"] <= 50
        assert 0 < pages["label_filter"]["rows"] <= 50
        assert pages["label_filter_rare"]["rows"] >= 1
        assert all(p["n"] == report["parameters"]["repeats"] for p in pages.values())


def test_smoke_compare_view_benchmark_draws_the_chart_in_chromium(repo_root: Path) -> None:
    chromium_path()  # skips (or fails in CI) without Debian's chromium, as the browser tests
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_compare_view", "--smoke"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["mode"] == "smoke" and report["machine"]["cpu_model"]
    shape = report["shape"]
    page = report["sqlite"]["page"]
    assert page["series_drawn"] == shape["trials"]
    assert page["chart_drawn"]["n"] == shape["timed_loads"]
    assert page["thinned_strides"] == "2"  # 3,000 reports a trial: every 2nd is drawn
    assert report["sqlite"]["naive"]["reports_read"] == shape["reports_stored"]
