"""The pictures of what a search found, without a database: which hyperparameters are
plotted and how their axes are scaled, which trial is best, and where each trial of an ASHA
search sits among its bracket's rungs."""

from __future__ import annotations

import itertools
import math
from typing import Any

from master.core import asha
from master.core import search_views as sv

HYPERPARAMETERS: dict[str, Any] = {
    "global_batch_size": 64,
    "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1},
    "layers": {"type": "int", "minval": 1, "maxval": 4},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "optimizer": {"type": "categorical", "vals": ["adam", "sgd", {"name": "lamb"}]},
    "model": {
        "width": {"type": "int", "minval": 8, "maxval": 64},
        "activation": {"type": "const", "val": "relu"},
    },
    "one_choice": {"type": "categorical", "vals": ["only"]},
    "fixed_range": {"type": "int", "minval": 3, "maxval": 3},
}


def test_searched_hyperparameters_are_split_from_constants_and_nested_ones_named_by_path() -> None:
    searched, constants = sv.searched_hyperparameters(HYPERPARAMETERS)
    assert [(h.name, h.kind) for h in searched] == [
        ("dropout", "double"),
        ("layers", "int"),
        ("lr", "log"),
        ("model.width", "int"),
        ("optimizer", "categorical"),
    ]
    lr = searched[2]
    assert math.isclose(lr.low, 1e-4) and math.isclose(lr.high, 0.1) and lr.base == 10
    assert searched[4].categories == ("adam", "sgd", {"name": "lamb"})
    # A single category or a one-value range is as constant as a plain value.
    assert [(c.name, c.value) for c in constants] == [
        ("fixed_range", 3),
        ("global_batch_size", 64),
        ("model.activation", "relu"),
        ("one_choice", "only"),
    ]
    assert sv.searched_hyperparameters(None) == ([], [])
    assert sv.value_at({"model": {"width": 16}}, ("model", "width")) == 16
    assert sv.value_at({"model": 3}, ("model", "width")) is None


def outcome(trial_id: int, metric: float | None, **hparams: Any) -> sv.TrialOutcome:
    return sv.TrialOutcome(trial_id, "COMPLETED", hparams, metric)


def test_the_best_trial_respects_the_metrics_direction_and_ties_go_to_the_earliest() -> None:
    trials = [outcome(1, 0.5), outcome(2, 0.2), outcome(3, None), outcome(4, 0.9), outcome(5, 0.2)]
    best = sv.best_trial(trials, smaller_is_better=True)
    assert best is not None and best.trial_id == 2
    best = sv.best_trial(trials, smaller_is_better=False)
    assert best is not None and best.trial_id == 4
    assert sv.best_trial([outcome(1, None)], smaller_is_better=True) is None


def plots(trials: list[sv.TrialOutcome], smaller: bool = True) -> dict[str, sv.Scatter]:
    searched, _ = sv.searched_hyperparameters(HYPERPARAMETERS)
    return {s.hyperparameter.name: s for s in sv.scatter_plots(searched, trials, "loss", smaller)}


TRIALS = [
    outcome(1, 0.8, lr=1e-4, layers=1, dropout=0.0, optimizer="adam", model={"width": 8}),
    outcome(2, 0.3, lr=1e-2, layers=4, dropout=0.5, optimizer={"name": "lamb"}, model={}),
    outcome(3, None, lr=1e-3, layers=2, dropout=0.1, optimizer="sgd", model={"width": 9}),
    outcome(4, 0.5, lr=1e-1, layers=2, dropout=0.25, optimizer="sgd", model={"width": 64}),
]


def test_each_searched_hyperparameter_gets_a_plot_of_the_trials_with_a_metric() -> None:
    found = plots(TRIALS)
    assert list(found) == ["dropout", "layers", "lr", "model.width", "optimizer"]
    lr = found["lr"]
    assert [p.trial_id for p in lr.points] == [1, 4, 2]  # no metric: no point; best drawn last
    assert lr.best is not None and lr.best.trial_id == 2
    assert lr.y_title == "best loss (smaller is better)"
    assert lr.x_title == "lr (log scale, base 10)"
    # Log axis: equal ratios are equal distances, and the decades are the ticks.
    x = {p.trial_id: p.x for p in lr.points}
    assert math.isclose(x[2] - x[1], 2 * (x[4] - x[2]), rel_tol=1e-3)
    assert [t.label for t in lr.x_ticks] == ["0.0001", "0.001", "0.01", "0.1"]
    # Every point inside the plot; a smaller loss is higher up (SVG's y grows downwards).
    for scatter in found.values():
        for p in scatter.points:
            assert scatter.left <= p.x <= scatter.right and scatter.top <= p.y <= scatter.bottom
    y = {p.trial_id: p.y for p in lr.points}
    assert y[1] < y[4] < y[2]
    # A trial without the nested value is listed as not placed, not silently dropped.
    assert found["model.width"].unplaced == [2]
    assert plots([outcome(1, None)]) == {}


