"""Trial plans: the values, IDs and seeds a user sees for single, random and grid searches."""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from master.core.errors import ConfigError
from master.core.searcher import TrialPlan, count_trials, grid_points, plan_trials

SINGLE = {"name": "single", "metric": "loss"}
GRID = {"name": "grid", "metric": "loss"}


def random_searcher(max_trials: int) -> dict[str, Any]:
    return {"name": "random", "metric": "loss", "max_trials": max_trials}


def numpy_request_id(rs: np.random.RandomState) -> uuid.UUID:
    words = rs.randint(0, 2**32, size=4, dtype=np.uint64)
    raw = b"".join(int(w).to_bytes(4, "little") for w in words)
    return uuid.UUID(bytes=raw, version=4)


def problem_paths(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [p.path for p in exc.value.problems]


# --- single --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 42, 1_700_000_000, 2**31 - 1, 2**32 - 1])
def test_single_with_consts_seed_matches_documented_numpy_formula(seed: int) -> None:
    hps = {"global_batch_size": 64, "lr": {"type": "const", "val": 0.1}, "layers": [1, 2]}

    [trial] = plan_trials(SINGLE, hps, seed)

    assert trial.seed == int(np.random.RandomState(seed).randint(0, 2**31, size=5)[4])
    assert trial.hparams == {"global_batch_size": 64, "layers": [1, 2], "lr": 0.1}
    assert trial.request_id == numpy_request_id(np.random.RandomState(seed))
    assert trial.request_id.version == 4


def test_single_samples_its_hyperparameters() -> None:
    # Determined's single searcher is random with max_trials 1: ranges are sampled.
    hps = {"x": {"type": "int", "minval": 0, "maxval": 1000}}
    rs = np.random.RandomState(3)
    [trial] = plan_trials(SINGLE, hps, 3)
    assert trial.hparams == {"x": int(rs.randint(0, 1001))}
    assert trial.request_id == numpy_request_id(rs)
    assert trial.seed == rs.randint(0, 2**31)


def test_same_seed_gives_identical_plans_and_different_seeds_differ() -> None:
    hps = {
        "a": {"type": "double", "minval": 0.0, "maxval": 1.0},
        "b": {"type": "categorical", "vals": [1, 2, 3, 4]},
    }
    first = plan_trials(random_searcher(5), hps, 77)
    assert first == plan_trials(random_searcher(5), hps, 77)
    other = plan_trials(random_searcher(5), hps, 78)
    assert [t.seed for t in first] != [t.seed for t in other]
    assert [t.hparams for t in first] != [t.hparams for t in other]
    assert {t.request_id for t in first}.isdisjoint({t.request_id for t in other})


def test_request_ids_are_unique_within_an_experiment() -> None:
    plans = plan_trials(random_searcher(200), {}, 5)
    assert len({p.request_id for p in plans}) == 200


# --- random: parity with a hand-computed NumPy sequence -----------------------------------

# Deliberately not in sorted order, with a nested group whose keys are also unsorted.
EXAMPLE_HPS: dict[str, Any] = {
    "optimizer": {
        "name": {"type": "categorical", "vals": ["adam", "sgd", "rmsprop"]},
        "momentum": {"type": "double", "minval": 0.5, "maxval": 0.99},
    },
    "lr": {"type": "log", "minval": -4.0, "maxval": -1.0, "base": 10},
    "global_batch_size": 32,
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "batch": {"type": "int", "minval": 16, "maxval": 64},
    "width": {"type": "log", "minval": 3, "maxval": 6, "base": 2},
}


def expected_example_trials(seed: int, n: int) -> list[TrialPlan]:
    rs = np.random.RandomState(seed)
    trials = []
    for _ in range(n):
        # sorted names: batch, dropout, global_batch_size, lr, optimizer{momentum, name}, width
        batch = 16 + int(rs.randint(0, 64 - 16 + 1))
        dropout = float(rs.uniform(0.0, 0.5))
        lr = math.pow(10.0, float(rs.uniform(-4.0, -1.0)))
        momentum = float(rs.uniform(0.5, 0.99))
        name = ["adam", "sgd", "rmsprop"][int(rs.randint(0, 3))]
        width = math.pow(2.0, float(rs.uniform(3.0, 6.0)))
        request_id = numpy_request_id(rs)
        trial_seed = int(rs.randint(0, 2**31))
        hparams = {
            "batch": batch,
            "dropout": dropout,
            "global_batch_size": 32,
            "lr": lr,
            "optimizer": {"momentum": momentum, "name": name},
            "width": width,
        }
        trials.append(TrialPlan(hparams=hparams, request_id=request_id, seed=trial_seed))
    return trials


@pytest.mark.parametrize("seed", [0, 12345, 2**31 - 1])
def test_random_draws_match_numpy_sequence(seed: int) -> None:
    assert plan_trials(random_searcher(6), EXAMPLE_HPS, seed) == expected_example_trials(seed, 6)


def test_nested_names_are_sampled_in_sorted_order_regardless_of_insertion_order() -> None:
    forward = {
        "a": {"type": "int", "minval": 0, "maxval": 10**6},
        "group": {
            "x": {"type": "int", "minval": 0, "maxval": 10**6},
            "y": {"sub": {"type": "int", "minval": 0, "maxval": 10**6}, "b": 1},
            "z": {"type": "double", "minval": 0.0, "maxval": 1.0},
        },
    }
    backward = {
        "group": {
            "z": {"type": "double", "minval": 0.0, "maxval": 1.0},
            "y": {"b": 1, "sub": {"type": "int", "minval": 0, "maxval": 10**6}},
            "x": {"type": "int", "minval": 0, "maxval": 10**6},
        },
        "a": {"type": "int", "minval": 0, "maxval": 10**6},
    }
    plans = plan_trials(random_searcher(3), forward, 9)
    assert plans == plan_trials(random_searcher(3), backward, 9)

    rs = np.random.RandomState(9)
    a = int(rs.randint(0, 10**6 + 1))
    x = int(rs.randint(0, 10**6 + 1))
    sub = int(rs.randint(0, 10**6 + 1))
    z = float(rs.uniform(0.0, 1.0))
    assert plans[0].hparams == {"a": a, "group": {"x": x, "y": {"b": 1, "sub": sub}, "z": z}}


def test_random_creates_max_trials() -> None:
    assert len(plan_trials(random_searcher(7), EXAMPLE_HPS, 1)) == 7


def test_empty_nested_group_survives_sampling() -> None:
    [trial] = plan_trials(SINGLE, {"empty": {}, "x": 1}, 0)
    assert trial.hparams == {"empty": {}, "x": 1}


def test_log_base_defaults_to_ten() -> None:
    hps = {"lr": {"type": "log", "minval": -3, "maxval": -1}}
    rs = np.random.RandomState(4)
    [trial] = plan_trials(SINGLE, hps, 4)
    assert trial.hparams["lr"] == math.pow(10.0, float(rs.uniform(-3.0, -1.0)))


def test_plans_share_no_mutable_values_with_the_config() -> None:
    hps: dict[str, Any] = {
        "layers": [64, 32],
        "opts": {"type": "const", "val": {"k": [1]}},
        "cat": {"type": "categorical", "vals": [[1, 2]]},
    }
    plans = plan_trials(random_searcher(2), hps, 0)
    plans[0].hparams["layers"].append(0)
    plans[0].hparams["opts"]["k"].append(0)
    plans[0].hparams["cat"].append(0)
    assert hps["layers"] == [64, 32]
    assert hps["opts"] == {"type": "const", "val": {"k": [1]}}
    assert hps["cat"]["vals"] == [[1, 2]]
    assert plans[1].hparams == {"cat": [1, 2], "layers": [64, 32], "opts": {"k": [1]}}


@given(
    st.integers(-(10**9), 10**9),
    st.integers(0, 10**9),
    st.integers(0, 2**32 - 1),
)
def test_int_samples_stay_in_range(minval: int, width: int, seed: int) -> None:
    maxval = minval + width
    hps = {"n": {"type": "int", "minval": minval, "maxval": maxval}}
    for plan in plan_trials(random_searcher(5), hps, seed):
        assert minval <= plan.hparams["n"] <= maxval
        assert 0 <= plan.seed < 2**31


# --- grid ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "values"),
    [
        # int: evenly spaced, rounded half away from zero (Go's math.Round)
        ({"type": "int", "minval": 0, "maxval": 20, "count": 3}, [0, 10, 20]),
        ({"type": "int", "minval": 0, "maxval": 10, "count": 4}, [0, 3, 7, 10]),
        ({"type": "int", "minval": 0, "maxval": 5, "count": 3}, [0, 3, 5]),
        ({"type": "int", "minval": -5, "maxval": 0, "count": 3}, [-5, -3, 0]),
        ({"type": "int", "minval": -4, "maxval": -2, "count": 3}, [-4, -3, -2]),
        # int: count above the number of integers in the range is clamped to it
        ({"type": "int", "minval": 0, "maxval": 4, "count": 10}, [0, 1, 2, 3, 4]),
        ({"type": "int", "minval": 7, "maxval": 8, "count": 5}, [7, 8]),
        # int: count 1 gives the rounded midpoint
        ({"type": "int", "minval": 1, "maxval": 4, "count": 1}, [3]),
        ({"type": "int", "minval": -4, "maxval": -1, "count": 1}, [-3]),
        ({"type": "int", "minval": 0, "maxval": 10, "count": 1}, [5]),
        # double: evenly spaced including both ends; count 1 gives the midpoint
        (
            {"type": "double", "minval": -1.0, "maxval": 1.0, "count": 5},
            [-1.0, -0.5, 0.0, 0.5, 1.0],
        ),
        ({"type": "double", "minval": 13, "maxval": 17, "count": 2}, [13.0, 17.0]),
        ({"type": "double", "minval": 0.0, "maxval": 3.0, "count": 1}, [1.5]),
        # log: base ** evenly spaced exponents
        ({"type": "log", "minval": 1, "maxval": 2, "base": 10, "count": 2}, [10.0, 100.0]),
        ({"type": "log", "minval": 0, "maxval": 4, "base": 2, "count": 3}, [1.0, 4.0, 16.0]),
        ({"type": "log", "minval": 1, "maxval": 2, "base": 10, "count": 1}, [10**1.5]),
        # categorical: every value, in the order written
        ({"type": "categorical", "vals": ["b", "a", 3]}, ["b", "a", 3]),
        # const, both spellings
        ({"type": "const", "val": 0.5}, [0.5]),
        ([1, 2], [[1, 2]]),
    ],
)
def test_grid_values_per_hyperparameter(spec: Any, values: list[Any]) -> None:
    points = grid_points({"h": spec})
    assert [p["h"] for p in points] == values
    assert [type(p["h"]) for p in points] == [type(v) for v in values]
    assert count_trials(GRID, {"h": spec}) == len(values)


