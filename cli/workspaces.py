"""`det workspace` (`det w`) and `det project` (`det p`): where experiments are kept.

Both name things as Determined's client does: a workspace by its name, a project by its
workspace's name and its own."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
import yaml

from cli.client import MasterClient
from cli.errors import CliError, NameNotFound
from cli.output import (
    CsvOpt,
    JsonOpt,
    cli_errors,
    one_format,
    print_json,
    print_table,
    short_time,
    state_name,
    stdout,
)
from cli.state import client

workspace_app = typer.Typer(help="Manage workspaces.", no_args_is_help=True)
project_app = typer.Typer(help="Manage projects in workspaces.", no_args_is_help=True)

WORKSPACE_HEADERS = [
    "ID",
    "Name",
    "# Projects",
    "# Experiments",
    "Owner",
    "Archived",
    "Pinned",
    "Default Compute Pool",
    "Default Aux Pool",
]
PROJECT_HEADERS = ["ID", "Key", "Name", "Description", "# Experiments", "# Active Experiments"]


def workspace_by_name(api: MasterClient, name: str) -> dict[str, Any]:
    found = api.get("/api/v1/workspaces", params={"nameCaseSensitive": name})["workspaces"]
    if not found:
        raise NameNotFound(f"workspace '{name}' not found")
    workspace: dict[str, Any] = found[0]
    return workspace


def project_by_name(api: MasterClient, workspace: str, name: str) -> dict[str, Any]:
    ws = workspace_by_name(api, workspace)
    found = api.get(f"/api/v1/workspaces/{ws['id']}/projects", params={"name": name})["projects"]
    if not found:
        raise CliError(f"project '{name}' not found in workspace '{workspace}'")
    project: dict[str, Any] = found[0]
    return project


def _workspace_row(w: dict[str, Any]) -> list[Any]:
    return [
        w["id"],
        w["name"],
        w["numProjects"],
        w["numExperiments"],
        w["username"],
        "yes" if w["archived"] else "",
        "yes" if w["pinned"] else "",
        w.get("defaultComputePool") or "",
        w.get("defaultAuxPool") or "",
    ]


def _project_row(p: dict[str, Any]) -> list[Any]:
    return [
        p["id"],
        p["key"],
        p["name"],
        p.get("description") or "",
        p["numExperiments"],
        p["numActiveExperiments"],
    ]


def _show_workspace(w: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(w)
        return
    print_table(WORKSPACE_HEADERS, [_workspace_row(w)])
    storage = w.get("checkpointStorageConfig")
    if storage:  # secrets come masked
        print(f"Checkpoint storage: {json.dumps(storage, sort_keys=True)}")


StorageOpt = typer.Option(
    None,
    "--checkpoint-storage-config",
    help="Where its experiments that name no checkpoint_storage keep checkpoints: a JSON "
    "mapping ('{}' clears it, back to the master's).",
)
StorageFileOpt = typer.Option(
    None,
    "--checkpoint-storage-config-file",
    help="The same, from a YAML or JSON file.",
)


def _storage(text: str | None, path: Path | None) -> dict[str, Any] | None:
    """The storage mapping the options give, or None when neither is given."""
    if text is not None and path is not None:
        raise CliError(
            "give --checkpoint-storage-config or --checkpoint-storage-config-file, not both"
        )
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"--checkpoint-storage-config-file: {exc.strerror}: {path}") from None
    if text is None:
        return None
    try:
        storage = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"--checkpoint-storage-config: not JSON or YAML: {exc}") from None
    if not isinstance(storage, dict):
        raise CliError("--checkpoint-storage-config: must be a mapping of storage keys")
    return storage


def _show_project(p: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(p)
    else:
        print_table(PROJECT_HEADERS, [_project_row(p)])


# -- det workspace ----------------------------------------------------------------------


@workspace_app.command("list")
def list_workspaces(
    ctx: typer.Context,
    show_archived: bool = typer.Option(True, "--archived/--no-archived", help="Archived too."),
    pinned_only: bool = typer.Option(False, "--pinned", help="Only those you pinned."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List workspaces."""
    with cli_errors():
        one_format(as_json, as_csv)
        params: dict[str, Any] = {}
        if not show_archived:
            params["archived"] = "false"
        if pinned_only:
            params["pinned"] = "true"
        found = client(ctx).get_all("/api/v1/workspaces", "workspaces", params)
        if as_json:
            print_json(found)
            return
        print_table(WORKSPACE_HEADERS, [_workspace_row(w) for w in found], as_csv=as_csv)


