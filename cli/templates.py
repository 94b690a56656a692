"""`det template` (`det tpl`): config templates stored on the master."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer
import yaml

from cli.client import MasterClient
from cli.errors import CliError
from cli.output import (
    CsvOpt,
    JsonOpt,
    cli_errors,
    one_format,
    print_json,
    print_table,
    print_yaml,
    stdout,
)
from cli.state import client
from cli.workspaces import workspace_by_name

app = typer.Typer(help="Manage config templates.", no_args_is_help=True)


def _path(name: str) -> str:
    return f"/api/v1/templates/{quote(name, safe='')}"


def _workspace_id(api: MasterClient, name: str | None) -> int:
    """0 asks for the built-in workspace on create, and to stay put on set."""
    return 0 if name is None else int(workspace_by_name(api, name)["id"])


def _show_saved(template: dict[str, Any], said: str, as_json: bool) -> None:
    # The line Determined's client prints, which scripts may match.
    if as_json:
        print_json(template)
    else:
        stdout.print(f"{said} template {template['name']}", markup=False)


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise CliError(f"{path}: {problem}{where}") from None
    if not isinstance(data, dict):
        raise CliError(f"{path}: a config must be a YAML mapping, not {type(data).__name__}")
    return data


@app.command("list")
def list_templates(
    ctx: typer.Context,
    details: bool = typer.Option(False, "-d", "--details", help="Show each template's config."),
    workspace: list[str] | None = typer.Option(
        None,
        "-w",
        "--workspace",
        "--workspace-name",
        help="Only this workspace's templates (repeat for several).",
    ),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List templates."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        ids = [_workspace_id(api, w) for w in workspace or []]
        params = {"workspaceIds": ids} if ids else None
        templates = api.get("/api/v1/templates", params=params)["templates"]
        if as_json:
            print_json(templates)
            return
        names = {w["id"]: w["name"] for w in api.get("/api/v1/workspaces")["workspaces"]}
        rows = []
        for t in templates:
            row = [t["name"], names.get(t["workspaceId"], "missing workspace")]
            if details:
                row.append(yaml.safe_dump(t["config"], sort_keys=False).rstrip())
            rows.append(row)
        print_table(["Name", "Workspace", *(["Config"] if details else [])], rows, as_csv=as_csv)


app.command("ls", hidden=True)(list_templates)


@app.command("describe")
def describe(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Template name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON only."),
) -> None:
    """Print a template's config."""
    with cli_errors():
        template = client(ctx).get(_path(name))["template"]
        if as_json:
            print_json(template)
        else:
            print_yaml(template["config"])


@app.command("set")
def set_template(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Template name."),
    file: Path = typer.Argument(..., help="YAML file with the template's config."),
    workspace: str | None = typer.Option(
        None,
        "-w",
        "--workspace",
        "--workspace-name",
        help="Workspace name: where a new template goes, or where an existing one moves.",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Create a template, or replace its config if it exists."""
    with cli_errors():
        config = load_yaml_mapping(file)
        api = client(ctx)
        body = {"name": name, "config": config, "workspaceId": _workspace_id(api, workspace)}
        # PUT is an atomic upsert; Determined's client does GET then PATCH or POST.
        template = api.request("PUT", _path(name), json=body)["template"]
        _show_saved(template, "Set", as_json)


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Template name."),
    file: Path = typer.Argument(..., help="YAML file with the template's config."),
    workspace: str | None = typer.Option(
        None,
        "-w",
        "--workspace",
        "--workspace-name",
        help="Workspace name (the built-in Uncategorized one if not given).",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Create a template; fails if one with that name exists."""
    with cli_errors():
        config = load_yaml_mapping(file)
        api = client(ctx)
        body = {"name": name, "config": config, "workspaceId": _workspace_id(api, workspace)}
        template = api.post(_path(name), json=body)["template"]
        _show_saved(template, "Created", as_json)


@app.command("remove")
def remove(ctx: typer.Context, name: str = typer.Argument(..., help="Template name.")) -> None:
    """Delete a template. Experiments created from it keep their merged config."""
    with cli_errors():
        client(ctx).request("DELETE", _path(name))
        stdout.print(f"Removed template {name}", markup=False)


app.command("rm", hidden=True)(remove)
