"""The scheduler benchmark still runs and its invariants hold (timings are not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PostgresServer, require

pytestmark = pytest.mark.postgres


def test_quick_benchmark_runs_and_places_every_gang_whole(postgres: PostgresServer) -> None:
    require(postgres.error is None, postgres.error or "")
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_scheduler", "--quick"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["machine"]["postgres"]["fsync"] == "on"
    s1, s2 = report["s1"], report["s2"]
    assert s1["a_committed_placements"]["db_check_violations"] == 0
    assert s1["d_naive_one_transaction_per_placement"]["db_check_violations"] == 0
    for variant in ("batched", "naive_one_transaction_per_placement"):
        run = s2[variant]
        assert run["partial_gangs"]["violations"] == 0
        assert run["unplaced"] == 0 and not run["stuck"]
    assert s2["same_placements_in_both_variants"] is True
