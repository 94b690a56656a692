"""Commands, notebooks, shells and TensorBoards: their config and what they run. No I/O.

The config is Determined's command config (`det cmd run --config-file`): description,
entrypoint, resources, environment, bind_mounts, work_dir, idle_timeout and
notebook_idle_type. Every key Determined documents is accepted and checked as an
experiment's is (the image runs on agents with a container runtime), except pod_spec, which
is refused as it is for experiments.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError

from master.core import expconf
from master.core.errors import ConfigError, ConfigProblem

TASK_TYPES = ("COMMAND", "NOTEBOOK", "SHELL", "TENSORBOARD")
# Determined's idle types. "activity" (traffic through the proxy) is what we measure for
# every type; the notebook types also count a kernel that is busy running a cell.
IDLE_TYPES = ("kernels_or_terminals", "kernel_connections", "activity")
DEFAULT_PRIORITY = 42
MAX_IDLE_TIMEOUT_S = 365 * 24 * 3600.0

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class TaskResources(expconf._Strict):
    # A command's processes run on one agent, given all its slots (Determined's rule).
    slots: int = Field(default=1, ge=0, le=2**31 - 1)
    resource_pool: str = ""
    priority: int | None = Field(default=None, ge=1, le=99)
    weight: float = Field(default=1.0, gt=0)
    shm_size: expconf.ShmSize = None
    devices: list[expconf.Device] = Field(default_factory=list)
    max_slots: int | None = None
    is_single_node: bool | None = None


class TaskConfig(expconf._Strict):
    description: str = ""
    entrypoint: str | list[str] | None = None
    resources: TaskResources = Field(default_factory=TaskResources)
    environment: expconf.Environment = Field(default_factory=expconf.Environment)
    bind_mounts: list[expconf.BindMount] = Field(default_factory=list)
    work_dir: str | None = None
    # A duration ("30m", "1h30m", "90s") or seconds; none: the pool's default.
    idle_timeout: str | int | float | None = None
    notebook_idle_type: Literal["kernels_or_terminals", "kernel_connections", "activity"] = (
        "kernels_or_terminals"
    )
    debug: bool = False
    tensorboard_args: list[str] = Field(default_factory=list)
    pbs: dict[str, Any] | None = None
    slurm: dict[str, Any] | None = None


def parse_duration(value: Any, path: str) -> float:
    """Seconds in a Go-style duration ("30m", "1h30m", "45s") or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError.at(path, 'must be a duration such as "30m" or a number of seconds')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        parts = _DURATION.findall(text)
        if "".join(n + u for n, u in parts) != text:
            raise ConfigError.at(
                path, f'{value!r} is not a duration; write it as "30m", "1h30m" or "90s"'
            )
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise ConfigError.at(path, 'must be a duration such as "30m" or a number of seconds')
    if not 0 < seconds <= MAX_IDLE_TIMEOUT_S:
        raise ConfigError.at(path, "must be more than 0 and at most 365 days")
    return seconds


def validate_task_config(raw: Mapping[str, Any], task_type: str) -> TaskConfig:
    """The typed config, or every problem with the field's path."""
    if not isinstance(raw, Mapping):
        raise ConfigError.at("", "the config must be a mapping of keys to values")
    problems: list[ConfigProblem] = []
    config: TaskConfig | None = None
    try:
        config = TaskConfig.model_validate(dict(raw))
    except ValidationError as exc:
        problems.extend(expconf._problems_from(exc, TaskConfig))
    if raw.get("idle_timeout") is not None and isinstance(raw["idle_timeout"], str | int | float):
        try:
            parse_duration(raw["idle_timeout"], "idle_timeout")
        except ConfigError as exc:
            problems.extend(exc.problems)
    if config is not None and task_type == "COMMAND" and not command_argv(config.entrypoint):
        problems.append(ConfigProblem("entrypoint", "a command needs a command to run"))
    if config is not None and task_type:  # complete: after any template merge
        problems.extend(expconf.registry_auth_problems(config.environment))
    if problems:
        raise ConfigError(problems)
    assert config is not None
    resources = raw.get("resources")
    if task_type == "TENSORBOARD" and not (isinstance(resources, Mapping) and "slots" in resources):
        # As in Determined, a TensorBoard takes no slot unless its config asks for some: it
        # must not keep a trial waiting on a small cluster.
        config = config.model_copy(
            update={"resources": config.resources.model_copy(update={"slots": 0})}
        )
    return config


