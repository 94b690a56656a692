"""Output helpers: JSON alone on stdout for --json, CSV for --csv, rich tables for people,
errors on stderr."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer
import yaml
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.errors import CliError

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def print_yaml(data: Any) -> None:
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


JsonOpt = typer.Option(False, "--json", help="Print JSON only (every value in full).")
CsvOpt = typer.Option(False, "--csv", help="Print CSV: the table's columns, every value in full.")

# Columns whose header names an id ("ID", "Trial ID", "UUID", "#") are never cut.
_ID_HEADER = re.compile(r"(^|\s)(ID|UUID|#)$")
# A cell that is a UUID, perhaps with a short suffix (an allocation's ".1", a "(DELETED)").
_ID_CELL = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\S*( \(\w+\))?$"
)
# Columns this narrow (states, times, numbers) are never cut; wider ones not below it.
_SHORT = 20


def one_format(as_json: bool, as_csv: bool) -> None:
    if as_json and as_csv:
        raise CliError("--json and --csv cannot be used together")


def cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _width(text: str) -> int:
    """Terminal cells of the longest line (a template's config spans lines)."""
    return max((cell_len(line) for line in text.splitlines()), default=0)


def _least_width(header: str, column: list[str], whole: bool) -> int:
    """How narrow a column may become: ids and short columns never shrink; long ones
    (descriptions, reasons, configs) down to _SHORT, but never below an id in them."""
    natural = max(_width(text) for text in [header, *column])
    if whole or natural <= _SHORT or _ID_HEADER.search(header):
        return natural
    ids = [_width(text) for text in column if _ID_CELL.match(text)]
    return max([_SHORT, _width(header), *ids])


def column_widths(
    headers: Sequence[str],
    cells: Sequence[Sequence[str]],
    width: int | None,
    whole: Collection[str],
) -> list[int]:
    """Each column's width in a table at most `width` wide (None: no limit) with one space
    of padding either side: the widest shrinkable column loses a character at a time. When
    even the least widths do not fit, the table is wider than `width`."""
    columns = [[row[i] for row in cells] for i in range(len(headers))]
    widths = [max(_width(t) for t in [h, *c]) for h, c in zip(headers, columns, strict=True)]
    if width is None:
        return widths
    least = [_least_width(h, c, h in whole) for h, c in zip(headers, columns, strict=True)]
    excess = sum(widths) + 2 * len(widths) - width
    while excess > 0:
        shrinkable = [i for i, w in enumerate(widths) if w > least[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


def _table_width() -> int | None:
    # Piped without COLUMNS: no limit, so `det ... | grep` sees every value whole, as with
    # Determined's tables; a terminal (or COLUMNS) sets the width.
    if stdout.is_terminal or os.environ.get("COLUMNS"):
        return stdout.width
    return None


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    as_csv: bool = False,
    whole: Collection[str] = (),
    wrap: Collection[str] = ("Reason", "State reason", "Value"),
) -> None:
    """A table for people, or CSV with every value in full. Where the table must shrink,
    long text columns are cut with an ellipsis; ids, UUIDs, short columns and the columns
    named in `whole` never are. Columns named in `wrap` (the reasons: why a trial waits or
    ended is the point of reading them; a describe's values) wrap at spaces onto more
    lines instead, never splitting a word."""
    cells = [[cell_text(v) for v in row] for row in rows]
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows(cells)
        return
    limit = _table_width()
    widths = column_widths(headers, cells, limit, whole)
    table = Table(show_lines=False, box=None, header_style="bold")
    for header, width in zip(headers, widths, strict=True):
        table.add_column(header, no_wrap=header not in wrap, overflow="ellipsis", width=width)
    for row in cells:
        table.add_row(*(Text(text) for text in row))  # values, never markup
    needed = sum(widths) + 2 * len(widths)
    console = stdout
    if limit is None or needed > limit:
        console = Console(file=stdout.file, highlight=False, soft_wrap=True, width=needed)
    console.print(table, crop=False)


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