def test_grid_enumerates_first_sorted_name_slowest() -> None:
    hps = {
        "2": {"type": "int", "minval": 0, "maxval": 10, "count": 3},
        "1": {"type": "int", "minval": 0, "maxval": 20, "count": 3},
    }
    assert grid_points(hps) == [
        {"1": 0, "2": 0},
        {"1": 0, "2": 5},
        {"1": 0, "2": 10},
        {"1": 10, "2": 0},
        {"1": 10, "2": 5},
        {"1": 10, "2": 10},
        {"1": 20, "2": 0},
        {"1": 20, "2": 5},
        {"1": 20, "2": 10},
    ]


def test_grid_creates_trials_from_the_last_point_backwards() -> None:
    # Determined pops grid points off the end of its list.
    hps = {
        "a": {"type": "categorical", "vals": [1, 2]},
        "b": {"type": "categorical", "vals": ["x", "y", "z"]},
    }
    plans = plan_trials(GRID, hps, 0)
    assert [p.hparams for p in plans] == list(reversed(grid_points(hps)))
    assert plans[0].hparams == {"a": 2, "b": "z"}


def test_nested_grid_keeps_nesting() -> None:
    hps = {
        "constant": 2,
        "a": {
            "b": {
                "c2": {"type": "int", "minval": 7, "maxval": 11, "count": 2},
                "c1": {"type": "categorical", "vals": [3, 5]},
            }
        },
        "f": {"type": "double", "minval": 13.0, "maxval": 17.0, "count": 2},
        "l": {"type": "log", "minval": 1, "maxval": 2, "base": 10, "count": 2},
        "empty": {},
    }
    points = grid_points(hps)
    assert len(points) == count_trials(GRID, hps) == 16
    assert points[0] == {
        "a": {"b": {"c1": 3, "c2": 7}},
        "constant": 2,
        "empty": {},
        "f": 13.0,
        "l": 10.0,
    }
    assert points[-1] == {
        "a": {"b": {"c1": 5, "c2": 11}},
        "constant": 2,
        "empty": {},
        "f": 17.0,
        "l": 100.0,
    }
    # a.b.c1 is the first axis (sorted, depth first), so it varies slowest.
    assert [p["a"]["b"]["c1"] for p in points] == [3] * 8 + [5] * 8
    assert len({repr(p) for p in points}) == 16


