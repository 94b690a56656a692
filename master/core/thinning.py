"""Thinning a trial's reports for charts that overlay many trials, without reading them all.

Each metrics report gets an ordinal within its trial and group (0, 1, 2, ... in the order
they are written) and a thinning level: the number of trailing zero bits of the ordinal.
Every report of level >= L is then every 2**L-th report, and an index on
(trial, group, level) reads exactly those rows, so a chart of 100 trials of 10,000 reports
reads about 1,250 rows a trial instead of 10,000. The first report (ordinal 0) has the
highest level and is always drawn; the caller adds each trial's latest report.
"""

from __future__ import annotations

# Ordinals fit the 32-bit column, so no level below this is ever reached by another one.
FIRST_REPORT_LEVEL = 31


def thinning_level(ordinal: int) -> int:
    """The number of trailing zero bits of `ordinal`; FIRST_REPORT_LEVEL for 0."""
    if ordinal < 0:
        raise ValueError(f"ordinal {ordinal} is negative")
    if ordinal == 0:
        return FIRST_REPORT_LEVEL
    return min((ordinal & -ordinal).bit_length() - 1, FIRST_REPORT_LEVEL)


def level_for(report_count: int, max_points: int) -> int:
    """The lowest level that leaves at most `max_points` of `report_count` reports: reports
    0..n-1 of level >= L number ceil(n / 2**L)."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    level = 0
    while -(-report_count // (1 << level)) > max_points and level < FIRST_REPORT_LEVEL:
        level += 1
    return level


def stride(level: int) -> int:
    """How many reports one drawn point stands for at `level`."""
    return 1 << level
