"""`det experiment` (`det e`): create, inspect and control experiments."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer
import yaml
from rich.markup import escape

from cli import workspaces
from cli.config_overrides import ConfigOverrideError, apply_config_overrides
from cli.context import read_model_dir
from cli.errors import CliError
from cli.output import (
    CsvOpt,
    JsonOpt,
    cli_errors,
    compact_json,
    one_format,
    print_json,
    print_table,
    print_yaml,
    short_time,
    state_name,
    stderr,
    stdout,
    warn,
)
from cli.state import client
from cli.trials import fetch_workloads, format_value, print_workloads

app = typer.Typer(help="Create and manage experiments.", no_args_is_help=True)
label_app = typer.Typer(help="Add or remove an experiment's labels.", no_args_is_help=True)
app.add_typer(label_app, name="label")
set_app = typer.Typer(
    help="Change an experiment's name, description, priority, weight, max slots or "
    "checkpoint retention.",
    no_args_is_help=True,
)
app.add_typer(set_app, name="set")


# Where `det e wait` stops; PAUSED stops it too, as Determined's client refuses to wait on it.
TERMINAL_STATES = ("STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR", "STATE_DELETED")


@app.command("create")
def create(
    ctx: typer.Context,
    config_file: Path = typer.Argument(..., help="Experiment config (YAML)."),
    model_dir: Path | None = typer.Argument(None, help="Directory with the model code."),
    template: str | None = typer.Option(None, "--template", help="Config template to merge in."),
    project_id: int | None = typer.Option(
        None,
        "--project_id",
        "--project-id",
        help="The project to put it in (else the config's workspace/project, else Uncategorized).",
    ),
    paused: bool = typer.Option(False, "--paused", help="Create the experiment paused."),
    test: bool = typer.Option(
        False, "-t", "--test", help="Validate and print the effective config; store nothing."
    ),
    overrides: list[str] | None = typer.Option(
        None,
        "--config",
        metavar="KEY=VALUE",
        help="Change the config before it is sent; repeatable. KEY is a dotted path "
        "(resources.slots_per_trial=4), VALUE is YAML (lr=0.1, 'bind_mounts=[{...}]'), "
        "a,b is a list. Applied before the template merge, as Determined's CLI does.",
    ),
) -> None:
    """Create an experiment: prints `Created experiment N`."""
    with cli_errors():
        try:
            config_text = config_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot read {config_file}: {exc.strerror}") from None
        if overrides:
            config_text = _with_overrides(config_file, config_text, overrides)
        files = read_model_dir(model_dir) if model_dir is not None else []
        body = {
            "activate": not paused,
            "config": config_text,  # the master parses and merges, as Determined's does
            "modelDefinition": files,
            "parentId": None,
            "projectId": project_id,
            "template": template,
            "validateOnly": test,
        }
        reply = client(ctx).post("/api/v1/experiments", json=body)
        for message in reply.get("warningMessages") or []:
            warn(escape(message))  # it quotes the user's values, which may hold [brackets]
        if test:
            print_yaml(reply["config"])
            return
        stdout.print(f"Created experiment {reply['experiment']['id']}", markup=False)


@app.command("fork")
def fork(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="The experiment to fork."),
    overrides: list[str] | None = typer.Option(
        None,
        "--config",
        metavar="KEY=VALUE",
        help="Change the forked config; repeatable, as `det e create --config`.",
    ),
    paused: bool = typer.Option(False, "--paused", help="Create the fork paused."),
) -> None:
    """A new experiment from another's config (changed by --config) and model definition,
    which records where it came from, as the web UI's fork: prints `Created experiment N`."""
    with cli_errors():
        api = client(ctx)
        parent = api.get(f"/api/v1/experiments/{experiment_id}")["experiment"]
        config = parent["config"]
        if overrides:
            try:
                config = apply_config_overrides(config, overrides)
            except ConfigOverrideError as exc:
                raise CliError(str(exc)) from None
        body = {"activate": not paused, "config": config, "parentId": experiment_id}
        reply = api.post("/api/v1/experiments", json=body)
        for message in reply.get("warningMessages") or []:
            warn(escape(message))
        stdout.print(f"Created experiment {reply['experiment']['id']}", markup=False)