workspace_app.command("ls", hidden=True)(list_workspaces)


ComputePoolOpt = typer.Option(
    None,
    "--default-compute-pool",
    help="Pool of its experiments and tasks that name none (a pool it may use).",
)
AuxPoolOpt = typer.Option(
    None, "--default-aux-pool", help="Pool of its tasks that ask for no slots and name none."
)


@workspace_app.command("create")
def create_workspace(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A name no other workspace has."),
    default_compute_pool: str | None = ComputePoolOpt,
    default_aux_pool: str | None = AuxPoolOpt,
    storage_text: str | None = StorageOpt,
    storage_file: Path | None = StorageFileOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Create a workspace (you own it)."""
    with cli_errors():
        body = {
            "name": name,
            "defaultComputePool": default_compute_pool,
            "defaultAuxPool": default_aux_pool,
            "checkpointStorageConfig": _storage(storage_text, storage_file),
        }
        reply = client(ctx).post("/api/v1/workspaces", json=body)
        _show_workspace(reply["workspace"], as_json)


@workspace_app.command("edit")
def edit_workspace(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Workspace name."),
    new_name: str | None = typer.Option(None, "--name", help="Its new name."),
    default_compute_pool: str | None = ComputePoolOpt,
    default_aux_pool: str | None = AuxPoolOpt,
    storage_text: str | None = StorageOpt,
    storage_file: Path | None = StorageFileOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Change a workspace's name, default pools or checkpoint storage (its owner or an
    admin; "" clears a default pool, '{}' the storage)."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, name)
        body = {
            "name": new_name,
            "defaultComputeResourcePool": default_compute_pool,
            "defaultAuxResourcePool": default_aux_pool,
            "checkpointStorageConfig": _storage(storage_text, storage_file),
        }
        reply = api.request("PATCH", f"/api/v1/workspaces/{ws['id']}", json=body)
        _show_workspace(reply["workspace"], as_json)


@workspace_app.command("list-pools")
def list_workspace_pools(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Workspace name."),
    as_json: bool = JsonOpt,
) -> None:
    """List the resource pools a workspace may use: those bound to it and those bound to
    none."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, name)
        pools = api.get_all(
            f"/api/v1/workspaces/{ws['id']}/available-resource-pools", "resourcePools"
        )
        if as_json:
            print_json(pools)
            return
        print_table(["Workspace", "Available Resource Pools"], [[name, ", ".join(pools)]])


@workspace_app.command("describe")
def describe_workspace(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Workspace name."),
    as_json: bool = JsonOpt,
) -> None:
    """Show a workspace and its projects."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, name)
        if as_json:
            print_json(ws)
            return
        _show_workspace(ws, False)
        projects = api.get_all(f"/api/v1/workspaces/{ws['id']}/projects", "projects")
        stdout.print("\nProjects", markup=False)
        print_table(PROJECT_HEADERS, [_project_row(p) for p in projects])


@workspace_app.command("rename")
def rename_workspace(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Its name now."),
    new_name: str = typer.Argument(..., help="Its new name."),
    as_json: bool = JsonOpt,
) -> None:
    """Rename a workspace (its owner or an admin)."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, name)
        reply = api.request("PATCH", f"/api/v1/workspaces/{ws['id']}", json={"name": new_name})
        _show_workspace(reply["workspace"], as_json)


def _workspace_action(ctx: typer.Context, name: str, action: str, said: str) -> None:
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, name)
        api.post(f"/api/v1/workspaces/{ws['id']}/{action}")
        stdout.print(f"{said} workspace {name}", markup=False)


