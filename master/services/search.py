"""The ASHA searchers on the database: trials created as the search goes, rung entries,
stops delivered to running trials, and progress.

The rules are `master.core.asha`'s; this module only gathers what they need and stores
what they decide, in the caller's transaction, so an event and the searcher state it
changes commit together (a master killed in between loses neither). Every event first
holds the scheduler's row, then locks the experiment's, in that order everywhere, so two
reports of one search are decided one after the other on SQLite and Postgres alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from master.core import asha
from master.core.errors import ConfigError, ConfigProblem
from master.core.expconf import effective_dict, parse_yaml, validate_config
from master.core.searcher import TrialPlan, count_trials, sample_trials
from master.core.seeds import LegacyRandom
from master.db.models import (
    ExperimentModel,
    ExperimentState,
    SearcherRungEntryModel,
    TrialModel,
    TrialState,
    utcnow,
)
from master.errors import InvalidArgument
from master.services import allocations, logs, states, trial_reports
from master.services.configs import config_errors_as_invalid_argument

log = logging.getLogger(__name__)

_DECIDING_STATES = (TrialState.PULLING, TrialState.STARTING, TrialState.RUNNING)
_INVALID_HP_REASONS = (
    trial_reports.EARLY_EXIT_REASONS["EXITED_REASON_INVALID_HP"],
    trial_reports.EARLY_EXIT_REASONS["EXITED_REASON_INIT_INVALID_HP"],
)


def is_asha_experiment(experiment: ExperimentModel) -> bool:
    return experiment.searcher_type in asha.ASHA_SEARCHERS


def config_of(experiment: ExperimentModel) -> asha.AshaConfig:
    return asha.parse_config(experiment.config["searcher"])


@dataclass(frozen=True)
class InitialTrials:
    plans: list[tuple[int, TrialPlan]]  # (bracket, plan) in creation order
    searcher_state: dict[str, Any]


def initial_trials(effective: Mapping[str, Any], seed: int) -> InitialTrials:
    """Determined's initial creates, bracket by bracket, from the experiment seed."""
    cfg = asha.parse_config(effective["searcher"])
    rng = LegacyRandom(seed)
    brackets = asha.initial_creates(cfg.brackets)
    plans = sample_trials(effective.get("hyperparameters") or {}, rng, len(brackets))
    return InitialTrials(list(zip(brackets, plans, strict=True)), {"rng": rng.state()})


async def _lock_search(session: AsyncSession, experiment: ExperimentModel) -> None:
    # A write first: on Postgres a row lock, on SQLite the database's write lock, taken
    # before anything the decision reads.
    # The state as committed comes back with it; the generator's position is read again
    # only by a create (create_trials).
    state = await session.scalar(
        update(ExperimentModel)
        .where(ExperimentModel.id == experiment.id)
        .values(searcher_state=ExperimentModel.searcher_state)
        .returning(ExperimentModel.state)
        .execution_options(synchronize_session=False)
    )
    set_committed_value(experiment, "state", state)


# --- validations ---------------------------------------------------------------------------


