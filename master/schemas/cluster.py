"""Wire shapes of agents, slots, tasks, jobs and pools, as Determined's client reads them."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import Field

from master.db.models import AgentMetricModel, AllocationState, SlotModel
from master.schemas.common import Pagination, WireInput
from master.services.agents import AgentView
from master.services.tasks import JobView, PoolView, TaskView
from master.settings import MasterSettings

DEVICE_TYPES = {"cpu": "TYPE_CPU", "cuda": "TYPE_CUDA", "rocm": "TYPE_ROCM"}
# What Determined's container states call each allocation state.
CONTAINER_STATES = {
    AllocationState.ASSIGNED: "STATE_ASSIGNED",
    AllocationState.PULLING: "STATE_PULLING",
    AllocationState.STARTING: "STATE_STARTING",
    AllocationState.RUNNING: "STATE_RUNNING",
    AllocationState.TERMINATING: "STATE_RUNNING",
}


def iso(value: Any) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def container_id(allocation_id: str, agent_id: str) -> str:
    return f"{allocation_id}@{agent_id}"


def device(slot: SlotModel) -> dict[str, Any]:
    return {
        "id": slot.slot_id,
        "brand": slot.brand,
        "uuid": slot.uuid,
        "type": DEVICE_TYPES.get(slot.device_type, "TYPE_UNSPECIFIED"),
    }


def agent(
    view: AgentView,
    allocation_states: dict[str, str],
    latest: AgentMetricModel | None = None,
) -> dict[str, Any]:
    a = view.agent
    slots: dict[str, Any] = {}
    containers: dict[str, Any] = {}
    type_stats: dict[str, Counter[str]] = {}
    brand_stats: dict[str, Counter[str]] = {}
    for slot in view.slots:
        entry: dict[str, Any] = {
            "id": str(slot.slot_id),
            "device": device(slot),
            "enabled": a.enabled and slot.enabled,
            "draining": a.draining,
        }
        holder = view.holders.get(slot.slot_id)
        if holder is not None:
            cid = container_id(holder, a.id)
            container = containers.setdefault(
                cid,
                {
                    "id": cid,
                    "parent": holder,
                    "state": CONTAINER_STATES.get(
                        AllocationState(allocation_states.get(holder, "ASSIGNED")),
                        "STATE_ASSIGNED",
                    ),
                    "devices": [],
                    "permissionDenied": False,
                },
            )
            container["devices"].append(device(slot))
            entry["container"] = container
        slots[str(slot.slot_id)] = entry
        for stats, key in ((type_stats, entry["device"]["type"]), (brand_stats, slot.brand)):
            counter = stats.setdefault(key, Counter())
            counter["total"] += 1
            counter["disabled"] += 0 if entry["enabled"] else 1
            counter["draining"] += 1 if a.draining else 0
    return {
        "id": a.id,
        "registeredTime": iso(a.registered_at),
        "version": a.version,
        "slots": slots,
        "containers": containers,
        "resourcePools": [a.resource_pool],
        "enabled": a.enabled,
        "draining": a.draining,
        "addresses": a.addresses,
        "slotStats": {
            "typeStats": {k: _device_stats(v) for k, v in type_stats.items()},
            "brandStats": {k: _device_stats(v) for k, v in brand_stats.items()},
        },
        # resolute additions
        "connected": a.connected,
        # enrolled: it holds a secret of its own, which alone admits its id from now on;
        # revoked: `det agent revoke` shut the id out.
        "enrolled": a.credential_confirmed,
        "revoked": a.revoked_at is not None,
        "hostname": a.hostname,
        "lastSeenTime": iso(a.last_seen_at),
        "zeroSlotAllocations": view.zero_slot_allocations,
        "utilization": utilization(latest),
    }


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def millis_iso(unix_millis: int) -> str | None:
    """RFC 3339 in UTC with milliseconds; None outside datetime's range (the metrics buffer
    stores none such)."""
    try:
        moment = _EPOCH + timedelta(milliseconds=unix_millis)
    except OverflowError:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utilization(sample: AgentMetricModel | None) -> dict[str, Any] | None:
    """An agent's newest metric sample in brief: what `det agent list` shows."""
    if sample is None:
        return None
    gpu_utils = [g["gpu_util"] for g in sample.gpus if isinstance(g.get("gpu_util"), int | float)]
    return {
        "cpu_util_simple": sample.cpu_util_simple,
        "memory_free": sample.memory_free,
        "memory_used": sample.memory_used,
        "gpu_util": sum(gpu_utils) / len(gpu_utils) if gpu_utils else None,
        "timestamp": millis_iso(sample.unix_millis),
    }