def test_grid_makes_no_hyperparameter_draws() -> None:
    hps = {
        "x": {"type": "int", "minval": 0, "maxval": 100, "count": 2},
        "y": {"type": "categorical", "vals": ["a", "b"]},
    }
    plans = plan_trials(GRID, hps, 2021)
    rs = np.random.RandomState(2021)
    for plan in plans:
        assert plan.request_id == numpy_request_id(rs)
        assert plan.seed == rs.randint(0, 2**31)
    assert plans[0].seed == int(np.random.RandomState(2021).randint(0, 2**31, size=5)[4])


def test_grid_ignores_max_trials() -> None:
    hps = {"x": {"type": "int", "minval": 0, "maxval": 100, "count": 4}}
    searcher = {**GRID, "max_trials": 2}
    assert count_trials(searcher, hps) == 4
    assert len(plan_trials(searcher, hps, 0)) == 4


def test_grid_without_hyperparameters_is_one_trial() -> None:
    assert count_trials(GRID, {}) == 1
    assert [p.hparams for p in plan_trials(GRID, {}, 0)] == [{}]


def test_count_trials_of_a_huge_grid_is_cheap() -> None:
    hps = {f"h{i}": {"type": "double", "minval": 0, "maxval": 1, "count": 1000} for i in range(20)}
    assert count_trials(GRID, hps) == 1000**20
    wide = {"n": {"type": "int", "minval": 0, "maxval": 10**15, "count": 10**12}}
    assert count_trials(GRID, wide) == 10**12