def idle_timeout_s(
    config: TaskConfig, task_type: str, pool_default_s: float | None
) -> float | None:
    """Commands run until they exit; the interactive types end after idle_timeout."""
    if task_type == "COMMAND":
        return None
    if config.idle_timeout is not None:
        return parse_duration(config.idle_timeout, "idle_timeout")
    return pool_default_s


def command_argv(entrypoint: str | Sequence[str] | None) -> list[str]:
    """Determined runs a one-string entrypoint through the shell (`det cmd run 'a; b'`),
    and a list as it is."""
    if entrypoint is None:
        return []
    if isinstance(entrypoint, str):
        return ["sh", "-c", entrypoint] if entrypoint.strip() else []
    items = [str(item) for item in entrypoint]
    if len(items) == 1:
        return ["sh", "-c", items[0]] if items[0].strip() else []
    return items


def proxy_prefix(task_uuid: str) -> str:
    """Where the master serves the task: its server is started with this base path, so
    its own links and redirects already point through the proxy."""
    return f"/proxy/{task_uuid}/"


def task_argv(
    task_type: str,
    config: TaskConfig,
    *,
    task_uuid: str,
    port: int,
    python: str = "python3",
    experiment_ids: Sequence[int] = (),
    trial_ids: Sequence[int] = (),
) -> list[str]:
    """The process a task's agent starts. Its servers listen on `port` (reserved by the
    agent) and read their secret from RESOLUTE_TASK_SECRET."""
    prefix = proxy_prefix(task_uuid)
    if task_type == "COMMAND":
        return command_argv(config.entrypoint)
    if task_type == "NOTEBOOK":
        # Jupyter reads its token from the environment (JUPYTER_TOKEN), never argv, which
        # any user of the agent could read in `ps`.
        return [
            python,
            "-m",
            "jupyterlab",
            "--ServerApp.ip=0.0.0.0",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.base_url={prefix}",
            "--ServerApp.open_browser=False",
            # The master's proxy is the only way in, and it forwards the browser's Origin.
            "--ServerApp.allow_origin=*",
            "--ServerApp.allow_remote_access=True",
            "--ServerApp.root_dir=.",
            # Ranks run as root on agents without a rank_user; Jupyter refuses root unless told.
            "--ServerApp.allow_root=True",
        ]
    if task_type == "SHELL":
        return [python, "-m", "resolute.shell_server", "--port", str(port)]
    if task_type == "TENSORBOARD":
        return [
            python,
            "-m",
            "resolute.tensorboard_task",
            "--port",
            str(port),
            "--path-prefix",
            prefix.rstrip("/"),
            *[str(e) for e in experiment_ids],
            *[arg for t in trial_ids for arg in ("--trial", str(t))],
        ]
    raise ValueError(f"unknown task type {task_type!r}")


def describe(
    task_type: str,
    config: TaskConfig,
    experiment_ids: Sequence[int] = (),
    trial_ids: Sequence[int] = (),
) -> str:
    """Determined's default descriptions ("Command (echo hi)", "TensorBoard (Experiments 1)")."""
    if config.description:
        return config.description
    if task_type == "COMMAND":
        argv = command_argv(config.entrypoint)
        shown = argv[2] if argv[:2] == ["sh", "-c"] else shlex.join(argv)
        return f"Command ({shown[:200]})"
    if task_type == "TENSORBOARD":
        sources = [
            f"{noun}{'s' if len(ids) > 1 else ''} {', '.join(str(i) for i in ids)}"
            for noun, ids in (("Experiment", experiment_ids), ("Trial", trial_ids))
            if ids
        ]
        return f"TensorBoard ({'; '.join(sources)})"
    return {"NOTEBOOK": "Notebook", "SHELL": "Shell"}[task_type]
