"""Tasks and the job queue: commands, notebooks, shells and TensorBoards (each with its page,
logs and kill), every allocation with its state and pending reason, and the jobs'
priorities, changed through the same service as `det job update`."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession

from master.api.deps import MAX_INT, SessionDep
from master.core import roles
from master.db.models import AllocationState, TaskType
from master.errors import MasterError, NotFound
from master.services import access, experiments, interactive, logs, tasks
from master.services.interactive import TaskRow
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
from master.web.experiments import LogsAfter, LogsLimit, LogsRank, log_feed

router = APIRouter(route_class=WebRoute)

TasksPaging = Annotated[Paging, Depends(paging_by(50))]
INTERACTIVE_PER_PAGE = 25
InteractivePage = Annotated[int, Query(ge=1, le=MAX_INT // INTERACTIVE_PER_PAGE)]
TaskId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[^\x00/]*$")]
RECENT_FAILURES = timedelta(hours=1)
NOTICES = {
    "priority": "Priority changed; the next scheduling pass reorders the queue.",
    "killed": "Kill requested: the task stops once its process has exited.",
}
# Served through /proxy/<id>/ to their owner. A shell serves no page: it is reached by ssh
# through `det shell open ID`, which its page shows its owner (as Determined's web UI does).
OPENABLE = (TaskType.NOTEBOOK, TaskType.TENSORBOARD)


def can_connect(row: TaskRow, web: WebSession) -> bool:
    """Whether to show the owner of a shell that has not ended how to reach it: `det shell
    open` waits for a pending shell to run, so the command holds from the start."""
    return (
        row.task.type == TaskType.SHELL
        and row.allocation.state not in (AllocationState.TERMINATED, AllocationState.TERMINATING)
        and row.task.owner_id == web.user_id
    )


def can_open(row: TaskRow, web: WebSession) -> bool:
    """Whether to link the task's own page: one that serves one and runs, for its owner,
    the only one the proxy lets in (see master/api/routes/proxy.py)."""
    return (
        row.task.type in OPENABLE
        and row.allocation.state == AllocationState.RUNNING
        and row.task.owner_id == web.user_id
    )


async def _context(
    session: AsyncSession,
    actor: access.Actor,
    paged: Paging,
    interactive_page: int = 1,
    *,
    with_jobs: bool = True,
) -> dict[str, Any]:
    # Trials that ended in an error lately stay listed, with why (as `det task list`).
    allocations = await tasks.list_tasks(
        session,
        failed_within=RECENT_FAILURES,
        readable=await access.readable(session, actor, "allocations"),
    )
    shown = slice_page(allocations, paged)
    # The 3-second refresh (tasks_live.html) shows tasks and allocations only.
    jobs = await tasks.list_jobs(session) if with_jobs else []
    if jobs:
        seen = await access.sight(session, actor, roles.VIEW_EXPERIMENT_METADATA)
        jobs = [j for j in jobs if seen.sees(j.workspace_id, j.experiment.owner_id)]
    task_rows = await interactive.list_tasks(
        session, newest_first=True, readable=await access.readable(session, actor, "tasks")
    )
    task_paged = Paging(interactive_page, INTERACTIVE_PER_PAGE)
    shown_tasks = slice_page(task_rows, task_paged)
    return {
        "nav": "tasks",
        "tasks": shown,
        "pager": page_links(
            "/ui/tasks",
            paged,
            len(allocations),
            len(shown),
            {"interactive_page": interactive_page if interactive_page > 1 else None},
        ),
        "interactive": shown_tasks,
        "interactive_pager": page_links(
            "/ui/tasks",
            task_paged,
            len(task_rows),
            len(shown_tasks),
            {"page": paged.page if paged.page > 1 else None, "per_page": paged.per_page},
            page_param="interactive_page",
            per_page_param=None,
        ),
        # Jobs are one per experiment with queued or running trials: a short list.
        "jobs": jobs,
        "can_open": can_open,
        "can_connect": can_connect,
    }


@router.get("/ui/tasks")
async def tasks_page(
    request: Request,
    session: SessionDep,
    web: WebSessionDep,
    paged: TasksPaging,
    interactive_page: InteractivePage = 1,
    notice: str = "",
) -> Response:
    live = is_htmx(request)
    context = await _context(session, web.actor, paged, interactive_page, with_jobs=not live)
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
    context = await _context(session, web.actor, Paging(1, 50))
    context.update(notice=None, error=exc.message)
    return page_response(request, "tasks.html", context, web=web)


# -- one command, notebook, shell or TensorBoard -----------------------------------------


async def _task_context(session: AsyncSession, task_id: str) -> dict[str, Any]:
    row = await interactive.get_task(session, task_id)
    state = AllocationState(row.allocation.state)
    return {
        "nav": "tasks",
        "row": row,
        "kind": row.task.type.lower(),
        "ended": state == AllocationState.TERMINATED,
        "can_kill": state not in (AllocationState.TERMINATED, AllocationState.TERMINATING),
        "can_open": can_open,
        "can_connect": can_connect,
    }


@router.get("/ui/tasks/{task_id}")
async def task_page(
    request: Request,
    task_id: TaskId,
    session: SessionDep,
    web: WebSessionDep,
    notice: str = "",
) -> Response:
    """The task's facts, its open and kill actions, and its logs followed live; an htmx
    refresh gets the facts alone (task_live.html)."""
    context = await _task_context(session, task_id)
    context["notice"] = NOTICES.get(notice)
    template = "task_live.html" if is_htmx(request) else "task.html"
    return page_response(request, template, context, web=web)


@router.get("/ui/tasks/{task_id}/logs.json")
async def task_logs(
    task_id: TaskId,
    session: SessionDep,
    _web: WebSessionDep,
    after: LogsAfter = None,
    rank: LogsRank = None,
    limit: LogsLimit = 500,
) -> Response:
    await interactive.get_task(session, task_id)  # 404 for a trial's task id too
    target = await logs.get_task_target(session, task_id)
    return await log_feed(session, target, after, rank, limit)


@router.post("/ui/tasks/{task_id}/kill")
async def kill_task(
    request: Request, task_id: TaskId, session: SessionDep, web: WebSessionDep
) -> Response:
    await checked_form(request, web)
    try:
        await interactive.kill_task(session, web.actor, task_id)
    except NotFound:
        raise
    except MasterError as exc:
        # Shown on the task's page with the API's status (403 for another user's task);
        # the rollback leaves the task as it was.
        await session.rollback()
        context = await _task_context(session, task_id)
        context["error"] = exc.message
        return page_response(request, "task.html", context, web=web, status=exc.http_status)
    return redirect(f"/ui/tasks/{quote(task_id, safe='')}?notice=killed")