@pytest.mark.parametrize(
    ("searcher", "hps", "expected"),
    [
        (SINGLE, {}, 1),
        (SINGLE, EXAMPLE_HPS, 1),
        (random_searcher(1), EXAMPLE_HPS, 1),
        (random_searcher(37), EXAMPLE_HPS, 37),
        (GRID, {"a": {"type": "int", "minval": 0, "maxval": 9, "count": 3}}, 3),
        (GRID, {"a": {"type": "int", "minval": 0, "maxval": 2, "count": 30}}, 3),
        (
            GRID,
            {
                "a": {"type": "categorical", "vals": [1, 2, 3, 4]},
                "n": {"m": {"type": "log", "minval": 0, "maxval": 1, "count": 5}, "k": 1},
                "c": "const",
            },
            20,
        ),
        # ranges without count are fine outside grid search
        (random_searcher(2), {"a": {"type": "int", "minval": 0, "maxval": 9}}, 2),
    ],
)
def test_count_trials(searcher: dict[str, Any], hps: dict[str, Any], expected: int) -> None:
    assert count_trials(searcher, hps) == expected
    if expected < 100:
        assert len(plan_trials(searcher, hps, 0)) == expected


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hps", "path"),
    [
        ({"lr": {"type": "double", "minval": 0, "maxval": 1}}, "hyperparameters.lr.count"),
        ({"n": {"type": "int", "minval": 0, "maxval": 1}}, "hyperparameters.n.count"),
        (
            {"opt": {"inner": {"lr": {"type": "log", "minval": -3, "maxval": -1}}}},
            "hyperparameters.opt.inner.lr.count",
        ),
    ],
)
def test_grid_range_without_count_is_an_error(hps: dict[str, Any], path: str) -> None:
    for call in (lambda: count_trials(GRID, hps), lambda: plan_trials(GRID, hps, 0)):
        with pytest.raises(ConfigError) as exc:
            call()
        assert problem_paths(exc) == [path]
        assert "count" in str(exc.value)