async def on_validation(
    session: AsyncSession, trial: TrialModel, metrics: Mapping[str, Any], steps_completed: int
) -> list[str]:
    """A validation report of a trial of an ASHA experiment: enter the rungs its time has
    reached and stop it where the rule says. Returns the allocations asked to stop."""
    experiment = await session.get(ExperimentModel, trial.experiment_id)
    assert experiment is not None  # foreign key
    if not is_asha_experiment(experiment):
        return []
    # The scheduler's lock before the experiment's, the order a release takes them in
    # (release -> on_trial_closed); the other order deadlocks on Postgres. Holding it also
    # keeps the hub from marking the trial RUNNING over the stop decided here.
    await allocations.hold_scheduler_for_pass(session)
    await _lock_search(session, experiment)
    await session.refresh(trial)
    if (
        trial.searcher_bracket is None
        or trial.searcher_stopped_rung is not None
        or trial.searcher_closed is not None
        or trial.end_reason in _INVALID_HP_REASONS
        or TrialState(trial.state) not in _DECIDING_STATES
    ):
        # A stopped trial's later reports enter no rung; one that said its hyperparameters
        # are invalid leaves the rungs when it exits.
        return []
    cfg = config_of(experiment)
    time = asha.searcher_time(cfg, metrics, steps_completed)
    if time is None:
        await _trial_log(
            session,
            trial,
            f"WARNING: the {cfg.name} searcher ignored the validation at step "
            f"{steps_completed}: it has no number for the time metric {cfg.time_metric!r}",
        )
        return []
    value, problem = asha.searcher_value(cfg, metrics)
    bracket = cfg.brackets[trial.searcher_bracket]
    next_rung = trial.searcher_rung or 0
    reached = asha.rungs_reached(bracket, next_rung, time)
    if not reached:
        return []
    standings = {
        r: await _standing(session, experiment.id, bracket.index, r, value) for r in reached
    }
    result = asha.climb(bracket, cfg.divisor, next_rung, time, standings)
    reported = None if problem else (value if cfg.smaller_is_better else -value)
    for r in result.entered:
        session.add(
            SearcherRungEntryModel(
                trial_id=trial.id,
                rung=r,
                experiment_id=experiment.id,
                bracket=bracket.index,
                value=value,
                time=time,
                metric=reported,
            )
        )
    trial.searcher_rung = result.next_rung
    if problem:
        await _trial_log(
            session, trial, f"WARNING: {problem}; the searcher counts it as the worst value"
        )
    stopped: list[str] = []
    if result.stopped_at is not None:
        stopped = await _stop(session, trial, cfg, bracket, result, standings, problem)
    await session.flush()
    if 0 in result.entered:  # the only input of progress a validation changes
        await refresh_progress(session, experiment)
    return stopped


async def _standing(
    session: AsyncSession, experiment_id: int, bracket: int, rung: int, value: float
) -> asha.Standing:
    row = (
        await session.execute(
            select(
                func.count().filter(SearcherRungEntryModel.value < value),
                func.count(),
            ).where(
                SearcherRungEntryModel.experiment_id == experiment_id,
                SearcherRungEntryModel.bracket == bracket,
                SearcherRungEntryModel.rung == rung,
            )
        )
    ).one()
    return asha.Standing(better=int(row[0] or 0), size=int(row[1] or 0))


async def _stop(
    session: AsyncSession,
    trial: TrialModel,
    cfg: asha.AshaConfig,
    bracket: asha.Bracket,
    result: asha.Climb,
    standings: Mapping[int, asha.Standing],
    problem: str | None,
) -> list[str]:
    rung = result.stopped_at
    assert rung is not None
    units = bracket.rung_units[rung]
    where = f"rung {rung} ({units} {cfg.unit})"
    if result.reached_top:
        why = f"reached the top {where}: trained the full max_time"
    else:
        standing = standings[rung]
        why = (
            f"stopped by the searcher at {where}: place {standing.better + 1} of "
            f"{standing.size + 1}, not in the top 1/{cfg.divisor:g}"
        )
    if problem:
        why += f" ({problem})"
    trial.searcher_stopped_rung = rung
    trial.end_reason = why
    states.set_trial_state(session, trial, TrialState.STOPPING_COMPLETED, why)
    # The preemption signal: the trial checkpoints and exits, or is stopped after its
    # preemption_timeout; its slots then go to the next trial.
    return await allocations.ask_to_stop(session, [trial.id], terminate=False)


async def _trial_log(session: AsyncSession, trial: TrialModel, text: str) -> None:
    allocation_id = f"{trial.id}.{trial.run_id}"
    line = logs.LogLine(
        allocation_id=allocation_id,
        rank=None,
        stdtype="stdout",
        timestamp=utcnow(),
        message=text + "\n",
    )
    if not await logs.append_logs(session, "", [line]):
        log.info("trial %d: %s", trial.id, text)


# --- closes and creates --------------------------------------------------------------------


