"""Experiments: the sortable list, one experiment's page, its actions, and the JSON feeds its
charts and log view poll (trial metrics, trial logs)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import Field
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import MAX_INT, ObjectId, SessionDep
from master.core import launch
from master.core.errors import ConfigError
from master.core.expconf import SEARCHER_NAMES, SearcherName, parse_yaml
from master.db.models import ExperimentState, TrialModel, TrialState
from master.errors import InvalidArgument, MasterError, NotFound
from master.services import (
    access,
    auth,
    checkpoint_gc,
    experiments,
    labels,
    logs,
    search,
    trial_compare,
    trial_reports,
    workspaces,
)
from master.services.experiments import MAX_TEXT_FILTER, ExperimentView
from master.services.logs import LogFilter
from master.web.common import (
    Paging,
    PagingDep,
    WebRoute,
    WebSession,
    WebSessionDep,
    checked_form,
    is_htmx,
    json_response,
    page_links,
    page_response,
    paging_by,
    redirect,
    slice_page,
    to_yaml,
)
from resolute.storage import mask_config

router = APIRouter(route_class=WebRoute)

SORTS = {
    "id": "SORT_BY_ID",
    "name": "SORT_BY_NAME",
    "state": "SORT_BY_STATE",
    "started": "SORT_BY_START_TIME",
    "searcher": "SORT_BY_SEARCHER_TYPE",
    "trials": "SORT_BY_NUM_TRIALS",
    "best": "SORT_BY_SEARCHER_METRIC_VAL",
}
SortKey = Literal["id", "name", "state", "started", "searcher", "trials", "best"]
Order = Literal["asc", "desc"]
# Newest and largest first; names, states, searchers and metrics read best A to Z (a
# loss's best is its smallest).
DESCENDING_FIRST = ("id", "started", "trials")
TRIALS_PER_PAGE = 25
CHECKPOINTS_PER_PAGE = 20
MAX_CHART_SERIES = 8
MAX_LOG_LINES = 1000
MAX_RANK_CHOICES = 64
MAX_LABEL_CHOICES = 200  # the label filter suggests the most used ones


# -- the list ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ListParams:
    sort: SortKey
    order: Order
    state: ExperimentState | None
    searcher: SearcherName | None
    user: str
    text: str
    label: str
    archived: bool  # archived ones listed too (hidden by default, as Determined's list)
    project: int = 0  # only this project's (0: every project's)

    def query(self) -> dict[str, str]:
        return {
            "project": str(self.project) if self.project else "",
            "sort": self.sort,
            "order": self.order,
            "state": self.state.value if self.state else "",
            "searcher": self.searcher or "",
            "user": self.user,
            "text": self.text,
            "label": self.label,
            "archived": "show" if self.archived else "",
        }

    @property
    def filtered(self) -> bool:
        return bool(
            self.state
            or self.searcher
            or self.user
            or self.text
            or self.label
            or self.archived
            or self.project
        )


# Neither NUL (Postgres text cannot hold it) nor more than the service's limit.
FilterText = Annotated[str, Query(max_length=MAX_TEXT_FILTER, pattern=r"^[^\x00]*$")]


def list_params(
    sort: SortKey = "id",
    order: Order | None = None,
    # The form sends "" for "any".
    state: FilterText = "",
    searcher: FilterText = "",
    user: FilterText = "",
    text: FilterText = "",
    label: FilterText = "",
    archived: Literal["", "show"] = "",
    project: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
) -> ListParams:
    default: Order = "desc" if sort in DESCENDING_FIRST else "asc"
    states = [s.value for s in ExperimentState]
    if state and state not in states:
        raise InvalidArgument(f"state: {state[:32]!r} is not one of {', '.join(states)}")
    if searcher and searcher not in SEARCHER_NAMES:
        raise InvalidArgument(
            f"searcher: {searcher[:32]!r} is not one of {', '.join(SEARCHER_NAMES)}"
        )
    # A label is matched exactly, spaces and case included, as the API's filter does.
    if label and (problem := labels.label_problem(label)) is not None:
        raise InvalidArgument(f"label: the label {problem}")
    return ListParams(
        sort,
        order or default,
        ExperimentState(state) if state else None,
        cast(SearcherName, searcher) if searcher else None,
        user.strip(),
        text.strip(),
        label,
        archived == "show",
        project,
    )


@router.get("/ui/experiments")
async def experiments_page(
    request: Request,
    session: SessionDep,
    web: WebSessionDep,
    paged: PagingDep,
    params: Annotated[ListParams, Depends(list_params)],
) -> Response:
    usernames = await auth.list_usernames(session)
    if params.user and params.user not in usernames:
        raise InvalidArgument(f"user: there is no user named {params.user!r}")
    if params.project:
        await access.check_readable(session, web.actor, "project_id", str(params.project))
    project = await workspaces.describe_project(session, params.project) if params.project else None
    views, total = await experiments.list_experiments(
        session,
        offset=paged.offset,
        limit=paged.per_page,
        states_filter=[params.state] if params.state else (),
        usernames=[params.user] if params.user else (),
        searchers=[params.searcher] if params.searcher else (),
        text=params.text or None,
        with_labels=[params.label] if params.label else (),
        archived=None if params.archived else False,
        sort_by=SORTS[params.sort],
        descending=params.order == "desc",
        project_id=params.project or None,
        readable=await access.readable(session, web.actor, "experiments"),
    )
    context = {
        "nav": "experiments",
        "rows": views,
        "params": params,
        "project": project,
        "states": list(ExperimentState),
        "searchers": SEARCHER_NAMES,
        "usernames": usernames,
        "pager": page_links("/ui/experiments", paged, total, len(views), params.query()),
        "per_page": paged.per_page,
        "sort_url": lambda key: _sort_url(params, paged, key),
        "label_url": lambda label: _label_url(params, paged, label),
        "metric_of": metric_of,
    }
    if is_htmx(request):  # the table refreshing itself: the form's choices are there already
        return page_response(request, "experiments_table.html", context, web=web)
    context["known_labels"] = await labels.label_counts(
        session,
        limit=MAX_LABEL_CHOICES,
        readable=await access.readable(session, web.actor, "experiments"),
    )
    template = "experiments.html"
    return page_response(request, template, context, web=web)


def metric_of(view: ExperimentView) -> str | None:
    """The searcher metric's name (the best metric column shows it with the value)."""
    return trial_reports.searcher_metric(view.experiment.config)[0]


