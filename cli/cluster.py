"""`det task|agent|slot|job|resource-pool`: what runs where, and why the rest waits."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import typer

from cli.client import MasterClient
from cli.errors import CliError
from cli.output import CsvOpt, JsonOpt, cli_errors, one_format, print_json, print_table, stdout
from cli.quotas import print_usage
from cli.state import client

# Like Determined's, each noun alone runs its `list`.
task_app = typer.Typer(help="Tasks (trials) that wait for or hold resources, and why they wait.")
agent_app = typer.Typer(help="List, enable, disable and revoke agents.")
slot_app = typer.Typer(help="List the slots of every agent and what holds them.")
job_app = typer.Typer(help="Show the job queue and change job priorities.")
pool_app = typer.Typer(help="List resource pools and their scheduler settings.")

TASK_HEADERS = [
    "Task ID",
    "Allocation ID",
    "Name",
    "Slots Needed",
    "Registered Time",
    "Agent",
    "Priority",
    "Resource Pool",
    "Workspace",
    "State",
    "Reason",
]
AGENT_HEADERS = [
    "Agent ID",
    "Version",
    "Registered Time",
    "Slots",
    "Containers",
    "Resource Pool",
    "Enabled",
    "Draining",
    "Connected",
    "CPU %",
    "Mem free",
    "GPU %",
    "Addresses",
]
METRIC_HEADERS = [
    "Time",
    "CPU %",
    "Mem used",
    "Mem free",
    "Disk read/s",
    "Disk write/s",
    "Disk IOPS",
    "Net sent/s",
    "Net recv/s",
    "GPU %",
    "GPU mem used",
]
SLOT_HEADERS = [
    "Agent ID",
    "Resource Pool",
    "Slot ID",
    "Enabled",
    "Draining",
    "Allocation ID",
    "Task Name",
    "Type",
    "Device",
]
JOB_HEADERS = [
    "#",
    "ID",
    "Type",
    "Job Name",
    "Workspace",
    "Priority",
    "Submitted",
    "Slots (acquired/needed)",
    "State",
    "User",
]
POOL_HEADERS = [
    "Name",
    "Agents",
    "Slots Used",
    "Slots Total",
    "Slots per Agent",
    "Slot Type",
    "Scheduler",
    "Fitting Policy",
    "Preemption",
    "Default Priority",
    "Default Pool",
    "Description",
]


# -- helpers -------------------------------------------------------------------------------


def _time(value: str | None) -> str:
    return (value or "").replace("T", " ")[:19]


def _enum(value: str | None, prefix: str) -> str:
    return (value or "").removeprefix(prefix)


def _number(value: Any) -> str:
    """One decimal (percentages, IOPS); blank when the master sent none."""
    return f"{value:.1f}" if isinstance(value, int | float) else ""


def _bytes(value: Any) -> str:
    """Binary units, as `free -h` shows memory: 512 B, 1.5 KiB, 31.2 GiB."""
    if not isinstance(value, int | float):
        return ""
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(amount) < 1024 or unit == "PiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def _rate(value: Any) -> str:
    text = _bytes(value)
    return f"{text}/s" if text else ""


# `det task list` also shows tasks that ended in an error this recently, with why.
RECENT_FAILURES_S = 3600


def _tasks(api: MasterClient, failed_within_s: int = 0) -> dict[str, dict[str, Any]]:
    params = {"failedWithinSeconds": failed_within_s} if failed_within_s else None
    summaries: dict[str, dict[str, Any]] = (
        api.get("/api/v1/tasks", params=params).get("allocationIdToSummary") or {}
    )
    return summaries


def _agents(api: MasterClient) -> list[dict[str, Any]]:
    agents: list[dict[str, Any]] = api.get("/api/v1/agents").get("agents") or []
    return sorted(agents, key=lambda a: str(a.get("id", "")))


def _task_agents(task: dict[str, Any]) -> list[str]:
    return [agent for r in task.get("resources") or [] for agent in r.get("agentDevices") or {}]


# -- det task --------------------------------------------------------------------------------


@task_app.command("list")
def list_tasks(
    ctx: typer.Context,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List tasks with their agent and workspace, and for waiting ones the reason they wait
    (tasks that ended in an error within the last hour are listed too, with the reason);
    then each workspace's quota per pool: slots held of its nominal, borrowed, limits."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        tasks = _tasks(api, RECENT_FAILURES_S)
        if as_json:
            print_json(tasks)
            return
        rows = []
        for task in sorted(
            tasks.values(), key=lambda t: (t.get("registeredTime") or "", t["allocationId"])
        ):
            agents = _task_agents(task)
            if task.get("resources") is None:
                agent: str = "unassigned"
            else:
                agent = ", ".join(agents)
            reason = task.get("pendingReason") or {}
            priority = task.get("priority") if task.get("schedulerType") == "priority" else "N/A"
            rows.append(
                [
                    task.get("taskId"),
                    task.get("allocationId"),
                    task.get("name"),
                    task.get("slotsNeeded"),
                    _time(task.get("registeredTime")),
                    agent,
                    priority,
                    task.get("resourcePool"),
                    task.get("workspaceName") or "",
                    _enum(task.get("state"), "STATE_"),
                    reason.get("message") or task.get("exitReason") or "",
                ]
            )
        # A gang's agents: a list of ids, never cut.
        print_table(TASK_HEADERS, rows, as_csv=as_csv, whole=("Agent",))
        if not as_csv:
            print_usage(api)


task_app.command("ls", hidden=True)(list_tasks)


# -- det agent -------------------------------------------------------------------------------


@agent_app.command("list")
def list_agents(
    ctx: typer.Context,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List agents: slots, containers, pool, and whether they take new work."""
    with cli_errors():
        one_format(as_json, as_csv)
        agents = _agents(client(ctx))
        if as_json:
            print_json(agents)
            return
        rows = []
        for a in agents:
            usage = a.get("utilization") or {}
            rows.append(
                [
                    a.get("id"),
                    a.get("version"),
                    _time(a.get("registeredTime")),
                    len(a.get("slots") or {}),
                    len(a.get("containers") or {}),
                    ", ".join(a.get("resourcePools") or []),
                    a.get("enabled"),
                    a.get("draining"),
                    a.get("connected", ""),
                    _number(usage.get("cpu_util_simple")),
                    _bytes(usage.get("memory_free")),
                    _number(usage.get("gpu_util")),
                    ", ".join(a.get("addresses") or []),
                ]
            )
        print_table(AGENT_HEADERS, rows, as_csv=as_csv)


