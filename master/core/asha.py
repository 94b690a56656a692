"""Determined 0.38's `adaptive_asha` and `async_halving` searchers, without I/O.

The search is stopping-based, as in 0.38: each trial trains until a rung (a point on the
time axis) and continues only if its metric is in the top 1/divisor of the values the rung
has seen so far; otherwise it is stopped and a new trial takes its place. `adaptive_asha`
runs several such searches ("brackets") side by side, with different rung counts.

What matches Determined exactly (checked by tests against its own Go tests' values):
the bracket and rung formulas, including their floating-point edges; the initial trials,
bracket by bracket; the stop rule, with ties placed before equal values; and the trial
seeds, request ids and hyperparameters drawn from the experiment seed (`searcher.py`).

What we fix (reference §9, docs/asha.md says why):
- one rung entry per (trial, rung): a stopped trial's later reports enter nothing;
- a new trial is created when a trial *closes* (stopped, finished, errored, invalid) and
  the bracket has fewer live trials than its concurrency, so `max_concurrent_trials` is a
  real cap and a trial that finishes without a stop is replaced up to `max_trials`;
- a missing or NaN metric is the worst value (+inf) for that trial alone;
- InvalidHP reaches the searcher: the trial leaves the rungs and is replaced, uncounted;
- progress is clamped to [0, 1].

The service keeps the rung entries in the database and asks `climb` for a decision with
the standings it queried; `MemorySearch` runs the same rules in memory for previews,
simulations and tests.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from master.core.errors import ConfigError, ConfigProblem

ASHA_SEARCHERS = ("adaptive_asha", "async_halving")
MODES = ("aggressive", "standard", "conservative")
LEGACY_TIME = "batches"  # what `max_length` counts when no time_metric is named
WORST = math.inf
# Rungs per bracket. 64 rungs with divisor 2 already span 2**63 units of time; more would
# only build enormous rung tables from a typo.
MAX_RUNGS = 64

CloseKind = Literal["stopped", "completed", "errored", "canceled", "invalid_hp"]


@dataclass(frozen=True)
class Bracket:
    """One async_halving search: `num_rungs` rungs at `rung_units` on the time axis."""

    index: int
    num_rungs: int
    max_trials: int
    max_concurrent: int
    rung_units: tuple[int, ...]


@dataclass(frozen=True)
class AshaConfig:
    name: str
    metric: str
    smaller_is_better: bool
    max_trials: int
    max_time: int
    # The validation metric that measures time; None for the pre-0.38 `max_length` form,
    # where the time is the report's steps_completed (batches).
    time_metric: str | None
    divisor: float
    brackets: tuple[Bracket, ...]

    @property
    def unit(self) -> str:
        return self.time_metric or LEGACY_TIME


# --- config --------------------------------------------------------------------------------


def is_asha(searcher: Mapping[str, Any] | None) -> bool:
    return isinstance(searcher, Mapping) and searcher.get("name") in ASHA_SEARCHERS


def parse_config(searcher: Mapping[str, Any]) -> AshaConfig:
    """The searcher section as an AshaConfig; every problem names its field."""
    name = searcher.get("name")
    problems: list[ConfigProblem] = []

    def bad(field_name: str, message: str) -> None:
        problems.append(ConfigProblem(f"searcher.{field_name}", message))

    metric = searcher.get("metric")
    if not isinstance(metric, str) or not metric:
        bad("metric", f"is required for the {name} searcher (the validation metric it ranks by)")
    smaller = searcher.get("smaller_is_better", True)
    if not isinstance(smaller, bool):
        bad("smaller_is_better", "must be true or false")
    max_trials = _int_at_least(searcher, "max_trials", 1, bad, required=True)
    mct = _int_at_least(searcher, "max_concurrent_trials", 0, bad, default=16)
    divisor = searcher.get("divisor", 4)
    if isinstance(divisor, bool) or not isinstance(divisor, int | float) or not divisor > 1:
        bad("divisor", f"must be a number greater than 1, got {divisor!r}")
        divisor = 4
    elif not math.isfinite(divisor):
        bad("divisor", "must be finite")
        divisor = 4
    max_time, time_metric = _time_axis(searcher, name, bad)

    rungs_per_bracket: list[int] = []
    if name == "async_halving":
        num_rungs = _int_at_least(searcher, "num_rungs", 1, bad, required=True)
        if num_rungs > MAX_RUNGS:
            bad("num_rungs", f"must be at most {MAX_RUNGS}, got {num_rungs}")
        for field_name in ("mode", "max_rungs", "bracket_rungs"):
            if searcher.get(field_name) is not None:
                bad(field_name, "is a setting of adaptive_asha, not of async_halving")
        rungs_per_bracket = [num_rungs]
    else:
        if searcher.get("num_rungs") is not None:
            bad("num_rungs", "is a setting of async_halving; adaptive_asha uses max_rungs")
        mode = searcher.get("mode") or "standard"
        if mode not in MODES:
            bad("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
            mode = "standard"
        max_rungs = _int_at_least(searcher, "max_rungs", 1, bad, default=5)
        bracket_rungs = searcher.get("bracket_rungs") or []
        if not isinstance(bracket_rungs, list):
            bad("bracket_rungs", "must be a list of rung counts")
            bracket_rungs = []
        for i, count in enumerate(bracket_rungs):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                # Determined accepts 0 and then panics indexing an empty rung list.
                bad(f"bracket_rungs[{i}]", f"must be an integer >= 1, got {count!r}")
            elif count > MAX_RUNGS:
                bad(f"bracket_rungs[{i}]", f"must be at most {MAX_RUNGS}, got {count}")
        if len(bracket_rungs) > max_trials:
            # Every bracket runs at least one trial.
            bad(
                "bracket_rungs",
                f"lists {len(bracket_rungs)} brackets, but max_trials is {max_trials}: "
                "each bracket needs at least one trial",
            )
        if not problems:
            rungs_per_bracket = bracket_rungs or mode_rungs(
                mode, max_rungs, max_time, max_trials, float(divisor)
            )
    if problems:
        raise ConfigError(problems)
    try:
        brackets = make_brackets(
            rungs_per_bracket,
            max_trials=max_trials,
            max_concurrent=mct,
            divisor=float(divisor),
            max_time=max_time,
            adaptive=name == "adaptive_asha",
        )
    except OverflowError:
        # divisor ** (rungs - 1) past the largest float: no rung could ever be reached.
        most = max(rungs_per_bracket)
        raise ConfigError(
            [ConfigProblem("searcher.divisor", f"{divisor!r} is too large for {most} rungs")]
        ) from None
    assert isinstance(metric, str) and isinstance(smaller, bool)
    return AshaConfig(
        name=str(name),
        metric=metric,
        smaller_is_better=smaller,
        max_trials=max_trials,
        max_time=max_time,
        time_metric=time_metric,
        divisor=float(divisor),
        brackets=tuple(brackets),
    )


def _int_at_least(
    searcher: Mapping[str, Any],
    field_name: str,
    minimum: int,
    bad: Callable[[str, str], None],
    *,
    required: bool = False,
    default: int = 1,
) -> int:
    value = searcher.get(field_name)
    if value is None:
        if required:
            bad(field_name, f"is required for the {searcher.get('name')} searcher")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        bad(field_name, f"must be an integer >= {minimum}, got {value!r}")
        return default
    return value


def _time_axis(
    searcher: Mapping[str, Any], name: Any, bad: Callable[[str, str], None]
) -> tuple[int, str | None]:
    """(max_time, time_metric): 0.38's pair, or the pre-0.38 max_length counted in batches."""
    max_time = searcher.get("max_time")
    time_metric = searcher.get("time_metric")
    legacy = searcher.get("max_length")
    if time_metric is not None and (not isinstance(time_metric, str) or not time_metric.strip()):
        bad("time_metric", "must be the name of a validation metric, e.g. batches")
        time_metric = None
    if max_time is not None:
        if isinstance(max_time, bool) or not isinstance(max_time, int) or max_time < 1:
            # Determined accepts 0 and derives a garbage rung count from log(0).
            bad("max_time", f"must be an integer >= 1, got {max_time!r}")
            return 1, time_metric
        if time_metric is None:
            bad("time_metric", f"is required with max_time: the {name} searcher needs both")
        return max_time, time_metric
    if legacy is None:
        bad("max_time", f"the {name} searcher requires max_time and time_metric to be set")
        return 1, time_metric
    units, unit = _legacy_length(legacy)
    if units is None or units < 1:
        bad("max_length", f"must be a positive integer or {{batches: N}}, got {legacy!r}")
        return 1, time_metric
    if unit != "batches" and time_metric is None:
        bad(
            "max_length",
            f"counts {unit}, which trials do not report as a time; set max_time and "
            f"time_metric (e.g. time_metric: {unit}) instead",
        )
    return units, time_metric


