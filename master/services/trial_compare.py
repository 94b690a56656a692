"""Trials compared: one metric of up to MAX_COMPARED trials of an experiment on one chart.

The chart reads, per trial, every 2**L-th report of the group and its latest, L chosen so
that a trial gives at most points_per_trial() points (master.core.thinning). The rows
are found through the (trial, group, thinning level) index and the metric's value is taken
out of the JSON by the database, so the time grows with the points drawn, not with the
reports stored (100 trials of 10,000 reports read 62,500 rows, not 1,000,000).
A trial's own page still draws every report (its metrics feed reads them all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, Numeric, case, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from master.core import thinning
from master.db.models import ExperimentModel, TrialMetricModel, TrialModel
from master.errors import NotFound
from master.services import trial_reports
from master.services.trial_reports import VALIDATION

MAX_COMPARED = 100
# What one chart draws: at most 2,000 points a trial, and about 100,000 in all, so 100
# trials get 1,000 each (10,000 reports: every 16th, 625 points). A 1,280-pixel chart
# shows no more; the browser parses, and the database reads, half as much as at 2,000.
MAX_POINTS_PER_TRIAL = 2_000
MAX_POINTS_PER_CHART = 100_000
_LARGEST_FLOAT = 1.7976931348623157e308

Metrics = TrialMetricModel


@dataclass
class TrialSeries:
    """One trial's points, by step; `stride` 1 means every report is drawn."""

    trial_id: int
    reports: int
    stride: int
    steps: list[int] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)


