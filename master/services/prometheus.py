"""The master's metrics in Prometheus' text format (version 0.0.4), written by hand: a few
gauges read from the database at scrape time, and counters kept in memory.

Counters start at zero when a master starts, as Prometheus expects of counters. Every
metric is named resolute_*; labels are escaped as the format requires.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# Heartbeat round trips, in seconds: a healthy link sits in the first buckets; the fence
# fires at 6 s without one, so the last buckets show a link about to cost a run.
ROUND_TRIP_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0)
# Scheduling passes, in seconds.
PASS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class Histogram:
    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    observed: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.observed += 1


Labels = Mapping[str, str]


class Exposition:
    """Builds one scrape's text: each metric's HELP and TYPE once, then its samples."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def metric(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[Labels, float]]
    ) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self._lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} histogram")
        running = 0
        for bound, count in zip(histogram.bounds, histogram.counts, strict=False):
            running += count
            self._lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {running}')
        self._lines.append(f'{name}_bucket{{le="+Inf"}} {histogram.observed}')
        self._lines.append(f"{name}_sum {_number(histogram.total)}")
        self._lines.append(f"{name}_count {histogram.observed}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(labels.items()))
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))