def close_kind(trial: TrialModel) -> asha.CloseKind:
    state = TrialState(trial.state)
    if trial.end_reason in _INVALID_HP_REASONS:
        return "invalid_hp"
    if trial.searcher_stopped_rung is not None:
        return "stopped"
    if state == TrialState.COMPLETED:
        return "completed"
    if state == TrialState.CANCELED:
        return "canceled"
    return "errored"


async def on_trial_closed(
    session: AsyncSession, trial: TrialModel, experiment: ExperimentModel
) -> None:
    """A trial of an ASHA experiment reached a terminal state: tell the searcher, which
    may create trials to keep its brackets at their concurrency."""
    if not is_asha_experiment(experiment) or trial.searcher_bracket is None:
        return
    await _lock_search(session, experiment)
    await session.refresh(trial, ["searcher_closed", "searcher_rung", "searcher_stopped_rung"])
    if trial.searcher_closed is not None or not TrialState(trial.state).is_terminal:
        return
    cfg = config_of(experiment)
    kind = close_kind(trial)
    trial.searcher_closed = kind
    bracket = cfg.brackets[trial.searcher_bracket]
    next_rung = trial.searcher_rung or 0
    if kind == "invalid_hp":
        entries = await session.scalars(
            select(SearcherRungEntryModel).where(SearcherRungEntryModel.trial_id == trial.id)
        )
        for entry in entries:
            await session.delete(entry)
    elif kind in ("errored", "canceled") and next_rung < bracket.num_rungs:
        # Determined's rule: a trial that ends early is the worst of its next rung.
        exists = await session.get(SearcherRungEntryModel, (trial.id, next_rung))
        if exists is None:
            session.add(
                SearcherRungEntryModel(
                    trial_id=trial.id,
                    rung=next_rung,
                    experiment_id=experiment.id,
                    bracket=bracket.index,
                    value=asha.WORST,
                    time=0.0,
                    metric=None,
                )
            )
    await session.flush()
    await _refill(session, experiment, cfg, bracket)
    await refresh_progress(session, experiment)


async def _refill(
    session: AsyncSession, experiment: ExperimentModel, cfg: asha.AshaConfig, bracket: asha.Bracket
) -> None:
    state = ExperimentState(experiment.state)
    if state not in (ExperimentState.ACTIVE, ExperimentState.PAUSED):
        return  # stopping or ended: no new trials
    rows = (
        await session.execute(
            select(TrialModel.state, TrialModel.searcher_closed).where(
                TrialModel.experiment_id == experiment.id,
                TrialModel.searcher_bracket == bracket.index,
            )
        )
    ).all()
    live = sum(1 for s, closed in rows if closed is None and not TrialState(s).is_terminal)
    invalid = sum(1 for _, closed in rows if closed == "invalid_hp")
    wanted = asha.creates_wanted(bracket, len(rows), invalid, live)
    if wanted:
        await create_trials(session, experiment, [bracket.index] * wanted)


async def create_trials(
    session: AsyncSession, experiment: ExperimentModel, brackets: list[int]
) -> list[int]:
    """New trials drawn from where the experiment's generator stands; the generator's new
    position is stored in the same transaction."""
    await session.refresh(experiment, ["searcher_state"])
    stored = (experiment.searcher_state or {}).get("rng")
    rng = LegacyRandom.from_state(stored) if stored else LegacyRandom(experiment.experiment_seed)
    plans = sample_trials(experiment.config.get("hyperparameters") or {}, rng, len(brackets))
    experiment.searcher_state = {**(experiment.searcher_state or {}), "rng": rng.state()}
    return await add_trials(session, experiment, list(zip(brackets, plans, strict=True)))


async def add_trials(
    session: AsyncSession, experiment: ExperimentModel, plans: list[tuple[int | None, TrialPlan]]
) -> list[int]:
    """Store planned trials: QUEUED with an allocation, or PAUSED in a paused experiment.
    Returns the new trials' ids, in the plans' order."""
    # Core statements do not flush the session: what it holds (the experiment's own state
    # record) goes first, in the order it was added.
    await session.flush()
    [ids] = await add_trials_of(session, [(experiment, plans)])
    return ids


