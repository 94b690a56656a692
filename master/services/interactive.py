"""Commands, notebooks, shells and TensorBoards: tasks that are not trials.

A task has one allocation ("<uuid>.1"), scheduled by the same pass as trials (slots,
priority, pool, fitting, pending reasons), started by the agent hub as one process on one
agent, and never run again: an agent lost, a failed start or a kill ends it for good, with
its exit code and the reason kept on the task row. Everything here leaves the commit to
the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid as uuid_module
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import ColumnElement, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.core import images, roles, task_config
from master.core.credentials import new_token
from master.core.expconf import parse_yaml
from master.core.merge import merge_template
from master.db.models import (
    AllocationModel,
    AllocationState,
    ExperimentModel,
    TaskContextModel,
    TaskLogModel,
    TaskModel,
    TaskType,
    TrialModel,
    UserModel,
    utcnow,
)
from master.db.session import session_scope
from master.errors import Conflict, InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from master.services import access, allocations, bind_mounts, pool_bindings, workspaces
from master.services.access import Actor
from master.services.configs import config_errors_as_invalid_argument
from master.services.loops import Loop
from master.services.model_definitions import pack_model_definition
from master.services.templates import get_template, refuse_hidden_secrets
from master.settings import MasterSettings

log = logging.getLogger(__name__)

# How often the proxy's traffic is written to a task's row: the idle clock is this coarse.
ACTIVITY_WRITE_S = 5.0
MAX_SOURCES_PER_TENSORBOARD = 100
# What the proxy tells a client without a login (or one that may not come without).
SIGN_IN_FIRST = "sign in first: open /ui/login, or send an API token"


@dataclass(frozen=True)
class TaskRequest:
    type: TaskType
    config: dict[str, Any] | str | None = None
    template_name: str | None = None
    workspace_id: int | None = None
    experiment_ids: tuple[int, ...] = ()
    trial_ids: tuple[int, ...] = ()
    # The context directory as Determined's client sends it (v1File entries).
    files: Any = None


@dataclass(frozen=True)
class TaskRow:
    task: TaskModel
    allocation: AllocationModel
    username: str


@dataclass(frozen=True)
class ProxyTarget:
    task_uuid: str
    address: str
    port: int
    secret: str

    @property
    def base_url(self) -> str:
        return server_url(self.address, self.port)


def server_url(address: str, port: int) -> str:
    """Where a task's server listens, as a URL (an IPv6 address in brackets)."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def _user_config(request: TaskRequest) -> dict[str, Any]:
    if isinstance(request.config, str):
        with config_errors_as_invalid_argument("config"):
            raw = parse_yaml(request.config) if request.config.strip() else {}
    else:
        raw = dict(request.config or {})
    if not isinstance(raw, dict):
        raise InvalidArgument("config: must be a mapping of keys to values")
    refuse_hidden_secrets(raw, "config")
    return raw


