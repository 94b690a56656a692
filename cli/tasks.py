"""`det command`, `det notebook`, `det shell` and `det tensorboard`, as in Determined's CLI.

Notebooks and TensorBoards are opened through the master's proxy (`<master>/proxy/<id>/`);
`det shell start` opens a terminal on the task's agent over a WebSocket through the same
proxy, so nothing on the agents needs to be reachable from the laptop.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import typer
import yaml

from cli.client import MasterClient
from cli.config_overrides import ConfigOverrideError, apply_config_overrides
from cli.context import read_model_dir
from cli.errors import CliError
from cli.logs import _print as print_logs
from cli.output import (
    CsvOpt,
    JsonOpt,
    cli_errors,
    one_format,
    print_json,
    print_table,
    short_time,
    stdout,
)
from cli.state import client
from cli.workspaces import workspace_by_name

# Determined's CLI waits this long for a notebook before giving up on it.
READY_TIMEOUT_S = 600.0
POLL_S = 0.1

ConfigOpt = typer.Option(
    None,
    "--config",
    metavar="KEY=VALUE",
    help="Change the config (resources.slots=0, idle_timeout=30m); repeatable.",
)
ConfigFileOpt = typer.Option(None, "--config-file", help="Task config (YAML).")
TemplateOpt = typer.Option(None, "--template", help="Config template to merge in.")
DetachOpt = typer.Option(False, "-d", "--detach", help="Print the id and return at once.")
ContextOpt = typer.Option(
    None,
    "-c",
    "--context",
    help="Send this directory's files with the task; it runs with them in its working "
    "directory (.detignore skips files; limit as for a model definition, 96 MiB).",
)
AllOpt = typer.Option(False, "-a", "--all", help="Every user's, not only yours.")
WorkspaceOpt = typer.Option(
    None,
    "-w",
    "--workspace-name",
    help="Run it in this workspace (its pools and members); omitted: Uncategorized.",
)

_KINDS = {
    "command": ("commands", "Command"),
    "notebook": ("notebooks", "Notebook"),
    "shell": ("shells", "Shell"),
    "tensorboard": ("tensorboards", "TensorBoard"),
}


def _config(config_file: Path | None, overrides: list[str] | None) -> dict[str, Any]:
    config: Any = {}
    if config_file is not None:
        try:
            config = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise CliError(f"cannot read {config_file}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise CliError(f"{config_file}: not YAML: {exc}") from None
        if not isinstance(config, dict):
            raise CliError(f"{config_file}: the config must be a mapping of keys to values")
    try:
        return apply_config_overrides(config, overrides or [])
    except ConfigOverrideError as exc:
        raise CliError(str(exc)) from None


def _create(
    api: MasterClient,
    kind: str,
    config: dict[str, Any],
    template: str | None,
    workspace: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    plural, _ = _KINDS[kind]
    body = {"config": config, "templateName": template, **extra}
    if workspace is not None:
        body["workspaceId"] = workspace_by_name(api, workspace)["id"]
    reply: dict[str, Any] = api.post(f"/api/v1/{plural}", json=body)[kind]
    return reply


def _context_files(context: Path | None) -> dict[str, Any]:
    """The request's `files`, packed as an experiment's model definition; none without -c."""
    if context is None:
        return {}
    return {"files": read_model_dir(context, what="context directory")}


def _get(api: MasterClient, kind: str, task_id: str) -> dict[str, Any]:
    plural, _ = _KINDS[kind]
    reply: dict[str, Any] = api.get(f"/api/v1/{plural}/{quote(task_id, safe='')}")[kind]
    return reply


def _ended(task: dict[str, Any]) -> CliError:
    code = task.get("exitCode")
    said = f" (exit code {code})" if code not in (None, 0) else ""
    return CliError(f"{task['description']} {task['id']} ended{said}: {task.get('endReason')}")


def wait_until_serving(
    api: MasterClient, kind: str, task_id: str, timeout_s: float = READY_TIMEOUT_S
) -> dict[str, Any]:
    """Until the task's page answers through the proxy: scheduled, started, and its server
    listening. Says once why it waits; raises with the reason if the task ends."""
    deadline = time.monotonic() + timeout_s
    said = ""
    headers = {"Authorization": f"Bearer {api.session_token()}"}
    while True:
        task = _get(api, kind, task_id)
        state = task["state"]
        if state == "STATE_TERMINATED":
            raise _ended(task)
        if state == "STATE_RUNNING":
            try:
                reply = api._http.get(task["serviceAddress"], headers=headers)
            except httpx.HTTPError:
                reply = None
            # 502/503: running, but its server is not listening yet.
            if reply is not None and reply.status_code < 500:
                return task
        elif task.get("pendingReason") and task["pendingReason"] != said:
            said = task["pendingReason"]
            print(f"waiting: {said}", file=sys.stderr, flush=True)
        if time.monotonic() > deadline:
            raise CliError(f"{task_id} is not serving after {timeout_s:g} s ({state})")
        time.sleep(POLL_S if state == "STATE_RUNNING" else 0.25)


def _list(ctx: typer.Context, kind: str, every: bool, as_json: bool, as_csv: bool) -> None:
    plural = _KINDS[kind][0]
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        params: dict[str, Any] = {}
        if not every:
            api.session_token()  # the login decides who "you" are
            params = {"users": [api.user]}
        items = api.get(f"/api/v1/{plural}", params=params)[plural]
        if as_json:
            print_json(items)
            return
        rows = [
            [
                t["id"],
                t["username"],
                t["description"],
                t["state"].removeprefix("STATE_"),
                short_time(t.get("startTime")),
                t.get("exitStatus") or t.get("pendingReason") or "",
                *([t.get("serviceAddress", "")] if kind != "command" else []),
            ]
            for t in items
        ]
        headers = ["Id", "Owner", "Description", "State", "Started", "Exit Status"]
        print_table(headers + (["Address"] if kind != "command" else []), rows, as_csv=as_csv)


def _kill(ctx: typer.Context, kind: str, task_ids: list[str]) -> None:
    plural, title = _KINDS[kind]
    with cli_errors():
        api = client(ctx)
        for task_id in task_ids:
            api.post(f"/api/v1/{plural}/{quote(task_id, safe='')}/kill")
            stdout.print(f"Killed {title.lower()} {task_id}", markup=False)


def _logs(ctx: typer.Context, task_id: str, follow: bool) -> None:
    params: dict[str, Any] = {"follow": "true" if follow else "false"}
    print_logs(ctx, f"/api/v1/tasks/{quote(task_id, safe='')}/logs", params, False)


def _url(api: MasterClient, task: dict[str, Any]) -> str:
    return f"{api.base_url}{task['serviceAddress']}"


def _open_browser(url: str) -> None:
    # Only where a browser can show it: a console browser would take over the terminal.
    if (
        os.environ.get("DISPLAY")
        or os.environ.get("WAYLAND_DISPLAY")
        or sys.platform
        in (
            "darwin",
            "win32",
        )
    ):
        webbrowser.open(url)


# -- det command ---------------------------------------------------------------------------

command_app = typer.Typer(help="Run commands on the cluster.", no_args_is_help=True)


@command_app.command("run", context_settings={"allow_interspersed_args": False})
def command_run(
    ctx: typer.Context,
    entrypoint: list[str] = typer.Argument(..., help="The command and its arguments."),
    config_file: Path | None = ConfigFileOpt,
    overrides: list[str] | None = ConfigOpt,
    template: str | None = TemplateOpt,
    context: Path | None = ContextOpt,
    detach: bool = DetachOpt,
    workspace: str | None = WorkspaceOpt,
) -> None:
    """Run a command on an agent and print its output; exits with its exit code. With -c
    DIR it runs in a copy of DIR: det cmd run -c . python3 prep.py"""
    with cli_errors():
        api = client(ctx)
        config = _config(config_file, overrides)
        config["entrypoint"] = entrypoint
        task = _create(api, "command", config, template, workspace, **_context_files(context))
        if detach:
            stdout.print(task["id"], markup=False)
            return
        print(f"Launched command (id: {task['id']})", file=sys.stderr, flush=True)
    _logs(ctx, task["id"], follow=True)
    with cli_errors():
        task = _get(api, "command", task["id"])
        code = task.get("exitCode")
        if code is None:
            raise _ended(task)
    raise typer.Exit(code)


# -- det notebook, det tensorboard ----------------------------------------------------------

notebook_app = typer.Typer(help="Jupyter notebooks on the cluster.", no_args_is_help=True)
tensorboard_app = typer.Typer(help="TensorBoards of experiments and trials.", no_args_is_help=True)


def _start_served(
    ctx: typer.Context,
    kind: str,
    config: dict[str, Any],
    template: str | None,
    detach: bool,
    no_browser: bool,
    workspace: str | None,
    **extra: Any,
) -> None:
    with cli_errors():
        api = client(ctx)
        task = _create(api, kind, config, template, workspace, **extra)
        title = _KINDS[kind][1]
        print(f"Scheduling {task['description']} (id: {task['id']})", file=sys.stderr, flush=True)
        if detach:
            stdout.print(task["id"], markup=False)
            return
        task = wait_until_serving(api, kind, task["id"])
        url = _url(api, task)
        stdout.print(f"{title} {task['id']} is ready at {url}", markup=False)
        if not no_browser:
            _open_browser(url)


@notebook_app.command("start")
def notebook_start(
    ctx: typer.Context,
    config_file: Path | None = ConfigFileOpt,
    overrides: list[str] | None = ConfigOpt,
    template: str | None = TemplateOpt,
    context: Path | None = ContextOpt,
    detach: bool = DetachOpt,
    no_browser: bool = typer.Option(False, "--no-browser", help="Only print its address."),
    workspace: str | None = WorkspaceOpt,
) -> None:
    """Start a JupyterLab; prints its address once it answers."""
    with cli_errors():  # a bad config or context: one line, as everywhere else
        files = _context_files(context)
        config = _config(config_file, overrides)
    _start_served(ctx, "notebook", config, template, detach, no_browser, workspace, **files)


@tensorboard_app.command("start")
def tensorboard_start(
    ctx: typer.Context,
    experiment_ids: list[int] | None = typer.Argument(None, help="Experiments to show."),
    trial_ids: list[int] | None = typer.Option(
        None, "--trial-ids", "-t", help="A trial to show (repeatable): -t 12 -t 13."
    ),
    config_file: Path | None = ConfigFileOpt,
    overrides: list[str] | None = ConfigOpt,
    template: str | None = TemplateOpt,
    detach: bool = DetachOpt,
    no_browser: bool = typer.Option(False, "--no-browser", help="Only print its address."),
    workspace: str | None = WorkspaceOpt,
) -> None:
    """Start a TensorBoard over experiments' and trials' metrics; prints its address once it
    answers."""
    with cli_errors():
        config = _config(config_file, overrides)
    _start_served(
        ctx,
        "tensorboard",
        config,
        template,
        detach,
        no_browser,
        workspace,
        experimentIds=experiment_ids or [],
        trialIds=trial_ids or [],
    )


# -- det shell ------------------------------------------------------------------------------

shell_app = typer.Typer(help="Interactive shells on cluster nodes.", no_args_is_help=True)


def _attach(api: MasterClient, task: dict[str, Any], command: str | None = None) -> int:
    from cli.terminal import attach  # imported here: only shells need websockets
    from resolute.shell_access import TERMINAL

    # .../terminal: the shell server's terminal protocol (its root is Determined's ssh tunnel).
    url = _url(api, task).replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    url += TERMINAL
    tls = api.tls.verify if api.tls is not None else None
    context = tls if not isinstance(tls, bool) else None
    if tls is False:
        import ssl

        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    elif url.startswith("wss://") and context is None:
        import ssl

        context = ssl.create_default_context()
    headers = {"Authorization": f"Bearer {api.session_token()}"}
    import asyncio  # here: only an attached terminal needs it, and it slows every start

    return asyncio.run(attach(url, headers, context, command=command))


def _shell_command(command: list[str] | None, detach: bool) -> str | None:
    """The words after `--`, joined as ssh joins them for Determined's client."""
    if not command:
        return None
    if command[0].startswith("-"):
        raise CliError(
            f"{command[0]}: ssh options are not supported (this client opens no ssh "
            "connection); after -- give a command to run in the shell"
        )
    if detach:
        raise CliError("--detach: a command after -- needs the shell attached; drop -d")
    return " ".join(command)