_GPU_KEYS = (
    "index",
    "uuid",
    "gpu_util",
    "gpu_memory_used",
    "gpu_free_memory",
    "temperature_c",
    "power_w",
)


def metric_sample(sample: AgentMetricModel) -> dict[str, Any]:
    # Metric names are the ones Determined's profiler reports (cpu_util_simple, ...).
    return {
        "timestamp": millis_iso(sample.unix_millis),
        "unixMillis": sample.unix_millis,
        "cpu_util_simple": sample.cpu_util_simple,
        "memory_free": sample.memory_free,
        "memory_used": sample.memory_used,
        "disk_throughput_read": sample.disk_throughput_read,
        "disk_throughput_write": sample.disk_throughput_write,
        "disk_iops": sample.disk_iops,
        "net_throughput_sent": sample.net_throughput_sent,
        "net_throughput_recv": sample.net_throughput_recv,
        "gpus": [{k: g.get(k) for k in _GPU_KEYS} for g in sample.gpus],
    }


def _device_stats(counter: Counter[str]) -> dict[str, int]:
    return {k: counter[k] for k in ("disabled", "draining", "total")}


def task(view: TaskView, slots_by_agent: dict[str, dict[int, SlotModel]]) -> dict[str, Any]:
    a = view.allocation
    resources = None
    if a.state != AllocationState.PENDING:
        resources = [
            {
                "resourcesId": container_id(a.id, agent_id),
                "allocationId": a.id,
                "containerId": container_id(a.id, agent_id),
                "agentDevices": {
                    agent_id: {
                        "devices": [
                            device(slots_by_agent[agent_id][s])
                            for s in slot_ids
                            if s in slots_by_agent.get(agent_id, {})
                        ]
                    }
                },
                "started": None,
                "exited": None,
            }
            for agent_id, slot_ids in sorted(view.slots.items())
        ]
    return {
        "taskId": view.task_id,
        "allocationId": a.id,
        "name": view.name,
        "registeredTime": iso(a.registered_at),
        "resourcePool": a.resource_pool,
        "slotsNeeded": a.slots_needed,
        "resources": resources,
        "schedulerType": "priority",
        "priority": view.priority,
        "proxyPorts": [],
        # resolute additions: why it waits, in words and as a code.
        "state": f"STATE_{a.state}",
        "pendingReason": {
            "code": a.pending_code,
            "message": a.pending_reason,
            "blockingJob": a.blocking_job,
        }
        # Placed allocations have a reason only when they cannot start (no common
        # network interface, say); the code is cleared once they do.
        if a.state == AllocationState.PENDING or a.pending_code
        else None,
        "experimentId": a.experiment_id,
        "trialId": a.trial_id,
        "taskType": f"TASK_TYPE_{view.task_type}",
        # Where its slots count against a quota (docs/quotas.md).
        "workspaceId": view.workspace_id,
        "workspaceName": view.workspace_name,
        "preemptRequested": a.preempt_requested,
        # How it ended ("unrunnable: /usr/bin/python3 has no determined..."); "" while held.
        "exitReason": a.exit_reason if a.state == AllocationState.TERMINATED else "",
    }


