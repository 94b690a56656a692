"""What a search found: each searched hyperparameter against the searcher's metric (with
its JSON feed), and an ASHA search's trials by rung, refreshed in place while it runs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from master.api.deps import ObjectId, SessionDep
from master.core import search_views as pictures
from master.db.models import ExperimentState
from master.services import search_views
from master.web.common import WebRoute, WebSessionDep, is_htmx, json_response, page_response

router = APIRouter(route_class=WebRoute)


@router.get("/ui/experiments/{experiment_id}/hyperparameters")
async def hyperparameters_page(
    request: Request, experiment_id: ObjectId, session: SessionDep, web: WebSessionDep
) -> Response:
    found = await search_views.hyperparameter_view(session, experiment_id)
    scatters, parallel = [], None
    if found.metric:
        shape = (found.searched, found.outcomes, found.metric, found.smaller_is_better)
        scatters = pictures.scatter_plots(*shape)
        parallel = pictures.parallel_coordinates(*shape)
    context = {
        "nav": "experiments",
        "view": found.view,
        "found": found,
        "scatters": scatters,
        "parallel": parallel,
        "shown": pictures.shown,
        "value_at": pictures.value_at,
    }
    return page_response(request, "hyperparameters.html", context, web=web)


@router.get("/ui/experiments/{experiment_id}/hyperparameters.json")
async def hyperparameters_feed(
    experiment_id: ObjectId, session: SessionDep, _web: WebSessionDep
) -> Response:
    """The same as the page, as data: each trial's searched values and best metric."""
    found = await search_views.hyperparameter_view(session, experiment_id)
    return json_response(
        {
            "experimentId": experiment_id,
            "metric": found.metric,
            "smallerIsBetter": found.smaller_is_better,
            "bestTrialId": found.best.trial_id if found.best else None,
            "hyperparameters": [_searched_json(h) for h in found.searched],
            "constants": [{"name": c.name, "value": c.value} for c in found.constants],
            "trials": [
                {
                    "id": o.trial_id,
                    "state": o.state,
                    "metric": o.metric,
                    "values": {
                        h.name: pictures.value_at(o.hparams, h.path) for h in found.searched
                    },
                }
                for o in found.outcomes
            ],
        }
    )


def _searched_json(h: pictures.SearchedHyperparameter) -> dict[str, Any]:
    if h.kind == "categorical":
        return {"name": h.name, "type": h.kind, "categories": list(h.categories)}
    shape: dict[str, Any] = {"name": h.name, "type": h.kind, "min": h.low, "max": h.high}
    if h.kind == "log":
        shape["base"] = h.base
    return shape


@router.get("/ui/experiments/{experiment_id}/rungs")
async def rungs_page(
    request: Request, experiment_id: ObjectId, session: SessionDep, web: WebSessionDep
) -> Response:
    """The page, or for htmx's refresh while the search runs only the picture."""
    found = await search_views.rung_view(session, experiment_id)
    context = {
        "nav": "experiments",
        "view": found.view,
        "found": found,
        "polling": not ExperimentState(found.view.experiment.state).is_terminal,
    }
    template = "rungs_live.html" if is_htmx(request) else "rungs.html"
    return page_response(request, template, context, web=web)