async def add_trials_of(
    session: AsyncSession,
    planned: Sequence[tuple[ExperimentModel, Sequence[tuple[int | None, TrialPlan]]]],
    created: Sequence[tuple[str, int, str]] = (),
) -> list[list[int]]:
    """The trials of several new experiments (store_experiments'), in three statements
    whatever their count (trials, the state records of the trials and of `created`, the
    queued allocations), not the ORM's per-object work: a 1,000-trial search is stored by
    the POST that creates it (issue 16). The new trials' ids, per experiment, in order."""
    rows = []
    for experiment, plans in planned:
        queued = ExperimentState(experiment.state) != ExperimentState.PAUSED
        rows += [
            {
                "experiment_id": experiment.id,
                "request_id": str(plan.request_id),
                "state": TrialState.QUEUED if queued else TrialState.PAUSED,
                "hparams": plan.hparams,
                "seed": plan.seed,
                "searcher_bracket": bracket,
                "searcher_rung": None if bracket is None else 0,
                # A queued trial's first allocation is "<trial id>.1" (enqueue_new_trials).
                "run_id": 1 if queued else 0,
            }
            for bracket, plan in plans
        ]
    table = cast(Table, TrialModel.__table__)
    ids: list[int] = []
    if rows:
        ids = list(
            (
                await session.scalars(
                    insert(table).returning(table.c.id, sort_by_parameter_order=True), rows
                )
            ).all()
        )
    trial_states = [("trial", i, cast(str, row["state"])) for i, row in zip(ids, rows, strict=True)]
    await states.record_created(session, [*created, *trial_states])
    per_experiment: list[list[int]] = []
    for _, plans in planned:
        per_experiment.append(ids[: len(plans)])
        del ids[: len(plans)]
    await allocations.enqueue_new_trials_of(
        session,
        [
            (trial_ids, experiment)
            for (experiment, _), trial_ids in zip(planned, per_experiment, strict=True)
            if ExperimentState(experiment.state) != ExperimentState.PAUSED
        ],
    )
    return per_experiment


# --- progress and views --------------------------------------------------------------------


async def refresh_progress(session: AsyncSession, experiment: ExperimentModel) -> None:
    cfg = config_of(experiment)
    rung0 = dict(
        (
            await session.execute(
                select(SearcherRungEntryModel.bracket, func.count())
                .where(
                    SearcherRungEntryModel.experiment_id == experiment.id,
                    SearcherRungEntryModel.rung == 0,
                )
                .group_by(SearcherRungEntryModel.bracket)
            )
        ).all()
    )
    done = dict(
        (
            await session.execute(
                select(TrialModel.searcher_bracket, func.count())
                .where(
                    TrialModel.experiment_id == experiment.id,
                    TrialModel.searcher_closed.is_not(None),
                    TrialModel.searcher_closed != "invalid_hp",
                )
                .group_by(TrialModel.searcher_bracket)
            )
        ).all()
    )
    experiment.progress = asha.progress(
        cfg.brackets,
        [rung0.get(b.index, 0) for b in cfg.brackets],
        [done.get(b.index, 0) for b in cfg.brackets],
    )


@dataclass(frozen=True)
class TrialSearch:
    """What describe and the dashboard show of a trial's place in the search."""

    bracket: int
    rung: int  # the highest rung it entered, -1 for none
    stopped_rung: int | None
    rungs: dict[int, tuple[float, float | None]]  # rung -> (time, metric as reported)

    def summary(self, cfg: asha.AshaConfig) -> str:
        bracket = cfg.brackets[self.bracket]
        if self.rung < 0:
            reached = f"below rung 0 ({bracket.rung_units[0]} {cfg.unit})"
        else:
            reached = f"rung {self.rung} ({bracket.rung_units[self.rung]} {cfg.unit})"
        text = f"bracket {self.bracket}, {reached} of {bracket.num_rungs}"
        if self.reached_top(cfg):
            text += "; trained the full max_time"
        elif self.stopped_rung is not None:
            text += f"; stopped at rung {self.stopped_rung}"
        return text

    def reached_top(self, cfg: asha.AshaConfig) -> bool:
        """The searcher's end for a trial at its bracket's last rung is not a stop: it
        trained the full max_time."""
        return self.stopped_rung == cfg.brackets[self.bracket].num_rungs - 1

    def as_json(self, cfg: asha.AshaConfig) -> dict[str, Any]:
        units = cfg.brackets[self.bracket].rung_units
        return {
            "bracket": self.bracket,
            "rung": self.rung,
            "stoppedAtRung": self.stopped_rung,
            "reachedTop": self.reached_top(cfg),
            "rungs": [
                {"rung": r, "units": units[r], "time": time, "metric": metric}
                for r, (time, metric) in sorted(self.rungs.items())
            ],
            "unit": cfg.unit,
            "summary": self.summary(cfg),
        }


