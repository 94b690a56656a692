"""The model registry's pages: the models, and a model with its versions, the checkpoint
each holds, and the trial, experiment and metrics that checkpoint came from. Read-only:
changes go through `det model` and the API."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from master.api.deps import SessionDep
from master.services import access, model_registry, trial_reports
from master.services.checkpoint_gc import SHOWN
from master.services.model_registry import ModelFilter
from master.web.common import PagingDep, WebRoute, WebSessionDep, page_links, page_response

router = APIRouter(route_class=WebRoute)


@router.get("/ui/models")
async def models_page(
    request: Request,
    session: SessionDep,
    web: WebSessionDep,
    paged: PagingDep,
    name: Annotated[str, Query(max_length=255)] = "",
    archived: bool = False,
) -> Response:
    filters = ModelFilter(name=name.strip() or None, archived=None if archived else False)
    rows, total = await model_registry.list_models(
        session,
        filters,
        sort_by="SORT_BY_NAME",
        offset=paged.offset,
        limit=paged.per_page,
        readable=await access.readable(session, web.actor, "models"),
    )
    params = {"name": name, "archived": "true" if archived else ""}
    context = {
        "nav": "models",
        "rows": rows,
        "name": name,
        "archived": archived,
        "pager": page_links("/ui/models", paged, total, len(rows), params),
    }
    return page_response(request, "models.html", context, web=web)


@router.get("/ui/models/{identifier}")
async def model_page(
    request: Request, identifier: str, session: SessionDep, web: WebSessionDep
) -> Response:
    model, versions, _ = await model_registry.list_versions(session, identifier)
    metrics = await trial_reports.checkpoint_metrics(session, [v.checkpoint for v in versions])
    rows: list[dict[str, Any]] = []
    for v in versions:
        c = v.checkpoint
        at_step = metrics.get((c.trial_id, c.steps_completed), {})
        rows.append(
            {
                "version": v.row,
                "username": v.username,
                "checkpoint": c,
                "state": SHOWN.get(c.state, c.state),
                "validation": at_step.get(trial_reports.VALIDATION, {}),
                "training": at_step.get(trial_reports.TRAINING, {}),
            }
        )
    context = {"nav": "models", "model": model, "versions": rows}
    return page_response(request, "model.html", context, web=web)