def _sort_url(params: ListParams, paged: Paging, key: str) -> str:
    if params.sort == key:
        order = "desc" if params.order == "asc" else "asc"
    else:
        order = "desc" if key in DESCENDING_FIRST else "asc"
    query = {**params.query(), "sort": key, "order": order, "per_page": str(paged.per_page)}
    return "/ui/experiments?" + urlencode({k: v for k, v in query.items() if v})


def _label_url(params: ListParams, paged: Paging, label: str) -> str:
    """The list filtered by this label, other filters and the sort kept (the first page)."""
    query = {**params.query(), "label": label, "per_page": str(paged.per_page)}
    return "/ui/experiments?" + urlencode({k: v for k, v in query.items() if v})


def slots_of(view: ExperimentView) -> Any:
    return (view.experiment.config.get("resources") or {}).get("slots_per_trial", 1)


# -- one experiment ----------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigKey:
    key: str
    source: str  # template | config | template + config | default
    text: str


def config_sources(view: ExperimentView) -> list[ConfigKey]:
    """Each top-level key of the effective config and where it came from."""
    row = view.experiment
    try:
        submitted: dict[str, Any] = parse_yaml(row.original_config)
    except ConfigError:
        submitted = {}
    template = row.template_config or {}
    keys = []
    for key, value in mask_config(row.config).items():
        in_template, in_config = key in template, key in submitted
        if in_template and in_config:
            source = "template + config"
        elif in_template:
            source = "template"
        elif in_config:
            source = "config"
        else:
            source = "default"  # filled in by the master: defaults, storage, seed, pool
        keys.append(ConfigKey(key, source, to_yaml(value)))
    return keys


