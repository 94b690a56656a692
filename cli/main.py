"""`det`: resolute's command-line client, one sub-command per noun."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import typer

from cli.state import Globals
from master.version import DETERMINED_COMPAT_VERSION, __version__


# The sub-command groups, in the order help lists them, and how to build each. A group's
# module is imported, and its commands turned into click's, only when the command line
# names it: importing and building all 240 commands cost every `det` call more CPU than
# the call itself.
def _templates() -> typer.Typer:
    from cli import templates

    return templates.app


@functools.cache
def _experiments() -> typer.Typer:
    from cli import checkpoints, experiments, logs

    experiments.app.command("logs")(logs.experiment_logs)
    # Determined 0.38's own spelling of `det checkpoint list`.
    experiments.app.command("list-checkpoints")(checkpoints.list_checkpoints)
    experiments.app.command("lc", hidden=True)(checkpoints.list_checkpoints)
    return experiments.app


@functools.cache
def _trials() -> typer.Typer:
    from cli import checkpoints, logs, trials

    logs.trial_app.command("describe")(trials.describe)
    logs.trial_app.command("kill")(trials.kill)
    logs.trial_app.command("download")(checkpoints.download_from_trial)
    return logs.trial_app


def _checkpoints() -> typer.Typer:
    from cli import checkpoints

    return checkpoints.app


def _models() -> typer.Typer:
    from cli import models

    return models.app


@functools.cache
def _tasks() -> typer.Typer:
    from cli import cluster, logs

    cluster.task_app.command("logs")(logs.task_logs)
    return cluster.task_app


@functools.cache
def _pools() -> typer.Typer:
    from cli import cluster, pool_bindings

    cluster.pool_app.add_typer(pool_bindings.app, name="bindings")
    return cluster.pool_app


@functools.cache
def _workspaces() -> typer.Typer:
    from cli import quotas, workspaces

    workspaces.workspace_app.add_typer(quotas.quota_app, name="quota")
    workspaces.workspace_app.add_typer(quotas.resource_quota_app, name="resource-quota")
    return workspaces.workspace_app


def _cluster(name: str) -> Callable[[], typer.Typer]:
    def build() -> typer.Typer:
        from cli import cluster

        app: typer.Typer = getattr(cluster, name)
        return app

    return build


def _module(module: str, name: str) -> Callable[[], typer.Typer]:
    def build() -> typer.Typer:
        app: typer.Typer = getattr(importlib.import_module(f"cli.{module}"), name)
        return app

    return build


class _Group(NamedTuple):
    names: tuple[str, ...]  # the first is listed in help, the others are hidden aliases
    build: Callable[[], typer.Typer]
    hidden: bool = False


_GROUPS = (
    _Group(("template", "tpl"), _templates),
    _Group(("experiment", "e"), _experiments),
    _Group(("trial", "t"), _trials),
    _Group(("checkpoint", "c"), _checkpoints),
    _Group(("model", "m"), _models),
    _Group(("task",), _tasks),
    _Group(("agent", "a"), _cluster("agent_app")),
    _Group(("slot", "s"), _cluster("slot_app")),
    _Group(("job", "j"), _cluster("job_app")),
    _Group(("resource-pool", "rp"), _pools),
    _Group(("user", "u"), _module("users", "user_app")),
    _Group(("user-group",), _module("user_groups", "group_app")),
    _Group(("rbac",), _module("rbac", "rbac_app")),
    _Group(("dev",), _module("users", "dev_app"), hidden=True),
    _Group(("command", "cmd"), _module("tasks", "command_app")),
    _Group(("notebook",), _module("tasks", "notebook_app")),
    _Group(("shell",), _module("tasks", "shell_app")),
    _Group(("tensorboard",), _module("tasks", "tensorboard_app")),
    _Group(("token", "tkn"), _module("tokens", "token_app")),
    _Group(("workspace", "w"), _workspaces),
    _Group(("webhook",), _module("webhooks", "app")),
    _Group(("project", "p"), _module("workspaces", "project_app")),
    _Group(("master",), _module("master", "master_app")),
)
# Options of `det` itself that take a value: the group named is the first word after them.
_VALUE_OPTIONS = ("-m", "--master", "-u", "--user")


def _named_group(argv: list[str]) -> str | None:
    words = iter(argv)
    for word in words:
        if word in ("-h", "--help"):
            return None  # `det -h e`: the help of `det` itself, which lists every group
        if word in _VALUE_OPTIONS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_app(only: str | None = None) -> typer.Typer:
    """`det` with every group, or with only the group `only` names when there is one."""
    app = typer.Typer(
        name="det",
        help="Command-line client for the resolute master.",
        no_args_is_help=True,
        context_settings={"help_option_names": ["-h", "--help"]},
        add_completion=False,
    )
    app.callback()(root)
    app.command("preview-search")(preview_search)
    app.command("version")(version)
    named = [g for g in _GROUPS if only in g.names]
    for group in named or _GROUPS:  # a word that names no group: all, for click's error
        commands = group.build()
        for index, name in enumerate(group.names):
            app.add_typer(commands, name=name, hidden=group.hidden or index > 0)
    return app


def root(
    ctx: typer.Context,
    master: str | None = typer.Option(
        None, "-m", "--master", help="Master address (else DET_MASTER, else localhost:8080)."
    ),
    user: str | None = typer.Option(
        None, "-u", "--user", help="User name (else DET_USER, else determined)."
    ),
) -> None:
    ctx.obj = Globals(master=master, user=user)


def preview_search(
    ctx: typer.Context,
    config_file: Path = typer.Argument(..., help="Experiment config (YAML)."),
) -> None:
    """Show the trials a searcher would run and how far each trains (Determined's
    preview-search)."""
    from cli import experiments

    experiments.preview_search(ctx, config_file)


def version() -> None:
    """Print the client version."""
    typer.echo(f"resolute {__version__} (Determined API {DETERMINED_COMPAT_VERSION})")


def main() -> None:
    sys.exit(build_app(_named_group(sys.argv[1:]))())
