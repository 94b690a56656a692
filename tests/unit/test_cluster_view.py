"""The leader's in-memory scheduling view (master.core.cluster_view): changes applied in
commit order, and a view that cannot be sure it is exact asks to be loaded."""

from __future__ import annotations

import pytest

from master.core import fair_share, placement
from master.core.cluster_view import (
    USER_ROW,
    AgentEntry,
    Cancelled,
    ClusterView,
    Enqueued,
    HeldEntry,
    PendingEntry,
    Released,
    StopAsked,
    StoredUsage,
    Unknown,
)

WAITING = ("WAITING_FOR_SCHEDULER", "submitted", None)


def pending(allocation_id: str, trial_id: int, slots: int = 1) -> PendingEntry:
    return PendingEntry(
        id=allocation_id,
        trial_id=trial_id,
        job_id=1,
        slots=slots,
        single_node=False,
        pool="default",
        priority=42,
        order=(float(trial_id), trial_id),
        reason=WAITING,
    )


def loaded(epoch: int = 5) -> ClusterView:
    view = ClusterView()
    view.load(
        epoch,
        [pending("1.1", 1)],
        [AgentEntry("a", "default", (0, 1)), AgentEntry("b", "default", (0, 1))],
        [
            HeldEntry(
                placement.Running("9.1", 2, 42, (0.0, 9), (("b", (0, 1)),)),
                "default",
            )
        ],
    )
    return view


def test_changes_apply_in_commit_order_even_when_told_out_of_order() -> None:
    view = loaded(5)
    view.committed(7, [Released("9.1")])
    assert view.epoch == 5 and "9.1" in view.held  # 6 has not been told yet
    view.committed(6, [Enqueued((pending("2.1", 2),))])
    assert view.epoch == 7
    assert set(view.pending) == {"1.1", "2.1"} and not view.held
    used = {a.id: a.used_slot_ids for a in view.agent_states()["default"]}
    assert used == {"a": frozenset(), "b": frozenset()}


def test_an_undescribed_change_or_an_epoch_the_view_missed_makes_it_load() -> None:
    view = loaded(5)
    view.committed(6, [Cancelled(frozenset({1})), Unknown()])
    assert view.epoch is None and not view.exact_at(6)

    view = loaded(5)
    view.committed(7, [Released("9.1")])  # 6 came from elsewhere and is never told
    assert not view.exact_at(7)  # the pass locks 7 and loads


def test_commits_already_in_a_load_are_ignored() -> None:
    view = loaded(5)
    view.committed(5, [Released("9.1")])
    view.committed(3, [Unknown()])
    assert view.epoch == 5 and "9.1" in view.held


def test_cancel_and_stop_change_only_what_they_name() -> None:
    view = loaded(5)
    view.committed(6, [Enqueued((pending("2.1", 2),)), Cancelled(frozenset({1}))])
    view.committed(7, [StopAsked(frozenset({"9.1", "nope"}))])
    assert set(view.pending) == {"2.1"}
    assert view.held["9.1"].running.stopping is True
    assert view.epoch == 7


def test_a_pass_moves_what_it_placed_from_the_queue_to_the_held_slots() -> None:
    view = loaded(5)
    view.committed(6, [Enqueued((pending("2.1", 2, slots=2),))])
    reasons = {"1.1": ("WAITING_FOR_SLOTS", "no free slot", None)}
    view.placed([placement.Assignment("2.1", (("a", (1, 0)),))], reasons, preempted=["9.1"])
    assert view.epoch == 6  # a pass does not move the epoch
    assert view.held["2.1"].running.slots == (("a", (0, 1)),)
    assert view.held["2.1"].running.preemptible is True
    assert view.pending["1.1"].reason == reasons["1.1"]
    assert view.held["9.1"].running.stopping is True
    states = {a.id: a for a in view.agent_states()["default"]}
    assert states["a"].used_slot_ids == frozenset({0, 1})


def test_usage_follows_placements_and_releases_and_jobs_back_in_the_queue() -> None:
    """The view's usage sums (fair_share.UsageBook) equal a fresh build after each change,
    and a job queued again after the load asks for its stored rows."""
    decay = fair_share.Decay(half_life_s=3600.0, start_charge_s=60.0)
    view = ClusterView()
    view.load(
        5,
        [pending("1.1", 1)],
        [AgentEntry("a", "default", (0, 1))],
        [],
        # The user's row; job 3's is not read (job 3 is neither queued nor running).
        stored_usage=[StoredUsage("default", 0, 0, USER_ROW, 500.0, 1000.0)],
        usage_jobs={1},
        newest_job=3,
    )
    share = view.share_of("default", 1000.0, decay)
    assert share.user((0, 0)) == 500.0 and share.job(1) == 0.0 and share.job(3) == 0.0
    view.placed([placement.Assignment("1.1", (("a", (0,)),))], {}, (), now=1000.0)
    share = view.share_of("default", 1000.0, decay)
    assert share.job(1) == 60.0 and share.user((0, 0)) == 560.0  # the start charge
    # An hour (one half-life) later it ends; its usage stays, decaying with the rest.
    view.committed(6, [Released("1.1", 4600.0)])
    later = view.share_of("default", 4600.0, decay)
    ran = fair_share.allocation_usage(1, 3600.0, 3600.0, 60.0)
    assert later.job(1) == pytest.approx(ran)
    assert later.user((0, 0)) == pytest.approx(250.0 + ran)
    fresh = ClusterView()
    fresh.load(6, [], [], [], stored_usage=view.stored_usage, ended=view.ended)
    assert fresh.share_of("default", 4600.0, decay).user((0, 0)) == pytest.approx(
        later.user((0, 0))
    )
    # Job 3, over at the load, is queued again by a change the view is told of.
    back = PendingEntry("7.1", 7, 3, 1, False, "default", 42, (5.0, 7), WAITING)
    view.committed(7, [Enqueued((back,))])
    assert view.jobs_without_usage() == {3}
    view.add_stored([StoredUsage("default", 0, 0, 3, 200.0, 1000.0)], {3})
    assert view.jobs_without_usage() == set()
    assert view.share_of("default", 4600.0, decay).job(3) == pytest.approx(100.0)