def job(view: JobView, jobs_ahead: int) -> dict[str, Any]:
    e = view.experiment
    state = "STATE_SCHEDULED" if view.scheduled else "STATE_QUEUED"
    return {
        "jobId": e.job_id,
        "entityId": str(e.id),
        "type": "TYPE_EXPERIMENT",
        "name": e.name,
        "priority": e.priority,
        "weight": 1.0,
        "submissionTime": iso(e.start_time),
        "resourcePool": e.resource_pool,
        "isPreemptible": True,
        "requestedSlots": view.requested_slots,
        "allocatedSlots": view.allocated_slots,
        "userId": e.owner_id,
        "username": view.username,
        "workspaceId": view.workspace_id,
        "progress": e.progress or 0.0,
        "summary": {"state": state, "jobsAhead": jobs_ahead},
        # resolute additions
        "workspaceName": view.workspace_name,
        "queuedTrials": view.queued,
        "scheduledTrials": view.scheduled,
    }


# What Determined's LimitedJob keeps of a job its reader may not see: its place and size,
# not its name, owner or submission time.
LIMITED_JOB_FIELDS = (
    "summary",
    "type",
    "resourcePool",
    "isPreemptible",
    "priority",
    "weight",
    "jobId",
    "workspaceId",
    "requestedSlots",
    "allocatedSlots",
    "progress",
)


def limited_job(full: dict[str, Any]) -> dict[str, Any]:
    return {k: full[k] for k in LIMITED_JOB_FIELDS}


def pool(view: PoolView, settings: MasterSettings, slot_type: str) -> dict[str, Any]:
    p = view.pool
    return {
        "name": p.pool_name,
        "description": p.description,
        "type": "RESOURCE_POOL_TYPE_STATIC",
        "numAgents": view.agents,
        "slotsAvailable": view.slots_total,
        "slotsUsed": view.slots_used,
        "slotType": slot_type,
        "slotsPerAgent": view.slots_per_agent,
        "auxContainerCapacity": p.max_aux_containers_per_agent * view.agents,
        "auxContainerCapacityPerAgent": p.max_aux_containers_per_agent,
        "auxContainersRunning": view.zero_slot_running,
        "defaultComputePool": p.pool_name == settings.default_compute_pool,
        "defaultAuxPool": p.pool_name == settings.default_compute_pool,
        "preemptible": p.scheduler.preemption,
        "minAgents": 0,
        "maxAgents": 0,
        "schedulerType": "SCHEDULER_TYPE_PRIORITY",
        "schedulerFittingPolicy": f"FITTING_POLICY_{p.scheduler.fitting_policy.upper()}",
        "location": "on-prem",
        "imageId": "",
        "instanceType": "",
        "masterUrl": "",
        "masterCertName": "",
        "startupScript": "",
        "containerStartupScript": "",
        "agentDockerNetwork": "",
        "agentDockerRuntime": "",
        "agentDockerImage": "",
        "agentFluentImage": "",
        "maxIdleAgentPeriod": 0.0,
        "maxAgentStartingPeriod": 0.0,
        "details": {
            "priorityScheduler": {
                "preemption": p.scheduler.preemption,
                "defaultPriority": p.scheduler.default_priority,
            }
        },
        "resourceManagerMetadata": {},
        "clusterName": settings.cluster_name,
        "accelerator": "",
    }


def paginated(key: str, items: list[Any], offset: int = 0, limit: int = 0) -> dict[str, Any]:
    total = len(items)
    page = items[offset : offset + limit] if limit > 0 else items[offset:]
    pagination = Pagination.of(offset, limit, len(page), total)
    return {key: page, "pagination": pagination.model_dump(by_alias=True)}


class DisableAgentRequest(WireInput):
    agent_id: str | None = None
    drain: bool | None = False


class QueueControl(WireInput):
    job_id: str
    priority: int | None = None
    weight: float | None = Field(default=None, allow_inf_nan=False)
    resource_pool: str | None = None
    ahead_of: str | None = None
    behind_of: str | None = None


class UpdateJobQueueRequest(WireInput):
    updates: list[QueueControl]
