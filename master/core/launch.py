"""What each agent of a gang runs: ranks, rendezvous and environment. Pure: no I/O.

Ranks are laid out agent by agent in the gang's order (the chief, which hosts rank 0 and
the rendezvous, first), one rank per slot in slot order, so RANK = GROUP_RANK * slots
per agent + LOCAL_RANK, as torchrun numbers them.
"""

from __future__ import annotations

import json
import shlex
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    ranks: tuple[RankPlan, ...]
    env: dict[str, str] = field(default_factory=dict)


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
    raw = environment.get("environment_variables") or []
    if isinstance(raw, Mapping):
        raw = raw.get(device_type) or []
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


def build_launches(
    members: Sequence[GangMember],
    trial: TrialInfo,
    rendezvous: Rendezvous,
    *,
    master_url: str,
    cluster_id: str,
    master_id: str,
    device_type: str,
) -> list[AgentLaunch]:
    """Every agent's ranks and the environment its ranks share (the agent adds the
    per-rank RANK, LOCAL_RANK, DET_SLOT_IDS and CUDA_VISIBLE_DEVICES)."""
    ordered = order_gang(members)
    planned = plan_ranks(ordered)
    world_size = sum(len(p.ranks) for p in planned)
    url = urllib.parse.urlsplit(master_url)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    common = {
        **deterministic_variables(trial.config),
        **config_variables(trial.config, device_type),
    }
    for reserved in RESERVED_VARIABLES & common.keys():
        del common[reserved]
    common.update(
        {
            "DET_MASTER": master_url,
            "DET_MASTER_HOST": host,
            "DET_MASTER_ADDR": host,
            "DET_MASTER_PORT": str(port),
            "DET_CLUSTER_ID": cluster_id,
            "DET_MASTER_ID": master_id,
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
            "WORLD_SIZE": str(world_size),
            "GROUP_WORLD_SIZE": str(len(planned)),
            "CROSS_SIZE": str(len(planned)),
            "MASTER_ADDR": rendezvous.chief_address,
            "MASTER_PORT": str(rendezvous.master_port),
            **batch_sizes(trial.config, trial.hparams),
        }
    )
    if trial.latest_checkpoint:
        common["DET_LATEST_CHECKPOINT"] = trial.latest_checkpoint
    # The interface a user set in environment_variables wins, as Determined's DeepSpeed
    # launcher lets it; otherwise ours.
    common.setdefault("NCCL_SOCKET_IFNAME", rendezvous.interface)
    common.setdefault("GLOO_SOCKET_IFNAME", rendezvous.interface)
    launches = []
    for group_rank, plan in enumerate(planned):
        env = dict(common)
        env["GROUP_RANK"] = env["CROSS_RANK"] = str(group_rank)
        launches.append(AgentLaunch(plan.agent_id, plan.ranks, env))
    return launches
