"""`det trial logs`, `det experiment logs` and `det task logs`: output printed raw, as
Determined's `det` prints it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import typer

from cli.client import MasterClient, _error_message
from cli.errors import CliError
from cli.output import cli_errors
from cli.state import Globals

trial_app = typer.Typer(help="Inspect and kill trials.", no_args_is_help=True)

LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

FollowOpt = typer.Option(False, "-f", "--follow", help="Keep printing new lines until it ends.")
HeadOpt = typer.Option(None, "--head", min=0, help="Only the first N lines.")
TailOpt = typer.Option(None, "--tail", min=0, help="Only the last N lines.")
RankOpt = typer.Option(None, "--rank", "--rank-id", min=0, help="Only this rank (repeatable).")
LevelOpt = typer.Option(None, "--level", help=f"Only this level and above ({', '.join(LEVELS)}).")
JsonOpt = typer.Option(False, "--json", help="Print each line's JSON record, one per line.")


class LogClient(MasterClient):
    """Reads the master's NDJSON streams, which the plain JSON client cannot."""

    def stream(self, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if self._token is None:
            self._token = self._login()
        headers = {"Authorization": f"Bearer {self._token}"}
        # No read timeout: a followed trial may print nothing for a long while.
        timeout = httpx.Timeout(60.0, read=None)
        try:
            with self._http.stream(
                "GET", path, params=params, headers=headers, timeout=timeout
            ) as reply:
                if reply.status_code != 200:
                    reply.read()
                    raise CliError(_error_message(reply))
                for text in reply.iter_lines():
                    if not text.strip():
                        continue
                    item = json.loads(text)
                    if "error" in item:
                        error = item["error"] or {}
                        raise CliError(error.get("message") or "the log stream failed")
                    yield item["result"]
        except httpx.ConnectError:
            raise CliError(
                f"cannot reach the master at {self.base_url}; is it running? (set -m or DET_MASTER)"
            ) from None
        except httpx.RemoteProtocolError:
            raise CliError(
                "the master closed the log stream before its end (is it restarting?); "
                "run the command again"
            ) from None
        except httpx.HTTPError as exc:
            raise CliError(f"log stream from {self.base_url}{path} failed: {exc}") from None
        except ValueError:
            raise CliError(f"the master sent a line that is not JSON for {path}") from None


def _client(ctx: typer.Context) -> LogClient:
    root = ctx.find_root()
    globals_: Globals = root.obj if isinstance(root.obj, Globals) else Globals()
    return LogClient(globals_.master, globals_.user)


def _params(
    follow: bool, head: int | None, tail: int | None, ranks: list[int] | None, level: str | None
) -> dict[str, Any]:
    if sum((follow, head is not None, tail is not None)) > 1:
        raise CliError("use at most one of --follow, --head and --tail")
    params: dict[str, Any] = {"follow": "true" if follow else "false"}
    if head is not None:
        params["limit"] = head
    if tail is not None:
        params.update(limit=tail, orderBy="ORDER_BY_DESC")
    if ranks:
        params["rankIds"] = ranks
    if level is not None:
        name = level.upper().removeprefix("LOG_LEVEL_")
        if name not in LEVELS:
            raise CliError(f"--level: {level!r} is not one of {', '.join(LEVELS)}")
        params["levels"] = [f"LOG_LEVEL_{x}" for x in LEVELS[LEVELS.index(name) :]]
    return params


def _print(ctx: typer.Context, path: str, params: dict[str, Any], as_json: bool) -> None:
    with cli_errors():
        api = _client(ctx)
        try:
            results: Iterator[dict[str, Any]] = api.stream(path, params)
            if params.get("orderBy") == "ORDER_BY_DESC":
                results = reversed(list(results))  # newest first on the wire
            for result in results:
                if as_json:
                    sys.stdout.write(json.dumps(result) + "\n")
                else:
                    sys.stdout.write(result["message"])
                sys.stdout.flush()
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BrokenPipeError:
            # The reader left (`| head`): stop quietly, and keep Python from complaining
            # again when it flushes stdout on the way out.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        finally:
            api.close()


@trial_app.command("logs")
def trial_logs(
    ctx: typer.Context,
    trial_id: int = typer.Argument(..., min=0, help="Trial ID."),
    follow: bool = FollowOpt,
    head: int | None = HeadOpt,
    tail: int | None = TailOpt,
    rank: list[int] | None = RankOpt,
    level: str | None = LevelOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Print a trial's logs; with -f, until the trial ends."""
    with cli_errors():
        params = _params(follow, head, tail, rank, level)
    _print(ctx, f"/api/v1/trials/{trial_id}/logs", params, as_json)


def experiment_logs(
    ctx: typer.Context,
    experiment_id: int = typer.Argument(..., min=0, help="Experiment ID."),
    follow: bool = FollowOpt,
    head: int | None = HeadOpt,
    tail: int | None = TailOpt,
    rank: list[int] | None = RankOpt,
    level: str | None = LevelOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Print the logs of an experiment's first trial (as Determined's `det e logs` does);
    with -f, until that trial ends."""
    with cli_errors():
        params = _params(follow, head, tail, rank, level)
        api = _client(ctx)
        try:
            trials = api.get(f"/api/v1/experiments/{experiment_id}/trials")["trials"]
        finally:
            api.close()
        if not trials:
            raise CliError(f"experiment {experiment_id} has no trials yet")
        first = min(int(t["id"]) for t in trials)
    _print(ctx, f"/api/v1/trials/{first}/logs", params, as_json)


def task_logs(
    ctx: typer.Context,
    task_id: str = typer.Argument(..., help="Task ID (as `det task list` shows it)."),
    follow: bool = FollowOpt,
    head: int | None = HeadOpt,
    tail: int | None = TailOpt,
    rank: list[int] | None = RankOpt,
    level: str | None = LevelOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Print a task's logs; with -f, until the task ends."""
    with cli_errors():
        params = _params(follow, head, tail, rank, level)
    _print(ctx, f"/api/v1/tasks/{quote(task_id, safe='')}/logs", params, as_json)
