"""Determined's checkpoint GC rule (master.core.retention), case by case."""

from __future__ import annotations

from master.core.retention import CheckpointFacts, Retention, retry_delay_s, to_delete


def facts(
    trial_id: int, steps_and_metrics: list[tuple[int, float | None]]
) -> list[CheckpointFacts]:
    return [
        CheckpointFacts(f"t{trial_id}-s{steps}", trial_id, steps, metric, order=trial_id * 100 + i)
        for i, (steps, metric) in enumerate(steps_and_metrics)
    ]


ONE_TRIAL = facts(1, [(1, 0.5), (2, 0.1), (3, 0.9), (4, 0.3), (5, 0.7)])


def test_defaults_keep_the_trials_best_and_latest() -> None:
    doomed = to_delete(ONE_TRIAL, Retention(), ended_trials={1})
    assert doomed == ["t1-s1", "t1-s3", "t1-s4"]


def test_zero_everywhere_deletes_every_checkpoint() -> None:
    doomed = to_delete(ONE_TRIAL, Retention(0, 0, 0), ended_trials={1})
    assert doomed == [c.uuid for c in ONE_TRIAL]


def test_latest_n_and_best_n() -> None:
    kept = Retention(save_experiment_best=0, save_trial_best=2, save_trial_latest=2)
    doomed = to_delete(ONE_TRIAL, kept, ended_trials={1})
    assert doomed == ["t1-s1", "t1-s3"]  # best two: s2, s4; latest two: s4, s5


def test_experiment_best_spans_trials_and_trial_best_is_per_trial() -> None:
    checkpoints = facts(1, [(1, 0.5), (2, 0.4)]) + facts(2, [(1, 0.1), (2, 0.2)])
    # The experiment's best two are trial 2's; trial 1 keeps its own best (s2, also latest).
    doomed = to_delete(checkpoints, Retention(2, 1, 1), ended_trials={1, 2})
    assert doomed == ["t1-s1"]
    # Without trial bests, trial 1 keeps only its latest.
    assert to_delete(checkpoints, Retention(2, 0, 1), ended_trials={1, 2}) == ["t1-s1"]
    assert to_delete(checkpoints, Retention(0, 0, 0), ended_trials={1, 2}) == [
        c.uuid for c in checkpoints
    ]


def test_a_checkpoint_without_a_validation_is_kept_only_as_a_latest() -> None:
    checkpoints = facts(1, [(1, None), (2, 0.3), (3, None)])
    doomed = to_delete(checkpoints, Retention(5, 5, 1), ended_trials={1})
    assert doomed == ["t1-s1"]  # no metric: not a "best"; s3 is the latest


def test_ties_go_to_the_earlier_validation() -> None:
    checkpoints = facts(1, [(1, 0.2), (2, 0.2), (3, 0.9)])
    assert to_delete(checkpoints, Retention(0, 1, 1), ended_trials={1}) == ["t1-s2"]


def test_running_trials_and_warm_starts_are_kept() -> None:
    checkpoints = facts(1, [(1, 0.5), (2, 0.9)]) + facts(2, [(1, 0.4), (2, 0.8)])
    doomed = to_delete(checkpoints, Retention(0, 0, 0), ended_trials={2}, keep={"t2-s1"})
    assert doomed == ["t2-s2"]  # trial 1 still runs; t2-s1 is another experiment's start


def test_retries_back_off_to_five_minutes() -> None:
    assert [retry_delay_s(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert retry_delay_s(9) == 256.0
    assert retry_delay_s(10) == retry_delay_s(10_000) == 300.0
