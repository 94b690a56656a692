"""Tasks and the job queue: every allocation with its state and pending reason, and the
jobs' priorities, changed through the same service as `det job update`."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import SessionDep
from master.errors import MasterError
from master.services import access, experiments, tasks
from master.web.common import (
    Paging,
    WebRoute,
    WebSession,
    WebSessionDep,
    checked_form,
    is_htmx,
    page_links,
    page_response,
    paging_by,
    parse_int,
    redirect,
    slice_page,
)

router = APIRouter(route_class=WebRoute)

TasksPaging = Annotated[Paging, Depends(paging_by(50))]
RECENT_FAILURES = timedelta(hours=1)
NOTICES = {"priority": "Priority changed; the next scheduling pass reorders the queue."}


async def _context(
    session: AsyncSession, paged: Paging, *, with_jobs: bool = True
) -> dict[str, Any]:
    # Trials that ended in an error lately stay listed, with why (as `det task list`).
    allocations = await tasks.list_tasks(session, failed_within=RECENT_FAILURES)
    shown = slice_page(allocations, paged)
    # The 3-second refresh (tasks_live.html) shows allocations only.
    jobs = await tasks.list_jobs(session) if with_jobs else []
    return {
        "nav": "tasks",
        "tasks": shown,
        "pager": page_links("/ui/tasks", paged, len(allocations), len(shown)),
        # Jobs are one per experiment with queued or running trials: a short list.
        "jobs": jobs,
    }


@router.get("/ui/tasks")
async def tasks_page(
    request: Request,
    session: SessionDep,
    web: WebSessionDep,
    paged: TasksPaging,
    notice: str = "",
) -> Response:
    live = is_htmx(request)
    context = await _context(session, paged, with_jobs=not live)
    context["notice"] = NOTICES.get(notice)
    template = "tasks_live.html" if live else "tasks.html"
    return page_response(request, template, context, web=web)


@router.post("/ui/jobs/{job_id}/priority")
async def set_priority(
    request: Request, job_id: str, session: SessionDep, web: WebSessionDep
) -> Response:
    form = await checked_form(request, web)
    try:
        priority = parse_int(form, "priority", 1, 99)
        await access.require_job_owner(session, web.actor, job_id, "change its priority")
        await experiments.set_job_priority(session, job_id, priority, web.username)
    except MasterError as exc:
        await session.rollback()
        return await _page_with_error(request, session, web, exc)
    return redirect("/ui/tasks?notice=priority")


async def _page_with_error(
    request: Request, session: AsyncSession, web: WebSession, exc: MasterError
) -> Response:
    context = await _context(session, Paging(1, 50))
    context.update(notice=None, error=exc.message)
    return page_response(request, "tasks.html", context, web=web)