agent_app.command("ls", hidden=True)(list_agents)


def _agent_path(agent_id: str, action: str) -> str:
    return f"/api/v1/agents/{quote(agent_id, safe='')}/{action}"


@agent_app.command("enable")
def enable_agent(ctx: typer.Context, agent_id: str = typer.Argument(..., help="Agent ID.")) -> None:
    """Let an agent take new work again (also ends draining)."""
    with cli_errors():
        client(ctx).post(_agent_path(agent_id, "enable"), json={"agentId": agent_id})
        stdout.print(f"Enabled agent {agent_id}", markup=False)


@agent_app.command("disable")
def disable_agent(
    ctx: typer.Context,
    agent_id: str = typer.Argument(..., help="Agent ID."),
    drain: bool = typer.Option(
        False, "--drain", help="Let the tasks running there finish; start nothing new."
    ),
) -> None:
    """Stop an agent from taking new work."""
    with cli_errors():
        api = client(ctx)
        api.post(_agent_path(agent_id, "disable"), json={"agentId": agent_id, "drain": drain})
        if not drain:
            stdout.print(f"Disabled agent {agent_id}", markup=False)
            return
        running = [t for t in _tasks(api).values() if agent_id in _task_agents(t)]
        stdout.print(
            f"Disabled agent {agent_id} (draining: "
            f"{len(running)} task{'' if len(running) == 1 else 's'} still running there)",
            markup=False,
        )