@shell_app.command("start")
def shell_start(
    ctx: typer.Context,
    command: list[str] | None = typer.Argument(
        None,
        metavar="-- CMD",
        help="Run this in the shell instead of opening a terminal (print its output, exit "
        "with its code): det shell start -- python3 check.py",
    ),
    config_file: Path | None = ConfigFileOpt,
    overrides: list[str] | None = ConfigOpt,
    template: str | None = TemplateOpt,
    context: Path | None = ContextOpt,
    detach: bool = DetachOpt,
    keep: bool = typer.Option(
        False, "--keep", help="Keep the shell running after this terminal closes."
    ),
    workspace: str | None = WorkspaceOpt,
) -> None:
    """Start a shell on an agent and open a terminal in it (or run a command given after
    --); exits with the shell's code. The shell task ends with the terminal or the command
    (its slots are freed) unless --keep or -d."""
    with cli_errors():
        api = client(ctx)
        line = _shell_command(command, detach)
        config = _config(config_file, overrides)
        task = _create(api, "shell", config, template, workspace, **_context_files(context))
        print(f"Launched shell (id: {task['id']})", file=sys.stderr, flush=True)
        if detach:
            stdout.print(task["id"], markup=False)
            return
        try:
            task = wait_until_serving(api, "shell", task["id"])
            code = _attach(api, task, line)
        finally:
            if not keep:
                with contextlib.suppress(CliError):
                    api.post(f"/api/v1/shells/{quote(task['id'], safe='')}/kill")
    raise typer.Exit(code)