@app.command("continue")
def continue_experiment(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="The ended experiment."),
    overrides: list[str] | None = typer.Option(
        None,
        "--config",
        metavar="KEY=VALUE",
        help="Change its config (a single-trial experiment only); repeatable.",
    ),
) -> None:
    """Run an ended experiment on: a single trial again with the changed config, or a
    search's trials that did not complete; each from its latest checkpoint."""
    with cli_errors():
        try:
            override = apply_config_overrides({}, overrides or [])
        except ConfigOverrideError as exc:
            raise CliError(str(exc)) from None
        body = {"id": experiment_id, "overrideConfig": yaml.safe_dump(override) if override else ""}
        client(ctx).post("/api/v1/experiments/continue", json=body)
        stdout.print(f"Continued experiment {experiment_id}", markup=False)


@app.command("move")
def move(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., help="Experiment ID."),
    workspace: str = typer.Argument(..., help="The destination project's workspace."),
    project: str = typer.Argument(..., help="The destination project."),
) -> None:
    """Move an experiment (running or not) to another project."""
    with cli_errors():
        workspaces.move_experiment(client(ctx), experiment_id, workspace, project)
        stdout.print(f'Moved experiment {experiment_id} to project "{project}"', markup=False)


def _with_overrides(config_file: Path, config_text: str, overrides: list[str]) -> str:
    """The config file with `--config` overrides applied, as YAML. As in Determined's CLI,
    the file is re-serialised only when there are overrides (its comments are lost)."""
    from master.core.errors import ConfigError  # imported here: pydantic is slow to load
    from master.core.expconf import parse_yaml

    try:
        config = parse_yaml(config_text)  # the master's own reading of the file
    except ConfigError as exc:
        raise CliError(f"{config_file}: {exc}") from None
    try:
        changed = apply_config_overrides(config, overrides)
    except ConfigOverrideError as exc:
        raise CliError(str(exc)) from None
    return yaml.safe_dump(changed, sort_keys=False, allow_unicode=True)


