"""`det template` (`det tpl`): config templates stored on the master."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer
import yaml

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

app = typer.Typer(help="Manage config templates.", no_args_is_help=True)


def _path(name: str) -> str:
    return f"/api/v1/templates/{quote(name, safe='')}"


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
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List templates."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        templates = api.get("/api/v1/templates")["templates"]
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
) -> None:
    """Create a template, or replace its config if it exists."""
    with cli_errors():
        config = load_yaml_mapping(file)
        # PUT is an atomic upsert; Determined's client does GET then PATCH or POST.
        client(ctx).request("PUT", _path(name), json={"name": name, "config": config})
        stdout.print(f"Set template {name}", markup=False)


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Template name."),
    file: Path = typer.Argument(..., help="YAML file with the template's config."),
) -> None:
    """Create a template; fails if one with that name exists."""
    with cli_errors():
        config = load_yaml_mapping(file)
        client(ctx).post(_path(name), json={"name": name, "config": config, "workspaceId": 0})
        stdout.print(f"Created template {name}", markup=False)


@app.command("remove")
def remove(ctx: typer.Context, name: str = typer.Argument(..., help="Template name.")) -> None:
    """Delete a template. Experiments created from it keep their merged config."""
    with cli_errors():
        client(ctx).request("DELETE", _path(name))
        stdout.print(f"Removed template {name}", markup=False)


app.command("rm", hidden=True)(remove)