def test_categories_are_discrete_positions_in_the_configs_order() -> None:
    optimizer = plots(TRIALS)["optimizer"]
    assert optimizer.x_title == "optimizer (categorical)"
    assert [t.label for t in optimizer.x_ticks] == ["adam", "sgd", '{"name": "lamb"}']
    positions = [t.at for t in optimizer.x_ticks]
    x = {p.trial_id: p.x for p in optimizer.points}
    assert x == {1: positions[0], 4: positions[1], 2: positions[2]}
    gaps = [b - a for a, b in itertools.pairwise(positions)]
    assert math.isclose(gaps[0], gaps[1])


def test_larger_is_better_marks_the_largest_and_says_so() -> None:
    layers = plots(TRIALS, smaller=False)["layers"]
    assert layers.best is not None and layers.best.trial_id == 1
    assert layers.y_title == "best loss (larger is better)"
    # Integers: whole-number ticks only.
    assert [t.label for t in layers.x_ticks] == ["1", "2", "3", "4"]


def test_one_metric_value_still_gets_an_axis() -> None:
    (only,) = [outcome(7, 0.25, lr=0.01, layers=3, dropout=0.1, optimizer="sgd")]
    lr = plots([only])["lr"]
    assert len(lr.points) == 1 and lr.points[0].best
    assert lr.top < lr.points[0].y < lr.bottom
    assert lr.y_ticks


