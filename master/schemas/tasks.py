"""Commands, notebooks, shells and TensorBoards on the wire, as Determined's API sends them
(v1Command, v1Notebook, v1Shell, v1Tensorboard), with resolute's additions."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from master.core.task_config import proxy_prefix
from master.db.models import MAX_INT, AllocationState, TaskType
from master.schemas.cluster import iso
from master.services.interactive import TaskRow
from resolute.shell_access import shell_keys

# Determined's taskv1State: its commands are QUEUED, never PENDING.
_STATE = {
    AllocationState.PENDING: "STATE_QUEUED",
    AllocationState.ASSIGNED: "STATE_PULLING",
    AllocationState.PULLING: "STATE_PULLING",
    AllocationState.STARTING: "STATE_STARTING",
    AllocationState.RUNNING: "STATE_RUNNING",
    AllocationState.TERMINATING: "STATE_TERMINATING",
    AllocationState.TERMINATED: "STATE_TERMINATED",
}
WIRE_KEY = {
    TaskType.COMMAND: "command",
    TaskType.NOTEBOOK: "notebook",
    TaskType.SHELL: "shell",
    TaskType.TENSORBOARD: "tensorboard",
}


class TaskCreate(BaseModel):
    """POST /api/v1/commands (notebooks, shells, tensorboards): Determined's body."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    config: dict[str, Any] | str | None = None
    template_name: str | None = Field(default=None, alias="templateName")
    workspace_id: int | None = Field(default=None, alias="workspaceId", ge=0, le=MAX_INT)
    # TensorBoards only.
    experiment_ids: list[Annotated[int, Field(ge=0, le=MAX_INT)]] = Field(
        default_factory=list, alias="experimentIds"
    )
    trial_ids: list[Annotated[int, Field(ge=0, le=MAX_INT)]] = Field(
        default_factory=list, alias="trialIds"
    )
    # The context directory (`-c DIR`): v1File entries, checked by the service.
    files: list[Any] = Field(default_factory=list)
    data: Any = None


def task_view(row: TaskRow, viewer_id: int | None = None) -> dict[str, Any]:
    """`viewer_id`: who asks. A shell's private key goes to its owner alone."""
    task, allocation = row.task, row.allocation
    state = AllocationState(allocation.state)
    container = None
    if state not in (AllocationState.PENDING, AllocationState.TERMINATED):
        container = {
            "id": allocation.id,
            "state": _STATE[state],
            "devices": [],
        }
    view: dict[str, Any] = {
        "id": task.uuid,
        "description": task.description,
        "state": _STATE[state],
        "container": container,
        "username": row.username,
        "displayName": row.username,
        "userId": task.owner_id,
        "resourcePool": task.resource_pool,
        "exitStatus": _exit_status(row),
        "jobId": task.uuid,
        "workspaceId": task.workspace_id,
        "startTime": iso(task.created_at),
        # resolute additions: the type, why it waits or how it ended, its idle clock.
        "taskType": task.type,
        "allocationId": allocation.id,
        "slots": allocation.slots_needed,
        "priority": task.priority,
        "pendingReason": allocation.pending_reason if state == AllocationState.PENDING else "",
        "exitCode": task.exit_code,
        "endReason": task.end_reason if state == AllocationState.TERMINATED else "",
        "endTime": iso(task.ended_at),
        "idleTimeoutSeconds": task.idle_timeout_s,
        "lastActivityTime": iso(task.last_activity_at),
    }
    if task.type != TaskType.COMMAND:
        view["serviceAddress"] = proxy_prefix(task.uuid)
    if task.type == TaskType.TENSORBOARD:
        view["experimentIds"] = list(task.experiment_ids)
        view["trialIds"] = list(task.trial_ids)
    if task.type == TaskType.SHELL:
        view.update(_ssh_access(row, viewer_id))
    return view


def _ssh_access(row: TaskRow, viewer_id: int | None) -> dict[str, Any]:
    """What Determined's `det shell start` runs ssh with. The shell server accepts any login
    name with the key; the owner's is shown because the shell runs as the agent's rank user,
    which only the agent knows."""
    keys = shell_keys(row.task.secret)
    access: dict[str, Any] = {
        "publicKey": keys.public_openssh,
        "agentUserGroup": {"user": row.username},
    }
    if viewer_id == row.task.owner_id:
        access["privateKey"] = keys.private_openssh
    return access


def _exit_status(row: TaskRow) -> str:
    if row.allocation.state != AllocationState.TERMINATED:
        return ""
    code = row.task.exit_code
    reason = row.task.end_reason
    return f"exit code {code}: {reason}" if code is not None else reason


def task_summary(row: TaskRow, ready: bool) -> dict[str, Any]:
    """GET /api/v1/tasks/<id>: Determined's v1Task, whose allocation's isReady its CLI
    waits on before it says a notebook is ready."""
    task, allocation = row.task, row.allocation
    state = AllocationState(allocation.state)
    return {
        "taskId": task.uuid,
        "taskType": f"TASK_TYPE_{task.type}",
        "startTime": iso(task.created_at),
        "endTime": iso(task.ended_at),
        "allocations": [
            {
                "allocationId": allocation.id,
                "taskId": task.uuid,
                "state": _STATE[state],
                "slots": allocation.slots_needed,
                "isReady": ready,
                "startTime": iso(allocation.assigned_at),
                "endTime": iso(allocation.ended_at),
                "exitReason": allocation.exit_reason,
            }
        ],
    }
