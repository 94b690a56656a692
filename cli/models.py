"""`det model` (`det m`): the model registry, models and the checkpoints registered as versions."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import typer

from cli.errors import CliError
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

app = typer.Typer(help="Manage the model registry.", no_args_is_help=True)

MODEL_HEADERS = ["ID", "Name", "Description", "Versions", "Labels", "Archived", "Owner", "Updated"]
VERSION_HEADERS = [
    "Version",
    "Name",
    "Checkpoint UUID",
    "Trial ID",
    "Experiment ID",
    "Steps",
    "Checkpoint state",
    "Created",
]


def _path(name: str, *rest: str) -> str:
    return "/".join([f"/api/v1/models/{quote(name, safe='')}", *rest])


def _metadata(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--metadata: not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise CliError('--metadata: must be a JSON object, such as \'{"team": "vision"}\'')
    return value


def _model_row(m: dict[str, Any]) -> list[Any]:
    return [
        m["id"],
        m["name"],
        m.get("description") or "",
        m.get("numVersions", 0),
        ", ".join(m.get("labels") or []),
        "yes" if m.get("archived") else "no",
        m.get("username") or "",
        short_time(m.get("lastUpdatedTime")),
    ]


def _version_row(v: dict[str, Any]) -> list[Any]:
    checkpoint = v.get("checkpoint") or {}
    training = checkpoint.get("training") or {}
    steps = checkpoint.get("stepsCompleted")
    if steps is None:
        steps = (checkpoint.get("metadata") or {}).get("steps_completed")
    return [
        v["version"],
        v.get("name") or "",
        checkpoint.get("uuid", ""),
        training.get("trialId", ""),
        training.get("experimentId", ""),
        steps if steps is not None else "",
        checkpoint.get("storageState") or checkpoint.get("state", ""),
        short_time(v.get("creationTime")),
    ]


def _print_model(model: dict[str, Any]) -> None:
    print_table(MODEL_HEADERS, [_model_row(model)])
    if model.get("metadata"):
        stdout.print(f"Metadata: {json.dumps(model['metadata'], sort_keys=True)}", markup=False)
    if model.get("notes"):
        stdout.print(f"Notes: {model['notes']}", markup=False)


@app.command("create")
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The model's name, unique in the registry."),
    description: str | None = typer.Option(None, "--description", help="What the model is."),
    labels: list[str] | None = typer.Option(None, "--label", help="A label (repeatable)."),
    metadata: str | None = typer.Option(None, "--metadata", help="A JSON object."),
    as_json: bool = JsonOpt,
) -> None:
    """Create a model in the registry."""
    with cli_errors():
        body = {
            "name": name,
            "description": description,
            "labels": labels or None,
            "metadata": _metadata(metadata),
        }
        model = client(ctx).post("/api/v1/models", json=body)["model"]
        if as_json:
            print_json(model)
        else:
            _print_model(model)


@app.command("list")
def list_models(
    ctx: typer.Context,
    archived: bool = typer.Option(False, "--archived", help="Include archived models."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List models, by name."""
    with cli_errors():
        one_format(as_json, as_csv)
        params: dict[str, Any] = {"sortBy": "SORT_BY_NAME"}
        if not archived:
            params["archived"] = "false"
        models = client(ctx).get_all("/api/v1/models", "models", params)
        if as_json:
            print_json(models)
            return
        print_table(MODEL_HEADERS, [_model_row(m) for m in models], as_csv=as_csv)


app.command("ls", hidden=True)(list_models)


@app.command("describe")
def describe(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name or id."),
    as_json: bool = JsonOpt,
) -> None:
    """Show a model and its versions."""
    with cli_errors():
        api = client(ctx)
        model = api.get(_path(name))["model"]
        versions = api.get_all(_path(name, "versions"), "modelVersions")
        if as_json:
            print_json({"model": model, "modelVersions": versions})
            return
        _print_model(model)
        if versions:
            stdout.print("")
            print_table(VERSION_HEADERS, [_version_row(v) for v in versions])


@app.command("register-version")
def register_version(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name or id."),
    uuid: str = typer.Argument(..., help="The UUID of a completed checkpoint."),
    version_name: str | None = typer.Option(None, "--name", help="A name for this version."),
    comment: str | None = typer.Option(None, "--comment", help="A comment on this version."),
    metadata: str | None = typer.Option(None, "--metadata", help="A JSON object."),
    as_json: bool = JsonOpt,
) -> None:
    """Register a checkpoint as the model's next version (kept from retention and deletes)."""
    with cli_errors():
        body = {
            "checkpointUuid": uuid,
            "modelName": name,
            "name": version_name,
            "comment": comment,
            "metadata": _metadata(metadata),
        }
        version = client(ctx).post(_path(name, "versions"), json=body)["modelVersion"]
        if as_json:
            print_json(version)
            return
        print_table(VERSION_HEADERS, [_version_row(version)])


@app.command("list-versions")
def list_versions(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name or id."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List a model's versions, oldest first."""
    with cli_errors():
        one_format(as_json, as_csv)
        versions = client(ctx).get_all(_path(name, "versions"), "modelVersions")
        if as_json:
            print_json(versions)
            return
        print_table(VERSION_HEADERS, [_version_row(v) for v in versions], as_csv=as_csv)


@app.command("delete")
def delete(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name or id."),
    version: int | None = typer.Option(
        None, "--version", help="Delete only this version, not the model."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Delete a model with its versions, or one version. Their checkpoints stay."""
    with cli_errors():
        api = client(ctx)
        if version is None:
            api.request("DELETE", _path(name))
            what = f"model {name}"
        else:
            api.request("DELETE", _path(name, "versions", str(version)))
            what = f"version {version} of model {name}"
        if as_json:
            print_json({"deleted": what})
        else:
            stdout.print(f"Deleted {what}", markup=False)


def _set_archived(ctx: typer.Context, name: str, archived: bool, as_json: bool) -> None:
    with cli_errors():
        api = client(ctx)
        api.post(_path(name, "archive" if archived else "unarchive"))
        model = api.get(_path(name))["model"]
        if as_json:
            print_json(model)
        else:
            state = "Archived" if archived else "Unarchived"
            stdout.print(f"{state} model {model['name']}", markup=False)


@app.command("archive")
def archive(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name or id."),
    as_json: bool = JsonOpt,
) -> None:
    """Archive a model: it leaves `det model list` and takes no new versions."""
    _set_archived(ctx, name, True, as_json)


@app.command("unarchive")
def unarchive(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name or id."),
    as_json: bool = JsonOpt,
) -> None:
    """Bring an archived model back."""
    _set_archived(ctx, name, False, as_json)


@app.command("move")
def move(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Model name or id."),
    workspace_name: str = typer.Option(
        ..., "--workspace-name", "-w", help="The workspace it moves to."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Move a model, with its versions, to another workspace."""
    with cli_errors():
        api = client(ctx)
        workspace = workspace_by_name(api, workspace_name)
        model = api.get(_path(name))["model"]
        api.post(
            _path(name, "move"),
            json={"destinationWorkspaceId": workspace["id"], "modelName": model["name"]},
        )
        moved = api.get(_path(name))["model"]
        if as_json:
            print_json(moved)
        else:
            stdout.print(
                f"Moved model {moved['name']} to workspace {workspace['name']}", markup=False
            )
