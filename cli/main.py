"""`det`: resolute's command-line client, one sub-command per noun."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from cli import (
    checkpoints,
    cluster,
    experiments,
    logs,
    master,
    models,
    tasks,
    templates,
    tokens,
    trials,
    users,
    webhooks,
    workspaces,
)
from cli.state import Globals
from master.version import DETERMINED_COMPAT_VERSION, __version__

app = typer.Typer(
    name="det",
    help="Command-line client for the resolute master.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
)
app.add_typer(templates.app, name="template")
app.add_typer(templates.app, name="tpl", hidden=True)
app.add_typer(experiments.app, name="experiment")
app.add_typer(experiments.app, name="e", hidden=True)
logs.trial_app.command("describe")(trials.describe)
logs.trial_app.command("kill")(trials.kill)
experiments.app.command("logs")(logs.experiment_logs)
app.add_typer(logs.trial_app, name="trial")
app.add_typer(logs.trial_app, name="t", hidden=True)
# Determined 0.38's own spelling of `det checkpoint list`.
experiments.app.command("list-checkpoints")(checkpoints.list_checkpoints)
experiments.app.command("lc", hidden=True)(checkpoints.list_checkpoints)
app.add_typer(checkpoints.app, name="checkpoint")
app.add_typer(checkpoints.app, name="c", hidden=True)
app.add_typer(models.app, name="model")
app.add_typer(models.app, name="m", hidden=True)
cluster.task_app.command("logs")(logs.task_logs)
app.add_typer(cluster.task_app, name="task")
app.add_typer(cluster.agent_app, name="agent")
app.add_typer(cluster.agent_app, name="a", hidden=True)
app.add_typer(cluster.slot_app, name="slot")
app.add_typer(cluster.slot_app, name="s", hidden=True)
app.add_typer(cluster.job_app, name="job")
app.add_typer(cluster.job_app, name="j", hidden=True)
app.add_typer(cluster.pool_app, name="resource-pool")
app.add_typer(cluster.pool_app, name="rp", hidden=True)
app.add_typer(users.user_app, name="user")
app.add_typer(users.user_app, name="u", hidden=True)
app.add_typer(users.dev_app, name="dev", hidden=True)
app.add_typer(tasks.command_app, name="command")
app.add_typer(tasks.command_app, name="cmd", hidden=True)
app.add_typer(tasks.notebook_app, name="notebook")
app.add_typer(tasks.shell_app, name="shell")
app.add_typer(tasks.tensorboard_app, name="tensorboard")
app.add_typer(tokens.token_app, name="token")
app.add_typer(tokens.token_app, name="tkn", hidden=True)
app.add_typer(workspaces.workspace_app, name="workspace")
app.add_typer(workspaces.workspace_app, name="w", hidden=True)
app.add_typer(webhooks.app, name="webhook")
app.add_typer(workspaces.project_app, name="project")
app.add_typer(workspaces.project_app, name="p", hidden=True)
app.add_typer(master.master_app, name="master")


@app.callback()
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


@app.command("preview-search")
def preview_search(
    ctx: typer.Context,
    config_file: Path = typer.Argument(..., help="Experiment config (YAML)."),
) -> None:
    """Show the trials a searcher would run and how far each trains (Determined's
    preview-search)."""
    experiments.preview_search(ctx, config_file)


@app.command("version")
def version() -> None:
    """Print the client version."""
    typer.echo(f"resolute {__version__} (Determined API {DETERMINED_COMPAT_VERSION})")


def main() -> None:
    sys.exit(app())
