"""`det checkpoint` (`det c`): the checkpoints an experiment's trials reported."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer

from cli.client import MasterClient
from cli.errors import CliError
from cli.output import (
    CsvOpt,
    JsonOpt,
    cli_errors,
    one_format,
    print_json,
    print_table,
    short_time,
    state_name,
)
from cli.state import client
from cli.trials import format_metrics, format_value

app = typer.Typer(help="Inspect checkpoints.", no_args_is_help=True)

LIST_HEADERS = [
    "Trial ID",
    "Steps",
    "UUID",
    "Validation metric",
    "State",
    "Report time",
    "Resources",
    "Storage path",
]


def _size(total: int) -> str:
    size = float(total)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{total} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_resources(resources: dict[str, Any] | None) -> str:
    """`N files, SIZE`: Determined lists directories as keys ending in `/`; they are not files."""
    files = {path: size for path, size in (resources or {}).items() if not path.endswith("/")}
    total = 0
    for size in files.values():
        try:
            total += int(size)
        except (TypeError, ValueError):
            continue
    noun = "file" if len(files) == 1 else "files"
    return f"{len(files)} {noun}, {_size(total)}"


def _steps(checkpoint: dict[str, Any]) -> Any:
    steps = checkpoint.get("stepsCompleted")
    if steps is None:
        steps = (checkpoint.get("metadata") or {}).get("steps_completed")
    return steps


def _trial_id(checkpoint: dict[str, Any]) -> Any:
    return checkpoint.get("trialId") or (checkpoint.get("training") or {}).get("trialId")


def storage_state(checkpoint: dict[str, Any]) -> str:
    """ACTIVE, DELETING, DELETED or PARTIALLY_DELETED (Determined's `state` has no
    DELETING; a master without `storageState` is read as Determined's)."""
    shown = checkpoint.get("storageState")
    if isinstance(shown, str) and shown:
        return shown
    state = state_name(checkpoint.get("state") or "")
    return "ACTIVE" if state == "COMPLETED" else state


def _searcher_metric(checkpoint: dict[str, Any]) -> float | None:
    value = (checkpoint.get("training") or {}).get("searcherMetric")
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


@app.command("list")
def list_checkpoints(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    best: int | None = typer.Option(
        None, "--best", min=1, help="Only the N best by the searcher metric."
    ),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List an experiment's checkpoints (by trial, then steps; with --best, best first)."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        path = f"/api/v1/experiments/{experiment_id}/checkpoints"
        checkpoints: list[dict[str, Any]]
        if best is None:
            checkpoints = api.get_all(path, "checkpoints")  # by trial, then steps
        else:
            # The master orders by the searcher metric, best first, as for Determined's client.
            params = {"sortByAttr": "SORT_BY_SEARCHER_METRIC", "limit": best}
            checkpoints = api.get(path, params=params)["checkpoints"]
        if as_json:
            print_json(checkpoints)
            return
        rows = [
            [
                _trial_id(c),
                _steps(c),
                c["uuid"],
                "" if _searcher_metric(c) is None else format_value(_searcher_metric(c)),
                storage_state(c),
                short_time(c.get("reportTime")),
                format_resources(c.get("resources")),
                c.get("storagePath") or "",
            ]
            for c in checkpoints
        ]
        headers = list(LIST_HEADERS)
        if any(c.get("stateReason") for c in checkpoints):
            headers.append("State reason")
            for row, c in zip(rows, checkpoints, strict=True):
                row.append(c.get("stateReason") or "")
        print_table(headers, rows, as_csv=as_csv)


app.command("ls", hidden=True)(list_checkpoints)


@app.command("describe")
def describe(
    ctx: typer.Context,
    uuid: str = typer.Argument(..., help="Checkpoint UUID."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON only."),
) -> None:
    """Show one checkpoint: where it is, its metrics and its metadata."""
    with cli_errors():
        if not uuid.strip():
            raise CliError("a checkpoint UUID is required")
        reply = client(ctx).get(f"/api/v1/checkpoints/{quote(uuid, safe='')}")
        checkpoint: dict[str, Any] = reply["checkpoint"]
        if as_json:
            print_json(checkpoint)
            return
        training = checkpoint.get("training") or {}
        metric = _searcher_metric(checkpoint)
        print_table(
            ["Field", "Value"],
            [
                ["UUID", checkpoint["uuid"]],
                ["Experiment ID", checkpoint.get("experimentId") or training.get("experimentId")],
                ["Trial ID", _trial_id(checkpoint)],
                ["Steps completed", _steps(checkpoint)],
                ["State", storage_state(checkpoint)],
                ["State reason", checkpoint.get("stateReason") or ""],
                ["Report time", short_time(checkpoint.get("reportTime"))],
                ["Storage path", checkpoint.get("storagePath") or ""],
                ["Resources", format_resources(checkpoint.get("resources"))],
                ["Searcher metric", "" if metric is None else format_value(metric)],
                [
                    "Training metrics",
                    format_metrics((training.get("trainingMetrics") or {}).get("avgMetrics")),
                ],
                [
                    "Validation metrics",
                    format_metrics((training.get("validationMetrics") or {}).get("avgMetrics")),
                ],
                ["Metadata", json.dumps(checkpoint.get("metadata") or {}, sort_keys=True)],
            ],
        )


@app.command("delete")
def delete(
    ctx: typer.Context,
    uuids: list[str] = typer.Argument(
        ..., help="Checkpoint UUIDs, separated by spaces or commas (as Determined's)."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete checkpoints from their storage. Their files are removed in the background and
    retried until they are gone; `det checkpoint list` shows how it goes."""
    with cli_errors():
        wanted = [u.strip() for arg in uuids for u in arg.split(",") if u.strip()]
        if not wanted:
            raise CliError("give at least one checkpoint UUID")
        if not yes and not typer.confirm(
            f"Delete {len(wanted)} checkpoint(s) and all their files in checkpoint storage?"
        ):
            print("Stopping deletion of checkpoints.")
            return
        client(ctx).request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": wanted})
        print(f"Deletion of checkpoints {','.join(wanted)} is in progress")


class _ChunkReader(io.RawIOBase):
    """The bytes of an iterator of chunks, as a file tarfile can read in stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = chunk
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


@app.command("download")
def download(
    ctx: typer.Context,
    uuid: str = typer.Argument(..., help="Checkpoint UUID."),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", "-o", help="Where to put its files (default checkpoints/UUID)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the directory."),
) -> None:
    """Download a checkpoint's files through the master, from whatever storage holds them
    (no credentials needed here), with a progress bar."""
    with cli_errors():
        _download(client(ctx), uuid, output_dir, quiet)


# Checkpoints whose files can still be downloaded (Determined's rule for `det trial download`).
_DOWNLOADABLE = ("STATE_COMPLETED", "STATE_PARTIALLY_DELETED", "COMPLETED", "PARTIALLY_DELETED")


def download_from_trial(
    ctx: typer.Context,
    trial_id: int = typer.Argument(..., help="Trial ID."),
    best: bool = typer.Option(False, "--best", help="The checkpoint with the best metric."),
    latest: bool = typer.Option(False, "--latest", help="The most recent checkpoint."),
    uuid: str | None = typer.Option(None, "--uuid", help="A checkpoint of the trial by UUID."),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", "-o", help="Where to put its files (default checkpoints/UUID)."
    ),
    sort_by: str | None = typer.Option(
        None, "--sort-by", help="With --best: the validation metric to rank by."
    ),
    smaller_is_better: str | None = typer.Option(
        None, "--smaller-is-better", help="With --sort-by: true or false."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the directory."),
) -> None:
    """Download one of a trial's checkpoints: its best (by the searcher's metric, or
    --sort-by), its latest, or one by --uuid (Determined's `det trial download`)."""
    with cli_errors():
        if [best, latest, uuid is not None].count(True) != 1:
            raise CliError("give exactly one of --best, --latest or --uuid")
        if sort_by is not None and not best:
            raise CliError("--sort-by and --smaller-is-better go with --best")
        if (sort_by is None) != (smaller_is_better is None):
            raise CliError("--sort-by and --smaller-is-better go together")
        api = client(ctx)
        if uuid is not None:
            _download(api, uuid, output_dir, quiet)
            return
        params: dict[str, str] = {}
        if latest:
            params = {"sortByAttr": "SORT_BY_BATCH_NUMBER", "orderBy": "ORDER_BY_DESC"}
        elif sort_by is not None:
            smaller = _bool(str(smaller_is_better), "--smaller-is-better")
            params = {
                "sortByMetric": sort_by,
                "orderBy": "ORDER_BY_ASC" if smaller else "ORDER_BY_DESC",
            }
        else:  # best first by the experiment's searcher metric
            params = {"sortByAttr": "SORT_BY_SEARCHER_METRIC"}
        listed = api.get(f"/api/v1/trials/{trial_id}/checkpoints", params=params)
        found = [c for c in listed.get("checkpoints") or [] if c.get("state") in _DOWNLOADABLE]
        if not found:
            raise CliError(f"trial {trial_id} has no checkpoint that can be downloaded")
        _download(api, found[0]["uuid"], output_dir, quiet)


def _bool(text: str, option: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise CliError(f"{option}: {text!r} is neither true nor false")


def _download(api: MasterClient, uuid: str, output_dir: Path | None, quiet: bool) -> None:
    # Here, not at the top: rich.progress cost every command's start 0.05-0.1 s.
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    path = f"/api/v1/checkpoints/{quote(uuid, safe='')}"
    checkpoint = api.get(path)["checkpoint"]
    total = sum(
        int(v) for k, v in (checkpoint.get("resources") or {}).items() if not k.endswith("/")
    )
    target = output_dir or Path("checkpoints") / checkpoint["uuid"]
    target.mkdir(parents=True, exist_ok=True)
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    ]
    with (
        api.stream_body(path, accept="application/gzip") as reply,
        Progress(*columns, disable=quiet, transient=False) as progress,
    ):
        task = progress.add_task(checkpoint["uuid"][:8], total=total)
        reader = io.BufferedReader(_ChunkReader(reply.iter_bytes()))
        try:
            with tarfile.open(fileobj=reader, mode="r|gz") as tar:
                for member in tar:
                    tar.extract(member, target, filter="data")
                    progress.advance(task, member.size)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise CliError(f"checkpoint {uuid}: the download broke off: {exc}") from None
    if quiet:
        print(target)
    else:
        print(f"Local checkpoint path: {target}")
