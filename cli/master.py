"""`det master config`, `det master logs` and `det master cluster-message set|get|clear`
(the banner admins show every user, on the dashboard and at `det user login`)."""

from __future__ import annotations

import json
from typing import Any

import typer

from cli.errors import CliError
from cli.output import JsonOpt, cli_errors, print_json, print_yaml, stdout
from cli.state import client

master_app = typer.Typer(help="The master's own settings.", no_args_is_help=True)
message_app = typer.Typer(help="Set, show or clear the cluster-wide message.", no_args_is_help=True)
master_app.add_typer(message_app, name="cluster-message")

PATH = "/api/v1/master/cluster_message"
# Determined's v1LogLevel names, shortened as its `det master logs` prints them.
LEVELS = {"LOG_LEVEL_DEBUG": "DEBUG", "LOG_LEVEL_INFO": "INFO", "LOG_LEVEL_WARNING": "WARNING"}
LEVELS |= {"LOG_LEVEL_ERROR": "ERROR", "LOG_LEVEL_CRITICAL": "CRITICAL"}


@master_app.command("config")
def config(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """The settings the master runs with, secrets masked (YAML; --json for JSON). Admins
    only."""
    with cli_errors():
        settings = client(ctx).get("/api/v1/master/config")["config"]
        if as_json:
            print_json(settings)
        else:
            print_yaml(settings)


@master_app.command("logs")
def logs(
    ctx: typer.Context,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    tail: int | None = typer.Option(
        None, "--tail", "-t", min=1, help="Only the last N lines (of the last 10,000 kept)."
    ),
) -> None:
    """The master's own log lines, oldest first. Admins only."""
    with cli_errors():
        path = f"/api/v1/master/logs?follow={str(follow).lower()}"
        if tail is not None:
            path += f"&offset={-tail}"
        with client(ctx).stream_body(path, accept="application/x-ndjson") as reply:
            for raw in reply.iter_lines():
                if not raw.strip():
                    continue
                try:
                    entry = json.loads(raw)["result"]["logEntry"]
                except (ValueError, KeyError, TypeError):
                    problem = f"the master sent a line that is no log entry: {raw[:200]!r}"
                    raise CliError(problem) from None
                level = LEVELS.get(entry.get("level"), "INFO")
                # As Determined's client prints them, so what people grep for still matches.
                print(f"[{entry['timestamp']}] [{level}]: {entry['message']}", flush=True)


def describe(message: dict[str, Any]) -> str:
    """One message as people read it: the text, then when it shows."""
    until = message.get("endTime") or "cleared"
    return f"{message['message']}\n  (from {message['startTime']} until {until})"


@message_app.command("set")
def set_message(
    ctx: typer.Context,
    message: str = typer.Option(..., "--message", "-m", help="The text (at most 250 characters)."),
    start: str | None = typer.Option(
        None, "--start", "-s", help="RFC 3339 time to start showing it (default: now)."
    ),
    end: str | None = typer.Option(
        None, "--end", "-e", help="RFC 3339 time to stop showing it (default: until cleared)."
    ),
    duration: str | None = typer.Option(
        None, "--duration", "-d", help="How long to show it instead of --end: 24h, 90m, 5d, 2w."
    ),
) -> None:
    """Show a message to every user from --start until --end (or for --duration); it
    replaces any message set before. Admins only."""
    with cli_errors():
        body = {"message": message, "startTime": start, "endTime": end, "duration": duration}
        client(ctx).request("PUT", PATH, json=body)
        stdout.print("Cluster message set", markup=False)


@message_app.command("get")
def get_message(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """The message showing or scheduled to show, if any. Admins only."""
    with cli_errors():
        reply = client(ctx).get(PATH)
        message = reply.get("clusterMessage")
        if as_json:
            print_json(message)
        elif message is None:
            stdout.print("No cluster message is set", markup=False)
        else:
            stdout.print(describe(message), markup=False)


@message_app.command("clear")
def clear_message(ctx: typer.Context) -> None:
    """Stop showing the message (and drop a scheduled one). Admins only."""
    with cli_errors():
        client(ctx).request("DELETE", PATH)
        stdout.print("Cluster message cleared", markup=False)
