"""What a search found, as pictures, without I/O: each searched hyperparameter against the
searcher's metric (scatter plots laid out for SVG), and an ASHA search's trials by rung.

The dashboard draws these on the server: each point is a link to its trial, and the page
needs no script to show them. Inputs are plain values (the experiment's config, each
trial's hyperparameters and best metric, the API's `searcher` block of each trial), so the
rules here are tested without a database.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from master.core import asha

# -- the hyperparameters a search varies ----------------------------------------------------

AxisKind = Literal["int", "double", "log", "categorical"]


@dataclass(frozen=True)
class SearchedHyperparameter:
    """One hyperparameter whose value differs between trials; `path` walks nested groups."""

    path: tuple[str, ...]
    kind: AxisKind
    low: float = 0.0  # the searched range as values (a log one's base ** minval...)
    high: float = 0.0
    base: float = 10.0
    categories: tuple[Any, ...] = ()

    @property
    def name(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class ConstantHyperparameter:
    path: tuple[str, ...]
    value: Any

    @property
    def name(self) -> str:
        return ".".join(self.path)


def searched_hyperparameters(
    config: Mapping[str, Any] | None,
) -> tuple[list[SearchedHyperparameter], list[ConstantHyperparameter]]:
    """The experiment's `hyperparameters` split into those searched and those fixed, by
    name (Postgres keeps a config's keys in an order of its own), nested groups flattened
    to dotted names. A range of one value or a single category is a constant: plotting it
    would show a vertical line."""
    searched: list[SearchedHyperparameter] = []
    constants: list[ConstantHyperparameter] = []

    def walk(group: Mapping[str, Any], route: tuple[str, ...]) -> None:
        for name, raw in group.items():
            path = (*route, str(name))
            if not isinstance(raw, Mapping):
                constants.append(ConstantHyperparameter(path, raw))
            elif "type" not in raw:
                walk(raw, path)
            else:
                found = _searched(path, raw)
                if isinstance(found, SearchedHyperparameter):
                    searched.append(found)
                else:
                    constants.append(found)

    walk(config or {}, ())
    searched.sort(key=lambda h: h.path)
    constants.sort(key=lambda c: c.path)
    return searched, constants


def _searched(
    path: tuple[str, ...], raw: Mapping[str, Any]
) -> SearchedHyperparameter | ConstantHyperparameter:
    kind = raw.get("type")
    if kind == "categorical":
        vals = raw.get("vals")
        categories = tuple(vals) if isinstance(vals, list | tuple) else ()
        if len({_key(v) for v in categories}) > 1:
            return SearchedHyperparameter(path, "categorical", categories=categories)
        return ConstantHyperparameter(path, categories[0] if categories else None)
    if kind in ("int", "double", "log"):
        low, high = _number(raw.get("minval")), _number(raw.get("maxval"))
        base = _number(raw.get("base", 10.0))
        if low is None or high is None or (kind == "log" and not (base and base > 0)):
            return ConstantHyperparameter(path, None)  # refused at submit; never here
        axis: AxisKind = "int" if kind == "int" else "double" if kind == "double" else "log"
        if axis == "log":
            assert base is not None
            try:
                low, high = base**low, base**high
            except OverflowError:
                return ConstantHyperparameter(path, None)  # no trial could be drawn either
        if low == high:
            return ConstantHyperparameter(path, int(low) if axis == "int" else low)
        return SearchedHyperparameter(path, axis, low, high, base or 10.0)
    return ConstantHyperparameter(path, raw.get("val"))


def value_at(hparams: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = hparams
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _key(value: Any) -> str:
    # Categories may be lists or objects; compare them as JSON, as the config wrote them.
    return json.dumps(value, sort_keys=True, default=str)


def shown(value: Any, limit: int = 24) -> str:
    """A hyperparameter value as one short line."""
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# -- trials and the best one ----------------------------------------------------------------


@dataclass(frozen=True)
class TrialOutcome:
    trial_id: int
    state: str
    hparams: Mapping[str, Any]
    metric: float | None  # the trial's best value of the searcher's metric, finite


def best_trial(outcomes: Sequence[TrialOutcome], smaller_is_better: bool) -> TrialOutcome | None:
    """The trial with the best metric; the earliest trial wins a tie."""
    scored = [o for o in outcomes if o.metric is not None]
    if not scored:
        return None
    sign = 1.0 if smaller_is_better else -1.0
    return min(scored, key=lambda o: (sign * (o.metric or 0.0), o.trial_id))


# -- scatter plots, laid out for SVG -----------------------------------------------------------

WIDTH, HEIGHT = 420, 290
LEFT, RIGHT, TOP, BOTTOM = 66, 18, 16, 50  # room for tick labels and axis titles


@dataclass(frozen=True)
class Tick:
    at: float  # pixels along the axis
    label: str


@dataclass(frozen=True)
class ScatterPoint:
    trial_id: int
    x: float
    y: float
    value: str  # the hyperparameter's value as shown
    metric: float
    best: bool


@dataclass(frozen=True)
class Scatter:
    hyperparameter: SearchedHyperparameter
    x_title: str
    y_title: str
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    points: list[ScatterPoint]  # the best last, so it is drawn on top
    unplaced: list[int] = field(default_factory=list)  # a value outside what was searched
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM

    @property
    def best(self) -> ScatterPoint | None:
        return next((p for p in self.points if p.best), None)


def scatter_plots(
    searched: Sequence[SearchedHyperparameter],
    outcomes: Sequence[TrialOutcome],
    metric: str,
    smaller_is_better: bool,
) -> list[Scatter]:
    """One plot per searched hyperparameter of the trials that have a metric, all on the
    same metric axis so the plots read side by side."""
    scored = [o for o in outcomes if o.metric is not None]
    if not scored:
        return []
    best = best_trial(scored, smaller_is_better)
    values = [o.metric for o in scored if o.metric is not None]
    y_low, y_high = _padded(min(values), max(values))
    y_ticks = [
        Tick(_to_pixels(v, y_low, y_high, HEIGHT - BOTTOM, TOP), _tick_label(v))
        for v in nice_ticks(y_low, y_high)
    ]
    direction = "smaller is better" if smaller_is_better else "larger is better"
    y_title = f"best {metric} ({direction})"
    return [
        _scatter(h, scored, best.trial_id if best else None, y_low, y_high, y_ticks, y_title)
        for h in searched
    ]


def _scatter(
    hyperparameter: SearchedHyperparameter,
    scored: Sequence[TrialOutcome],
    best_id: int | None,
    y_low: float,
    y_high: float,
    y_ticks: list[Tick],
    y_title: str,
) -> Scatter:
    x_scale, x_ticks, x_title = _axis(hyperparameter, LEFT, WIDTH - RIGHT)
    points: list[ScatterPoint] = []
    unplaced: list[int] = []
    for outcome in scored:
        value = value_at(outcome.hparams, hyperparameter.path)
        x = x_scale(value)
        if x is None or outcome.metric is None:
            unplaced.append(outcome.trial_id)
            continue
        y = _to_pixels(outcome.metric, y_low, y_high, HEIGHT - BOTTOM, TOP)
        points.append(
            ScatterPoint(
                outcome.trial_id, x, y, shown(value), outcome.metric, outcome.trial_id == best_id
            )
        )
    points.sort(key=lambda p: (p.best, p.trial_id))
    return Scatter(hyperparameter, x_title, y_title, x_ticks, y_ticks, points, unplaced)


def _axis(
    h: SearchedHyperparameter, start: float, end: float, vertical: bool = False
) -> tuple[Callable[[Any], float | None], list[Tick], str]:
    """The hyperparameter's scale from value to pixels (None: not placeable), its ticks and
    its title, for an axis from `start` to `end` pixels."""
    if h.kind == "categorical":
        keys = [_key(c) for c in h.categories]
        count = len(keys)

        def categorical(value: Any) -> float | None:
            key = _key(value)
            if key not in keys:
                return None
            return _to_pixels(keys.index(key), -0.5, count - 0.5, start, end)

        # Every label when they fit (about 6 pixels a character), else every k-th, so
        # none overlap.
        labels = [shown(c, 16) for c in h.categories]
        room = 14 if vertical else max(len(label) for label in labels) * 6 + 8
        every = max(1, math.ceil(count * room / abs(end - start)))
        ticks = [
            Tick(_to_pixels(i, -0.5, count - 0.5, start, end), label)
            for i, label in enumerate(labels)
            if i % every == 0
        ]
        return categorical, ticks, f"{h.name} (categorical)"
    if h.kind == "log":
        lo, hi = math.log(h.low, h.base), math.log(h.high, h.base)
        lo, hi = min(lo, hi), max(lo, hi)
        pad = (hi - lo) * 0.04

        def logarithmic(value: Any) -> float | None:
            number = _number(value)
            if number is None or number <= 0:
                return None
            return _to_pixels(math.log(number, h.base), lo - pad, hi + pad, start, end)

        ticks = [
            Tick(_to_pixels(math.log(v, h.base), lo - pad, hi + pad, start, end), _tick_label(v))
            for v in log_ticks(lo, hi, h.base)
        ]
        base = f"{h.base:g}"
        return logarithmic, ticks, f"{h.name} (log scale, base {base})"
    lo, hi = min(h.low, h.high), max(h.low, h.high)
    pad = (hi - lo) * 0.04
    if h.kind == "int":
        pad = max(pad, 0.5)  # whole numbers: the end values half a step in from the axes

    def linear(value: Any) -> float | None:
        number = _number(value)
        return None if number is None else _to_pixels(number, lo - pad, hi + pad, start, end)

    values = nice_ticks(lo, hi, integers=h.kind == "int")
    ticks = [Tick(_to_pixels(v, lo - pad, hi + pad, start, end), _tick_label(v)) for v in values]
    return linear, ticks, h.name


@dataclass(frozen=True)
class ParallelAxis:
    x: float
    name: str
    ticks: list[Tick]  # `at` is the y in pixels


@dataclass(frozen=True)
class ParallelLine:
    trial_id: int
    points: str  # SVG polyline points: "x,y x,y ..."
    metric: float
    best: bool
    end: tuple[float, float]  # on the metric's axis, where the best one is named


@dataclass(frozen=True)
class ParallelCoordinates:
    axes: list[ParallelAxis]  # the searched hyperparameters, then the metric
    lines: list[ParallelLine]  # the best last, so it is drawn on top
    width: int
    height: int
    top: int
    bottom: int

    @property
    def best(self) -> ParallelLine | None:
        return next((line for line in self.lines if line.best), None)


PARALLEL_HEIGHT, PARALLEL_TOP, PARALLEL_BOTTOM = 300, 34, 16
PARALLEL_SPACING, PARALLEL_MARGIN, PARALLEL_RIGHT = 130, 70, 150


def parallel_coordinates(
    searched: Sequence[SearchedHyperparameter],
    outcomes: Sequence[TrialOutcome],
    metric: str,
    smaller_is_better: bool,
) -> ParallelCoordinates | None:
    """Every searched hyperparameter and the metric as vertical axes, each trial with a
    metric a line across them. None with fewer than two searched hyperparameters (the
    scatter says it all) or no metric yet. A trial missing a value has no line."""
    scored = [o for o in outcomes if o.metric is not None]
    if len(searched) < 2 or not scored:
        return None
    best = best_trial(scored, smaller_is_better)
    low, high = PARALLEL_HEIGHT - PARALLEL_BOTTOM, PARALLEL_TOP
    # Room on the right for the metric's ticks and the best trial's name.
    width = PARALLEL_MARGIN + PARALLEL_SPACING * len(searched) + PARALLEL_RIGHT
    scales: list[Callable[[Any], float | None]] = []
    axes: list[ParallelAxis] = []
    for i, h in enumerate(searched):
        scale, ticks, _title = _axis(h, low, high, vertical=True)
        axes.append(ParallelAxis(PARALLEL_MARGIN + i * PARALLEL_SPACING, h.name, ticks))
        scales.append(scale)
    values = [o.metric for o in scored if o.metric is not None]
    y_low, y_high = _padded(min(values), max(values))
    metric_ticks = [
        Tick(_to_pixels(v, y_low, y_high, low, high), _tick_label(v))
        for v in nice_ticks(y_low, y_high)
    ]
    axes.append(ParallelAxis(width - PARALLEL_RIGHT, metric, metric_ticks))
    lines = []
    for outcome in scored:
        assert outcome.metric is not None
        ys = [
            scale(value_at(outcome.hparams, h.path))
            for scale, h in zip(scales, searched, strict=True)
        ]
        ys.append(_to_pixels(outcome.metric, y_low, y_high, low, high))
        if any(y is None for y in ys):
            continue
        points = " ".join(f"{axis.x:g},{y:g}" for axis, y in zip(axes, ys, strict=True))
        is_best = best is not None and outcome.trial_id == best.trial_id
        end = (axes[-1].x, ys[-1] or 0.0)
        lines.append(ParallelLine(outcome.trial_id, points, outcome.metric, is_best, end))
    lines.sort(key=lambda line: (line.best, line.trial_id))
    return ParallelCoordinates(axes, lines, width, PARALLEL_HEIGHT, high, low)


def _to_pixels(value: float, low: float, high: float, start: float, end: float) -> float:
    span = high - low
    where = (value - low) / span if span else 0.5
    return round(start + where * (end - start), 2)


def _padded(low: float, high: float) -> tuple[float, float]:
    # One value still gets a range around it, so its point is not on the plot's edge.
    pad = (high - low) * 0.08 if high > low else abs(low) * 0.1 or 1.0
    return low - pad, high + pad


def nice_ticks(low: float, high: float, count: int = 5, integers: bool = False) -> list[float]:
    """Round values (1, 2, 2.5 or 5 times a power of ten) between low and high, about
    `count` of them."""
    if not high > low:
        return [low]
    span = high - low
    power = 10 ** math.floor(math.log10(span / max(count - 1, 1)))
    step = min((m * power for m in (1, 2, 2.5, 5, 10)), key=lambda s: abs(span / s - (count - 1)))
    if integers:
        step = max(1.0, math.ceil(step))
    first = math.ceil(low / step - 1e-9)
    last = math.floor(high / step + 1e-9)
    # Rounded, so 3 * 0.2 is labelled 0.6, not 0.6000000000000001.
    return [round(k * step, 12) + 0.0 for k in range(first, last + 1)]


def log_ticks(low_exponent: float, high_exponent: float, base: float) -> list[float]:
    """Powers of the base inside the range; within a single power, round values instead."""
    first, last = math.ceil(low_exponent - 1e-9), math.floor(high_exponent + 1e-9)
    if last - first + 1 >= 2:
        every = max(1, math.ceil((last - first + 1) / 7))
        return [base**k for k in range(first, last + 1, every)]
    return [
        v
        for v in nice_ticks(base**low_exponent, base**high_exponent, count=4, integers=False)
        if v > 0
    ]


def _tick_label(value: float) -> str:
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.3g}"


# -- an ASHA search's trials by rung ---------------------------------------------------------

CardStatus = Literal["top", "stopped", "ended", "training", "waiting"]


@dataclass(frozen=True)
class TrialFacts:
    state: str
    ended: bool  # a terminal state


@dataclass(frozen=True)
class RungCard:
    trial_id: int
    state: str
    status: CardStatus
    note: str  # what the status means for this trial, in words
    metric: float | None  # its metric at the rung it is placed in
    summary: str  # the API's one-line summary of its place in the search


@dataclass(frozen=True)
class RungColumn:
    rung: int  # -1: trials that have not reached rung 0
    label: str
    cards: list[RungCard]


@dataclass(frozen=True)
class BracketPicture:
    index: int
    num_rungs: int
    rung_units: tuple[int, ...]
    unit: str
    columns: list[RungColumn]

    @property
    def trials(self) -> int:
        return sum(len(c.cards) for c in self.columns)


def rung_picture(
    cfg: asha.AshaConfig,
    searches: Mapping[int, Mapping[str, Any]],
    trials: Mapping[int, TrialFacts],
) -> list[BracketPicture]:
    """Each bracket's rungs as columns, each trial in the highest rung it entered with its
    metric there, best first. `searches` is the API's `searcher` block of each trial."""
    pictures = []
    for bracket in cfg.brackets:
        by_rung: dict[int, list[RungCard]] = {}
        for trial_id, found in searches.items():
            if found["bracket"] != bracket.index:
                continue
            facts = trials.get(trial_id, TrialFacts("UNKNOWN", False))
            rung = int(found["rung"])
            by_rung.setdefault(rung, []).append(_card(trial_id, found, facts, cfg, bracket))
        columns = []
        if by_rung.get(-1):
            columns.append(
                RungColumn(-1, f"before rung 0 ({bracket.rung_units[0]} {cfg.unit})", by_rung[-1])
            )
        for rung, units in enumerate(bracket.rung_units):
            columns.append(
                RungColumn(rung, f"rung {rung} ({units} {cfg.unit})", by_rung.get(rung, []))
            )
        for column in columns:
            column.cards.sort(key=lambda c: _rank_key(c, cfg.smaller_is_better))
        pictures.append(
            BracketPicture(bracket.index, bracket.num_rungs, bracket.rung_units, cfg.unit, columns)
        )
    return pictures


def _card(
    trial_id: int,
    found: Mapping[str, Any],
    facts: TrialFacts,
    cfg: asha.AshaConfig,
    bracket: asha.Bracket,
) -> RungCard:
    rung = int(found["rung"])
    metric = next((r["metric"] for r in found.get("rungs", []) if r["rung"] == rung), None)
    status: CardStatus
    if found.get("reachedTop"):
        status, note = "top", f"trained the full {bracket.rung_units[-1]} {cfg.unit}"
    elif found.get("stoppedAtRung") is not None:
        status, note = "stopped", f"stopped at rung {found['stoppedAtRung']}"
    elif facts.ended:
        status, note = "ended", f"ended {facts.state} without a stop"
    elif rung < 0 and facts.state in ("QUEUED", "PAUSED"):
        status, note = "waiting", facts.state.lower()
    else:
        status, note = "training", "still training"
    return RungCard(trial_id, facts.state, status, note, metric, str(found.get("summary", "")))


def _rank_key(card: RungCard, smaller_is_better: bool) -> tuple[int, float, int]:
    if card.metric is None or not math.isfinite(card.metric):
        return (1, 0.0, card.trial_id)
    return (0, card.metric if smaller_is_better else -card.metric, card.trial_id)
