"""Which checkpoints the retention settings delete (Determined's checkpoint GC), without I/O.

Determined's rule, for the checkpoints of one experiment:

- rank each checkpoint by the searcher metric of the validation at its step, best first,
  over the whole experiment (`experiment_rank`) and within its trial (`trial_rank`); ties
  go to the earlier validation, checkpoints without a validation sort last;
- rank each checkpoint by steps within its trial, latest first (`latest_rank`; equal steps
  share a rank);
- a checkpoint is deleted when it is in neither the experiment's best `save_experiment_best`
  nor its trial's best `save_trial_best` (or it has no validation at all), and it is not
  among its trial's latest `save_trial_latest`.

Checkpoints another trial starts from (`searcher.source_checkpoint_uuid`) are kept, as
Determined keeps warm-start checkpoints.

Determined applies this once, when the experiment ends. We also apply it when a trial ends,
to the checkpoints of trials that have ended: an experiment rank only grows as checkpoints
arrive, so what is outside the best now stays outside, and a finished trial's own ranks no
longer change. Running and paused trials keep theirs until they end.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Retention:
    save_experiment_best: int = 0
    save_trial_best: int = 1
    save_trial_latest: int = 1


@dataclass(frozen=True)
class CheckpointFacts:
    uuid: str
    trial_id: int
    steps_completed: int
    # The searcher metric of the trial's validation at this step, signed so that smaller
    # is better; None without a (finite) one.
    metric: float | None
    # Order of that validation's report, Determined's tie-break (its validation id).
    order: int


def _sort_key(c: CheckpointFacts) -> tuple[bool, float, int]:
    return (c.metric is None, c.metric if c.metric is not None else math.inf, c.order)


def _metric_ranks(checkpoints: Sequence[CheckpointFacts]) -> dict[str, int]:
    """rank() over (metric asc nulls last, order asc): distinct keys, so 1, 2, 3..."""
    return {c.uuid: i + 1 for i, c in enumerate(sorted(checkpoints, key=_sort_key))}


def _latest_ranks(checkpoints: Sequence[CheckpointFacts]) -> dict[str, int]:
    """rank() over steps desc: equal steps share a rank, the next rank skips."""
    ordered = sorted(checkpoints, key=lambda c: -c.steps_completed)
    ranks: dict[str, int] = {}
    for i, c in enumerate(ordered):
        same = i > 0 and ordered[i - 1].steps_completed == c.steps_completed
        ranks[c.uuid] = ranks[ordered[i - 1].uuid] if same else i + 1
    return ranks


def to_delete(
    checkpoints: Iterable[CheckpointFacts],
    retention: Retention,
    *,
    ended_trials: Collection[int],
    keep: Collection[str] = (),
) -> list[str]:
    """The uuids to delete, in the order given. Only checkpoints of `ended_trials` are
    candidates; every checkpoint of the experiment counts for the experiment ranks."""
    every = list(checkpoints)
    experiment_rank = _metric_ranks(every)
    by_trial: dict[int, list[CheckpointFacts]] = {}
    for c in every:
        by_trial.setdefault(c.trial_id, []).append(c)
    trial_rank: dict[str, int] = {}
    latest_rank: dict[str, int] = {}
    for group in by_trial.values():
        trial_rank.update(_metric_ranks(group))
        latest_rank.update(_latest_ranks(group))
    doomed = []
    for c in every:
        if c.trial_id not in ended_trials or c.uuid in keep:
            continue
        outside_best = (
            experiment_rank[c.uuid] > retention.save_experiment_best
            and trial_rank[c.uuid] > retention.save_trial_best
        )
        if (outside_best or c.metric is None) and latest_rank[c.uuid] > retention.save_trial_latest:
            doomed.append(c.uuid)
    return doomed


def retry_delay_s(attempts: int, *, first_s: float = 1.0, most_s: float = 300.0) -> float:
    """Backoff between delete attempts: 1 s, 2 s, 4 s ... at most 5 minutes, for ever."""
    return float(min(most_s, first_s * 2.0 ** min(max(attempts - 1, 0), 30)))
