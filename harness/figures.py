"""Percentiles and millisecond summaries of measured durations."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest sample with at least p% of the samples at or below it."""
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def ms_summary(seconds: Sequence[float], digits: int = 2, mean: bool = False) -> dict[str, Any]:
    """n, p50, p99 and max of durations in seconds, as milliseconds (and the mean)."""
    ordered = sorted(seconds)
    if not ordered:
        return {"n": 0}
    summary: dict[str, Any] = {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 50) * 1000, digits),
        "p99_ms": round(percentile(ordered, 99) * 1000, digits),
        "max_ms": round(ordered[-1] * 1000, digits),
    }
    if mean:
        summary["mean_ms"] = round(statistics.fmean(ordered) * 1000, digits)
    return summary


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def ms_percentiles(
    seconds: Sequence[float], percentiles: Sequence[float], digits: int = 2
) -> dict[str, float]:
    """`p<N>_ms` of durations in seconds for each of `percentiles`: the ones a report wants
    beside ms_summary's p50 and p99 (`ms_summary(s) | ms_percentiles(s, (95,))`)."""
    ordered = sorted(seconds)
    if not ordered:
        return {}
    return {f"p{p:g}_ms": round(percentile(ordered, p) * 1000, digits) for p in percentiles}