@shell_app.command("open")
def shell_open(ctx: typer.Context, task_id: str = typer.Argument(..., help="Shell ID.")) -> None:
    """Open another terminal in a running shell."""
    with cli_errors():
        api = client(ctx)
        task = wait_until_serving(api, "shell", task_id, timeout_s=60.0)
    raise typer.Exit(_attach(api, task))


def _add_common(app: typer.Typer, kind: str) -> None:
    title = _KINDS[kind][1]

    def list_(
        ctx: typer.Context, every: bool = AllOpt, as_json: bool = JsonOpt, as_csv: bool = CsvOpt
    ) -> None:
        _list(ctx, kind, every, as_json, as_csv)

    def logs(
        ctx: typer.Context,
        task_id: str = typer.Argument(..., help=f"{title} ID."),
        follow: bool = typer.Option(False, "-f", "--follow", help="Until it ends."),
    ) -> None:
        _logs(ctx, task_id, follow)

    def kill(
        ctx: typer.Context, task_ids: list[str] = typer.Argument(..., help=f"{title} IDs.")
    ) -> None:
        _kill(ctx, kind, task_ids)

    noun = title if kind == "tensorboard" else kind
    list_.__doc__ = f"Your {noun}s (all users' with -a)."
    logs.__doc__ = f"Print a {noun}'s logs."
    kill.__doc__ = f"Stop {noun}s."
    app.command("list")(list_)
    app.command("ls", hidden=True)(list_)
    app.command("logs")(logs)
    app.command("kill")(kill)


for _app, _kind in (
    (command_app, "command"),
    (notebook_app, "notebook"),
    (tensorboard_app, "tensorboard"),
    (shell_app, "shell"),
):
    _add_common(_app, _kind)
