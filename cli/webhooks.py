"""`det webhook`: tell an endpoint (a team's service, Slack) about experiments and logs."""

from __future__ import annotations

from typing import Any

import typer

from cli.errors import CliError
from cli.output import CsvOpt, JsonOpt, cli_errors, one_format, print_json, print_table, stdout
from cli.state import client

app = typer.Typer(help="Manage webhooks.", no_args_is_help=True)

HEADERS = ["ID", "Name", "Type", "Mode", "Workspace", "URL", "Triggers"]
TRIGGER_HELP = (
    "What fires it (repeatable): state:COMPLETED (an experiment state), log:REGEX (a task "
    "log line matching REGEX), or custom (alerts from trials; needs --mode specific)."
)


def _trigger(text: str) -> dict[str, Any]:
    kind, _, value = text.partition(":")
    if kind == "state" and value:
        return {
            "triggerType": "TRIGGER_TYPE_EXPERIMENT_STATE_CHANGE",
            "condition": {"state": value.upper()},
        }
    if kind == "log" and value:
        return {"triggerType": "TRIGGER_TYPE_TASK_LOG", "condition": {"regex": value}}
    if kind == "custom" and not value:
        return {"triggerType": "TRIGGER_TYPE_CUSTOM", "condition": {}}
    raise CliError(f"--trigger: {text!r} is not state:STATE, log:REGEX or custom")


def _describe_trigger(t: dict[str, Any]) -> str:
    kind = str(t.get("triggerType", "")).removeprefix("TRIGGER_TYPE_")
    condition = t.get("condition") or {}
    if "state" in condition:
        return f"state:{condition['state']}"
    if "regex" in condition:
        return f"log:{condition['regex']}"
    return kind.lower()


def _row(w: dict[str, Any]) -> list[Any]:
    return [
        w["id"],
        w["name"],
        str(w["webhookType"]).removeprefix("WEBHOOK_TYPE_"),
        str(w["mode"]).removeprefix("WEBHOOK_MODE_"),
        w.get("workspaceId") or "all",
        w["url"],
        ", ".join(_describe_trigger(t) for t in w.get("triggers") or []),
    ]


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The webhook's name (experiments may name it)."),
    url: str = typer.Argument(..., help="Where deliveries go: an http:// or https:// URL."),
    triggers: list[str] = typer.Option(..., "--trigger", help=TRIGGER_HELP),
    kind: str = typer.Option("default", "--type", help="default (JSON) or slack."),
    mode: str = typer.Option(
        "workspace", "--mode", help="workspace (every experiment) or specific (those naming it)."
    ),
    workspace_id: int = typer.Option(0, "--workspace-id", help="Only this workspace (0: all)."),
    as_json: bool = JsonOpt,
) -> None:
    """Create a webhook (admins; a workspace's owner for its own)."""
    with cli_errors():
        body = {
            "name": name,
            "url": url,
            "webhookType": f"WEBHOOK_TYPE_{kind.upper()}",
            "mode": f"WEBHOOK_MODE_{mode.upper()}",
            "workspaceId": workspace_id,
            "triggers": [_trigger(t) for t in triggers],
        }
        webhook = client(ctx).post("/api/v1/webhooks", json=body)["webhook"]
        if as_json:
            print_json(webhook)
        else:
            stdout.print(f"Created webhook {webhook['id']}", markup=False)


@app.command("list")
def list_webhooks(ctx: typer.Context, as_json: bool = JsonOpt, as_csv: bool = CsvOpt) -> None:
    """List the webhooks you may see."""
    with cli_errors():
        one_format(as_json, as_csv)
        found = client(ctx).get("/api/v1/webhooks")["webhooks"]
        if as_json:
            print_json(found)
            return
        print_table(HEADERS, [_row(w) for w in found], as_csv=as_csv)


app.command("ls", hidden=True)(list_webhooks)


@app.command("delete")
def delete(
    ctx: typer.Context, webhook_id: int = typer.Argument(..., help="The webhook's id.")
) -> None:
    """Delete a webhook; its deliveries not yet made are dropped."""
    with cli_errors():
        client(ctx).request("DELETE", f"/api/v1/webhooks/{webhook_id}")
        stdout.print(f"Deleted webhook {webhook_id}", markup=False)


@app.command("test")
def test(
    ctx: typer.Context, webhook_id: int = typer.Argument(..., help="The webhook's id.")
) -> None:
    """Send a test delivery now and say whether the endpoint took it."""
    with cli_errors():
        client(ctx).post(f"/api/v1/webhooks/{webhook_id}/test")
        stdout.print(f"Webhook {webhook_id}: the test delivery was accepted", markup=False)
