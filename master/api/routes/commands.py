"""Commands, notebooks, shells and TensorBoards: Determined's /api/v1/commands,
/notebooks, /shells and /tensorboards, one set of routes per type over one service."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from master.api.deps import CurrentActor, CurrentUser, SessionDep, SettingsDep
from master.db.models import TaskType
from master.errors import InvalidArgument
from master.schemas.tasks import WIRE_KEY, TaskCreate, task_summary, task_view
from master.services import access, interactive
from resolute.storage import mask_config

router = APIRouter(prefix="/api/v1", tags=["Tasks"])

_PLURAL = {
    TaskType.COMMAND: "commands",
    TaskType.NOTEBOOK: "notebooks",
    TaskType.SHELL: "shells",
    TaskType.TENSORBOARD: "tensorboards",
}


async def _typed(session: SessionDep, kind: TaskType, task_id: str) -> interactive.TaskRow:
    row = await interactive.get_task(session, task_id)
    if row.task.type != kind:
        raise InvalidArgument(
            f"task {task_id} is a {row.task.type.lower()}, not a {kind.lower()}: use "
            f"/api/v1/{_PLURAL[TaskType(row.task.type)]}/{task_id}"
        )
    return row


def _routes(kind: TaskType) -> None:
    plural, key = _PLURAL[kind], WIRE_KEY[kind]

    async def create(
        body: TaskCreate, session: SessionDep, user: CurrentUser, settings: SettingsDep
    ) -> dict[str, Any]:
        request = interactive.TaskRequest(
            type=kind,
            config=body.config,
            template_name=body.template_name,
            workspace_id=body.workspace_id,
            experiment_ids=tuple(body.experiment_ids),
            trial_ids=tuple(body.trial_ids),
            files=body.files,
        )
        row = await interactive.create_task(session, user, request, settings)
        return {key: task_view(row, user.id), "config": mask_config(row.task.config)}

    async def list_all(
        session: SessionDep,
        actor: CurrentActor,
        users: list[str] = Query(default=[]),
        user_ids: list[int] = Query(default=[], alias="userIds"),
    ) -> dict[str, Any]:
        readable = await access.readable(session, actor, "tasks")
        rows = await interactive.list_tasks(session, kind, readable=readable)
        if users or user_ids:
            rows = [r for r in rows if r.username in users or r.task.owner_id in user_ids]
        return {plural: [task_view(r) for r in rows]}

    async def get_one(task_id: str, session: SessionDep, user: CurrentUser) -> dict[str, Any]:
        row = await _typed(session, kind, task_id)
        return {key: task_view(row, user.id), "config": mask_config(row.task.config)}

    async def kill(task_id: str, session: SessionDep, actor: CurrentActor) -> dict[str, Any]:
        await _typed(session, kind, task_id)
        row = await interactive.kill_task(session, actor, task_id)
        return {key: task_view(row)}

    router.add_api_route(f"/{plural}", create, methods=["POST"], name=f"create {key}")
    router.add_api_route(f"/{plural}", list_all, methods=["GET"], name=f"list {plural}")
    router.add_api_route(f"/{plural}/{{task_id}}", get_one, methods=["GET"], name=f"get {key}")
    router.add_api_route(f"/{plural}/{{task_id}}/kill", kill, methods=["POST"], name=f"kill {key}")


for _kind in TaskType:
    _routes(_kind)


@router.get("/tasks/{task_id}")
async def get_task(task_id: str, session: SessionDep, _user: CurrentUser) -> dict[str, Any]:
    """A command's, notebook's, shell's or TensorBoard's task and its allocation."""
    row = await interactive.get_task(session, task_id)
    await session.commit()  # the readiness probe must not hold a database connection
    return {"task": task_summary(row, await interactive.is_serving(row))}