async def _live_context(
    session: AsyncSession, experiment_id: int, trials_page: int, selected: int | None
) -> dict[str, Any]:
    view = await experiments.get_experiment(session, experiment_id)
    paged = Paging(trials_page, TRIALS_PER_PAGE)
    rows, total = await experiments.list_trials(
        session, experiment_id, offset=paged.offset, limit=paged.per_page
    )
    reasons = await experiments.pending_reasons(session, [r.id for r in rows])
    summaries = await trial_reports.trial_summaries(session, rows, view.experiment.config)
    metric, _smaller = trial_reports.searcher_metric(view.experiment.config)
    state = ExperimentState(view.experiment.state)
    layout = launch.stored_layout(view.experiment.config)
    asha = search.is_asha_experiment(view.experiment)
    return {
        "view": view,
        "state": state,
        "launch": {"layout": layout, "summary": launch.layout_summary(layout)},
        "trials": rows,
        "reasons": reasons,
        "summaries": summaries,
        # Each trial's place in an ASHA search (its rung, where it stopped); None otherwise.
        "searches": await search.trial_search_views(session, view.experiment) if asha else None,
        "metric": metric,
        "selected": selected if selected is not None else (rows[0].id if rows else None),
        "trials_page": trials_page,
        "trials_pager": page_links(
            f"/ui/experiments/{experiment_id}",
            paged,
            total,
            len(rows),
            {"trial": selected},
            page_param="trials_page",
            per_page_param=None,
        ),
        "polling": not state.is_terminal,
        "actions": {
            "pause": state == ExperimentState.ACTIVE,
            "activate": state == ExperimentState.PAUSED,
            "kill": not state.is_terminal,
        },
    }


async def _selected_trial(
    session: AsyncSession, actor: access.Actor, experiment_id: int, trial_id: int | None
) -> TrialModel | None:
    if trial_id is None:
        return None
    trial = await experiments.get_trial(session, trial_id)
    if await access.hidden(session, actor, "trial_id", str(trial_id)):
        raise NotFound(f"trial {trial_id} not found")  # as get_trial says of a missing one
    if trial.experiment_id != experiment_id:
        raise InvalidArgument(
            f"trial: trial {trial_id} is not a trial of experiment {experiment_id}"
        )
    return trial