@agent_app.command("revoke")
def revoke_agent(
    ctx: typer.Context,
    agent_id: str = typer.Argument(..., help="Agent ID."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Revoke an agent for good (a lost or retired node): its credential stops working, it
    is disconnected and its tasks are stopped, and its id can never connect again."""
    with cli_errors():
        if not yes and not typer.confirm(
            f"Revoke agent {agent_id}? It is disconnected, its tasks are stopped, and the "
            "id can never connect again."
        ):
            stdout.print(f"Agent {agent_id} was not revoked.", markup=False)
            return
        api = client(ctx)
        running = [t for t in _tasks(api).values() if agent_id in _task_agents(t)]
        api.post(_agent_path(agent_id, "revoke"), json={})
        stopped = (
            f"; {len(running)} task{'' if len(running) == 1 else 's'} ran there, "
            "stopped as on a lost agent"
            if running
            else ""
        )
        stdout.print(
            f"Revoked agent {agent_id}: it is disconnected and refused from now on{stopped}. "
            "To bring the node back, start det-agent there under a new --id.",
            markup=False,
        )


def _gpu_sum(gpus: list[dict[str, Any]], key: str) -> float | None:
    values = [g[key] for g in gpus if isinstance(g.get(key), int | float)]
    return sum(values) if values else None


def _gpu_mean(gpus: list[dict[str, Any]], key: str) -> float | None:
    values = [g[key] for g in gpus if isinstance(g.get(key), int | float)]
    return sum(values) / len(values) if values else None


@agent_app.command("metrics")
def agent_metrics(
    ctx: typer.Context,
    agent_id: str = typer.Argument(..., help="Agent ID."),
    limit: int = typer.Option(
        60, "-n", "--limit", min=1, max=10_000, help="Show the newest this many samples."
    ),
    since: str | None = typer.Option(
        None, "--since", help="Only samples from this time on (RFC 3339 or unix milliseconds)."
    ),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """Show an agent's recent system metrics, oldest first (GPU columns: mean and total)."""
    with cli_errors():
        one_format(as_json, as_csv)
        params: dict[str, Any] = {"limit": limit}
        if since:
            params["since"] = since
        reply = client(ctx).get(_agent_path(agent_id, "metrics"), params=params)
        samples: list[dict[str, Any]] = reply.get("samples") or []
        if as_json:
            print_json(samples)
            return
        rows = []
        for sample in samples:
            gpus = sample.get("gpus") or []
            rows.append(
                [
                    _time(sample.get("timestamp")),
                    _number(sample.get("cpu_util_simple")),
                    _bytes(sample.get("memory_used")),
                    _bytes(sample.get("memory_free")),
                    _rate(sample.get("disk_throughput_read")),
                    _rate(sample.get("disk_throughput_write")),
                    _number(sample.get("disk_iops")),
                    _rate(sample.get("net_throughput_sent")),
                    _rate(sample.get("net_throughput_recv")),
                    _number(_gpu_mean(gpus, "gpu_util")),
                    _bytes(_gpu_sum(gpus, "gpu_memory_used")),
                ]
            )
        print_table(METRIC_HEADERS, rows, as_csv=as_csv)


# -- det slot --------------------------------------------------------------------------------


def _device_type(device: dict[str, Any]) -> str:
    kind = _enum(device.get("type"), "TYPE_").lower()
    return kind if kind in ("cpu", "cuda", "rocm") else "unknown"


def _slot_key(slot: dict[str, Any]) -> tuple[int, str]:
    slot_id = str(slot.get("id", ""))
    return (int(slot_id), "") if slot_id.isdigit() else (sys.maxsize, slot_id)


@slot_app.command("list")
def list_slots(
    ctx: typer.Context,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List every slot: FREE, or the allocation and task holding it."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        tasks = _tasks(api)
        agents = _agents(api)
        by_container = {
            r["containerId"]: t
            for t in tasks.values()
            for r in t.get("resources") or []
            if r.get("containerId")
        }
        slots: list[dict[str, Any]] = []
        for agent in agents:
            for slot in sorted((agent.get("slots") or {}).values(), key=_slot_key):
                container = slot.get("container")
                device = slot.get("device") or {}
                if not container:
                    allocation_id, task_name = "FREE", "FREE"
                else:
                    task = by_container.get(container.get("id"))
                    allocation_id = (
                        task["allocationId"] if task else container.get("parent") or "OCCUPIED"
                    )
                    task_name = task["name"] if task else f"Unknown task: {container.get('id')}"
                slots.append(
                    {
                        "agentId": agent.get("id"),
                        "resourcePool": ", ".join(agent.get("resourcePools") or []),
                        "slotId": slot.get("id"),
                        "enabled": slot.get("enabled"),
                        "draining": slot.get("draining"),
                        "allocationId": allocation_id,
                        "taskName": task_name,
                        "type": _device_type(device),
                        "device": device.get("brand") or "",
                    }
                )
        if as_json:
            print_json(slots)
            return
        print_table(SLOT_HEADERS, [list(s.values()) for s in slots], as_csv=as_csv)


slot_app.command("ls", hidden=True)(list_slots)


# -- det job ---------------------------------------------------------------------------------


@job_app.command("list")
def list_jobs(
    ctx: typer.Context,
    resource_pool: str | None = typer.Option(
        None, "-p", "--resource-pool", help="Only this pool's queue."
    ),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List the job queue in scheduling order (lower priority number first), each job's
    workspace, then each workspace's quota per pool: slots held of its nominal, borrowed,
    limits."""
    with cli_errors():
        one_format(as_json, as_csv)
        params = {"resourcePool": resource_pool} if resource_pool else {}
        api = client(ctx)
        jobs: list[dict[str, Any]] = api.get("/api/v1/job-queues", params=params).get("jobs") or []
        if as_json:
            print_json(jobs)
            return
        rows = []
        for j in jobs:
            summary = j.get("summary") or {}
            ahead = summary.get("jobsAhead")
            is_experiment = j.get("type") == "TYPE_EXPERIMENT"
            rows.append(
                [
                    ahead if isinstance(ahead, int) and ahead > -1 else "N/A",
                    j.get("jobId"),
                    _enum(j.get("type"), "TYPE_"),
                    f"{j.get('name')} ({j.get('entityId')})" if is_experiment else j.get("name"),
                    j.get("workspaceName") or "",
                    j.get("priority"),
                    _time(j.get("submissionTime")),
                    f"{j.get('allocatedSlots', 0)}/{j.get('requestedSlots', 0)}",
                    _enum(summary.get("state"), "STATE_") or "N/A",
                    j.get("username"),
                ]
            )
        print_table(JOB_HEADERS, rows, as_csv=as_csv)
        if not as_csv:
            print_usage(api, resource_pool)


job_app.command("ls", hidden=True)(list_jobs)


@job_app.command("update")
def update_job(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., help="Job ID (see `det job list`)."),
    priority: int | None = typer.Option(
        None, "-p", "--priority", help="New priority, 1-99; lower is scheduled first."
    ),
    weight: float | None = typer.Option(None, "-w", "--weight", help="New weight, above 0."),
    resource_pool: str | None = typer.Option(
        None,
        "--resource-pool",
        help="Move the job to this pool: its queued trials wait there, its running ones "
        "checkpoint, stop and queue there.",
    ),
) -> None:
    """Change a job's priority, weight or resource pool (Determined's `det job update`)."""
    change: dict[str, Any] = {"jobId": job_id}
    said = []
    if priority is not None:
        change["priority"] = priority
        said.append(f"priority {priority}")
    if weight is not None:
        change["weight"] = weight
        said.append(f"weight {weight:g}")
    if resource_pool is not None:
        change["resourcePool"] = resource_pool
        said.append(f"resource pool {resource_pool}")
    with cli_errors():
        if not said:
            raise CliError("give --priority, --weight or --resource-pool")
        client(ctx).post("/api/v1/job-queues", json={"updates": [change]})
        stdout.print(f"Updated job {job_id}: {', '.join(said)}", markup=False)


# -- det resource-pool -----------------------------------------------------------------------


@pool_app.command("list")
def list_pools(ctx: typer.Context, as_json: bool = JsonOpt, as_csv: bool = CsvOpt) -> None:
    """List resource pools: agents, slots in use and scheduler settings."""
    with cli_errors():
        one_format(as_json, as_csv)
        pools: list[dict[str, Any]] = (
            client(ctx).get("/api/v1/resource-pools").get("resourcePools") or []
        )
        if as_json:
            print_json(pools)
            return
        rows = []
        for p in pools:
            details = (p.get("details") or {}).get("priorityScheduler") or {}
            rows.append(
                [
                    p.get("name"),
                    p.get("numAgents"),
                    p.get("slotsUsed"),
                    p.get("slotsAvailable"),
                    p.get("slotsPerAgent"),
                    _enum(p.get("slotType"), "TYPE_").lower(),
                    _enum(p.get("schedulerType"), "SCHEDULER_TYPE_").lower(),
                    _enum(p.get("schedulerFittingPolicy"), "FITTING_POLICY_").lower(),
                    p.get("preemptible"),
                    details.get("defaultPriority", ""),
                    p.get("defaultComputePool"),
                    p.get("description") or "",
                ]
            )
        print_table(POOL_HEADERS, rows, as_csv=as_csv)


pool_app.command("ls", hidden=True)(list_pools)


def _default_to_list(app: typer.Typer, run_list: Callable[[typer.Context], None]) -> None:
    def callback(ctx: typer.Context) -> None:
        if ctx.invoked_subcommand is None:
            run_list(ctx)

    app.callback(invoke_without_command=True)(callback)


_default_to_list(task_app, lambda ctx: list_tasks(ctx, as_json=False, as_csv=False))
_default_to_list(agent_app, lambda ctx: list_agents(ctx, as_json=False, as_csv=False))
_default_to_list(slot_app, lambda ctx: list_slots(ctx, as_json=False, as_csv=False))
_default_to_list(
    job_app, lambda ctx: list_jobs(ctx, resource_pool=None, as_json=False, as_csv=False)
)
_default_to_list(pool_app, lambda ctx: list_pools(ctx, as_json=False, as_csv=False))
