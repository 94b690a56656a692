"""Go-style durations ("24h", "1h30m", "90s") as Determined's config and CLI take them, plus
the "d" and "w" its cluster-message help promises ("5d", "2w"). Pure; no I/O."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
# Far beyond any banner or schedule, and inside what timedelta and the database hold.
LONGEST = timedelta(days=365 * 100)


def parse_duration(value: str, field: str) -> timedelta:
    """The duration `value` spells, or ValueError naming `field` and the problem."""
    text = value.strip()
    if not text or len(text) > 64:
        raise ValueError(f"{field}: expected a duration like '24h', '90m' or '5d', got {value!r}")
    total = timedelta(0)
    position = 0
    for match in _PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
        if total > LONGEST:
            raise ValueError(f"{field}: {value!r} is longer than 100 years")
    if position != len(text):
        raise ValueError(
            f"{field}: {value!r} is not a duration like '24h', '1h30m' or '5d' "
            "(units: ms, s, m, h, d, w)"
        )
    if total <= timedelta(0):
        raise ValueError(f"{field}: {value!r} must be longer than zero")
    return total