TrialsPage = Annotated[int, Query(ge=1, le=MAX_INT // TRIALS_PER_PAGE)]
SelectedTrial = Annotated[int | None, Query(ge=0, le=MAX_INT)]
CheckpointPaging = Annotated[Paging, Depends(paging_by(CHECKPOINTS_PER_PAGE))]


async def _experiment_context(
    session: AsyncSession,
    actor: access.Actor,
    experiment_id: int,
    trials_page: int,
    trial: int | None,
    checkpoints_paged: Paging,
) -> dict[str, Any]:
    selected = await _selected_trial(session, actor, experiment_id, trial)
    live = await _live_context(
        session, experiment_id, trials_page, selected.id if selected else None
    )
    view: ExperimentView = live["view"]
    best = await trial_reports.best_validation_metric(session, view.experiment)
    checkpoints = await trial_reports.list_checkpoints(session, experiment_id=experiment_id)
    shown = slice_page(checkpoints, checkpoints_paged)
    slots = slots_of(view)
    ranks = range(min(max(int(slots) if isinstance(slots, int) else 1, 1), MAX_RANK_CHOICES))
    return {
        **live,
        "nav": "experiments",
        "best": best,
        "config_keys": config_sources(view),
        "checkpoints": shown,
        # ACTIVE, DELETING, DELETED, PARTIALLY_DELETED: what `det checkpoint list` says.
        "checkpoint_states": checkpoint_gc.SHOWN,
        "checkpoints_pager": page_links(
            f"/ui/experiments/{experiment_id}",
            checkpoints_paged,
            len(checkpoints),
            len(shown),
            {"trial": trial, "trials_page": trials_page},
        ),
        "ranks": ranks,
    }


@router.get("/ui/experiments/{experiment_id}")
async def experiment_page(
    request: Request,
    experiment_id: ObjectId,
    session: SessionDep,
    web: WebSessionDep,
    checkpoints_paged: CheckpointPaging,
    trials_page: TrialsPage = 1,
    trial: SelectedTrial = None,
) -> Response:
    context = await _experiment_context(
        session, web.actor, experiment_id, trials_page, trial, checkpoints_paged
    )
    return page_response(request, "experiment.html", context, web=web)


@router.get("/ui/experiments/{experiment_id}/live")
async def experiment_live(
    request: Request,
    experiment_id: ObjectId,
    session: SessionDep,
    web: WebSessionDep,
    trials_page: TrialsPage = 1,
    trial: SelectedTrial = None,
) -> Response:
    """The part of the page that changes while trials run: state, actions, trials."""
    selected = await _selected_trial(session, web.actor, experiment_id, trial)
    context = await _live_context(
        session, experiment_id, trials_page, selected.id if selected else None
    )
    return page_response(request, "experiment_live.html", context, web=web)


Action = Literal["kill", "pause", "activate"]
_ACTIONS = {
    "kill": experiments.kill_experiment,
    "pause": experiments.pause_experiment,
    "activate": experiments.activate_experiment,
}


@router.post("/ui/experiments/{experiment_id}/{action}")
async def experiment_action(
    request: Request,
    experiment_id: ObjectId,
    action: Action,
    session: SessionDep,
    web: WebSessionDep,
) -> Response:
    await checked_form(request, web)
    try:
        await access.require_experiment_owner(session, web.actor, experiment_id, f"{action} it")
        await _ACTIONS[action](session, experiment_id, web.username)
    except MasterError as exc:
        await session.rollback()
        return await _page_with_error(request, session, web, experiment_id, exc)
    return redirect(f"/ui/experiments/{experiment_id}")


async def _page_with_error(
    request: Request, session: AsyncSession, web: WebSession, experiment_id: int, exc: MasterError
) -> Response:
    context = await _experiment_context(
        session, web.actor, experiment_id, 1, None, Paging(1, CHECKPOINTS_PER_PAGE)
    )
    context["error"] = exc.message
    return page_response(request, "experiment.html", context, web=web)


# -- trials compared ---------------------------------------------------------------------

MAX_COMPARE_CHOICES = 1000  # checkboxes on the page; any trial can still be named in the URL
BEST_SHORTCUTS = (5, 10, 25, 100)
MetricGroup = Literal["training", "validation"]
ComparedTrials = Annotated[list[Annotated[int, Field(ge=0, le=MAX_INT)]], Query()]
BestCount = Annotated[int | None, Query(ge=1, le=trial_compare.MAX_COMPARED)]
# The name goes to the database as a parameter: no NUL, which Postgres text cannot hold.
MetricName = Annotated[str, Query(max_length=256, pattern=r"^[^\x00]*$")]


def compare_chart(comparison: trial_compare.Comparison, group: str) -> dict[str, Any]:
    """What app.js draws: each trial's steps and values (its own x values, since thinned
    trials skip different steps), and how thinned each is."""
    return {
        "metric": comparison.metric,
        "group": group,
        "trials": [
            {
                "id": s.trial_id,
                "label": f"trial {s.trial_id}",
                "steps": s.steps,
                "values": s.values,
                "stride": s.stride,
                "reports": s.reports,
            }
            for s in comparison.series
        ],
    }


def nth(number: int) -> str:
    """2nd, 4th, 32nd: how the thinned note names a stride."""
    suffix = (
        "th" if number % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    )
    return f"{number:,}{suffix}"


def thinned_note(comparison: trial_compare.Comparison) -> str | None:
    """Says what the chart leaves out, so thinning never hides an extreme silently."""
    strides = comparison.strides
    if not strides:
        return None
    every = nth(strides[0]) if len(strides) == 1 else f"{nth(strides[0])} to {nth(strides[-1])}"
    return (
        f"Thinned to every {every} report (and each trial's latest) for trials with more than "
        f"{comparison.max_points:,} reports: a spike between the points drawn "
        "may not show. A trial's own page draws every report."
    )


@router.get("/ui/experiments/{experiment_id}/compare")
async def compare_trials(
    request: Request,
    experiment_id: ObjectId,
    session: SessionDep,
    web: WebSessionDep,
    trial: ComparedTrials = [],  # noqa: B006 - FastAPI copies defaults
    best: BestCount = None,
    metric: MetricName = "",
    group: MetricGroup = "validation",
) -> Response:
    """One chart of a metric for the chosen trials: those ticked, the best N by the searcher
    metric, or by default the experiment's first MAX_COMPARED."""
    view = await experiments.get_experiment(session, experiment_id)
    if len(trial) > trial_compare.MAX_COMPARED:
        raise InvalidArgument(
            f"trial: at most {trial_compare.MAX_COMPARED} trials in one chart; "
            f"{len(trial)} were chosen"
        )
    if trial and best is not None:
        raise InvalidArgument("best: choose trials with trial=... or best=N, not both")
    choices, total = await experiments.list_trials(
        session, experiment_id, offset=0, limit=MAX_COMPARE_CHOICES
    )
    if best is not None:
        selected = await trial_compare.best_trials(session, view.experiment, best)
    elif trial:
        readable = await access.readable(session, web.actor, "experiments")
        selected = await trial_compare.trials_of_experiment(session, experiment_id, trial, readable)
    else:
        selected = [t.id for t in choices[: trial_compare.MAX_COMPARED]]
    searcher_metric, _smaller = trial_reports.searcher_metric(view.experiment.config)
    comparison = await trial_compare.compare(session, selected, group, metric, searcher_metric)
    problem = None
    if comparison.unknown_metric:
        reported = ", ".join(comparison.names) if comparison.names else "none"
        problem = (
            f"No selected trial reported a {group} metric named {metric!r}. "
            f"They report: {reported}."
        )
    context = {
        "nav": "experiments",
        "view": view,
        "choices": choices,
        "total_trials": total,
        "selected": selected,
        "best": best,
        "best_shortcuts": [n for n in BEST_SHORTCUTS if n < total],
        "searcher_metric": searcher_metric,
        "max_compared": trial_compare.MAX_COMPARED,
        "metric": comparison.metric,
        "group": group,
        "names": comparison.names,
        "problem": problem,
        "strides": comparison.strides,
        "thinned_note": thinned_note(comparison),
        "chart": compare_chart(comparison, group) if comparison.points else None,
    }
    return page_response(request, "compare.html", context, web=web)


# -- feeds the page polls ----------------------------------------------------------------


@router.get("/ui/trials/{trial_id}/metrics.json")
async def trial_metrics(trial_id: ObjectId, session: SessionDep, _web: WebSessionDep) -> Response:
    """Training and validation metrics by step, one aligned series per metric name."""
    trial = await experiments.get_trial(session, trial_id)
    rows = await trial_reports.metric_rows(
        session, trial_id, (trial_reports.TRAINING, trial_reports.VALIDATION)
    )
    groups: dict[str, dict[str, Any]] = {}
    for group in (trial_reports.TRAINING, trial_reports.VALIDATION):
        picked = [r for r in rows if r.group_name == group]
        names = sorted(
            {
                k
                for r in picked
                for k, v in r.metrics.items()
                if trial_reports.numeric(v) is not None
            }
        )[:MAX_CHART_SERIES]
        groups[group] = {
            "steps": [r.steps_completed for r in picked],
            "series": {
                name: [_finite(trial_reports.numeric(r.metrics.get(name))) for r in picked]
                for name in names
            },
        }
    return json_response(
        {"trialId": trial.id, "final": TrialState(trial.state).is_terminal, "groups": groups}
    )


def _finite(value: float | None) -> float | None:
    # NaN and infinities are not JSON; the chart shows a gap instead.
    return value if value is not None and math.isfinite(value) else None


LogsAfter = Annotated[int | None, Query(ge=0, le=2**63 - 1)]
LogsRank = Annotated[int | None, Query(ge=0, le=MAX_INT)]
LogsLimit = Annotated[int, Query(ge=1, le=MAX_LOG_LINES)]


@router.get("/ui/trials/{trial_id}/logs.json")
async def trial_logs(
    trial_id: ObjectId,
    session: SessionDep,
    _web: WebSessionDep,
    after: LogsAfter = None,
    rank: LogsRank = None,
    limit: LogsLimit = 500,
) -> Response:
    target = await logs.get_trial_target(session, trial_id)
    return await log_feed(session, target, after, rank, limit)


async def log_feed(
    session: AsyncSession, target: logs.LogTarget, after: int | None, rank: int | None, limit: int
) -> Response:
    """Lines after `after` (a line id), oldest first; `finished` once no more can come."""
    # Read the state first: a line stored before the end is then in this batch.
    finished = await logs.is_finished(session, target)
    where = LogFilter(rank_ids=(rank,) if rank is not None else ())
    rows = await logs.read_logs(session, target, where, after_id=after, limit=limit)
    return json_response(
        {
            "lines": [
                {
                    "id": r.id,
                    "rank": r.rank,
                    "stdtype": r.stdtype,
                    "level": r.level,
                    "time": r.timestamp.isoformat().replace("+00:00", "Z"),
                    "message": r.message.removesuffix("\n"),
                }
                for r in rows
            ],
            "last": rows[-1].id if rows else after,
            "finished": finished and len(rows) < limit,
        }
    )