def _legacy_length(value: Any) -> tuple[int | None, str]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value, "batches"
    if isinstance(value, Mapping) and len(value) == 1:
        ((unit, units),) = value.items()
        if isinstance(units, int) and not isinstance(units, bool):
            return units, str(unit)
    return None, "batches"


# --- brackets and rungs (Determined's formulas) --------------------------------------------


def mode_rungs(
    mode: str, max_rungs: int, max_time: int, max_trials: int, divisor: float
) -> list[int]:
    """Rung counts of the brackets for a mode. Float logs, as Go's: log(1000)/log(10) is
    2.9999999999999996, so max_time 1000 with divisor 10 allows 3 rungs, not 4."""
    most = min(
        max_rungs,
        int(math.log(max_time) / math.log(divisor)) + 1,
        int(math.log(max_trials) / math.log(divisor)) + 1,
    )
    if mode == "aggressive":
        return [most]
    if mode == "conservative":
        return list(range(1, most + 1))
    return list(range((most - 1) // 2 + 1, most + 1))


def bracket_max_trials(max_trials: int, divisor: float, rungs: Sequence[int]) -> list[int]:
    """Trials per bracket, by each bracket's budget weight; the remainder to the first."""
    weights = [divisor ** (r - 1) / r for r in rungs]
    total = sum(weights)
    if not math.isfinite(total):
        raise OverflowError("bracket weights past the largest float")
    trials = [max(int(w / total * max_trials), 1) for w in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    return trials


def bracket_max_concurrent(max_concurrent: int, divisor: float, trials: Sequence[int]) -> list[int]:
    """Concurrency per bracket: 0 means "auto"; otherwise split, rounded up to one each."""
    count = len(trials)
    if max_concurrent == 0:
        return [max(trials[-1], int(divisor))] * count
    total = max(max_concurrent, count)
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


def rung_units(max_time: int, divisor: float, num_rungs: int) -> tuple[int, ...]:
    return tuple(max(int(max_time / divisor ** (num_rungs - 1 - i)), 1) for i in range(num_rungs))


def make_brackets(
    rungs_per_bracket: Sequence[int],
    *,
    max_trials: int,
    max_concurrent: int,
    divisor: float,
    max_time: int,
    adaptive: bool,
) -> list[Bracket]:
    rungs = sorted(rungs_per_bracket, reverse=True)  # the most aggressive bracket first
    if adaptive:
        trials = bracket_max_trials(max_trials, divisor, rungs)
        concurrency = bracket_max_concurrent(max_concurrent, divisor, trials)
    else:
        trials = [max_trials]
        if max_concurrent > 0:
            concurrency = [min(max_concurrent, max_trials)]
        else:
            concurrency = [min(max(int(divisor ** (rungs[0] - 1)), 1), max_trials)]
    return [
        Bracket(
            index=i,
            num_rungs=r,
            max_trials=trials[i],
            max_concurrent=concurrency[i],
            rung_units=rung_units(max_time, divisor, r),
        )
        for i, r in enumerate(rungs)
    ]


# --- the stop rule -------------------------------------------------------------------------


@dataclass(frozen=True)
class Standing:
    """Where a value would go in a rung, before it is added: `better` entries are strictly
    better (ties go before equal values, as Determined's sort.Search places them)."""

    better: int
    size: int


@dataclass(frozen=True)
class Climb:
    """What one validation report did: the rungs it entered, and whether it stops there."""

    entered: tuple[int, ...]
    next_rung: int
    stopped_at: int | None = None
    reached_top: bool = False


def rungs_reached(bracket: Bracket, next_rung: int, time: float) -> list[int]:
    """The rungs from `next_rung` on whose units the reported time has reached."""
    return [r for r in range(next_rung, bracket.num_rungs) if time >= bracket.rung_units[r]]


def climb(
    bracket: Bracket, divisor: float, next_rung: int, time: float, standings: Mapping[int, Standing]
) -> Climb:
    """Determined's async_halving decision for one report of a trial not yet stopped.

    `standings[r]` is the report's place in each rung of `rungs_reached`. One report can
    pass several rungs; the same value enters each. The top rung always stops the trial.
    """
    entered: list[int] = []
    for r in rungs_reached(bracket, next_rung, time):
        entered.append(r)
        standing = standings[r]
        if r == bracket.num_rungs - 1:
            return Climb(tuple(entered), r, stopped_at=r, reached_top=True)
        if standing.better >= max(int((standing.size + 1) / divisor), 1):
            return Climb(tuple(entered), r, stopped_at=r)
        next_rung = r + 1
    return Climb(tuple(entered), next_rung)


def searcher_value(cfg: AshaConfig, metrics: Mapping[str, Any]) -> tuple[float, str | None]:
    """The value the rungs rank (smaller is better), and why it is the worst, if it is."""
    raw = metrics.get(cfg.metric)
    value = _number(raw)
    if value is None or not math.isfinite(value):
        # Infinities too: a diverged loss (or an integer past the largest float) must not
        # rank first, and the API could not show it in JSON.
        if raw is None:
            what = "missing"
        elif value is None or math.isnan(value):
            what = f"{_short(raw)}, not a number"
        else:
            what = f"{_short(raw)}, not a finite number"
        return WORST, f"validation metric {cfg.metric!r} was {what}"
    return (value if cfg.smaller_is_better else -value), None


def searcher_time(
    cfg: AshaConfig, metrics: Mapping[str, Any], steps_completed: int
) -> float | None:
    """How far the trial is on the time axis; None when the report does not say."""
    if cfg.time_metric is None:
        return float(steps_completed)
    value = _number(metrics.get(cfg.time_metric))
    if value is None and cfg.time_metric == "batches":
        # Determined's own loops add `batches` themselves; steps_completed is the same count.
        return float(steps_completed)
    if value is None or not math.isfinite(value):
        return None
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an integer past the largest float
            return math.inf if value > 0 else -math.inf
    if value == "NaN":  # how Determined's harness sends NaN in JSON
        return math.nan
    if value in ("Infinity", "-Infinity"):
        return math.inf if value == "Infinity" else -math.inf
    return None


# --- creating trials -----------------------------------------------------------------------


def creates_wanted(bracket: Bracket, created: int, invalid: int, live: int) -> int:
    """New trials a bracket wants now: up to its concurrency, until `max_trials` have run.

    Invalid-hyperparameter trials do not count, but at most `max_trials` of them are
    replaced, so a space where every sample is invalid still ends.
    """
    counted = created - min(invalid, bracket.max_trials)
    return max(0, min(bracket.max_concurrent - live, bracket.max_trials - counted))


def initial_creates(brackets: Sequence[Bracket]) -> list[int]:
    """The bracket of each initial trial, in creation order (bracket 0's first)."""
    return [b.index for b in brackets for _ in range(creates_wanted(b, 0, 0, 0))]


def progress(brackets: Sequence[Bracket], rung0_sizes: Sequence[int], done: Sequence[int]) -> float:
    """Determined's heuristic per bracket, averaged: trials past rung 0 over 1.2 x max, or
    the share of trials done once every trial has been through rung 0; clamped to [0, 1]."""
    if not brackets:
        return 0.0
    shares = []
    for bracket, in_rung0, finished in zip(brackets, rung0_sizes, done, strict=True):
        share = in_rung0 / (1.2 * bracket.max_trials)
        if in_rung0 >= bracket.max_trials:
            share = max(share, finished / bracket.max_trials)
        shares.append(min(max(share, 0.0), 1.0))
    return min(max(sum(shares) / len(shares), 0.0), 1.0)


# --- preview (Determined's Simulate) -------------------------------------------------------


def preview(cfg: AshaConfig) -> list[tuple[int, int]]:
    """(units, trials) that train exactly that far, if every rung halves exactly."""
    per_units: dict[int, int] = {}
    for bracket in cfg.brackets:
        remaining = bracket.max_trials
        for i, units in enumerate(bracket.rung_units):
            kept = max(int(remaining / cfg.divisor), 1)
            stopped = remaining if i == bracket.num_rungs - 1 else remaining - kept
            per_units[units] = per_units.get(units, 0) + stopped
            remaining = kept
    return sorted(per_units.items())


# --- the whole search in memory ------------------------------------------------------------


@dataclass
class MemoryTrial:
    key: int
    bracket: int
    next_rung: int = 0
    stopped_at: int | None = None
    closed: CloseKind | None = None
    entries: dict[int, float] = field(default_factory=dict)


@dataclass
class Decision:
    stop: bool = False
    climb: Climb | None = None
    warning: str | None = None


class MemorySearch:
    """The search with its rungs in memory: the same rules the service runs on the
    database. Trials are numbered 0, 1, ... in creation order; `take_creates` hands out
    the trials created since it was last called."""

    def __init__(self, cfg: AshaConfig) -> None:
        self.cfg = cfg
        self.trials: list[MemoryTrial] = []
        self._rungs: dict[tuple[int, int], list[float]] = {}
        self._new: list[int] = []
        for bracket_index in initial_creates(cfg.brackets):
            self._create(bracket_index)

    def rung(self, bracket: int, rung: int) -> list[float]:
        return self._rungs.setdefault((bracket, rung), [])

    def standing(self, bracket: int, rung: int, value: float) -> Standing:
        values = self.rung(bracket, rung)
        return Standing(better=bisect.bisect_left(values, value), size=len(values))

    def take_creates(self) -> list[int]:
        new, self._new = self._new, []
        return new

    def validation(
        self, key: int, metrics: Mapping[str, Any], steps_completed: int = 0
    ) -> Decision:
        trial = self.trials[key]
        if trial.stopped_at is not None or trial.closed is not None:
            return Decision()  # a stopped trial's later reports enter no rung
        time = searcher_time(self.cfg, metrics, steps_completed)
        if time is None:
            return Decision(warning=f"time metric {self.cfg.time_metric!r} missing")
        value, warning = searcher_value(self.cfg, metrics)
        bracket = self.cfg.brackets[trial.bracket]
        reached = rungs_reached(bracket, trial.next_rung, time)
        standings = {r: self.standing(trial.bracket, r, value) for r in reached}
        result = climb(bracket, self.cfg.divisor, trial.next_rung, time, standings)
        for r in result.entered:
            bisect.insort_left(self.rung(trial.bracket, r), value)
            trial.entries[r] = value
        trial.next_rung = result.next_rung
        trial.stopped_at = result.stopped_at
        return Decision(stop=result.stopped_at is not None, climb=result, warning=warning)

    def closed(self, key: int, kind: CloseKind) -> None:
        trial = self.trials[key]
        if trial.closed is not None:
            return
        trial.closed = kind
        bracket = self.cfg.brackets[trial.bracket]
        if kind == "invalid_hp":
            for r, value in trial.entries.items():
                self.rung(trial.bracket, r).remove(value)
            trial.entries.clear()
        elif (
            kind in ("errored", "canceled")
            and trial.stopped_at is None
            and trial.next_rung < bracket.num_rungs
        ):
            # Determined's rule: an early exit counts as the worst in its next rung.
            bisect.insort_left(self.rung(trial.bracket, trial.next_rung), WORST)
            trial.entries[trial.next_rung] = WORST
        self._refill(bracket)

    def _refill(self, bracket: Bracket) -> None:
        mine = [t for t in self.trials if t.bracket == bracket.index]
        live = sum(1 for t in mine if t.closed is None)
        invalid = sum(1 for t in mine if t.closed == "invalid_hp")
        for _ in range(creates_wanted(bracket, len(mine), invalid, live)):
            self._create(bracket.index)

    def _create(self, bracket_index: int) -> None:
        key = len(self.trials)
        self.trials.append(MemoryTrial(key, bracket_index))
        self._new.append(key)

    def live(self) -> int:
        return sum(1 for t in self.trials if t.closed is None)

    def done(self) -> bool:
        return bool(self.trials) and all(t.closed is not None for t in self.trials)

    def progress(self) -> float:
        rung0 = [len(self.rung(b.index, 0)) for b in self.cfg.brackets]
        finished = [
            sum(
                1
                for t in self.trials
                if t.bracket == b.index and t.closed not in (None, "invalid_hp")
            )
            for b in self.cfg.brackets
        ]
        return progress(self.cfg.brackets, rung0, finished)
