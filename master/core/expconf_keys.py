"""What each key of Determined's experiment config (expconf v0) does here: applied, accepted
with a warning, or refused, and why. docs/determined.md carries this as a table
(`markdown_table`), and tests/unit/test_expconf_keys.py holds both the table and the
validation code to it, so neither drifts from what a submit does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["applied", "warned", "refused"]

_STATUS_TEXT: dict[Status, str] = {
    "applied": "applied",
    "warned": "accepted, with a warning",
    "refused": "refused",
}

_HARNESS = (
    "handed to Determined's harness in the trial's config (trial.json, "
    "DET_EXPERIMENT_CONFIG), which reads it as under Determined"
)


@dataclass(frozen=True)
class KeyRule:
    key: str
    """Dotted, as Determined's schema nests it (`resources.shm_size`)."""
    status: Status
    note: str
    sample: Any = None
    """For a warned key: a value that draws its warning (the tests submit it)."""


KEYS: tuple[KeyRule, ...] = (
    KeyRule("name", "applied", "the experiment's name"),
    KeyRule("description", "applied", "the experiment's description"),
    KeyRule("labels", "applied", "the experiment's labels"),
    KeyRule(
        "entrypoint",
        "applied",
        "the command each trial runs; a legacy Trial class (`model_def:MyTrial`) is refused, "
        "with what to write instead",
    ),
    KeyRule("hyperparameters", "applied", "const, int, double, log, categorical, nested"),
    KeyRule(
        "searcher",
        "applied",
        "single, grid, random, adaptive_asha, async_halving; the searchers Determined 0.38 "
        "removed are refused",
    ),
    KeyRule("max_restarts", "applied", "restarts of a failed trial"),
    KeyRule(
        "checkpoint_storage",
        "applied",
        "shared_fs, directory, s3, gcs, azure; save_* retention after every checkpoint",
    ),
    KeyRule("reproducibility", "applied", "experiment_seed, written in at submit when unset"),
    KeyRule("preemption_timeout", "applied", "seconds a preempted trial gets to checkpoint"),
    KeyRule("project", "applied", "where the experiment is kept"),
    KeyRule("workspace", "applied", "where the experiment is kept"),
    KeyRule(
        "bind_mounts",
        "applied",
        "made in the trial's private mount namespace before it starts; see the keys below",
    ),
    KeyRule("environment", "applied", "see the keys below"),
    KeyRule("resources", "applied", "see the keys below"),
    KeyRule("data", "applied", _HARNESS),
    KeyRule("optimizations", "applied", _HARNESS),
    KeyRule("debug", "applied", _HARNESS + " (also trial.json's `debug`)"),
    KeyRule("profiling", "applied", _HARNESS),
    KeyRule("min_validation_period", "applied", _HARNESS),
    KeyRule("min_checkpoint_period", "applied", _HARNESS),
    KeyRule("records_per_epoch", "applied", _HARNESS),
    KeyRule("scheduling_unit", "applied", _HARNESS),
    KeyRule("perform_initial_validation", "applied", _HARNESS),
    KeyRule("checkpoint_policy", "applied", _HARNESS),
    KeyRule(
        "integrations",
        "applied",
        "integrations.webhooks names the webhooks this experiment's events go to "
        "(docs/webhooks.md); the rest is " + _HARNESS,
    ),
    KeyRule(
        "log_policies",
        "warned",
        "the master does not match a trial's logs against patterns",
        sample=[{"pattern": ".*CUDA out of memory.*", "action": {"type": "cancel_retries"}}],
    ),
    KeyRule(
        "retention_policy",
        "applied",
        "log_retention_days: the leader deletes an ended trial's logs that much later "
        "(-1 keeps them; `det e set log-retention` changes it)",
    ),
    KeyRule(
        "data_layer",
        "refused",
        "the data layer of Determined's removed Trial APIs; load data in the script",
    ),
    KeyRule("internal", "refused", "Determined's own internal settings, not a user's"),
    KeyRule(
        "security",
        "refused",
        "Kerberos settings of Determined's enterprise edition; nothing here reads them",
    ),
    KeyRule(
        "slurm",
        "refused",
        "Determined's Slurm launcher settings; trials run on resolute's own agents",
    ),
    KeyRule(
        "pbs",
        "refused",
        "Determined's PBS launcher settings; trials run on resolute's own agents",
    ),
    KeyRule(
        "tensorboard_storage",
        "refused",
        "removed from Determined; TensorBoard reads what checkpoint_storage holds",
    ),
    # resources
    KeyRule("resources.slots_per_trial", "applied", "slots (GPUs, or CPUs) of each trial"),
    KeyRule(
        "resources.max_slots",
        "applied",
        "the most slots the experiment holds at once; its other trials wait (AT_MAX_SLOTS)",
    ),
    KeyRule("resources.priority", "applied", "the scheduling priority (1..99)"),
    KeyRule(
        "resources.weight",
        "applied",
        "at equal priority, the experiment's share of its user's slots (usage divided by "
        "weight orders the queue; docs/quotas.md)",
        sample=3,
    ),
    KeyRule("resources.resource_pool", "applied", "the pool the trials run in"),
    KeyRule("resources.is_single_node", "applied", "a trial's slots on one agent"),
    KeyRule(
        "resources.shm_size",
        "applied",
        "a private /dev/shm (tmpfs) of that size in the trial's mount namespace: bytes, or "
        'a size such as "4G" (powers of 1024, as Docker reads it); 0 gives Docker\'s 64 MiB; '
        "unset, the trial sees the host's /dev/shm",
    ),
    KeyRule(
        "resources.devices",
        "warned",
        "mapped into the trial's container with their mode as cgroup permissions; they "
        "apply only in containers (environment.image), and the submit says so: processes "
        "on the host see the host's devices as the agent's user may open them",
        sample=[{"host_path": "/dev/fuse", "container_path": "/dev/fuse"}],
    ),
    KeyRule(
        "resources.agent_label",
        "warned",
        "placement goes by resources.resource_pool",
        sample="gpu-a100",
    ),
    KeyRule(
        "resources.native_parallel",
        "warned",
        "a trial's processes start as its entrypoint and launch layout say (warned when true)",
        sample=True,
    ),
    KeyRule(
        "resources.slots",
        "refused",
        "a command's key, not an experiment's; use resources.slots_per_trial",
    ),
    # environment
    KeyRule(
        "environment.environment_variables",
        "applied",
        "set for every process of the trial (a list, or per cpu/cuda/rocm)",
    ),
    KeyRule(
        "environment.image",
        "applied",
        "the trial's container image (one, or per cpu/cuda/rocm) on agents started with "
        "`--container-runtime podman|docker`, and the submit says so; agents without a "
        "runtime run the processes on the host, where environment_variables `PATH=...` "
        "chooses the interpreter; a malformed image name is refused",
    ),
    KeyRule(
        "environment.registry_auth",
        "applied",
        "the credentials of the image's pull, given to the agent's runtime only: hidden "
        "(********) wherever a config is shown and never in the trial's config; a username "
        "without a password (or `auth`) is refused",
    ),
    KeyRule(
        "environment.force_pull_image",
        "applied",
        "the image is pulled before every launch, even when the agent has it",
    ),
    KeyRule(
        "environment.pod_spec",
        "refused",
        "resolute runs no Kubernetes pods; use environment.image for the container, "
        "bind_mounts for volumes and resources.devices for devices",
    ),
    KeyRule(
        "environment.add_capabilities",
        "warned",
        "no capabilities change, on the host or in a container",
        sample=["SYS_ADMIN"],
    ),
    KeyRule(
        "environment.drop_capabilities",
        "warned",
        "no capabilities change, on the host or in a container",
        sample=["NET_RAW"],
    ),
    KeyRule(
        "environment.ports",
        "warned",
        "trials use the host's network; nothing is published",
        sample={"web": 8888},
    ),
    KeyRule(
        "environment.proxy_ports",
        "warned",
        "the master does not proxy a trial's ports; trials listen on the host's network",
        sample=[{"proxy_port": 6006}],
    ),
    # bind_mounts entries
    KeyRule(
        "bind_mounts.host_path",
        "applied",
        "must exist: refused at submit when the master shares the agents' host, and the "
        "agent fails the trial naming it before anything runs",
    ),
    KeyRule(
        "bind_mounts.container_path",
        "applied",
        "absolute, or relative to the working directory (as Determined joins it); refused "
        "over /, /run/determined, the model definition's own files, /tmp, /dev/shm, /dev, "
        "/proc, and /determined_shared_fs under shared_fs storage; a missing mount point is "
        "created",
    ),
    KeyRule(
        "bind_mounts.read_only",
        "applied",
        "a read-only bind mount: writes fail with EROFS",
    ),
    KeyRule(
        "bind_mounts.propagation",
        "warned",
        "rprivate and private hold (mounts are private to the trial's namespace); the "
        "shared and slave kinds are warned about",
        sample="rshared",
    ),
)

RESOLUTE_EXTENSIONS: tuple[str, ...] = (
    "launch_layout",
    "reproducibility.deterministic",
    "environment.dtrain_network_interface",
)
"""Keys resolute adds to Determined's config (docs/determined.md describes them)."""

REFUSED_REASONS: dict[str, str] = {rule.key: rule.note for rule in KEYS if rule.status == "refused"}


def markdown_table() -> str:
    lines = ["| Key | Here | What happens |", "| --- | --- | --- |"]
    for rule in KEYS:
        key = rule.key.replace("bind_mounts.", "bind_mounts[].")
        lines.append(f"| `{key}` | {_STATUS_TEXT[rule.status]} | {rule.note} |")
    return "\n".join(lines) + "\n"
