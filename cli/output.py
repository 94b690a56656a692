"""Output helpers: JSON alone on stdout for --json, rich tables for people, errors on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from cli.errors import CliError

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def print_yaml(data: Any) -> None:
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(show_lines=False, box=None, header_style="bold")
    for header in headers:
        # Fold rather than cut with an ellipsis: a shortened id is worse than a wrapped one.
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    stdout.print(table)


def state_name(value: str) -> str:
    return value.removeprefix("STATE_")


def short_time(value: str | None) -> str:
    """An ISO timestamp to the second, as `YYYY-MM-DD HH:MM:SS`; empty for none."""
    return (value or "").replace("T", " ")[:19]


def compact_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/yellow] {message}", markup=True)


@contextmanager
def cli_errors() -> Iterator[None]:
    """Every failure becomes one line on stderr and exit status 1."""
    try:
        yield
    except CliError as exc:
        stderr.print(f"Error: {exc}", markup=False)
        raise typer.Exit(1) from None