def test_grid_reports_every_missing_count() -> None:
    hps = {
        "b": {"type": "int", "minval": 0, "maxval": 1},
        "a": {"type": "double", "minval": 0, "maxval": 1},
        "c": {"type": "categorical", "vals": [1]},
    }
    with pytest.raises(ConfigError) as exc:
        count_trials(GRID, hps)
    assert problem_paths(exc) == ["hyperparameters.a.count", "hyperparameters.b.count"]


@pytest.mark.parametrize("name", ["sync_halving", "custom", "", None, 3])
def test_unknown_searcher_name_lists_supported_ones(name: Any) -> None:
    searcher = {"metric": "loss"} if name is None else {"name": name}
    for call in (lambda: count_trials(searcher, {}), lambda: plan_trials(searcher, {}, 0)):
        with pytest.raises(ConfigError) as exc:
            call()
        assert problem_paths(exc) == ["searcher.name"]
        message = str(exc.value)
        assert "single" in message and "grid" in message and "random" in message


@pytest.mark.parametrize("max_trials", [None, 0, -3, "5", 2.0, True])
def test_random_needs_positive_integer_max_trials(max_trials: Any) -> None:
    searcher: dict[str, Any] = {"name": "random"}
    if max_trials is not None:
        searcher["max_trials"] = max_trials
    for call in (lambda: count_trials(searcher, {}), lambda: plan_trials(searcher, {}, 0)):
        with pytest.raises(ConfigError) as exc:
            call()
        assert problem_paths(exc) == ["searcher.max_trials"]


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"type": "uniform", "minval": 0, "maxval": 1}, "hyperparameters.g.h.type"),
        ({"type": "int", "minval": 0.5, "maxval": 3}, "hyperparameters.g.h.minval"),
        ({"type": "int", "maxval": 3}, "hyperparameters.g.h.minval"),
        ({"type": "double", "minval": 0, "maxval": "1"}, "hyperparameters.g.h.maxval"),
        ({"type": "double", "minval": 2, "maxval": 1}, "hyperparameters.g.h.maxval"),
        ({"type": "int", "minval": 0, "maxval": 3, "count": 0}, "hyperparameters.g.h.count"),
        ({"type": "log", "minval": 0, "maxval": 1, "base": 0}, "hyperparameters.g.h.base"),
        ({"type": "categorical", "vals": []}, "hyperparameters.g.h.vals"),
        ({"type": "categorical"}, "hyperparameters.g.h.vals"),
        ({"type": "const"}, "hyperparameters.g.h.val"),
    ],
)
def test_bad_hyperparameter_is_an_error_at_its_path(spec: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as exc:
        plan_trials(random_searcher(1), {"g": {"h": spec}}, 0)
    assert problem_paths(exc) == [path]


def test_out_of_range_experiment_seed_is_rejected() -> None:
    with pytest.raises(ValueError):
        plan_trials(SINGLE, {}, 2**32)
