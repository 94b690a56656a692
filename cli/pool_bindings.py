"""`det resource-pool bindings`: which workspaces a resource pool takes work from (admins
change them). Arguments as Determined's client names them: a pool, then workspace names."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import typer

from cli.client import MasterClient
from cli.output import JsonOpt, cli_errors, print_json, print_table, stdout
from cli.state import client

app = typer.Typer(help="Bind resource pools to workspaces.", no_args_is_help=True)

PoolArg = typer.Argument(..., help="Name of the resource pool.")
WorkspacesArg = typer.Argument(..., help="Names of the workspaces.")


def _path(pool_name: str) -> str:
    return f"/api/v1/resource-pools/{quote(pool_name, safe='')}/workspace-bindings"


def _bound(api: MasterClient, pool_name: str) -> dict[str, Any]:
    """The pool's workspaces now, by id and name."""
    ids = set(api.get_all(_path(pool_name), "workspaceIds"))
    named = [
        {"id": w["id"], "name": w["name"]}
        for w in api.get_all("/api/v1/workspaces", "workspaces")
        if w["id"] in ids
    ]
    return {"resourcePool": pool_name, "workspaces": named}


def _show(bound: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(bound)
        return
    names = ", ".join(w["name"] for w in bound["workspaces"]) or "(none: shared by all)"
    print_table(["Resource Pool", "Workspaces"], [[bound["resourcePool"], names]])


def _change(
    ctx: typer.Context, method: str, pool_name: str, names: list[str], as_json: bool, said: str
) -> None:
    with cli_errors():
        api = client(ctx)
        body = {"resourcePoolName": pool_name, "workspaceNames": names}
        api.request(method, _path(pool_name), json=body)
        if as_json:
            _show(_bound(api, pool_name), True)
        else:
            stdout.print(f"{said} pool {pool_name}: {', '.join(names)}", markup=False)


@app.command("add")
def add(
    ctx: typer.Context,
    pool_name: str = PoolArg,
    workspace_names: list[str] = WorkspacesArg,
    as_json: bool = JsonOpt,
) -> None:
    """Bind a pool to workspaces: a bound pool takes work only from its workspaces."""
    _change(ctx, "POST", pool_name, workspace_names, as_json, "Bound workspaces to")


@app.command("remove")
def remove(
    ctx: typer.Context,
    pool_name: str = PoolArg,
    workspace_names: list[str] = WorkspacesArg,
    as_json: bool = JsonOpt,
) -> None:
    """Unbind workspaces from a pool; a pool bound to none is shared by all."""
    _change(ctx, "DELETE", pool_name, workspace_names, as_json, "Unbound workspaces from")


@app.command("replace")
def replace(
    ctx: typer.Context,
    pool_name: str = PoolArg,
    workspace_names: list[str] = WorkspacesArg,
    as_json: bool = JsonOpt,
) -> None:
    """Make these the only workspaces bound to a pool."""
    _change(ctx, "PUT", pool_name, workspace_names, as_json, "Replaced the workspaces of")


@app.command("list-workspaces")
def list_workspaces(ctx: typer.Context, pool_name: str = PoolArg, as_json: bool = JsonOpt) -> None:
    """List the workspaces bound to a pool."""
    with cli_errors():
        _show(_bound(client(ctx), pool_name), as_json)