async def create_task(
    session: AsyncSession, owner: UserModel, request: TaskRequest, settings: MasterSettings
) -> TaskRow:
    """Validate, merge the template, queue. Raises a 4xx error naming the field; what it
    names that the owner may not read (template, workspace, a TensorBoard's experiments and
    trials) as if it did not exist."""
    kind = TaskType(request.type)
    actor = Actor.of(owner)
    raw = _user_config(request)
    with config_errors_as_invalid_argument("config"):
        task_config.validate_task_config(raw, "" if request.template_name else kind)
    merged = raw
    if request.template_name:
        await access.check_readable(session, actor, "template_name", request.template_name)
        merged = merge_template((await get_template(session, request.template_name)).config, raw)
    with config_errors_as_invalid_argument(
        "config" + (" after the template merge" if request.template_name else "")
    ):
        config = task_config.validate_task_config(merged, kind)
    experiment_ids, trial_ids = await _tensorboard_sources(
        session, actor, kind, request.experiment_ids, request.trial_ids
    )
    # Checked and packed as an experiment's model definition, with the same limit.
    context = pack_model_definition(request.files, settings.max_model_definition_bytes, "files")
    if request.workspace_id:
        await access.check_readable(session, actor, "workspace_id", str(request.workspace_id))
    workspace = await workspaces.resolve_workspace(session, request.workspace_id)
    await access.require_creator(
        session,
        actor,
        workspace,
        roles.CREATE_NSC,
        f"start a {kind.lower()} in workspace {workspace.name!r}",
    )
    pool = await pool_bindings.choose_pool(
        session, settings, workspace, config.resources.resource_pool, config.resources.slots
    )
    priority = config.resources.priority or pool.scheduler.default_priority
    defaults = settings.container_defaults(pool.pool_name)
    stored = images.with_default_image(
        config.model_dump(mode="json", exclude_none=True),
        defaults.image,
        defaults.force_pull_image,
    )
    if pool.require_image:
        problem = images.required_image_problem(stored, pool.pool_name)
        if problem:
            raise InvalidArgument(problem)
    stored["resources"].update(resource_pool=pool.pool_name, priority=priority)
    # A task's mounts and /dev/shm are a trial's, checked the same way before it queues.
    with config_errors_as_invalid_argument("config"):
        await bind_mounts.check_bind_mounts(session, pool.pool_name, stored, context.archive)
    now = utcnow()
    task = TaskModel(
        uuid=str(uuid_module.uuid4()),
        type=kind,
        description=task_config.describe(kind, config, experiment_ids, trial_ids),
        owner_id=owner.id,
        workspace_id=workspace.id,
        config=stored,
        template_name=request.template_name,
        resource_pool=pool.pool_name,
        priority=priority,
        experiment_ids=list(experiment_ids),
        trial_ids=list(trial_ids),
        secret=new_token(),
        idle_timeout_s=task_config.idle_timeout_s(config, kind, pool.idle_timeout_s),
        last_activity_at=now,
        created_at=now,
        end_reason="",
    )
    session.add(task)
    await session.flush()
    if context.file_count:
        session.add(
            TaskContextModel(
                task_id=task.id,
                archive=context.archive,
                size_bytes=context.size_bytes,
                file_count=context.file_count,
            )
        )
    allocation = AllocationModel(
        id=f"{task.uuid}.1",
        task_id=task.id,
        state=AllocationState.PENDING,
        resource_pool=pool.pool_name,
        slots_needed=config.resources.slots,
        single_node=True,  # one process on one agent
        registered_at=now,
        pending_code=allocations.FIRST_PENDING_CODE,
        pending_reason=allocations.FIRST_PENDING_REASON,
    )
    session.add(allocation)
    allocations.request_scheduling(session)
    await session.flush()
    log.info(
        "%s %s queued for %s (%d slots)", kind, task.uuid, owner.username, allocation.slots_needed
    )
    return TaskRow(task, allocation, owner.username)