def points_per_trial(trials: int) -> int:
    """How many points each of `trials` trials may draw (more reports are thinned)."""
    return min(MAX_POINTS_PER_TRIAL, MAX_POINTS_PER_CHART // max(trials, 1))


@dataclass(frozen=True)
class Comparison:
    metric: str
    names: list[str]  # the metrics these trials report in the group, for the chooser
    series: list[TrialSeries]
    max_points: int = MAX_POINTS_PER_TRIAL  # a trial with more reports is thinned
    # The metric was asked for by name and no selected trial reported it.
    unknown_metric: bool = False

    @property
    def strides(self) -> list[int]:
        """The strides of the thinned trials, smallest first (none when all is drawn)."""
        return sorted({s.stride for s in self.series if s.stride > 1})

    @property
    def points(self) -> int:
        return sum(len(s.steps) for s in self.series)


# -- which trials ------------------------------------------------------------------------


async def trials_of_experiment(
    session: AsyncSession,
    experiment_id: int,
    trial_ids: Sequence[int],
    readable: ColumnElement[bool],
) -> list[int]:
    """`trial_ids` without repeats, in order, once each is known to be the experiment's;
    else NotFound naming the first that is not (absent, or another experiment's). One of
    an experiment the caller may not read (`readable`) is absent."""
    wanted = list(dict.fromkeys(trial_ids))
    if not wanted:
        return []
    found = dict(
        (
            await session.execute(
                select(TrialModel.id, TrialModel.experiment_id)
                .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
                .where(TrialModel.id.in_(wanted), readable)
            )
        ).all()
    )
    for trial_id in wanted:
        if trial_id not in found:
            raise NotFound(f"trial {trial_id} not found")
        if found[trial_id] != experiment_id:
            raise NotFound(
                f"trial {trial_id} is not a trial of experiment {experiment_id} "
                f"(it belongs to experiment {found[trial_id]})"
            )
    return wanted


async def best_trials(session: AsyncSession, experiment: ExperimentModel, count: int) -> list[int]:
    """The `count` trials with the best validation value of the searcher metric, best first;
    trials without one are left out. Reads every validation report of the experiment (in
    the database, one aggregate), so it is asked for, never the default."""
    metric, smaller = trial_reports.searcher_metric(experiment.config)
    if not metric:
        return []
    best = await best_values(session, experiment.id, metric, smaller)
    scored = sorted(best.items(), key=lambda pair: (pair[1] if smaller else -pair[1], pair[0]))
    return [trial_id for trial_id, _ in scored[:count]]


async def best_values(
    session: AsyncSession, experiment_id: int, metric: str, smaller_is_better: bool
) -> dict[int, float]:
    """Each trial's best finite validation value of `metric` (as `trial_reports.best_of`
    picks it), computed by the database in one aggregate; trials without one are absent."""
    value = _sortable_value(session, metric)
    best = func.min(value.expression) if smaller_is_better else func.max(value.expression)
    query = (
        select(Metrics.trial_id, best)
        .select_from(Metrics)
        .join(TrialModel, TrialModel.id == Metrics.trial_id)
    )
    query = value.joined(query).where(
        TrialModel.experiment_id == experiment_id, Metrics.group_name == VALIDATION
    )
    rows = (await session.execute(query.group_by(Metrics.trial_id))).all()
    found = {trial_id: float(v) for trial_id, v in rows if v is not None}
    return {trial_id: v for trial_id, v in found.items() if math.isfinite(v)}


# -- the metric's values, taken out of the JSON by the database ----------------------------


@dataclass(frozen=True)
class _Value:
    """How one metric's value is read on this database: SQLite joins json_each (one JSON
    parse a row, any metric name); Postgres uses jsonb operators."""

    dialect: str
    metric: str
    each: Any = None  # SQLite's json_each(metrics), joined on the metric's key

    def joined(self, query: Any) -> Any:
        if self.each is None:
            return query.where(self.kind.is_not(None))
        return query.join(self.each, self.each.c.key == self.metric)

    @property
    def kind(self) -> Any:
        if self.each is None:
            return func.jsonb_typeof(Metrics.metrics.op("->")(self.metric))
        return self.each.c.type

    @property
    def raw(self) -> Any:
        if self.each is None:
            return Metrics.metrics.op("->>")(self.metric)
        return self.each.c.value

    @property
    def expression(self) -> Any:
        """The value as a number where it is a finite one, else NULL (for MIN and MAX)."""
        if self.each is None:
            # Nested: Postgres may evaluate both sides of an AND, and 'true'::numeric fails.
            number = cast(self.raw, Numeric)
            finite = case((func.abs(number) <= _LARGEST_FLOAT, number), else_=None)
            return case((self.kind == "number", finite), else_=None)
        return case(
            (
                self.kind.in_(("integer", "real"))
                & self.raw.between(-_LARGEST_FLOAT, _LARGEST_FLOAT),
                self.raw,
            ),
            else_=None,
        )

    def number(self, kind: str | None, raw: Any) -> float | None:
        """A fetched (kind, raw) pair as the chart's value: None where not a finite number
        (NaN and infinities are stored as strings; booleans are not numbers)."""
        if kind not in ("number", "integer", "real") or raw is None:
            return None
        try:
            value = float(raw)
        except (OverflowError, ValueError):
            return None
        return value if math.isfinite(value) else None


def _sortable_value(session: AsyncSession, metric: str) -> _Value:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return _Value(dialect, metric)
    each = func.json_each(Metrics.metrics).table_valued("key", "value", "type")
    return _Value(dialect, metric, each)


# -- the comparison ----------------------------------------------------------------------


async def compare(
    session: AsyncSession,
    trial_ids: Sequence[int],
    group: str,
    metric: str,
    preferred: str | None,
) -> Comparison:
    """`metric` (or, when "", `preferred` if reported, else the first name) of each trial,
    thinned to at most points_per_trial() points a trial and its latest report."""
    ids = list(trial_ids)
    budget = points_per_trial(len(ids))
    latest = await _latest_reports(session, ids, group)
    names = sorted(
        await _names_of_first_reports(session, ids, group)
        | {k for _, _, m in latest.values() for k, v in m.items() if _is_number(v)}
    )
    chosen = metric or (preferred if preferred in names else next(iter(names), ""))
    if not chosen:
        return Comparison("", names, [])
    if chosen not in names:
        if not await _reported_anywhere(session, ids, group, chosen):
            return Comparison(chosen, names, [], unknown_metric=True)
        names = sorted({*names, chosen})  # only in reports between the first and latest
    series = await _thinned_series(session, ids, group, chosen, latest, budget)
    return Comparison(chosen, names, series, budget)


def _is_number(value: Any) -> bool:
    return trial_reports.numeric(value) is not None


async def _latest_reports(
    session: AsyncSession, ids: list[int], group: str
) -> dict[int, tuple[int, int, dict[str, Any]]]:
    """Each trial's report of the group at its highest step: trial -> (steps, ordinal,
    metrics). One query, two index seeks a trial: the highest step, then its row."""
    if not ids:
        return {}
    other = aliased(Metrics)
    highest = (
        select(func.max(other.steps_completed))
        .where(other.trial_id == TrialModel.id, other.group_name == group)
        .correlate(TrialModel)
        .scalar_subquery()
    )
    rows = await session.execute(
        select(Metrics.trial_id, Metrics.steps_completed, Metrics.ordinal, Metrics.metrics)
        .select_from(TrialModel)
        .join(
            Metrics,
            (Metrics.trial_id == TrialModel.id)
            & (Metrics.group_name == group)
            & (Metrics.steps_completed == highest),
        )
        .where(TrialModel.id.in_(ids))
    )
    return {trial_id: (steps, ordinal, metrics) for trial_id, steps, ordinal, metrics in rows}


async def _names_of_first_reports(session: AsyncSession, ids: list[int], group: str) -> set[str]:
    if not ids:
        return set()
    rows = await session.scalars(
        select(Metrics.metrics).where(
            Metrics.trial_id.in_(ids),
            Metrics.group_name == group,
            Metrics.thinning_level >= thinning.FIRST_REPORT_LEVEL,
        )
    )
    return {k for metrics in rows for k, v in metrics.items() if _is_number(v)}


async def _reported_anywhere(
    session: AsyncSession, ids: list[int], group: str, metric: str
) -> bool:
    """Whether any report of these trials holds `metric` as a finite number, as the
    chooser's names do (a scan, only for a name the first and latest reports lack)."""
    if not ids:
        return False
    value = _sortable_value(session, metric)
    query = value.joined(
        select(Metrics.id)
        .select_from(Metrics)
        .where(
            Metrics.trial_id.in_(ids),
            Metrics.group_name == group,
            value.expression.is_not(None),
        )
    )
    return await session.scalar(query.limit(1)) is not None


async def _thinned_series(
    session: AsyncSession,
    ids: list[int],
    group: str,
    metric: str,
    latest: dict[int, tuple[int, int, dict[str, Any]]],
    max_points: int,
) -> list[TrialSeries]:
    series = {trial_id: TrialSeries(trial_id, 0, 1) for trial_id in ids}
    by_level: dict[int, list[int]] = {}
    for trial_id, (_steps, ordinal, _metrics) in latest.items():
        reports = ordinal + 1  # ordinals count the reports (0 for rows written without one)
        level = thinning.level_for(reports, max_points)
        series[trial_id].reports = reports
        series[trial_id].stride = thinning.stride(level)
        by_level.setdefault(level, []).append(trial_id)
    value = _sortable_value(session, metric)
    points: dict[int, list[tuple[int, float | None]]] = {trial_id: [] for trial_id in ids}
    for level, trial_ids in sorted(by_level.items()):
        query = value.joined(
            select(Metrics.trial_id, Metrics.steps_completed, value.kind, value.raw)
            .select_from(Metrics)
            .where(
                Metrics.trial_id.in_(trial_ids),
                Metrics.group_name == group,
                Metrics.thinning_level >= level,
            )
        )
        for trial_id, steps, kind, raw in await session.execute(query):
            points[trial_id].append((steps, value.number(kind, raw)))
    for trial_id, (steps, _ordinal, metrics) in latest.items():
        if metric in metrics:  # the latest report is always drawn
            points[trial_id].append((steps, _finite(trial_reports.numeric(metrics[metric]))))
    for trial_id, found in points.items():
        found.sort(key=lambda point: point[0])
        one = series[trial_id]
        for steps, number in found:
            if one.steps and one.steps[-1] == steps:
                continue  # the latest report, also read as a level's
            one.steps.append(steps)
            one.values.append(number)
    return [series[trial_id] for trial_id in ids]


def _finite(value: float | Decimal | None) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None
