"""`det workspace quota` (ours) and `det workspace resource-quota` (Determined's): the
slots a workspace is guaranteed in a pool, what it may borrow and lend (docs/quotas.md)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import typer

from cli.client import MasterClient
from cli.errors import CliError
from cli.output import JsonOpt, cli_errors, print_json, print_table, stdout, warn
from cli.state import client
from cli.workspaces import workspace_by_name

quota_app = typer.Typer(
    help="Slot quotas of a workspace in resource pools (admins set them).", no_args_is_help=True
)
resource_quota_app = typer.Typer(
    help="Determined's resource quota: a workspace's nominal slots in its default pool.",
    no_args_is_help=True,
)

HEADERS = [
    "Workspace",
    "Resource Pool",
    "Nominal Slots",
    "Borrowing Limit",
    "Lending Limit",
    "Held Slots",
    "Borrowed Slots",
    "Source",
]
WorkspaceArg = typer.Argument(..., help="Name of the workspace.")
PoolOpt = typer.Option(..., "--pool", help="Name of the resource pool.")
NONE = "none"


def _limit(value: str | None, option: str) -> int | None:
    if value is None or value.lower() == NONE:
        return None
    try:
        return int(value)
    except ValueError:
        raise CliError(f"{option}: {value!r} is not a number of slots or {NONE!r}") from None


def _limit_text(value: int | None) -> str:
    return NONE if value is None else str(value)


def _row(q: dict[str, Any]) -> list[Any]:
    return [
        q["workspaceName"],
        q["resourcePool"],
        q["nominalSlots"],
        _limit_text(q["borrowingLimit"]),
        _limit_text(q["lendingLimit"]),
        q["heldSlots"],
        q["borrowedSlots"],
        q["source"],
    ]


def usage_lines(quotas: list[dict[str, Any]], pool: str | None = None) -> list[str]:
    """The block `det job list` and `det task list` print after their table: per pool, each
    workspace with a quota there, its held/nominal slots, borrowed slots and limits."""
    by_pool: dict[str, list[dict[str, Any]]] = {}
    for q in quotas:
        if pool is None or q["resourcePool"] == pool:
            by_pool.setdefault(q["resourcePool"], []).append(q)
    lines = []
    for pool_name in sorted(by_pool):
        rows = sorted(by_pool[pool_name], key=lambda q: q["workspaceName"])
        name_width = max(len(q["workspaceName"]) for q in rows)
        held = [f"{q['heldSlots']}/{q['nominalSlots']}" for q in rows]
        held_width = max(len(h) for h in held)
        lines.append(f"Quotas in pool {pool_name} (held/nominal slots):")
        for q, h in zip(rows, held, strict=True):
            lines.append(
                f"  {q['workspaceName']:<{name_width}}  {h:>{held_width}}  "
                f"{q['borrowedSlots']} borrowed; borrowing limit "
                f"{_limit_text(q['borrowingLimit'])}, lending limit "
                f"{_limit_text(q['lendingLimit'])}"
            )
    return lines


def print_usage(api: MasterClient, pool: str | None = None) -> None:
    """`usage_lines` after a blank line, if any workspace has a quota; a master that cannot
    say (an older one, Determined's) costs a warning on stderr, not the listing."""
    try:
        quotas: list[dict[str, Any]] = api.get("/api/v1/quotas").get("quotas") or []
    except CliError as exc:
        warn(f"workspace quotas not shown: {exc}")
        return
    lines = usage_lines(quotas, pool)
    if lines:
        stdout.print("\n" + "\n".join(lines), markup=False)


def _path(workspace_id: int, pool: str | None = None) -> str:
    path = f"/api/v1/workspaces/{workspace_id}/quotas"
    return path if pool is None else f"{path}/{quote(pool, safe='')}"


def _print(reply: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(reply)
    else:
        print_table(HEADERS, [_row(q) for q in reply["quotas"]])


def _current(api: MasterClient, workspace_id: int, pool: str) -> dict[str, Any] | None:
    found: list[dict[str, Any]] = api.get(_path(workspace_id))["quotas"]
    return next((q for q in found if q["resourcePool"] == pool), None)


@quota_app.command("set")
def set_quota(
    ctx: typer.Context,
    workspace: str = WorkspaceArg,
    pool: str = PoolOpt,
    nominal: int = typer.Option(
        ..., "--nominal", help="Slots the workspace is guaranteed in the pool."
    ),
    borrowing_limit: str | None = typer.Option(
        None,
        "--borrowing-limit",
        help="Slots it may use above its nominal while others leave theirs idle, or 'none' "
        "for no limit (omitted: the limit in force stays).",
    ),
    lending_limit: str | None = typer.Option(
        None,
        "--lending-limit",
        help="Slots of its nominal others may borrow while it leaves them idle, or 'none' for "
        "all of them (omitted: the limit in force stays).",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Set a workspace's quota in a pool (admins); it replaces the master config's there."""
    with cli_errors():
        borrowing = _limit(borrowing_limit, "--borrowing-limit")
        lending = _limit(lending_limit, "--lending-limit")
        api = client(ctx)
        ws = workspace_by_name(api, workspace)
        if borrowing_limit is None or lending_limit is None:
            current = _current(api, ws["id"], pool) or {}
            if borrowing_limit is None:
                borrowing = current.get("borrowingLimit")
            if lending_limit is None:
                lending = current.get("lendingLimit")
        body = {"nominalSlots": nominal, "borrowingLimit": borrowing, "lendingLimit": lending}
        reply = api.request("PUT", _path(ws["id"], pool), json=body)
        if as_json:
            print_json(reply)
            return
        q = reply["quota"]
        stdout.print(
            f"Set the quota of workspace {workspace} in pool {pool}: {q['nominalSlots']} slots, "
            f"borrowing limit {_limit_text(q['borrowingLimit'])}, lending limit "
            f"{_limit_text(q['lendingLimit'])}",
            markup=False,
        )


@quota_app.command("show")
def show_quotas(ctx: typer.Context, workspace: str = WorkspaceArg, as_json: bool = JsonOpt) -> None:
    """Show a workspace's quotas, where each comes from and the slots it holds under each."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, workspace)
        _print(api.get(_path(ws["id"])), as_json)


@quota_app.command("list")
def list_quotas(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """Show every workspace's quotas."""
    with cli_errors():
        _print(client(ctx).get("/api/v1/quotas"), as_json)


@quota_app.command("unset")
def unset_quota(ctx: typer.Context, workspace: str = WorkspaceArg, pool: str = PoolOpt) -> None:
    """Remove the quota set for a workspace in a pool (admins); the master config's, if
    any, applies again."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, workspace)
        api.request("DELETE", _path(ws["id"], pool))
        stdout.print(f"Unset the quota of workspace {workspace} in pool {pool}", markup=False)


@resource_quota_app.command("set")
def set_resource_quota(
    ctx: typer.Context,
    workspace: str = WorkspaceArg,
    quota: int = typer.Argument(
        ..., help="Slots the workspace is guaranteed in its default compute pool."
    ),
    cluster_name: str | None = typer.Option(
        None, "--cluster-name", help="This master's cluster name (Determined's; optional)."
    ),
) -> None:
    """Set a workspace's nominal quota in its default compute pool (Determined's command;
    the borrowing and lending limits in force there stay)."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, workspace)
        body = {"id": ws["id"], "clusterQuotaPairs": {cluster_name or "": quota}}
        api.post(f"/api/v1/workspaces/{ws['id']}/set-resource-quota", json=body)
        where = f" for cluster {cluster_name}" if cluster_name else ""
        stdout.print(f"Resource quota {quota} is set on workspace {workspace}{where}", markup=False)