async def _tensorboard_sources(
    session: AsyncSession,
    actor: Actor,
    kind: TaskType,
    experiment_ids: Sequence[int],
    trial_ids: Sequence[int],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A TensorBoard's experiments and single trials (Determined's -t), each found."""
    if kind != TaskType.TENSORBOARD:
        for field, given in (("experimentIds", experiment_ids), ("trialIds", trial_ids)):
            if given:
                raise InvalidArgument(f"{field}: only a TensorBoard shows metrics, not a {kind}")
        return (), ()
    experiments = tuple(dict.fromkeys(experiment_ids))
    trials = tuple(dict.fromkeys(trial_ids))
    if not experiments and not trials:
        raise InvalidArgument(
            "experimentIds, trialIds: a TensorBoard needs at least one experiment or trial"
        )
    if len(experiments) + len(trials) > MAX_SOURCES_PER_TENSORBOARD:
        raise InvalidArgument(
            f"experimentIds, trialIds: at most {MAX_SOURCES_PER_TENSORBOARD} experiments and "
            "trials per TensorBoard"
        )
    readable = await access.readable(session, actor, "experiments")
    for field, model, noun, ids in (
        ("experimentIds", ExperimentModel, "experiment", experiments),
        ("trialIds", TrialModel, "trial", trials),
    ):
        if not ids:
            continue
        query = select(model.id).where(model.id.in_(ids))
        if model is TrialModel:
            query = query.join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
        # One the owner may not read is named as missing.
        found = set((await session.scalars(query.where(readable))).all())
        missing = [str(i) for i in ids if i not in found]
        if missing:
            raise NotFound(f"{field}: {noun} {', '.join(missing)} not found")
    return experiments, trials


async def get_task(session: AsyncSession, task_uuid: str) -> TaskRow:
    row = (
        await session.execute(
            select(TaskModel, AllocationModel, UserModel.username)
            .join(AllocationModel, AllocationModel.task_id == TaskModel.id)
            .join(UserModel, UserModel.id == TaskModel.owner_id)
            .where(TaskModel.uuid == task_uuid)
        )
    ).first()
    if row is None:
        raise NotFound(f"task {task_uuid} not found")
    return TaskRow(*row)


async def list_tasks(
    session: AsyncSession,
    kind: TaskType | None = None,
    *,
    owner_id: int | None = None,
    include_ended: bool = True,
    newest_first: bool = False,
    readable: ColumnElement[bool] | None = None,
) -> list[TaskRow]:
    query = (
        select(TaskModel, AllocationModel, UserModel.username)
        .join(AllocationModel, AllocationModel.task_id == TaskModel.id)
        .join(UserModel, UserModel.id == TaskModel.owner_id)
        .order_by(TaskModel.id.desc() if newest_first else TaskModel.id)
    )
    if kind is not None:
        query = query.where(TaskModel.type == kind)
    if owner_id is not None:
        query = query.where(TaskModel.owner_id == owner_id)
    if readable is not None:
        query = query.where(readable)
    if not include_ended:
        query = query.where(AllocationModel.state != AllocationState.TERMINATED)
    return [TaskRow(*row) for row in (await session.execute(query)).all()]


async def kill_task(
    session: AsyncSession, actor: Actor, task_uuid: str, reason: str = ""
) -> TaskRow:
    """Stop it: a queued task ends at once; a running one once its process has exited
    (the agent's exit releases it). Killing an ended task changes nothing."""
    await allocations.hold_scheduler(session)
    row = await get_task(session, task_uuid)
    label = f"{row.task.type.lower()} {row.task.uuid}"
    await access.require_task_owner(
        session, actor, row.task.owner_id, row.task.workspace_id, label, "kill it"
    )
    await _stop(session, row, reason or f"killed by {actor.username}")
    return row


async def _stop(session: AsyncSession, row: TaskRow, reason: str) -> None:
    allocation = await allocations.get_allocation(session, row.allocation.id)
    task = row.task
    if allocation.state == AllocationState.TERMINATED:
        return
    if not task.end_reason:
        task.end_reason = reason
    if allocation.state == AllocationState.PENDING:
        allocation.state = AllocationState.TERMINATED
        allocation.ended_at = task.ended_at = utcnow()
        allocation.exit_reason = f"killed: {reason}"
        allocations.request_scheduling(session)
        return
    allocation.preempt_requested = True
    allocation.state = AllocationState.TERMINATING
    allocations.request_scheduling(session)
    session.info[allocations.WAKE_HUB] = True


async def finish_task(
    session: AsyncSession,
    allocation: AllocationModel,
    outcome: allocations.ReleaseOutcome,
    message: str,
    exit_code: int | None,
) -> None:
    """The task's process is gone: keep how it ended (the allocation is TERMINATED)."""
    task = await session.get(TaskModel, allocation.task_id)
    if task is None:
        return
    task.ended_at = utcnow()
    task.exit_code = exit_code
    if not task.end_reason:
        if outcome == allocations.ReleaseOutcome.COMPLETED and not exit_code:
            task.end_reason = "exited"
        else:
            task.end_reason = f"{outcome}: {message}" if message else str(outcome)
            last = await _last_error_line(session, allocation.id)
            if last and exit_code:
                task.end_reason += f"; last output: {last}"


async def _last_error_line(session: AsyncSession, allocation_id: str) -> str:
    """What a process that failed at once said last (a missing Jupyter, a typo'd command)."""
    line = await session.scalar(
        select(TaskLogModel.message)
        .where(
            TaskLogModel.allocation_id == allocation_id,
            TaskLogModel.stdtype.in_(("stderr", "stdout")),
        )
        .order_by(TaskLogModel.id.desc())
        .limit(1)
    )
    return (line or "").strip()[:500]


async def proxy_target(session: AsyncSession, actor: Actor, task_uuid: str) -> ProxyTarget:
    """Where the task's server listens, for its owner only (see master/api/routes/proxy.py
    for why not admins)."""
    row = await get_task(session, task_uuid)
    if actor.user_id != row.task.owner_id:
        if not await access.sees(
            session, actor, roles.VIEW_NSC, row.task.workspace_id, row.task.owner_id
        ):
            raise NotFound(f"task {task_uuid} not found")
        raise PermissionDenied(
            f"{row.task.type.lower()} {task_uuid} belongs to {row.username}: only its owner "
            "may open it"
        )
    return _running_target(row)


async def ssh_tunnel_target(session: AsyncSession, task_uuid: str) -> ProxyTarget:
    """Where a shell's SSH server listens, for a WebSocket without a login: Determined's
    `det shell start` tunnels ssh without one, and the shell's key is the credential
    (resolute.shell_access). Any other task wants the owner's login, and a client without
    one is not told whether it exists."""
    sign_in = Unauthenticated(SIGN_IN_FIRST)
    try:
        row = await get_task(session, task_uuid)
    except NotFound:
        raise sign_in from None
    if row.task.type != TaskType.SHELL:
        raise sign_in
    return _running_target(row)


def _running_target(row: TaskRow) -> ProxyTarget:
    task, allocation = row.task, row.allocation
    task_uuid = task.uuid
    if task.type == TaskType.COMMAND:
        raise InvalidArgument(f"command {task_uuid} serves nothing to proxy")
    state = AllocationState(allocation.state)
    if state == AllocationState.TERMINATED:
        raise Conflict(f"{task.type.lower()} {task_uuid} has ended: {task.end_reason or 'ended'}")
    if state != AllocationState.RUNNING or allocation.master_port is None:
        raise Conflict(
            f"{task.type.lower()} {task_uuid} is {state.lower()}, not running yet"
            + (f": {allocation.pending_reason}" if allocation.pending_reason else "")
        )
    return ProxyTarget(task.uuid, allocation.chief_address, allocation.master_port, task.secret)


async def is_serving(row: TaskRow, timeout_s: float = 0.5) -> bool:
    """Whether the task is ready: a command once it runs; a notebook, shell or TensorBoard
    once its server accepts connections on its port (Jupyter takes seconds to listen)."""
    allocation = row.allocation
    if allocation.state != AllocationState.RUNNING or allocation.master_port is None:
        return False
    if row.task.type == TaskType.COMMAND:
        return True
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(allocation.chief_address, allocation.master_port), timeout_s
        )
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def record_activity(session: AsyncSession, moments: dict[str, datetime]) -> None:
    """The proxy's traffic, batched: each task's latest moment, never moved back."""
    for task_uuid, moment in moments.items():
        await session.execute(
            update(TaskModel)
            .where(TaskModel.uuid == task_uuid, TaskModel.last_activity_at < moment)
            .values(last_activity_at=moment)
            .execution_options(synchronize_session=False)
        )


