"""`det trial describe`, and the workloads table `det experiment describe --metrics` shares."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import typer

from cli.client import MasterClient
from cli.output import (
    CsvOpt,
    JsonOpt,
    cli_errors,
    compact_json,
    one_format,
    print_json,
    print_table,
    short_time,
    state_name,
    stdout,
)
from cli.state import client

WORKLOAD_KINDS = ("training", "validation", "checkpoint")
WORKLOAD_HEADERS = [
    "Trial ID",
    "Batches",
    "Training metrics",
    "Validation metrics",
    "Checkpoint",
    "End time",
]


def fetch_workloads(api: MasterClient, trial_id: int) -> list[dict[str, Any]]:
    return api.get_all(f"/api/v1/trials/{trial_id}/workloads", "workloads")


def format_value(value: Any) -> str:
    """A metric for people: a float to 6 significant digits (0.136789, 1.23457e-05), an
    int as an int; --json keeps what the trial reported, to the last digit."""
    if isinstance(value, float) and math.isfinite(value):
        return format(value, ".6g")
    if isinstance(value, str):
        return value  # "NaN", "Infinity" as the wire spells them
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def format_metrics(metrics: dict[str, Any] | None) -> str:
    values = metrics or {}
    return ", ".join(f"{name}={format_value(values[name])}" for name in sorted(values))


def _avg_metrics(workload: dict[str, Any] | None) -> dict[str, Any]:
    return dict(((workload or {}).get("metrics") or {}).get("avgMetrics") or {})


def workload_rows(trial_id: int, workloads: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """One row per batch count: training, validation and checkpoint reports at the same
    totalBatches merge into one, as Determined's `describe` condenses them."""
    merged: dict[int, dict[str, Any]] = {}
    for container in workloads:
        kind = next((k for k in WORKLOAD_KINDS if container.get(k)), None)
        if kind is None:
            continue
        item: dict[str, Any] = container[kind]
        batches = int(item.get("totalBatches") or 0)
        row = merged.setdefault(
            batches, {"training": {}, "validation": {}, "checkpoint": "", "end": ""}
        )
        if kind == "checkpoint":
            uuid = str(item.get("uuid") or "")
            state = state_name(str(item.get("state") or "STATE_COMPLETED"))
            row["checkpoint"] = uuid if state == "COMPLETED" else f"{uuid} ({state})"
        else:
            row[kind].update(_avg_metrics(item))
        end = str(item.get("endTime") or "")
        row["end"] = max(row["end"], end)
    return [
        [
            trial_id,
            batches,
            format_metrics(row["training"]),
            format_metrics(row["validation"]),
            row["checkpoint"],
            short_time(row["end"]),
        ]
        for batches, row in sorted(merged.items())
    ]


def print_workloads(
    trial_id: int, workloads: Sequence[dict[str, Any]], *, as_csv: bool = False
) -> None:
    if as_csv:
        print_table(WORKLOAD_HEADERS, workload_rows(trial_id, workloads), as_csv=True)
        return
    if not workloads:
        stdout.print(f"Trial {trial_id}: no metrics or checkpoints reported yet.", markup=False)
        return
    stdout.print(f"Workloads of trial {trial_id}:", markup=False)
    print_table(WORKLOAD_HEADERS, workload_rows(trial_id, workloads))


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.1f}%"


def _validation(workload: dict[str, Any] | None) -> str:
    if not workload:
        return ""
    return f"{format_metrics(_avg_metrics(workload))} (batches {workload.get('totalBatches', 0)})"


def _pending(reason: dict[str, Any] | None) -> str:
    if not reason:
        return ""
    code, message = reason.get("code") or "", reason.get("message") or ""
    return f"{code}: {message}" if code else message


def describe(
    ctx: typer.Context,
    trial_id: int = typer.Argument(..., min=0, help="Trial ID."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
    metrics: bool = typer.Option(False, "--metrics", help="Also show every reported workload."),
) -> None:
    """Show a trial: state, seed, progress, checkpoints and validation results."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        trial: dict[str, Any] = api.get(f"/api/v1/trials/{trial_id}")["trial"]
        workloads = fetch_workloads(api, trial_id) if metrics else []
        if as_json:
            print_json({"trial": trial, "workloads": workloads} if metrics else {"trial": trial})
            return
        print_table(
            ["Field", "Value"],
            [
                ["ID", trial["id"]],
                ["Experiment", trial["experimentId"]],
                ["State", state_name(trial["state"])],
                ["Runner state", trial.get("runnerState") or ""],
                ["Trial seed", trial["seed"]],
                ["Restarts", trial["restarts"]],
                ["Batches", trial["totalBatchesProcessed"]],
                ["Progress", _percent(trial.get("progress"))],
                ["Hyperparameters", compact_json(trial["hparams"])],
                ["Latest checkpoint", trial.get("latestCheckpointUuid") or ""],
                ["Best validation", _validation(trial.get("bestValidation"))],
                ["Latest validation", _validation(trial.get("latestValidation"))],
                ["Pending reason", _pending(trial.get("pendingReason"))],
                ["Start Time", short_time(trial.get("startTime"))],
                ["End Time", short_time(trial.get("endTime"))],
            ],
            as_csv=as_csv,
        )
        if metrics:
            stdout.print()
            print_workloads(trial_id, workloads, as_csv=as_csv)


def kill(
    ctx: typer.Context,
    trial_id: int = typer.Argument(..., min=0, help="Trial ID."),
) -> None:
    """Kill one trial; its experiment goes on with the others (Determined's `det trial kill`)."""
    with cli_errors():
        client(ctx).post(f"/api/v1/trials/{trial_id}/kill")
        stdout.print(f"Killed trial {trial_id}", markup=False)
