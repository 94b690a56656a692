"""The compare chart's thinning: levels from ordinals, and the level that fits a budget."""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from master.core.thinning import FIRST_REPORT_LEVEL, level_for, stride, thinning_level
from master.services.trial_compare import points_per_trial

ROOT = Path(__file__).resolve().parents[2]


def test_levels_are_trailing_zero_bits_and_the_first_report_has_every_level() -> None:
    assert [thinning_level(n) for n in range(1, 9)] == [0, 1, 0, 2, 0, 1, 0, 3]
    assert thinning_level(0) == FIRST_REPORT_LEVEL
    assert thinning_level(2**30) == 30
    with pytest.raises(ValueError):
        thinning_level(-1)


@given(st.integers(0, 2**31 - 1), st.integers(0, 30))
def test_level_at_least_l_is_every_2_to_the_l_th_report(ordinal: int, level: int) -> None:
    assert (thinning_level(ordinal) >= level) == (ordinal % stride(level) == 0)


@given(st.integers(0, 10**7), st.integers(1, 5000))
def test_the_chosen_level_is_the_finest_that_fits(reports: int, budget: int) -> None:
    level = level_for(reports, budget)
    kept = sum(1 for _ in range(0, reports, stride(level)))
    assert kept <= budget
    if level > 0:  # one level finer would not fit
        assert len(range(0, reports, stride(level - 1))) > budget


def test_100_trials_of_10000_reports_read_625_rows_each() -> None:
    budget = points_per_trial(100)
    assert budget == 1_000 and points_per_trial(8) == 2_000
    assert level_for(10_000, budget) == 4 and len(range(0, 10_000, stride(4))) == 625
    assert level_for(1_000, budget) == 0 and level_for(0, budget) == 0


def test_the_migrations_sql_gives_the_same_levels() -> None:
    """Migration 0016 backfills levels with a CASE both databases run; it must agree."""
    path = next((ROOT / "migrations" / "versions").glob("*_0016_*.py"))
    spec = importlib.util.spec_from_file_location("migration_0016", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (ordinal INTEGER)")
    ordinals = [*range(0, 5000), 2**20, 3 * 2**24, 2**30, 2**31 - 1]
    db.executemany("INSERT INTO t VALUES (?)", [(n,) for n in ordinals])
    rows = db.execute(f"SELECT ordinal, {module._level_case()} FROM t").fetchall()
    assert all(level == thinning_level(n) for n, level in rows)