async def _idle_rows(session: AsyncSession, now: datetime) -> list[tuple[TaskRow, datetime]]:
    """Running tasks whose idle clock has passed their idle_timeout, and since when."""
    rows = (
        await session.execute(
            select(TaskModel, AllocationModel, UserModel.username)
            .join(AllocationModel, AllocationModel.task_id == TaskModel.id)
            .join(UserModel, UserModel.id == TaskModel.owner_id)
            .where(
                TaskModel.idle_timeout_s.is_not(None),
                AllocationModel.state == AllocationState.RUNNING,
                AllocationModel.preempt_requested.is_(False),
            )
        )
    ).all()
    idle = []
    for task, allocation, username in rows:
        assert task.idle_timeout_s is not None
        # The clock starts when the task runs, not when it was queued.
        since = max(task.last_activity_at, allocation.assigned_at or task.created_at)
        if now - since >= timedelta(seconds=task.idle_timeout_s):
            idle.append((TaskRow(task, allocation, username), since))
    return idle


@dataclass(frozen=True)
class NotebookProbe:
    task_uuid: str
    address: str
    port: int
    secret: str
    idle_type: str


async def idle_notebooks(session: AsyncSession, now: datetime | None = None) -> list[NotebookProbe]:
    """Notebooks idle by the proxy's clock, to ask Jupyter about before they are ended."""
    return [
        NotebookProbe(
            row.task.uuid,
            row.allocation.chief_address,
            row.allocation.master_port or 0,
            row.task.secret,
            str(row.task.config.get("notebook_idle_type", "kernels_or_terminals")),
        )
        for row, _ in await _idle_rows(session, now or utcnow())
        if row.task.type == TaskType.NOTEBOOK
    ]


