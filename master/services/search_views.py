"""What a search found, read from the database: each trial's hyperparameters with its best
value of the searcher's metric, and an ASHA search's trials by rung. The pictures' rules are
`master.core.search_views`'; this module only gathers their inputs."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import search_views as pictures
from master.db.models import TrialModel, TrialState
from master.errors import InvalidArgument
from master.services import experiments, search, trial_compare, trial_reports
from master.services.experiments import ExperimentView


@dataclass(frozen=True)
class HyperparameterView:
    view: ExperimentView
    metric: str | None
    smaller_is_better: bool
    searched: list[pictures.SearchedHyperparameter]
    constants: list[pictures.ConstantHyperparameter]
    outcomes: list[pictures.TrialOutcome]  # every trial, by id
    best: pictures.TrialOutcome | None

    @property
    def without_metric(self) -> list[pictures.TrialOutcome]:
        return [o for o in self.outcomes if o.metric is None]


async def hyperparameter_view(session: AsyncSession, experiment_id: int) -> HyperparameterView:
    """Every trial's hyperparameters and best searcher metric (NotFound for an unknown
    experiment). The best is the value `trial_reports.best_of` picks for the trials table,
    aggregated by the database."""
    view = await experiments.get_experiment(session, experiment_id)
    config = view.experiment.config
    metric, smaller = trial_reports.searcher_metric(config)
    trials, _total = await experiments.list_trials(session, experiment_id, offset=0, limit=0)
    best = (
        await trial_compare.best_values(session, experiment_id, metric, smaller) if metric else {}
    )
    outcomes = [
        pictures.TrialOutcome(trial.id, trial.state, trial.hparams or {}, best.get(trial.id))
        for trial in trials
    ]
    searched, constants = pictures.searched_hyperparameters(config.get("hyperparameters"))
    return HyperparameterView(
        view,
        metric,
        smaller,
        searched,
        constants,
        outcomes,
        pictures.best_trial(outcomes, smaller),
    )


@dataclass(frozen=True)
class RungView:
    view: ExperimentView
    metric: str
    smaller_is_better: bool
    brackets: list[pictures.BracketPicture]


async def rung_view(session: AsyncSession, experiment_id: int) -> RungView:
    """An ASHA search's brackets with their trials by rung, from the search state the API
    shows (`search.trial_search_views`). Other searchers have no rungs: InvalidArgument."""
    view = await experiments.get_experiment(session, experiment_id)
    experiment = view.experiment
    if not search.is_asha_experiment(experiment):
        raise InvalidArgument(
            f"experiment {experiment_id} uses the {experiment.searcher_type} searcher: only "
            "adaptive_asha and async_halving searches have rungs"
        )
    cfg = search.config_of(experiment)
    searches = await search.trial_search_views(session, experiment)
    states = (
        await session.execute(
            select(TrialModel.id, TrialModel.state).where(TrialModel.experiment_id == experiment_id)
        )
    ).all()
    facts = {
        trial_id: pictures.TrialFacts(state, TrialState(state).is_terminal)
        for trial_id, state in states
    }
    return RungView(
        view,
        cfg.metric,
        cfg.smaller_is_better,
        pictures.rung_picture(cfg, searches, facts),
    )