async def trial_search_views(
    session: AsyncSession, experiment: ExperimentModel
) -> dict[int, dict[str, Any]]:
    """Each trial's place in the search, as the API shows it ({} for other searchers)."""
    searches = await trial_searches(session, experiment)
    if not searches:
        return {}
    cfg = config_of(experiment)
    return {trial_id: found.as_json(cfg) for trial_id, found in searches.items()}


async def trial_searches(
    session: AsyncSession, experiment: ExperimentModel
) -> dict[int, TrialSearch]:
    if not is_asha_experiment(experiment):
        return {}
    trials = (
        await session.execute(
            select(
                TrialModel.id, TrialModel.searcher_bracket, TrialModel.searcher_stopped_rung
            ).where(TrialModel.experiment_id == experiment.id)
        )
    ).all()
    entries = (
        await session.execute(
            select(
                SearcherRungEntryModel.trial_id,
                SearcherRungEntryModel.rung,
                SearcherRungEntryModel.time,
                SearcherRungEntryModel.metric,
            ).where(SearcherRungEntryModel.experiment_id == experiment.id)
        )
    ).all()
    by_trial: dict[int, dict[int, tuple[float, float | None]]] = {}
    for trial_id, rung, time, metric in entries:
        by_trial.setdefault(trial_id, {})[rung] = (time, metric)
    return {
        trial_id: TrialSearch(
            bracket=bracket,
            rung=max(by_trial.get(trial_id, {}), default=-1),
            stopped_rung=stopped,
            rungs=by_trial.get(trial_id, {}),
        )
        for trial_id, bracket, stopped in trials
        if bracket is not None
    }


# --- preview -------------------------------------------------------------------------------


def preview(raw_config: Any) -> dict[str, Any]:
    """Determined's POST /api/v1/preview-hp-search: the searcher with its defaults, and how
    many trials train how far (ASHA: if every rung keeps exactly the top 1/divisor)."""
    if isinstance(raw_config, str):
        with config_errors_as_invalid_argument("config"):
            raw_config = parse_yaml(raw_config)
    if not isinstance(raw_config, Mapping):
        raise InvalidArgument("config: must be an experiment config (an object)")
    if raw_config.get("searcher") is None:
        raise InvalidArgument("config.searcher: required; preview-search shows a searcher's plan")
    with config_errors_as_invalid_argument("config"):
        cfg = validate_config(raw_config, complete=False)
        effective = effective_dict(cfg)
        searcher = effective["searcher"]
        missing = [f for f in ("name", "metric") if searcher.get(f) is None]
        if missing:
            raise ConfigError([ConfigProblem(f"searcher.{f}", "required") for f in missing])
        if asha.is_asha(searcher):
            asha_cfg = asha.parse_config(searcher)
            unit = asha_cfg.unit
            trials = [
                {"count": count, "unit": {"name": unit, "value": units, "maxLength": False}}
                for units, count in asha.preview(asha_cfg)
            ]
        else:
            count = count_trials(searcher, effective.get("hyperparameters") or {})
            trials = [{"count": count, "unit": {"maxLength": True}}]
    shown = {k: v for k, v in searcher.items() if v is not None}
    return {"summary": {"config": shown, "trials": trials}}
