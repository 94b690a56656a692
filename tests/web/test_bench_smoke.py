"""The dashboard benchmark still runs and its pages render every row (timings are judged by
the full run, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_quick_dashboard_benchmark_renders_full_pages(repo_root: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_dashboard",
            "--quick",
            "--experiments",
            "300",
            "--repeats",
            "3",
        ],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["machine"]["cpu_model"]
    for backend in ("sqlite", "postgres"):
        run = report[backend]
        if "skipped" in run:
            continue
        assert run["page"]["default_newest_first"]["rows"] == 50
        assert run["page"]["last_page"]["rows"] == 300 - 5 * 50
        assert run["page"]["per_page_200"]["rows"] == 200
        assert run["naive_every_experiment_in_one_page"]["rows"] == 300