async def notebook_in_use(probe: NotebookProbe) -> bool:
    """Determined's notebook_idle_type, asked of Jupyter itself: kernels_or_terminals (a
    kernel or terminal is open), kernel_connections (a kernel has a connection), activity
    (a kernel is running a cell). A Jupyter that does not answer is not in use."""
    base = f"{server_url(probe.address, probe.port)}{task_config.proxy_prefix(probe.task_uuid)}api"
    headers = {"Authorization": f"token {probe.secret}"}
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=2.0)) as client:
            kernels = (await client.get(f"{base}/kernels", headers=headers)).json()
            if probe.idle_type == "kernel_connections":
                return any(k.get("connections", 0) > 0 for k in kernels)
            if probe.idle_type == "activity":
                return any(k.get("execution_state") == "busy" for k in kernels)
            terminals = await client.get(f"{base}/terminals", headers=headers)
            open_terminals = terminals.json() if terminals.status_code == 200 else []
            return bool(kernels) or bool(open_terminals)
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return False


async def end_idle_tasks(session: AsyncSession, now: datetime | None = None) -> list[str]:
    """Ask every task idle past its idle_timeout to stop; returns their ids."""
    now = now or utcnow()
    ended: list[str] = []
    for row, since in await _idle_rows(session, now):
        if not ended:
            await allocations.hold_scheduler(session)
        assert row.task.idle_timeout_s is not None
        reason = (
            f"idle for {_seconds(row.task.idle_timeout_s)} (idle_timeout): no activity since "
            f"{since.isoformat(timespec='seconds')}"
        )
        await _stop(session, row, reason)
        ended.append(row.task.uuid)
        log.info("%s %s ends: %s", row.task.type.lower(), row.task.uuid, reason)
    return ended


def _seconds(value: float) -> str:
    return f"{value:g} s" if value < 120 else f"{value / 60:g} min"


class ActivityLog:
    """The proxy's traffic per task, kept in memory and written every few seconds: a
    notebook's every keystroke must not be a database write."""

    def __init__(self) -> None:
        self._latest: dict[str, datetime] = {}

    def touch(self, task_uuid: str) -> None:
        self._latest[task_uuid] = utcnow()

    def take(self) -> dict[str, datetime]:
        latest, self._latest = self._latest, {}
        return latest


class IdleLoop(Loop):
    """Writes the proxy's activity and ends tasks idle past their idle_timeout; their
    slots are free in the commit of the agent's exit report, and the scheduler is woken."""

    name = "idle-tasks"

    def __init__(
        self, factory: async_sessionmaker[AsyncSession], activity: ActivityLog, interval: float
    ) -> None:
        super().__init__(interval)
        self.factory = factory
        self.activity = activity

    async def run_once(self) -> None:
        moments = self.activity.take()
        try:
            async with session_scope(self.factory) as session:
                await record_activity(session, moments)
                probes = await idle_notebooks(session)
        except Exception:
            # Kept for the next round (newer moments win), so an outage loses no activity.
            for task_uuid, moment in moments.items():
                self.activity._latest.setdefault(task_uuid, moment)
            raise
        # Asked outside any transaction: Jupyter may take a moment to answer.
        in_use = [p.task_uuid for p in probes if await notebook_in_use(p)]
        async with session_scope(self.factory) as session:
            now = utcnow()
            await record_activity(session, dict.fromkeys(in_use, now))
            await end_idle_tasks(session, now)