@workspace_app.command("archive")
def archive_workspace(ctx: typer.Context, name: str = typer.Argument(..., help="Name.")) -> None:
    """Archive a workspace: it takes no new projects or experiments; running ones go on."""
    _workspace_action(ctx, name, "archive", "Archived")


@workspace_app.command("unarchive")
def unarchive_workspace(ctx: typer.Context, name: str = typer.Argument(..., help="Name.")) -> None:
    """Unarchive a workspace."""
    _workspace_action(ctx, name, "unarchive", "Unarchived")


@workspace_app.command("pin")
def pin_workspace(ctx: typer.Context, name: str = typer.Argument(..., help="Name.")) -> None:
    """Pin a workspace (for you only)."""
    _workspace_action(ctx, name, "pin", "Pinned")


@workspace_app.command("unpin")
def unpin_workspace(ctx: typer.Context, name: str = typer.Argument(..., help="Name.")) -> None:
    """Unpin a workspace."""
    _workspace_action(ctx, name, "unpin", "Unpinned")


@workspace_app.command("delete")
def delete_workspace(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Workspace name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a workspace with its projects, ended tasks and templates; refused while any
    of its projects holds experiments or any of its tasks runs."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, name)
        if not yes and not typer.confirm(
            f"Delete workspace {name} with its projects, ended tasks and templates?"
        ):
            raise typer.Exit(1)
        reply = api.request("DELETE", f"/api/v1/workspaces/{ws['id']}")
        if not reply["completed"]:
            stdout.print(
                f"Deleting workspace {name}: its experiments' checkpoints go first", markup=False
            )
            _wait_gone(lambda: api.get("/api/v1/workspaces", params={"nameCaseSensitive": name}))
        stdout.print(f"Deleted workspace {name}", markup=False)


def _wait_gone(listing: Callable[[], dict[str, Any]]) -> None:
    """Until the master's listing (of one name) comes back empty."""
    while True:
        found = listing()
        if not (found.get("workspaces") or found.get("projects")):
            return
        time.sleep(1)


@workspace_app.command("list-projects")
def list_workspace_projects(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Workspace name."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List a workspace's projects."""
    list_projects(ctx, name, as_json, as_csv)


# -- det project ------------------------------------------------------------------------


@project_app.command("list")
def list_projects(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Workspace name."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List a workspace's projects."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        ws = workspace_by_name(api, workspace)
        found = api.get_all(f"/api/v1/workspaces/{ws['id']}/projects", "projects")
        if as_json:
            print_json(found)
            return
        print_table(PROJECT_HEADERS, [_project_row(p) for p in found], as_csv=as_csv)


project_app.command("ls", hidden=True)(list_projects)


@project_app.command("create")
def create_project(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Workspace name."),
    name: str = typer.Argument(..., help="A name no other project of the workspace has."),
    description: str | None = typer.Option(None, "--description", help="What it is for."),
    key: str | None = typer.Option(None, "--key", help="1-5 letters or digits."),
    as_json: bool = JsonOpt,
) -> None:
    """Create a project in a workspace (you own it)."""
    with cli_errors():
        api = client(ctx)
        ws = workspace_by_name(api, workspace)
        body = {"name": name, "workspaceId": ws["id"], "description": description, "key": key}
        reply = api.post(f"/api/v1/workspaces/{ws['id']}/projects", json=body)
        _show_project(reply["project"], as_json)


@project_app.command("describe")
def describe_project(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Workspace name."),
    name: str = typer.Argument(..., help="Project name."),
    as_json: bool = JsonOpt,
) -> None:
    """Show a project and its experiments."""
    with cli_errors():
        api = client(ctx)
        project = project_by_name(api, workspace, name)
        if as_json:
            print_json(project)
            return
        _show_project(project, False)
        experiments = api.get_all(
            "/api/v1/experiments", "experiments", {"projectId": project["id"]}, limit=200
        )
        stdout.print("\nExperiments", markup=False)
        _print_experiments(experiments, False)


def _print_experiments(experiments: list[dict[str, Any]], as_csv: bool) -> None:
    rows = [
        [e["id"], e["username"], e["name"], state_name(e["state"]), short_time(e["startTime"])]
        for e in experiments
    ]
    print_table(["ID", "Owner", "Name", "State", "Started"], rows, as_csv=as_csv)


@project_app.command("list-experiments")
def list_project_experiments(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Workspace name."),
    name: str = typer.Argument(..., help="Project name."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List a project's experiments (everyone's)."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        project = project_by_name(api, workspace, name)
        experiments = api.get_all(
            "/api/v1/experiments", "experiments", {"projectId": project["id"]}, limit=200
        )
        if as_json:
            print_json(experiments)
            return
        _print_experiments(experiments, as_csv)


@project_app.command("edit")
def edit_project(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Workspace name."),
    name: str = typer.Argument(..., help="Project name."),
    new_name: str | None = typer.Option(None, "--new-name", "--new_name", help="New name."),
    description: str | None = typer.Option(None, "--description", help="New description."),
    as_json: bool = JsonOpt,
) -> None:
    """Rename a project or change its description (its owner or an admin)."""
    with cli_errors():
        api = client(ctx)
        project = project_by_name(api, workspace, name)
        body = {"name": new_name, "description": description}
        reply = api.request("PATCH", f"/api/v1/projects/{project['id']}", json=body)
        _show_project(reply["project"], as_json)


def _project_action(ctx: typer.Context, workspace: str, name: str, action: str, said: str) -> None:
    with cli_errors():
        api = client(ctx)
        project = project_by_name(api, workspace, name)
        api.post(f"/api/v1/projects/{project['id']}/{action}")
        stdout.print(f"{said} project {name}", markup=False)


@project_app.command("archive")
def archive_project(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Workspace name."),
    name: str = typer.Argument(..., help="Project name."),
) -> None:
    """Archive a project: it takes no new experiments; running ones go on."""
    _project_action(ctx, workspace, name, "archive", "Archived")


@project_app.command("unarchive")
def unarchive_project(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Workspace name."),
    name: str = typer.Argument(..., help="Project name."),
) -> None:
    """Unarchive a project."""
    _project_action(ctx, workspace, name, "unarchive", "Unarchived")


@project_app.command("move")
def move_project(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Its workspace now."),
    name: str = typer.Argument(..., help="Project name."),
    destination: str = typer.Argument(..., help="The workspace to move it to."),
) -> None:
    """Move a project, with its experiments, to another workspace."""
    with cli_errors():
        api = client(ctx)
        project = project_by_name(api, workspace, name)
        target = workspace_by_name(api, destination)
        body = {"destinationWorkspaceId": target["id"], "projectId": project["id"]}
        api.post(f"/api/v1/projects/{project['id']}/move", json=body)
        stdout.print(f"Moved project {name} to workspace {destination}", markup=False)


@project_app.command("delete")
def delete_project(
    ctx: typer.Context,
    workspace: str = typer.Argument(..., help="Workspace name."),
    name: str = typer.Argument(..., help="Project name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a project; refused while it holds experiments."""
    with cli_errors():
        api = client(ctx)
        project = project_by_name(api, workspace, name)
        if not yes and not typer.confirm(f"Delete project {name} of workspace {workspace}?"):
            raise typer.Exit(1)
        reply = api.request("DELETE", f"/api/v1/projects/{project['id']}")
        if not reply["completed"]:
            stdout.print(
                f"Deleting project {name}: its experiments' checkpoints go first", markup=False
            )
            path = f"/api/v1/workspaces/{project['workspaceId']}/projects"
            _wait_gone(lambda: api.get(path, params={"name": name}))
        stdout.print(f"Deleted project {name}", markup=False)


def move_experiment(api: MasterClient, experiment_id: int, workspace: str, project: str) -> None:
    """What `det experiment move` sends (Determined's MoveExperiment)."""
    target = project_by_name(api, workspace, project)
    api.post(
        f"/api/v1/experiments/{experiment_id}/move",
        json={"destinationProjectId": target["id"], "experimentId": experiment_id},
    )