@app.command("list")
def list_experiments(
    ctx: typer.Context,
    show_all: bool = typer.Option(False, "--all", "-a", help="Everyone's, archived included."),
    with_labels: list[str] | None = typer.Option(
        None, "--label", "-l", help="Only experiments with this label; repeat for all of several."
    ),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List experiments (yours, not archived, unless --all)."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        params: dict[str, Any] = {}
        if with_labels:
            params["labels"] = with_labels
        if not show_all:
            params.update(archived="false", users=api.get("/api/v1/me")["user"]["username"])
        experiments: list[dict[str, Any]] = api.get_all(
            "/api/v1/experiments", "experiments", params, limit=200
        )
        if as_json:
            print_json(experiments)
            return
        rows = [
            [
                e["id"],
                e["username"],
                e["name"],
                state_name(e["state"]),
                progress_text(e.get("progress")),
                e["numTrials"],
                e.get("templateName") or "",
                short_time(e["startTime"]),
                short_time(e.get("endTime")),
                e.get("resourcePool") or "",
                labels_text(e),
            ]
            for e in experiments
        ]
        headers = [
            "ID",
            "Owner",
            "Name",
            "State",
            "Progress",
            "Trials",
            "Template",
            "Start Time",
            "End Time",
        ]
        # Labels last: the columns before keep their places for scripts reading the CSV.
        print_table([*headers, "Resource Pool", "Labels"], rows, as_csv=as_csv)


@app.command("describe")
def describe(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., help="Experiment ID."),
    as_json: bool = JsonOpt,
    as_csv: bool = typer.Option(
        False, "--csv", help="Print each table as CSV, every value in full (blank-line apart)."
    ),
    show_config: bool = typer.Option(False, "--config", help="Also print the effective config."),
    metrics: bool = typer.Option(
        False, "--metrics", help="Also show each trial's reported metrics and checkpoints."
    ),
) -> None:
    """Show an experiment, its seeds and its trials."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        experiment = api.get(f"/api/v1/experiments/{experiment_id}")["experiment"]
        trials = api.get(f"/api/v1/experiments/{experiment_id}/trials")["trials"]
        if metrics:
            for trial in trials:
                trial["workloads"] = fetch_workloads(api, trial["id"])
        if as_json:
            print_json({"experiment": experiment, "trials": trials})
            return
        print_table(
            ["Field", "Value"],
            [
                ["ID", experiment["id"]],
                ["Name", experiment["name"]],
                ["Labels", labels_text(experiment) or "-"],
                ["State", state_name(experiment["state"])],
                ["Progress", progress_text(experiment.get("progress"))],
                ["Owner", experiment["username"]],
                ["Searcher", experiment["searcherType"]],
                ["Template", experiment.get("templateName") or "-"],
                ["Experiment seed", experiment["experimentSeed"]],
                ["Slots per trial", experiment["config"]["resources"]["slots_per_trial"]],
                ["Launch", launch_line(experiment)],
                ["Start Time", short_time(experiment["startTime"])],
                ["End Time", short_time(experiment.get("endTime"))],
            ],
            as_csv=as_csv,
        )
        stdout.print()
        print_table(
            ["Trial ID", "State", "Trial seed", "Restarts", "Batches", "Hyperparameters", "Reason"],
            [
                [
                    t["id"],
                    state_name(t["state"]),
                    t["seed"],
                    t["restarts"],
                    t["totalBatchesProcessed"],
                    compact_json(t["hparams"]),
                    (t.get("pendingReason") or {}).get("message") or t.get("endReason") or "",
                ]
                for t in trials
            ],
            as_csv=as_csv,
        )
        searched = [t for t in trials if t.get("searcher")]
        if searched:
            stdout.print()
            print_rungs(searched, as_csv=as_csv)
        if metrics:
            for trial in trials:
                stdout.print()
                print_workloads(trial["id"], trial["workloads"], as_csv=as_csv)
        if show_config:
            stdout.print()
            print_yaml(experiment["config"])


def labels_text(experiment: dict[str, Any]) -> str:
    """The labels in the order they were added, comma-separated (CSV keeps them whole)."""
    return ", ".join(experiment.get("labels") or [])


def progress_text(progress: float | None) -> str:
    return "" if progress is None else f"{progress * 100:.0f}%"


def print_rungs(trials: list[dict[str, Any]], *, as_csv: bool = False) -> None:
    """Where each trial of an ASHA search stands: its bracket, the rungs it entered (with
    the metric it had there) and where the searcher ended it: stopped at a rung, or at the
    top rung having trained the full max_time."""
    rows = []
    for trial in trials:
        searcher = trial["searcher"]
        stopped = searcher.get("stoppedAtRung")
        entered = ", ".join(
            f"{r['rung']} at {r['units']} {searcher['unit']}: "
            + ("worst" if r["metric"] is None else format_value(r["metric"]))
            for r in searcher.get("rungs") or []
        )
        rows.append(
            [
                trial["id"],
                searcher["bracket"],
                entered or "-",
                searcher_end(stopped, searcher.get("reachedTop", False)),
            ]
        )
    headers = ["Trial ID", "Bracket", "Rungs entered (metric)", "Searcher's end"]
    print_table(headers, rows, as_csv=as_csv)


def searcher_end(stopped: int | None, reached_top: bool) -> str:
    if stopped is None:
        return "-"
    return f"top rung {stopped}: full max_time" if reached_top else f"stopped at rung {stopped}"


def launch_line(experiment: dict[str, Any]) -> str:
    """ "per_agent: the entrypoint runs once per agent ... (because train.py imports ...)"."""
    layout = experiment.get("launchLayout") or "per_slot"
    summary = experiment.get("launchLayoutSummary") or ""
    reason = experiment.get("launchReason") or ""
    return f"{layout}: {summary}" + (f" (because {reason})" if reason else "")


@app.command("wait")
def wait(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    interval: float = typer.Option(
        5.0, "--interval", "--polling-interval", min=0.1, help="Seconds between polls."
    ),
) -> None:
    """Wait for an experiment to end; exit 0 only if it COMPLETED."""
    with cli_errors():
        api = client(ctx)
        started = time.monotonic()
        next_note = started + 60
        try:
            while True:
                state = api.get(f"/api/v1/experiments/{experiment_id}")["experiment"]["state"]
                if state in TERMINAL_STATES:
                    break
                if state == "STATE_PAUSED":
                    raise CliError(
                        f"experiment {experiment_id} is paused; activate it, then wait again"
                    )
                if time.monotonic() >= next_note:
                    minutes = (time.monotonic() - started) / 60
                    stderr.print(
                        f"Waiting for experiment {experiment_id} ({state_name(state)}): "
                        f"{minutes:.0f} min so far",
                        markup=False,
                    )
                    next_note += 60
                time.sleep(interval)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        stdout.print(f"Experiment {experiment_id} ended: {state_name(state)}", markup=False)
        if state != "STATE_COMPLETED":
            raise typer.Exit(1)


def _label_path(experiment_id: int, label: str) -> str:
    # Every reserved character quoted, dots too, so no label reads as a path of its own.
    return f"/api/v1/experiments/{experiment_id}/labels/" + quote(label, safe="").replace(
        ".", "%2E"
    )


@label_app.command("add")
def add_label(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    label: str = typer.Argument(..., help="The label (at most 255 characters)."),
) -> None:
    """Label an experiment; a label it has already stays as it is."""
    with cli_errors():
        client(ctx).request("PUT", _label_path(experiment_id, label))
        stdout.print(f"Added label '{label}' to experiment {experiment_id}", markup=False)


@label_app.command("remove")
def remove_label(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    label: str = typer.Argument(..., help="The label."),
) -> None:
    """Remove a label from an experiment; removing one it lacks changes nothing."""
    with cli_errors():
        client(ctx).request("DELETE", _label_path(experiment_id, label))
        stdout.print(f"Removed label '{label}' from experiment {experiment_id}", markup=False)


def _set_field(ctx: typer.Context, experiment_id: int, field: str, value: str) -> None:
    with cli_errors():
        client(ctx).request("PATCH", f"/api/v1/experiments/{experiment_id}", json={field: value})
        stdout.print(f"Set {field} of experiment {experiment_id} to '{value}'", markup=False)


@set_app.command("name")
def set_name(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    name: str = typer.Argument(..., help="The new name (not empty)."),
) -> None:
    """Rename an experiment (its config's name too, as Determined keeps it)."""
    _set_field(ctx, experiment_id, "name", name)


@set_app.command("description")
def set_description(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    description: str = typer.Argument(..., help="The new description."),
) -> None:
    """Change an experiment's description."""
    _set_field(ctx, experiment_id, "description", description)


def _patch(ctx: typer.Context, experiment_id: int, body: dict[str, Any], said: str) -> None:
    with cli_errors():
        client(ctx).request("PATCH", f"/api/v1/experiments/{experiment_id}", json=body)
        stdout.print(f"Set {said} of experiment {experiment_id}", markup=False)


@set_app.command("priority")
def set_priority(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    priority: int = typer.Argument(..., help="1 (first) to 99 (last); queued trials move."),
) -> None:
    """Change a running or queued experiment's priority (as `det job update --priority`)."""
    _patch(ctx, experiment_id, {"resources": {"priority": priority}}, f"priority to {priority}")


@set_app.command("weight")
def set_weight(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    weight: float = typer.Argument(..., help="A positive number (resources.weight)."),
) -> None:
    """Set the experiment's `resources.weight`."""
    _patch(ctx, experiment_id, {"resources": {"weight": weight}}, f"weight to {weight}")


@set_app.command("max-slots")
def set_max_slots(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    max_slots: int = typer.Argument(..., help="Slots (resources.max_slots)."),
) -> None:
    """Set the experiment's `resources.max_slots`."""
    body = {"resources": {"maxSlots": max_slots}}
    _patch(ctx, experiment_id, body, f"max_slots to {max_slots}")


@set_app.command("gc-policy")
def set_gc_policy(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    save_experiment_best: int = typer.Option(..., help="Best checkpoints of the experiment."),
    save_trial_best: int = typer.Option(..., help="Best checkpoints of each trial."),
    save_trial_latest: int = typer.Option(..., help="Latest checkpoints of each trial."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Apply without showing what goes."),
    as_json: bool = JsonOpt,
) -> None:
    """Change the checkpoint retention settings; checkpoints of ended trials that they no
    longer keep are deleted at once. Without --yes, first lists those checkpoints and asks
    (with --json: prints them and changes nothing)."""
    with cli_errors():
        api = client(ctx)
        params = {
            "save_experiment_best": save_experiment_best,
            "save_trial_best": save_trial_best,
            "save_trial_latest": save_trial_latest,
        }
        if not yes:
            preview = api.get(f"/experiments/{experiment_id}/preview_gc", params=params)
            doomed = preview["checkpoints"]
            if as_json:
                print_json(doomed)
                return
            _print_gc_preview(doomed, preview.get("metric_name") or "")
            if not typer.confirm("Apply this policy? Deleted checkpoints cannot be recovered"):
                stdout.print("Aborting; nothing changed.", markup=False)
                return
        policy = {
            "saveExperimentBest": save_experiment_best,
            "saveTrialBest": save_trial_best,
            "saveTrialLatest": save_trial_latest,
        }
        api.request(
            "PATCH", f"/api/v1/experiments/{experiment_id}", json={"checkpointStorage": policy}
        )
        stdout.print(
            f"Set checkpoint retention of experiment {experiment_id} to "
            f"save_experiment_best={save_experiment_best}, save_trial_best={save_trial_best}, "
            f"save_trial_latest={save_trial_latest}",
            markup=False,
        )


def _print_gc_preview(doomed: list[dict[str, Any]], metric_name: str) -> None:
    if not doomed:
        stdout.print("This policy deletes no checkpoints.", markup=False)
        return
    stdout.print(f"This policy deletes {len(doomed)} checkpoints:", markup=False)
    rows = [
        [
            c["TrialID"],
            c["StepsCompleted"],
            format_value((c.get("ValidationMetrics") or {}).get(metric_name)),
            c["UUID"],
        ]
        for c in sorted(doomed, key=lambda c: (c["TrialID"], c["StepsCompleted"]))
    ]
    print_table(["Trial ID", "Steps", f"Validation {metric_name}".strip(), "UUID"], rows)


@set_app.command("log-retention")
def set_log_retention(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    days: int | None = typer.Option(
        None, "--days", help="Days its trials' logs are kept after each ends (0 to 32767)."
    ),
    forever: bool = typer.Option(False, "--forever", help="Keep its trials' logs forever."),
) -> None:
    """How long the logs of the experiment's trials are kept after they end; logs already
    past it are deleted at the master's next retention pass."""
    with cli_errors():
        if forever and days is not None:
            raise CliError("--days, --forever: give one or the other, not both")
        if not forever and days is None:
            raise CliError("give --days N (logs kept N days after a trial ends) or --forever")
        if days is not None and not 0 <= days <= 32767:
            raise CliError(f"--days: {days} is not from 0 to 32767 (--forever keeps them all)")
        num_days = -1 if forever else days
        client(ctx).request(
            "PUT",
            f"/api/v1/experiments/{experiment_id}/retain_logs",
            json={"experimentId": experiment_id, "numDays": num_days},
        )
        said = "forever" if forever else f"{days} days after each trial ends"
        stdout.print(f"Logs of experiment {experiment_id} are kept {said}", markup=False)


def _action(verb: str, past: str) -> Any:
    def command(
        ctx: typer.Context, experiment_id: int = typer.Argument(..., help="Experiment ID.")
    ) -> None:
        with cli_errors():
            client(ctx).post(f"/api/v1/experiments/{experiment_id}/{verb}")
            stdout.print(f"{past} experiment {experiment_id}", markup=False)

    command.__doc__ = f"{verb.capitalize()} an experiment."
    return command


app.command("kill")(_action("kill", "Killed"))
app.command("pause")(_action("pause", "Paused"))
app.command("activate")(_action("activate", "Activated"))
app.command("archive")(_action("archive", "Archived"))
app.command("unarchive")(_action("unarchive", "Unarchived"))


@app.command("delete")
def delete(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., help="Experiment ID."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete an ended experiment with its trials, metrics and checkpoints (their files in
    checkpoint storage too). It shows as DELETING until its checkpoints are gone."""
    with cli_errors():
        if not yes and not typer.confirm(
            f"Delete experiment {experiment_id} and every checkpoint it stored? This cannot "
            "be undone."
        ):
            stdout.print("Aborting experiment deletion.", markup=False)
            return
        client(ctx).request("DELETE", f"/api/v1/experiments/{experiment_id}")
        stdout.print(f"Deletion of experiment {experiment_id} is in progress", markup=False)


def preview_search(ctx: typer.Context, config_file: Path) -> None:
    """`det preview-search`: the searcher with its defaults, trials per training length,
    and the budget."""
    with cli_errors():
        try:
            config_text = config_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot read {config_file}: {exc.strerror}") from None
        reply = client(ctx).post("/api/v1/preview-hp-search", json={"config": config_text})
        summary = reply["summary"]
        searcher = summary["config"]
        stdout.print("Using search configuration:", markup=False)
        print_yaml(searcher)
        rows = []
        total_trials = total_units = 0
        unit = ""
        for trial in summary["trials"]:
            length = trial["unit"]
            total_trials += trial["count"]
            if length.get("maxLength"):
                rows.append([trial["count"], "train to completion"])
            else:
                unit = length["name"]
                total_units += trial["count"] * length["value"]
                rows.append([trial["count"], f"train for {length['value']} {unit}"])
        print_table(["Trials", "Training Time"], rows)
        if unit:
            full = searcher["max_trials"] * (searcher.get("max_time") or 0)
            budget = f"Budget: {total_trials} trials, {total_units} {unit} in all"
            if full:
                budget += f" ({total_units / full:.0%} of {full} without early stopping)"
            stdout.print(budget, markup=False)
