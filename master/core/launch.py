"""What each agent of a gang runs: ranks, rendezvous and environment. Pure: no I/O.

Two launch layouts, chosen per experiment (`choose_layout`):
- per_slot (resolute's): one process per slot. Ranks are laid out agent by agent in the
  gang's order (the chief, which hosts rank 0 and the rendezvous, first), one rank per
  slot in slot order, so RANK = GROUP_RANK * slots per agent + LOCAL_RANK, as torchrun
  numbers them.
- per_agent (Determined's): one entrypoint process per agent of the gang, given every slot
  the allocation holds there; a launcher inside it (determined.launch.torch_distributed,
  or the script's own) starts the ranks. It reads Determined's bootstrap files
  (`determined_info_files`) instead of RANK and WORLD_SIZE.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import shlex
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from master.core.expconf import entrypoint_modules

# Set by the agent per rank or by us per gang; the config's environment_variables cannot
# override them, because a wrong RANK or MASTER_PORT hangs the whole gang.
RESERVED_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "LOCAL_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "CROSS_RANK",
        "CROSS_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "DET_LATEST_CHECKPOINT",
    }
)


class LaunchError(ValueError):
    """The trial cannot be started as configured; the message is shown to the user."""


@dataclass(frozen=True)
class GangMember:
    agent_id: str
    slot_ids: tuple[int, ...]  # empty for a zero-slot task


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local_rank: int
    slot_ids: tuple[int, ...]


@dataclass(frozen=True)
class AgentLaunch:
    agent_id: str
    ranks: tuple[RankPlan, ...]  # per_agent: one "rank", the agent's container rank
    env: dict[str, str] = field(default_factory=dict)
    info_files: dict[str, str] = field(default_factory=dict)  # per_agent only


@dataclass(frozen=True)
class TrialInfo:
    experiment_id: int
    trial_id: int
    run_id: int
    task_id: str
    allocation_id: str
    seed: int
    hparams: Mapping[str, Any]
    config: Mapping[str, Any]
    steps_completed: int = 0
    latest_checkpoint: str = ""  # the checkpoint this run resumes from, if any
    user: str = ""
    session_token: str = ""


@dataclass(frozen=True)
class Rendezvous:
    interface: str  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    chief_address: str
    master_port: int
    # per_agent: every agent's address on `interface`, in gang order (the chief first),
    # and the chief's ports for Determined's ZMQ broadcast (INTER_TRAIN_PROCESS_COMM_PORT_1/2).
    addresses: tuple[str, ...] = ()
    comm_ports: tuple[int, ...] = ()


# -- launch layout ----------------------------------------------------------------------------

PER_SLOT = "per_slot"
PER_AGENT = "per_agent"


@dataclass(frozen=True)
class LayoutChoice:
    layout: str  # PER_SLOT or PER_AGENT
    reason: str


def stored_layout(config: Mapping[str, Any]) -> str:
    """An experiment's decided layout; experiments stored before layouts existed (and any
    value but per_agent) ran one process per slot."""
    return PER_AGENT if config.get("launch_layout") == PER_AGENT else PER_SLOT


def layout_summary(layout: str) -> str:
    """One sentence a user reads in describe and the dashboard: how many processes."""
    if layout == PER_AGENT:
        return (
            "the entrypoint runs once per agent of the trial (Determined's layout), with "
            "every slot it holds there in DET_SLOT_IDS; its launcher starts the ranks"
        )
    return (
        "the entrypoint runs once per slot (resolute's layout), each process with its own "
        "RANK, LOCAL_RANK and WORLD_SIZE"
    )


def determined_launcher(argv: Sequence[str]) -> str | None:
    """The `determined.launch.*` module the entrypoint runs with `python -m`, if any."""
    launchers = [m for m in entrypoint_modules(list(argv)) if m.startswith("determined.launch.")]
    return launchers[0] if launchers else None


def entry_script(argv: Sequence[str]) -> str | None:
    """The Python file the entrypoint runs, relative to the model definition, if it names
    one: the first `*.py` argument, else the module of `python -m pkg.mod`."""
    launcher = determined_launcher(argv)
    args = list(argv)
    if launcher is not None:  # look past the launcher to the script it runs
        at = next(i for i, a in enumerate(args) if a.endswith(launcher))
        args = args[at + 1 :]
    for arg in args:
        if arg.endswith(".py") and not arg.startswith("-"):
            return arg.removeprefix("./")
    for flag, module in itertools.pairwise(args):
        if flag == "-m" and not module.startswith("determined."):
            return module.replace(".", "/") + ".py"
    return None


_IMPORT_LINE = re.compile(r"^\s*(?:import|from)\s+determined(?:[\s.,]|$)", re.MULTILINE)


def imports_determined(source: str) -> bool:
    """Whether Python source imports the `determined` package (at any depth of the file)."""
    if "determined" not in source:
        return False  # no need to parse it (a parse is a millisecond of every submit)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return bool(_IMPORT_LINE.search(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] == "determined" for name in names):
            return True
    return False


def choose_layout(config: Mapping[str, Any], script_source: str | None) -> LayoutChoice:
    """The launch layout of an experiment, and why. The rule, in order:

    1. `launch_layout: per_slot | per_agent` in the config wins;
    2. an entrypoint that runs one of Determined's launchers (`python3 -m
       determined.launch.torch_distributed ...`) gets per_agent;
    3. an entrypoint whose script imports `determined` gets per_agent;
    4. anything else gets per_slot.
    `script_source` is the text of the entry script (`entry_script`), None if there is none.
    """
    explicit = config.get("launch_layout")
    if explicit in (PER_SLOT, PER_AGENT):
        return LayoutChoice(str(explicit), "launch_layout is set in the experiment config")
    argv = entrypoint_argv(config)
    launcher = determined_launcher(argv)
    if launcher is not None:
        return LayoutChoice(PER_AGENT, f"the entrypoint runs Determined's launcher {launcher}")
    script = entry_script(argv)
    if script is not None and script_source is not None and imports_determined(script_source):
        return LayoutChoice(PER_AGENT, f"{script} imports determined")
    if script is None:
        why = "the entrypoint names no Python script that imports determined"
    elif script_source is None:
        why = f"{script} is not in the model definition"
    else:
        why = f"{script} does not import determined"
    return LayoutChoice(PER_SLOT, why)


def order_gang(members: Sequence[GangMember]) -> list[GangMember]:
    """The gang's fixed order: agents by id, slots ascending. The first is the chief."""
    return [
        GangMember(m.agent_id, tuple(sorted(m.slot_ids)))
        for m in sorted(members, key=lambda m: m.agent_id)
    ]


def plan_ranks(members: Sequence[GangMember]) -> list[AgentLaunch]:
    """One rank per slot (one rank for a zero-slot task), numbered across the gang."""
    launches: list[AgentLaunch] = []
    next_rank = 0
    for member in members:
        slot_groups: list[tuple[int, ...]] = [(s,) for s in member.slot_ids] or [()]
        ranks = tuple(
            RankPlan(rank=next_rank + i, local_rank=i, slot_ids=slots)
            for i, slots in enumerate(slot_groups)
        )
        next_rank += len(ranks)
        launches.append(AgentLaunch(member.agent_id, ranks))
    return launches


def entrypoint_argv(config: Mapping[str, Any]) -> list[str]:
    entrypoint = config.get("entrypoint")
    if isinstance(entrypoint, list) and entrypoint and all(isinstance(a, str) for a in entrypoint):
        return list(entrypoint)
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        raise LaunchError("entrypoint: the experiment names no command to run")
    try:
        argv = shlex.split(entrypoint)
    except ValueError as exc:
        raise LaunchError(f"entrypoint: cannot be split into arguments: {exc}") from None
    if len(argv) == 1 and ":" in argv[0] and "/" not in argv[0]:
        raise LaunchError(
            f"entrypoint: {entrypoint!r} names a Trial class; resolute runs commands "
            "(for example 'python3 train.py')"
        )
    return argv


def config_variables(config: Mapping[str, Any], device_type: str) -> dict[str, str]:
    """environment.environment_variables: a list of KEY=VALUE, or one list per device type."""
    environment = config.get("environment") or {}
    return runtime_variables(environment.get("environment_variables"), device_type)


def runtime_variables(raw: Any, device_type: str) -> dict[str, str]:
    """Determined's RuntimeItems: a list of KEY=VALUE, or one list per device type (`gpu`
    is the legacy name of `cuda`)."""
    raw = raw or []
    if isinstance(raw, Mapping):
        legacy = raw.get("gpu") if device_type == "cuda" else None
        raw = raw.get(device_type) or legacy or []
    out: dict[str, str] = {}
    for item in raw:
        key, sep, value = str(item).partition("=")
        if sep and key:
            out[key] = value
    return out


# Seed doc 003's recipe: what must be set before the interpreter and CUDA start, so only
# the launcher can do it. The training library applies the rest (torch flags, seeds).
DETERMINISTIC_VARIABLES = {
    "PYTHONHASHSEED": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
    "NCCL_LAUNCH_MODE": "GROUP",
}


def deterministic_variables(config: Mapping[str, Any]) -> dict[str, str]:
    reproducibility = config.get("reproducibility") or {}
    return dict(DETERMINISTIC_VARIABLES) if reproducibility.get("deterministic") else {}


def batch_sizes(config: Mapping[str, Any], hparams: Mapping[str, Any]) -> dict[str, str]:
    """DET_GLOBAL_BATCH_SIZE and DET_PER_SLOT_BATCH_SIZE = global // slots_per_trial."""
    global_batch = hparams.get("global_batch_size")
    if not isinstance(global_batch, int) or isinstance(global_batch, bool):
        return {}
    slots = int((config.get("resources") or {}).get("slots_per_trial", 1)) or 1
    return {
        "DET_GLOBAL_BATCH_SIZE": str(global_batch),
        "DET_PER_SLOT_BATCH_SIZE": str(global_batch // slots),
    }


def master_variables(master_url: str, cluster_id: str, master_id: str) -> dict[str, str]:
    """Where every task's processes find the master (Determined's DET_MASTER* variables)."""
    url = urllib.parse.urlsplit(master_url)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    return {
        "DET_MASTER": master_url,
        "DET_MASTER_HOST": host,
        "DET_MASTER_ADDR": host,
        "DET_MASTER_PORT": str(port),
        "DET_CLUSTER_ID": cluster_id,
        "DET_MASTER_ID": master_id,
    }


def build_launches(
    members: Sequence[GangMember],
    trial: TrialInfo,
    rendezvous: Rendezvous,
    *,
    master_url: str,
    cluster_id: str,
    master_id: str,
    device_type: str,
    layout: str = PER_SLOT,
    default_variables: Mapping[str, str] | None = None,
) -> list[AgentLaunch]:
    """Every agent's processes and the environment they share (the agent adds the
    per-process RANK, LOCAL_RANK, DET_SLOT_IDS and CUDA_VISIBLE_DEVICES).
    `default_variables`: the pool's or master's task_container_defaults, beneath the
    experiment's own environment_variables."""
    ordered = order_gang(members)
    planned = plan_ranks(ordered) if layout == PER_SLOT else plan_agents(ordered)
    world_size = sum(len(p.ranks) for p in planned)
    common = {
        **deterministic_variables(trial.config),
        **(default_variables or {}),
        **config_variables(trial.config, device_type),
    }
    for reserved in RESERVED_VARIABLES & common.keys():
        del common[reserved]
    common.update(master_variables(master_url, cluster_id, master_id))
    common.update(
        {
            "DET_EXPERIMENT_ID": str(trial.experiment_id),
            "DET_TRIAL_ID": str(trial.trial_id),
            "DET_TRIAL_RUN_ID": str(trial.run_id),
            "DET_TRIAL_SEED": str(trial.seed),
            "DET_HPARAMS": json.dumps(trial.hparams, sort_keys=True),
            "DET_EXPERIMENT_CONFIG": json.dumps(trial.config, sort_keys=True),
            "DET_STEPS_COMPLETED": str(trial.steps_completed),
            "DET_TASK_ID": trial.task_id,
            "DET_TASK_TYPE": "TRIAL",
            "DET_ALLOCATION_ID": trial.allocation_id,
            "DET_SESSION_TOKEN": trial.session_token,
            "DET_USER_TOKEN": trial.session_token,
            "DET_USER": trial.user,
            "DET_CHIEF_IP": rendezvous.chief_address,
            "DET_INTER_NODE_NETWORK_INTERFACE": rendezvous.interface,
            **batch_sizes(trial.config, trial.hparams),
        }
    )
    if layout == PER_SLOT:
        common.update(
            {
                "WORLD_SIZE": str(world_size),
                "GROUP_WORLD_SIZE": str(len(planned)),
                "CROSS_SIZE": str(len(planned)),
                "MASTER_ADDR": rendezvous.chief_address,
                "MASTER_PORT": str(rendezvous.master_port),
            }
        )
    else:
        # Determined's launchers read these instead (torchrun's --master_port, the chief's
        # ZMQ broadcast); RANK and WORLD_SIZE come from the launcher, as in Determined.
        common["C10D_PORT"] = str(rendezvous.master_port)
        for index, comm_port in enumerate(rendezvous.comm_ports[:2], start=1):
            common[f"INTER_TRAIN_PROCESS_COMM_PORT_{index}"] = str(comm_port)
    if trial.latest_checkpoint:
        common["DET_LATEST_CHECKPOINT"] = trial.latest_checkpoint
    # The interface a user set in environment_variables wins, as Determined's DeepSpeed
    # launcher lets it; otherwise ours.
    common.setdefault("NCCL_SOCKET_IFNAME", rendezvous.interface)
    common.setdefault("GLOO_SOCKET_IFNAME", rendezvous.interface)
    launches = []
    for group_rank, plan in enumerate(planned):
        env = dict(common)
        info_files: dict[str, str] = {}
        if layout == PER_SLOT:
            env["GROUP_RANK"] = env["CROSS_RANK"] = str(group_rank)
        else:
            info_files = determined_info_files(
                trial,
                rendezvous,
                [len(p.ranks[0].slot_ids) for p in planned],
                group_rank=group_rank,
                agent_id=plan.agent_id,
                slot_ids=plan.ranks[0].slot_ids,
                master_url=master_url,
                cluster_id=cluster_id,
            )
        launches.append(AgentLaunch(plan.agent_id, plan.ranks, env, info_files))
    return launches


def plan_agents(members: Sequence[GangMember]) -> list[AgentLaunch]:
    """per_agent: one process per agent, numbered by the agent's place in the gang (its
    container rank), holding every slot of the allocation on that agent."""
    return [
        AgentLaunch(m.agent_id, (RankPlan(rank=i, local_rank=0, slot_ids=m.slot_ids),))
        for i, m in enumerate(members)
    ]


def determined_info_files(
    trial: TrialInfo,
    rendezvous: Rendezvous,
    slot_counts: Sequence[int],
    *,
    group_rank: int,
    agent_id: str,
    slot_ids: Sequence[int],
    master_url: str,
    cluster_id: str,
) -> dict[str, str]:
    """/run/determined/info/*.json as Determined 0.38.1's harness reads them
    (`determined/_info.py`: each file is `cls(**json)`, so the keys must be exactly these).
    resources.json (the GPU uuids) is the agent's to write: it knows its devices."""
    cluster = {
        "master_url": master_url,
        "cluster_id": cluster_id,
        "agent_id": agent_id,
        "slot_ids": list(slot_ids),
        "task_id": trial.task_id,
        "allocation_id": trial.allocation_id,
        "session_token": trial.session_token,
        "task_type": "TRIAL",
        "master_cert_name": None,
        "master_cert_file": None,
        "latest_checkpoint": trial.latest_checkpoint or None,
    }
    trial_info = {
        "trial_id": trial.trial_id,
        "experiment_id": trial.experiment_id,
        "trial_seed": trial.seed,
        "hparams": dict(trial.hparams),
        "config": dict(trial.config),
        "steps_completed": trial.steps_completed,
        "trial_run_id": trial.run_id,
        "debug": bool(trial.config.get("debug", False)),
        "inter_node_network_interface": rendezvous.interface or None,
    }
    rendezvous_info = {
        # Rank 0 first, as Determined orders them; one agent talks to itself on loopback.
        "container_addrs": list(rendezvous.addresses) or [rendezvous.chief_address],
        "container_rank": group_rank,
        "container_slot_counts": list(slot_counts),
    }
    return {
        "cluster.json": json.dumps(cluster, sort_keys=True),
        "trial.json": json.dumps(trial_info, sort_keys=True),
        "rendezvous.json": json.dumps(rendezvous_info, sort_keys=True),
    }


def shared_fs_host_path(config: Mapping[str, Any]) -> str:
    """What Determined bind-mounts at /determined_shared_fs: shared_fs's host_path."""
    storage = config.get("checkpoint_storage") or {}
    if storage.get("type") == "shared_fs" and storage.get("host_path"):
        return str(storage["host_path"])
    return ""


@dataclass(frozen=True)
class TaskInfo:
    """A command, notebook, shell or TensorBoard about to start."""

    task_id: str  # the public uuid
    task_type: str  # COMMAND | NOTEBOOK | SHELL | TENSORBOARD
    allocation_id: str
    config: Mapping[str, Any]
    argv: tuple[str, ...]
    port: int  # reserved on the agent for the task's server
    secret: str  # the task's server lets in only requests carrying it (the proxy's)
    user: str = ""
    session_token: str = ""


def build_task_launch(
    member: GangMember,
    task: TaskInfo,
    *,
    master_url: str,
    cluster_id: str,
    master_id: str,
    device_type: str,
    default_variables: Mapping[str, str] | None = None,
) -> AgentLaunch:
    """One process on one agent, given every slot the task holds (as Determined gives a
    command's container all of them), with Determined's task variables."""
    env = {**(default_variables or {}), **config_variables(task.config, device_type)}
    for reserved in RESERVED_VARIABLES & env.keys():
        del env[reserved]
    env.update(master_variables(master_url, cluster_id, master_id))
    env.update(
        {
            "DET_TASK_ID": task.task_id,
            "DET_TASK_TYPE": task.task_type,
            "DET_ALLOCATION_ID": task.allocation_id,
            "DET_SESSION_TOKEN": task.session_token,
            "DET_USER_TOKEN": task.session_token,
            "DET_USER": task.user,
            "DET_TASK_PORT": str(task.port),
            "RESOLUTE_TASK_SECRET": task.secret,
        }
    )
    if task.task_type == "NOTEBOOK":
        env["JUPYTER_TOKEN"] = task.secret
    rank = RankPlan(rank=0, local_rank=0, slot_ids=tuple(sorted(member.slot_ids)))
    return AgentLaunch(member.agent_id, (rank,), env=env)
