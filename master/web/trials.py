"""One trial's page: its state and why, hyperparameters, metric charts, logs by rank,
checkpoints (downloaded through the master) and its runs, each restart with its reason."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import ObjectId, SessionDep
from master.db.models import TrialState
from master.services import checkpoint_download, checkpoint_gc, experiments, search, trial_reports
from master.web.common import WebRoute, WebSessionDep, page_response
from master.web.experiments import MAX_RANK_CHOICES, slots_of

router = APIRouter(route_class=WebRoute)


async def _live_context(session: AsyncSession, trial_id: int) -> dict[str, Any]:
    trial = await experiments.get_trial(session, trial_id)
    view = await experiments.get_experiment(session, trial.experiment_id)
    summaries = await trial_reports.trial_summaries(session, [trial], view.experiment.config)
    metric, _smaller = trial_reports.searcher_metric(view.experiment.config)
    searches = (
        await search.trial_search_views(session, view.experiment)
        if search.is_asha_experiment(view.experiment)
        else {}
    )
    state = TrialState(trial.state)
    return {
        "nav": "experiments",
        "trial": trial,
        "view": view,
        "state": state,
        "reason": (await experiments.pending_reasons(session, [trial.id])).get(trial.id),
        "summary": summaries[trial.id],
        "metric": metric,
        "search": searches.get(trial.id),
        "runs": await experiments.trial_runs(session, trial.id),
        "polling": not state.is_terminal,
    }


@router.get("/ui/trials/{trial_id}")
async def trial_page(
    request: Request, trial_id: ObjectId, session: SessionDep, web: WebSessionDep
) -> Response:
    context = await _live_context(session, trial_id)
    slots = slots_of(context["view"])
    ranks = range(min(max(int(slots) if isinstance(slots, int) else 1, 1), MAX_RANK_CHOICES))
    context.update(
        ranks=ranks,
        checkpoints=await trial_reports.list_checkpoints(session, trial_id=trial_id),
        checkpoint_states=checkpoint_gc.SHOWN,
        downloadable=checkpoint_gc.ACTIVE,
    )
    return page_response(request, "trial.html", context, web=web)


@router.get("/ui/trials/{trial_id}/live")
async def trial_live(
    request: Request, trial_id: ObjectId, session: SessionDep, web: WebSessionDep
) -> Response:
    """The part of the page that changes while the trial runs: state, reason, runs."""
    context = await _live_context(session, trial_id)
    return page_response(request, "trial_live.html", context, web=web)


@router.get("/ui/checkpoints/{uuid}/download")
async def download_checkpoint(uuid: str, session: SessionDep, _web: WebSessionDep) -> Response:
    """The API's tar.gz download, for a signed-in browser (whose cookie the API ignores)."""
    filename, stream = await checkpoint_download.checkpoint_archive(session, uuid)
    return StreamingResponse(
        stream,
        media_type="application/gzip",
        headers={
            "Content-Disposition": f'attachment; filename="{filename}"',
            "Cache-Control": "no-store",
        },
    )
