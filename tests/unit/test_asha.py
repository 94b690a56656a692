"""The ASHA core against the acceptance values of the reference (determined-asha.md §7),
which come from Determined's own Go tests, and against the fixes of §9."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from master.core import asha
from master.core.errors import ConfigError
from master.core.searcher import plan_trials, sample_trials
from master.core.seeds import LegacyRandom


def cfg(**fields: Any) -> asha.AshaConfig:
    searcher = {"name": "adaptive_asha", "metric": "loss", "time_metric": "batches"}
    return asha.parse_config({**searcher, **fields})


def shape(config: asha.AshaConfig) -> list[tuple[int, int, int]]:
    return [(b.num_rungs, b.max_trials, b.max_concurrent) for b in config.brackets]


# --- bracket math (§7.1) -------------------------------------------------------------------


def test_bracket_max_trials_match_determined() -> None:
    assert asha.bracket_max_trials(20, 3, [3, 2, 1]) == [12, 5, 3]
    assert asha.bracket_max_trials(100, 4, [4, 3, 2]) == [70, 22, 8]


def test_bracket_max_concurrency_match_determined() -> None:
    assert asha.bracket_max_concurrent(0, 3, [9, 3, 1]) == [3, 3, 3]
    assert asha.bracket_max_concurrent(11, 3, [9, 3, 1]) == [4, 4, 3]
    assert asha.bracket_max_concurrent(0, 4, [40, 10]) == [10, 10]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_time": 100, "max_trials": 10, "max_concurrent_trials": 2}, [(2, 7, 1), (1, 3, 1)]),
        (
            {
                "mode": "conservative",
                "max_time": 1000,
                "divisor": 3,
                "max_concurrent_trials": 5,
                "max_trials": 10,
            },
            [(3, 7, 2), (2, 2, 2), (1, 1, 1)],
        ),
        (
            {"max_trials": 16, "max_time": 100000, "max_concurrent_trials": 8},
            [(3, 12, 4), (2, 4, 4)],
        ),
        ({"max_trials": 100, "max_time": 1000}, [(4, 70, 6), (3, 22, 5), (2, 8, 5)]),
        (
            {"max_trials": 100, "max_time": 1000, "max_concurrent_trials": 0},
            [(4, 70, 8), (3, 22, 8), (2, 8, 8)],
        ),
        (
            {"max_trials": 100, "max_time": 1000, "max_concurrent_trials": 1},
            [(4, 70, 1), (3, 22, 1), (2, 8, 1)],
        ),
        (
            {
                "bracket_rungs": [1, 3, 2],
                "divisor": 3,
                "max_time": 81,
                "max_trials": 20,
                "max_concurrent_trials": 7,
            },
            [(3, 12, 3), (2, 5, 2), (1, 3, 2)],
        ),
    ],
)
def test_brackets_match_determined(
    fields: dict[str, Any], expected: list[tuple[int, int, int]]
) -> None:
    assert shape(cfg(**fields)) == expected


def test_float_log_edge_caps_the_rungs_as_go_does() -> None:
    # log(1000)/log(10) is 2.9999999999999996 in IEEE doubles: 3 rungs at most, not 4.
    assert math.log(1000) / math.log(10) < 3
    config = cfg(max_trials=1000, max_time=1000, divisor=10)
    assert shape(config) == [(3, 870, 8), (2, 130, 8)]


def test_rung_units() -> None:
    config = cfg(max_trials=16, max_time=100000, max_concurrent_trials=8)
    assert [b.rung_units for b in config.brackets] == [(6250, 25000, 100000), (25000, 100000)]
    assert cfg(max_trials=100, max_time=1000).brackets[0].rung_units == (15, 62, 250, 1000)


def test_initial_trials_go_bracket_by_bracket() -> None:
    config = cfg(max_trials=16, max_time=100000, max_concurrent_trials=8)
    assert asha.initial_creates(config.brackets) == [0, 0, 0, 0, 1, 1, 1, 1]


# --- preview (§7.2) ------------------------------------------------------------------------


def test_preview_counts_match_determined_simulate() -> None:
    go_test = cfg(max_rungs=10, divisor=3, max_time=900, max_trials=10, max_concurrent_trials=5)
    assert dict(asha.preview(go_test)) == {100: 5, 300: 3, 900: 2}
    big = cfg(max_trials=16, max_time=100000, max_concurrent_trials=8)
    assert dict(asha.preview(big)) == {6250: 9, 25000: 5, 100000: 2}
    assert dict(asha.preview(cfg(max_trials=100, max_time=1000))) == {
        15: 53,
        62: 30,
        250: 13,
        1000: 4,
    }


def test_preview_works_for_async_halving_too() -> None:
    config = asha.parse_config(
        {
            "name": "async_halving",
            "metric": "loss",
            "num_rungs": 3,
            "max_trials": 9,
            "divisor": 3,
            "max_time": 9,
            "time_metric": "batches",
        }
    )
    assert asha.preview(config) == [(1, 6), (3, 2), (9, 1)]


# --- the sequential driver of Determined's util_test.go ------------------------------------


def run_sequentially(
    search: asha.MemorySearch,
    period: int,
    metric: Callable[[int], Any],
    fail: Callable[[int], bool] = lambda key: False,
) -> list[tuple[int, int | None]]:
    """Runs trials in creation order; each reports every `period` until stopped, then
    exits. Returns (trial, time it stopped at) per trial."""
    queue = list(search.take_creates())
    stopped: list[tuple[int, int | None]] = []
    while queue:
        key = queue.pop(0)
        if fail(key):
            search.closed(key, "errored")
            stopped.append((key, None))
        else:
            for time in itertools.count(0, period):
                decision = search.validation(key, {"loss": metric(key), "batches": time})
                if decision.stop:
                    stopped.append((key, time))
                    search.closed(key, "stopped")
                    break
        queue.extend(search.take_creates())
    return stopped


def async_halving(**fields: Any) -> asha.AshaConfig:
    base = {"name": "async_halving", "metric": "loss", "time_metric": "batches"}
    return asha.parse_config({**base, **fields})


def test_async_halving_go_test() -> None:
    config = async_halving(
        num_rungs=3, max_trials=10, divisor=3, max_time=900, max_concurrent_trials=3
    )
    search = asha.MemorySearch(config)
    assert search.live() == 3  # the initial creates
    counter: Iterator[int] = itertools.count()
    stops = run_sequentially(search, 100, lambda key: next(counter))
    assert len(stops) == 10
    assert sorted(t for _, t in stops) == [100] * 9 + [900]
    assert search.done()
    assert search.progress() == 1.0


def test_errors_count_as_worst_in_their_next_rung() -> None:
    config = async_halving(
        num_rungs=2, divisor=2, max_time=8, max_trials=4, max_concurrent_trials=2
    )
    search = asha.MemorySearch(config)
    stops = run_sequentially(search, 4, lambda key: 0, fail=lambda key: True)
    assert [t for _, t in stops] == [None] * 4
    assert search.rung(0, 0) == [math.inf] * 4

    search = asha.MemorySearch(config)
    losses = {1: 1, 2: 2, 3: 3}
    run_sequentially(search, 4, lambda key: losses[key], fail=lambda key: key == 0)
    assert search.rung(0, 0) == [1, 2, 3, math.inf]
    assert search.rung(0, 1) == [1]
    assert len(search.trials) == 4 and search.done()


def test_ties_go_before_equal_values() -> None:
    config = async_halving(
        num_rungs=2, divisor=2, max_time=2, max_trials=4, max_concurrent_trials=4
    )
    search = asha.MemorySearch(config)
    search.take_creates()
    assert not search.validation(0, {"loss": 1.0, "batches": 1}).stop
    # Equal to the best: it goes before it, in first place of two, and continues.
    assert not search.validation(1, {"loss": 1.0, "batches": 1}).stop
    assert search.validation(2, {"loss": 1.5, "batches": 1}).stop


# --- seeds (§7.8) --------------------------------------------------------------------------


ASHA = {
    "name": "adaptive_asha",
    "metric": "loss",
    "max_trials": 4,
    "max_time": 16,
    "time_metric": "batches",
    "max_concurrent_trials": 2,
}


def test_seed_zero_first_trial_matches_determined() -> None:
    first = plan_trials(ASHA, {}, 0)[0]
    assert str(first.request_id) == "ac0a7f8c-2faa-4497-b5a6-16b7c0cc21d8"
    assert first.seed == 441365315
    assert str(plan_trials(ASHA, {}, 42)[0].request_id) == "66dce15f-b33d-4acb-9c03-62f30e95f52e"


def test_seed_seven_hyperparameters_match_determined() -> None:
    hparams = {
        "bs": {"type": "const", "val": 64},
        "dropout": {"type": "double", "minval": 0, "maxval": 0.5},
        "layers": {"type": "int", "minval": 1, "maxval": 4},
        "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1},
        "opt": {"type": "categorical", "vals": ["adam", "sgd", "rmsprop"]},
    }
    first = plan_trials(ASHA, hparams, 7)[0]
    assert str(first.request_id) == "b9ecd94e-8edd-4a89-970a-8d43486e4980"
    assert first.seed == 372560217
    assert first.hparams["dropout"] == 0.038154144686978586
    assert first.hparams["layers"] == 2 and first.hparams["opt"] == "adam"
    assert first.hparams["lr"] == pytest.approx(9.0555885e-4, rel=1e-7)


def test_later_trials_continue_the_stored_generator() -> None:
    # The initial trials, then more drawn from a generator stored and loaded as JSON, are
    # the trials one uninterrupted generator gives.
    hparams = {"x": {"type": "double", "minval": 0, "maxval": 1}}
    random_search = {"name": "random", "metric": "loss", "max_trials": 5}
    uninterrupted = plan_trials(random_search, hparams, 11)
    rng = LegacyRandom(11)
    head = sample_trials(hparams, rng, 2)
    restored = LegacyRandom.from_state(list(rng.state()))
    assert head + sample_trials(hparams, restored, 3) == uninterrupted


def test_a_corrupt_generator_state_is_refused() -> None:
    with pytest.raises(ValueError, match="624"):
        LegacyRandom.from_state([1, 2, 3])


# --- the fixes of §9 -----------------------------------------------------------------------


def test_a_stopped_trial_enters_no_rung_again() -> None:
    config = async_halving(
        num_rungs=2, divisor=2, max_time=4, max_trials=3, max_concurrent_trials=3
    )
    search = asha.MemorySearch(config)
    search.take_creates()
    search.validation(0, {"loss": 1, "batches": 2})
    assert search.validation(1, {"loss": 2, "batches": 2}).stop
    # Trial 1 ignores the stop and keeps reporting (Determined 0.38 inserted it each time).
    for time in (2, 3, 4):
        assert not search.validation(1, {"loss": 0.5, "batches": time}).stop
    assert search.rung(0, 0) == [1, 2]
    assert search.rung(0, 1) == []


def test_a_trial_that_finishes_without_a_stop_is_replaced() -> None:
    config = async_halving(
        num_rungs=2, divisor=2, max_time=4, max_trials=3, max_concurrent_trials=1
    )
    search = asha.MemorySearch(config)
    assert search.take_creates() == [0]
    search.closed(0, "completed")  # its own loop ended before any rung
    assert search.take_creates() == [1]
    search.closed(1, "completed")
    assert search.take_creates() == [2]
    search.closed(2, "completed")
    assert search.take_creates() == [] and search.done()


def test_max_concurrent_trials_is_a_real_cap() -> None:
    # Stopped trials still hold their slots until they exit: no create until they close.
    config = async_halving(
        num_rungs=2, divisor=2, max_time=4, max_trials=8, max_concurrent_trials=2
    )
    search = asha.MemorySearch(config)
    search.take_creates()
    search.validation(0, {"loss": 1, "batches": 2})
    assert search.validation(1, {"loss": 2, "batches": 2}).stop
    assert search.take_creates() == []
    search.closed(1, "stopped")
    assert search.take_creates() == [2]
    assert search.live() == 2


def test_nan_or_missing_metric_is_the_worst_for_that_trial_only() -> None:
    config = async_halving(
        num_rungs=2, divisor=2, max_time=4, max_trials=3, max_concurrent_trials=3
    )
    search = asha.MemorySearch(config)
    search.take_creates()
    search.validation(0, {"loss": 1, "batches": 2})
    nan = search.validation(1, {"loss": "NaN", "batches": 2})
    assert nan.stop and nan.warning == "validation metric 'loss' was 'NaN', not a number"
    missing = search.validation(2, {"batches": 2})
    assert missing.stop and missing.warning == "validation metric 'loss' was missing"
    assert search.rung(0, 0) == [1, math.inf, math.inf]


def test_invalid_hyperparameters_leave_the_rungs_and_are_replaced_uncounted() -> None:
    config = async_halving(
        num_rungs=2, divisor=2, max_time=4, max_trials=2, max_concurrent_trials=2
    )
    search = asha.MemorySearch(config)
    search.take_creates()
    search.validation(0, {"loss": 1, "batches": 2})
    search.closed(0, "invalid_hp")
    assert search.rung(0, 0) == []
    assert search.take_creates() == [2]


def test_invalid_replacements_are_bounded() -> None:
    config = async_halving(
        num_rungs=2, divisor=2, max_time=4, max_trials=2, max_concurrent_trials=1
    )
    search = asha.MemorySearch(config)
    while created := search.take_creates():
        search.closed(created[0], "invalid_hp")
    assert len(search.trials) == 4  # 2 counted + at most max_trials invalid ones replaced


def test_progress_never_passes_one() -> None:
    config = cfg(max_trials=4, max_time=16, divisor=2, max_concurrent_trials=4, mode="aggressive")
    search = asha.MemorySearch(config)
    counter = itertools.count()
    seen = []
    queue = search.take_creates()
    while queue:
        key = queue.pop()
        for time in range(0, 17):
            seen.append(search.progress())
            if search.validation(key, {"loss": next(counter), "batches": time}).stop:
                break
        search.closed(key, "stopped")
        queue.extend(search.take_creates())
    assert all(0.0 <= p <= 1.0 for p in seen)
    assert search.progress() == 1.0
    assert asha.progress(config.brackets, [40], [9]) == 1.0  # a rung overfilled by errors


# --- config errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"max_time": 0}, "searcher.max_time"),
        ({"time_metric": ""}, "searcher.time_metric"),
        ({"time_metric": None}, "searcher.time_metric"),
        ({"divisor": 1}, "searcher.divisor"),
        ({"bracket_rungs": [2, 0]}, "searcher.bracket_rungs[1]"),
        ({"mode": "fast"}, "searcher.mode"),
        ({"max_rungs": 0}, "searcher.max_rungs"),
        ({"max_trials": 0}, "searcher.max_trials"),
        ({"metric": None}, "searcher.metric"),
        ({"num_rungs": 3}, "searcher.num_rungs"),
        ({"bracket_rungs": [65]}, "searcher.bracket_rungs[0]"),
        ({"bracket_rungs": [3, 2, 1, 1, 1]}, "searcher.bracket_rungs"),  # 5 brackets, 4 trials
        ({"bracket_rungs": [64], "divisor": 1e10}, "searcher.divisor"),  # 1e10**63 overflows
    ],
)
def test_bad_configs_name_the_field(fields: dict[str, Any], path: str) -> None:
    searcher = {
        "name": "adaptive_asha",
        "metric": "loss",
        "max_trials": 4,
        "max_time": 16,
        "time_metric": "batches",
        **fields,
    }
    with pytest.raises(ConfigError) as caught:
        asha.parse_config(searcher)
    assert path in [p.path for p in caught.value.problems]


def test_legacy_max_length_counts_steps_completed() -> None:
    legacy = asha.parse_config(
        {"name": "adaptive_asha", "metric": "loss", "max_trials": 4, "max_length": {"batches": 64}}
    )
    assert legacy.max_time == 64 and legacy.time_metric is None
    assert asha.searcher_time(legacy, {"loss": 1}, steps_completed=32) == 32.0
    with pytest.raises(ConfigError, match=r"searcher\.max_length: counts epochs"):
        asha.parse_config(
            {
                "name": "adaptive_asha",
                "metric": "loss",
                "max_trials": 4,
                "max_length": {"epochs": 2},
            }
        )


def test_rung_counts_are_bounded_so_a_typo_cannot_stall_the_master() -> None:
    with pytest.raises(ConfigError, match=r"searcher\.num_rungs: must be at most 64, got 10000000"):
        async_halving(num_rungs=10_000_000, max_trials=4, max_time=16)
    assert async_halving(num_rungs=64, max_trials=4, max_time=16).brackets[0].num_rungs == 64
    # max_rungs is only a cap on what max_time and max_trials allow, so any size is harmless.
    assert shape(cfg(max_rungs=10**30, max_trials=16, max_time=16, divisor=2)) == shape(
        cfg(max_rungs=5, max_trials=16, max_time=16, divisor=2)
    )


def test_count_trials_counts_one_trial_per_bracket_at_least() -> None:
    from master.core.searcher import count_trials

    searcher = {
        "name": "adaptive_asha",
        "metric": "loss",
        "max_trials": 3,
        "max_time": 256,
        "time_metric": "batches",
        "divisor": 2,
        "bracket_rungs": [1, 1, 8],
    }
    brackets = asha.parse_config(searcher).brackets
    assert [b.max_trials for b in brackets] == [2, 1, 1]
    assert count_trials(searcher, {}) == 4


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (math.inf, "inf, not a finite number"),
        ("-Infinity", "'-Infinity', not a finite number"),
        (10**400, "1000000000000000000000000000000000000..., not a finite number"),
    ],
)
def test_infinite_or_huge_metrics_count_as_the_worst(raw: Any, what: str) -> None:
    for smaller in (True, False):
        config = cfg(max_trials=4, max_time=16, smaller_is_better=smaller)
        value, problem = asha.searcher_value(config, {"loss": raw})
        assert value == asha.WORST and problem == f"validation metric 'loss' was {what}"
    # a huge time is past every rung, not a crash
    assert asha.searcher_time(cfg(max_trials=4, max_time=16), {"batches": 10**400}, 0) is None


def test_async_halving_needs_num_rungs() -> None:
    with pytest.raises(ConfigError, match=r"searcher\.num_rungs: is required"):
        async_halving(max_trials=4, max_time=16)