def test_nice_ticks_are_round_and_inside_the_range() -> None:
    assert sv.nice_ticks(0.0, 1.0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert sv.nice_ticks(-0.13, 0.92) == [0.0, 0.25, 0.5, 0.75]
    assert sv.nice_ticks(1, 4, integers=True) == [1, 2, 3, 4]
    assert sv.nice_ticks(5, 5) == [5]
    # A range within one decade gets round values instead of a single power of ten.
    ticks = sv.log_ticks(math.log10(0.02), math.log10(0.08), 10)
    assert len(ticks) >= 2 and all(0.02 <= t <= 0.08 for t in ticks)


# -- rungs ----------------------------------------------------------------------------------


def asha_config(**fields: Any) -> asha.AshaConfig:
    searcher = {
        "name": "async_halving",
        "metric": "loss",
        "time_metric": "batches",
        "num_rungs": 3,
        "divisor": 2,
        "max_time": 16,
        "max_trials": 6,
        **fields,
    }
    return asha.parse_config(searcher)


def searcher_block(
    bracket: int,
    rung: int,
    metrics: dict[int, float | None],
    stopped: int | None = None,
    top: bool = False,
) -> dict[str, Any]:
    """A trial's `searcher` block as the API sends it (TrialSearch.as_json)."""
    return {
        "bracket": bracket,
        "rung": rung,
        "stoppedAtRung": stopped,
        "reachedTop": top,
        "rungs": [{"rung": r, "metric": m} for r, m in metrics.items()],
        "summary": f"bracket {bracket}, rung {rung}",
    }


def test_each_trial_sits_in_its_highest_rung_with_stopped_and_full_length_ones_marked() -> None:
    cfg = asha_config()
    assert cfg.brackets[0].rung_units == (4, 8, 16)
    searches = {
        1: searcher_block(0, 2, {0: 0.5, 1: 0.4, 2: 0.3}, stopped=2, top=True),
        2: searcher_block(0, 0, {0: 0.9}, stopped=0),
        3: searcher_block(0, 1, {0: 0.6, 1: 0.7}),
        4: searcher_block(0, -1, {}),
        5: searcher_block(0, -1, {}),
        6: searcher_block(0, 0, {0: None}, stopped=0),  # a NaN metric
        7: searcher_block(0, 0, {0: 0.1}),
    }
    facts = {
        1: sv.TrialFacts("COMPLETED", True),
        2: sv.TrialFacts("STOPPING_COMPLETED", False),
        3: sv.TrialFacts("RUNNING", False),
        4: sv.TrialFacts("QUEUED", False),
        5: sv.TrialFacts("RUNNING", False),
        6: sv.TrialFacts("COMPLETED", True),
        7: sv.TrialFacts("ERROR", True),
    }
    (bracket,) = sv.rung_picture(cfg, searches, facts)
    columns = {c.rung: c for c in bracket.columns}
    assert [c.label for c in bracket.columns] == [
        "before rung 0 (4 batches)",
        "rung 0 (4 batches)",
        "rung 1 (8 batches)",
        "rung 2 (16 batches)",
    ]
    assert bracket.trials == 7
    # Best first (smaller is better), a missing value last.
    assert [(c.trial_id, c.status, c.metric) for c in columns[0].cards] == [
        (7, "ended", 0.1),
        (2, "stopped", 0.9),
        (6, "stopped", None),
    ]
    assert columns[0].cards[1].note == "stopped at rung 0"
    assert [(c.trial_id, c.status) for c in columns[1].cards] == [(3, "training")]
    (top,) = columns[2].cards
    assert (top.trial_id, top.status, top.note) == (1, "top", "trained the full 16 batches")
    assert [(c.trial_id, c.status) for c in columns[-1].cards] == [(4, "waiting"), (5, "training")]

    # With nobody waiting, there is no column before rung 0.
    del searches[4], searches[5]
    (bracket,) = sv.rung_picture(cfg, searches, facts)
    assert [c.rung for c in bracket.columns] == [0, 1, 2]


def test_brackets_are_pictured_separately() -> None:
    cfg = asha.parse_config(
        {
            "name": "adaptive_asha",
            "metric": "accuracy",
            "smaller_is_better": False,
            "time_metric": "batches",
            "max_time": 64,
            "max_trials": 8,
            "max_rungs": 3,
            "mode": "standard",
        }
    )
    assert len(cfg.brackets) > 1
    searches = {
        1: searcher_block(0, 0, {0: 0.5}),
        2: searcher_block(0, 0, {0: 0.7}),
        3: searcher_block(1, 0, {0: 0.6}),
    }
    facts = {i: sv.TrialFacts("RUNNING", False) for i in searches}
    pictures = sv.rung_picture(cfg, searches, facts)
    assert [p.index for p in pictures] == [b.index for b in cfg.brackets]
    assert [p.num_rungs for p in pictures] == [b.num_rungs for b in cfg.brackets]
    first = {c.rung: c for c in pictures[0].columns}
    # Larger is better: 0.7 ranks first.
    assert [c.trial_id for c in first[0].cards] == [2, 1]
    assert [c.trial_id for col in pictures[1].columns for c in col.cards] == [3]


def test_parallel_coordinates_draw_a_line_per_trial_across_every_axis() -> None:
    searched, _ = sv.searched_hyperparameters(HYPERPARAMETERS)
    trials = [t for t in TRIALS if t.trial_id != 2] + [
        outcome(5, 0.2, lr=1e-3, layers=3, dropout=0.2, optimizer="adam", model={"width": 16})
    ]
    parallel = sv.parallel_coordinates(searched, trials, "loss", smaller_is_better=True)
    assert parallel is not None
    assert [a.name for a in parallel.axes] == [
        "dropout",
        "layers",
        "lr",
        "model.width",
        "optimizer",
        "loss",
    ]
    xs = [a.x for a in parallel.axes]
    assert xs == sorted(xs) and xs[-1] < parallel.width
    # Trial 3 has no metric: no line. The best is drawn last and ends on the metric axis.
    assert [line.trial_id for line in parallel.lines] == [1, 4, 5]
    assert parallel.best is parallel.lines[-1] and parallel.best.trial_id == 5
    assert parallel.best.end[0] == xs[-1]
    for line in parallel.lines:
        points = [tuple(map(float, p.split(","))) for p in line.points.split()]
        assert [x for x, _ in points] == xs
        assert all(parallel.top <= y <= parallel.bottom for _, y in points)
    # One searched hyperparameter: its scatter says it all.
    assert sv.parallel_coordinates(searched[:1], trials, "loss", True) is None
    assert sv.parallel_coordinates(searched, [outcome(1, None)], "loss", True) is None
