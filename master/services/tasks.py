"""Read models of the queue for `det task list`, `det job list` and the resource pools."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import (
    AgentModel,
    AllocationModel,
    AllocationSlotModel,
    AllocationState,
    ExperimentModel,
    ProjectModel,
    SlotModel,
    TaskModel,
    TrialModel,
    TrialState,
    UserModel,
    WorkspaceModel,
    utcnow,
)
from master.services.allocations import HELD_STATES, task_id
from master.settings import MasterSettings, ResourcePoolSettings

ACTIVE_STATES = (AllocationState.PENDING, *HELD_STATES)


@dataclass
class TaskView:
    allocation: AllocationModel
    task_id: str
    name: str
    priority: int
    # agent id -> slot ids held there
    slots: dict[str, list[int]] = field(default_factory=dict)
    task_type: str = "TRIAL"  # or COMMAND, NOTEBOOK, SHELL, TENSORBOARD
    # Its experiment's project's, or the task's own: the one its quota counts it in.
    workspace_id: int | None = None
    workspace_name: str = ""


async def list_tasks(
    session: AsyncSession,
    pool: str | None = None,
    failed_within: timedelta | None = None,
    readable: ColumnElement[bool] | None = None,
) -> list[TaskView]:
    """Every allocation that waits or holds resources, oldest first; with `failed_within`,
    also those that ended that recently with their trial in ERROR (so a trial that could
    not start still shows why in `det task list` after it is gone)."""
    wanted: ColumnElement[bool] = AllocationModel.state.in_(ACTIVE_STATES)
    if failed_within is not None:
        wanted = wanted | (
            (AllocationModel.state == AllocationState.TERMINATED)
            & (AllocationModel.ended_at >= utcnow() - failed_within)
            & ((TrialModel.state == TrialState.ERROR) | (TaskModel.exit_code != 0))
        )
    query = (
        select(
            AllocationModel,
            TrialModel,
            ExperimentModel.name,
            TaskModel,
            func.coalesce(ExperimentModel.priority, TaskModel.priority),
            WorkspaceModel.id,
            WorkspaceModel.name,
        )
        .outerjoin(TrialModel, TrialModel.id == AllocationModel.trial_id)
        .outerjoin(ExperimentModel, ExperimentModel.id == AllocationModel.experiment_id)
        .outerjoin(TaskModel, TaskModel.id == AllocationModel.task_id)
        .outerjoin(ProjectModel, ProjectModel.id == ExperimentModel.project_id)
        .outerjoin(
            WorkspaceModel,
            WorkspaceModel.id == func.coalesce(ProjectModel.workspace_id, TaskModel.workspace_id),
        )
        .where(wanted)
        .order_by(AllocationModel.registered_at, AllocationModel.id)
    )
    if pool is not None:
        query = query.where(AllocationModel.resource_pool == pool)
    if readable is not None:
        query = query.where(readable)
    rows = (await session.execute(query)).all()
    held: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for agent_id, slot_id, allocation_id in (
        await session.execute(
            select(
                AllocationSlotModel.agent_id,
                AllocationSlotModel.slot_id,
                AllocationSlotModel.allocation_id,
            ).order_by(AllocationSlotModel.agent_id, AllocationSlotModel.slot_id)
        )
    ).all():
        held[allocation_id][agent_id].append(slot_id)
    views = []
    for allocation, trial, experiment_name, task, priority, ws_id, ws_name in rows:
        slots = dict(held.get(allocation.id, {}))
        if allocation.zero_slot_agent_id and not slots:
            slots = {allocation.zero_slot_agent_id: []}
        if trial is not None:
            shown_id = task_id(trial)
            name = f"Trial {trial.id} (Experiment {allocation.experiment_id}: {experiment_name})"
        else:
            shown_id, name = task.uuid, task.description
        views.append(
            TaskView(
                allocation=allocation,
                task_id=shown_id,
                name=name,
                priority=priority,
                slots=slots,
                task_type="TRIAL" if trial is not None else task.type,
                workspace_id=ws_id,
                workspace_name=ws_name or "",
            )
        )
    return views


@dataclass
class JobView:
    experiment: ExperimentModel
    username: str
    requested_slots: int
    allocated_slots: int
    queued: int
    scheduled: int
    workspace_id: int
    workspace_name: str


async def list_jobs(session: AsyncSession, pool: str | None = None) -> list[JobView]:
    """Experiments with trials in the queue or running, in queue order."""
    counts = (
        select(
            AllocationModel.experiment_id,
            func.sum(AllocationModel.slots_needed).label("requested"),
            func.count().filter(AllocationModel.state == AllocationState.PENDING).label("queued"),
            func.count().filter(AllocationModel.state != AllocationState.PENDING).label("held"),
            func.sum(AllocationModel.slots_needed)
            .filter(AllocationModel.state != AllocationState.PENDING)
            .label("allocated"),
        )
        .where(AllocationModel.state.in_(ACTIVE_STATES))
        .group_by(AllocationModel.experiment_id)
        .subquery()
    )
    query = (
        select(
            ExperimentModel,
            UserModel.username,
            WorkspaceModel.id.label("workspace_id"),
            WorkspaceModel.name.label("workspace_name"),
            counts,
        )
        .join(counts, counts.c.experiment_id == ExperimentModel.id)
        .join(UserModel, UserModel.id == ExperimentModel.owner_id)
        .join(ProjectModel, ProjectModel.id == ExperimentModel.project_id)
        .join(WorkspaceModel, WorkspaceModel.id == ProjectModel.workspace_id)
        .order_by(ExperimentModel.priority, ExperimentModel.start_time, ExperimentModel.id)
    )
    if pool is not None:
        query = query.where(ExperimentModel.resource_pool == pool)
    return [
        JobView(
            experiment=r[0],
            username=r[1],
            requested_slots=int(r.requested or 0),
            allocated_slots=int(r.allocated or 0),
            queued=int(r.queued or 0),
            scheduled=int(r.held or 0),
            workspace_id=r.workspace_id,
            workspace_name=r.workspace_name,
        )
        for r in (await session.execute(query)).all()
    ]


@dataclass
class PoolView:
    pool: ResourcePoolSettings
    agents: int
    slots_total: int
    slots_used: int
    slots_per_agent: int
    zero_slot_running: int


async def list_pools(session: AsyncSession, settings: MasterSettings) -> list[PoolView]:
    agent_counts = dict(
        (
            await session.execute(
                select(AgentModel.resource_pool, func.count()).group_by(AgentModel.resource_pool)
            )
        ).all()
    )
    slot_rows = (
        await session.execute(
            select(AgentModel.resource_pool, SlotModel.agent_id, func.count())
            .select_from(SlotModel)
            .join(AgentModel, AgentModel.id == SlotModel.agent_id)
            .where(SlotModel.enabled)
            .group_by(AgentModel.resource_pool, SlotModel.agent_id)
        )
    ).all()
    totals: dict[str, int] = defaultdict(int)
    sizes: dict[str, set[int]] = defaultdict(set)
    for pool_name, _agent, n in slot_rows:
        totals[pool_name] += n
        sizes[pool_name].add(n)
    used = dict(
        (
            await session.execute(
                select(AgentModel.resource_pool, func.count())
                .select_from(AllocationSlotModel)
                .join(AgentModel, AgentModel.id == AllocationSlotModel.agent_id)
                .group_by(AgentModel.resource_pool)
            )
        ).all()
    )
    zero = dict(
        (
            await session.execute(
                select(AllocationModel.resource_pool, func.count())
                .where(
                    AllocationModel.zero_slot_agent_id.is_not(None),
                    AllocationModel.state.in_(HELD_STATES),
                )
                .group_by(AllocationModel.resource_pool)
            )
        ).all()
    )
    return [
        PoolView(
            pool=p,
            agents=int(agent_counts.get(p.pool_name, 0)),
            slots_total=totals[p.pool_name],
            slots_used=int(used.get(p.pool_name, 0)),
            # Determined reports one size; a mixed pool reports its largest.
            slots_per_agent=max(sizes[p.pool_name], default=0),
            zero_slot_running=int(zero.get(p.pool_name, 0)),
        )
        for p in settings.resource_pools
    ]
