"""`det`'s tables, CSV and metric values as a person reads them, at a fixed width; the
quota block after `det job list` and `det task list`."""

from __future__ import annotations

import csv
import io

import pytest
from rich.console import Console

from cli import output
from cli.errors import CliError
from cli.quotas import usage_lines
from cli.trials import format_metrics, format_value

UUID = "3f2b8c1e-9a4d-4e7b-8f10-6c5d2e1a0b9f"
HEADERS = ["Trial ID", "UUID", "State", "Report time", "Description"]
LONG = "a checkpoint taken after the warm-up phase, " * 4
ROWS = [
    [12, UUID, "COMPLETED", "2026-11-28 04:20:55", LONG],
    [13, UUID.replace("3f", "4e"), "PARTIALLY_DELETED", "2026-11-28 04:21:07", "short"],
]


def rendered(
    monkeypatch: pytest.MonkeyPatch, width: int | None, rows: list[list[object]] = ROWS
) -> list[str]:
    """print_table's lines on a console `width` wide (None: piped, no COLUMNS)."""
    sink = io.StringIO()
    monkeypatch.setattr(output, "stdout", Console(file=sink, width=width or 80, highlight=False))
    if width is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(width))
    output.print_table(HEADERS, rows)
    return sink.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 150])
def test_a_narrow_table_cuts_the_description_never_an_id_or_a_state(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    lines = rendered(monkeypatch, width)
    assert len(lines) == 3, lines  # a header and one line per row: nothing wrapped
    _, first, second = lines
    # At 80 the whole columns (8 + 36 + 17 + 19) and a 20-wide description, with their
    # padding, need 110: the table is that wide rather than cut an id or a state.
    assert all(len(line.rstrip()) <= max(width, 110) for line in lines), lines
    assert UUID in first and "COMPLETED" in first and "2026-11-28 04:20:55" in first
    assert UUID.replace("3f", "4e") in second and "PARTIALLY_DELETED" in second
    assert LONG.strip() not in first and first.rstrip().endswith("…"), first
    assert "a checkpoint taken" in first  # cut at the end, not dropped
    assert second.rstrip().endswith("short")


def test_ids_wider_than_the_terminal_widen_the_table_rather_than_break(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = rendered(monkeypatch, 40)
    assert len(lines) == 3, lines
    assert UUID in lines[1] and "COMPLETED" in lines[1]
    assert "PARTIALLY_DELETED" in lines[2]


def test_piped_without_columns_every_value_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = rendered(monkeypatch, None)
    assert LONG.strip() in lines[1], lines


def test_a_table_fits_the_width_without_cutting_when_it_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = rendered(monkeypatch, 80, [[1, UUID, "ACTIVE", "", "fits"]])
    assert lines[1].split() == ["1", UUID, "ACTIVE", "fits"]
    assert "…" not in "".join(lines)


def test_cells_are_text_not_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = rendered(monkeypatch, 150, [[1, UUID, "ACTIVE", "", "[bold]x[/bold] [0, 1]"]])
    assert "[bold]x[/bold] [0, 1]" in lines[1]


def test_csv_has_every_value_in_full(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    output.print_table(HEADERS, [[*ROWS[0][:4], LONG], [1, None, ["a", "b"], "", ""]], as_csv=True)
    parsed = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert parsed == [
        HEADERS,
        ["12", UUID, "COMPLETED", "2026-11-28 04:20:55", LONG],
        ["1", "", "a, b", "", ""],
    ]


def test_json_and_csv_together_are_refused() -> None:
    with pytest.raises(CliError, match="--json and --csv cannot be used together"):
        output.one_format(True, True)
    output.one_format(True, False)
    output.one_format(False, True)


def test_the_widest_shrinkable_column_shrinks_first() -> None:
    cells = [["x" * 60, "y" * 30, UUID]]
    widths = output.column_widths(["Name", "Reason", "Checkpoint"], cells, 100, ())
    # 60 + 30 + 36 + 6 of padding = 132 for 100: the name down to the reason's width, then
    # both a character at a time; the id never.
    assert widths == [29, 29, 36]
    widths = output.column_widths(["Name", "Reason", "Checkpoint"], cells, 40, ())
    assert widths == [20, 20, 36]  # no narrower than 20; the table is then wider than 40
    assert output.column_widths(["Agents"], [["a" * 50]], 10, ("Agents",)) == [50]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.13678912345, "0.136789"),
        (1.2345678e-05, "1.23457e-05"),
        (0.5, "0.5"),
        (123456789.0, "1.23457e+08"),
        (2.0, "2"),
        (7, "7"),
        (10**12, "1000000000000"),
        ("NaN", "NaN"),
        (True, "true"),
    ],
)
def test_metrics_are_shown_to_six_significant_digits(value: object, shown: str) -> None:
    assert format_value(value) == shown


def test_metrics_line_names_each_metric() -> None:
    assert format_metrics({"loss": 0.13678912345, "lr": 1.2345678e-05, "step": 3}) == (
        "loss=0.136789, lr=1.23457e-05, step=3"
    )


def test_a_reason_wraps_at_spaces_and_keeps_every_word(monkeypatch: pytest.MonkeyPatch) -> None:
    # Why a trial waits is what `det task list` is read for: cut to its first words it
    # says nothing, so a reason wraps onto more lines instead, splitting no word.
    reason = (
        "slots_per_trial=12 can never be placed in pool default: its agents have 8 slots, "
        "so a multi-agent trial needs a multiple of 8"
    )
    sink = io.StringIO()
    monkeypatch.setattr(output, "stdout", Console(file=sink, width=100, highlight=False))
    monkeypatch.setenv("COLUMNS", "100")
    output.print_table(["Allocation ID", "State", "Reason"], [[f"{UUID}.1", "QUEUED", reason]])
    lines = sink.getvalue().splitlines()
    assert len(lines) > 2, lines  # wrapped
    assert all(len(line.rstrip()) <= 100 for line in lines), lines
    column = lines[0].index("Reason")
    words = " ".join(line[column:].strip() for line in lines[1:]).split()
    assert words == reason.split(), lines
    assert "…" not in sink.getvalue()


def quota(
    workspace: str, pool: str, nominal: int, held: int, **limits: int | None
) -> dict[str, object]:
    return {
        "workspaceName": workspace,
        "resourcePool": pool,
        "nominalSlots": nominal,
        "borrowingLimit": limits.get("borrowing"),
        "lendingLimit": limits.get("lending"),
        "heldSlots": held,
        "borrowedSlots": max(0, held - nominal),
    }


def test_the_quota_block_lists_each_pools_workspaces_held_of_nominal_borrowed_and_limits() -> None:
    quotas = [
        quota("vision", "gpu", 6, 8, borrowing=2),
        quota("nlp", "gpu", 2, 0, lending=0),
        quota("vision", "cpu", 10, 3),
    ]
    assert usage_lines(quotas) == [
        "Quotas in pool cpu (held/nominal slots):",
        "  vision  3/10  0 borrowed; borrowing limit none, lending limit none",
        "Quotas in pool gpu (held/nominal slots):",
        "  nlp     0/2  0 borrowed; borrowing limit none, lending limit 0",
        "  vision  8/6  2 borrowed; borrowing limit 2, lending limit none",
    ]
    # `det job list -p gpu`: that pool's only; no quota at all: no block.
    assert usage_lines(quotas, "gpu")[0] == "Quotas in pool gpu (held/nominal slots):"
    assert len(usage_lines(quotas, "gpu")) == 3
    assert usage_lines(quotas, "tpu") == usage_lines([]) == []
