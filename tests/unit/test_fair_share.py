"""The fair-share core: decay, usage of allocations, scaled quotas and the fair order, with
values worked out by hand."""

from __future__ import annotations

import math

import pytest

from master.core import fair_share
from master.core.fair_share import FairOrder, FairShare, Quota
from master.core.placement import Request

DAY = 24 * 3600.0
WEEK = 7 * DAY


def test_usage_halves_each_half_life() -> None:
    assert fair_share.decayed(1000.0, 0.0, WEEK) == 1000.0
    assert fair_share.decayed(1000.0, WEEK, WEEK) == pytest.approx(500.0)
    assert fair_share.decayed(1000.0, 3 * WEEK, WEEK) == pytest.approx(125.0)
    # A record from the future (clocks of two masters) is not inflated.
    assert fair_share.decayed(1000.0, -60.0, WEEK) == 1000.0


def test_an_allocation_counts_its_start_charge_then_its_slot_seconds() -> None:
    # Placed just now: 4 slots x 60 s of start charge.
    assert fair_share.allocation_usage(4, 0.0, WEEK, 60.0) == pytest.approx(240.0)
    # After one half-life: the charge has halved, and the running part is the integral of
    # 4 * 2^(-(h - t)/h) dt over [0, h] = 4 * h / (2 ln 2).
    h = 3600.0
    expected = 4 * 60.0 / 2 + 4 * h / (2 * math.log(2))
    assert fair_share.allocation_usage(4, h, h, 60.0) == pytest.approx(expected)
    # Short against the half-life, usage is close to slots x seconds (+ the charge).
    assert fair_share.allocation_usage(2, 100.0, WEEK, 0.0) == pytest.approx(200.0, rel=1e-3)


def test_nominal_quotas_scale_down_with_capacity_largest_remainder_first() -> None:
    quotas = {1: Quota("vision", 6), 2: Quota("nlp", 2)}
    assert fair_share.scaled_nominals(quotas, 8) == {1: 6, 2: 2}
    assert fair_share.scaled_nominals(quotas, 16) == {1: 6, 2: 2}  # never scaled up
    # 4 of 8: 3 and 1 exactly.
    assert fair_share.scaled_nominals(quotas, 4) == {1: 3, 2: 1}
    # 5 of 8: 3.75 and 1.25 -> 3 and 1, the odd slot to the larger remainder (vision).
    assert fair_share.scaled_nominals(quotas, 5) == {1: 4, 2: 1}
    # Equal remainders: the lower workspace id.
    assert fair_share.scaled_nominals({3: Quota("a", 1), 2: Quota("b", 1)}, 1) == {2: 1, 3: 0}
    assert fair_share.scaled_nominals(quotas, 0) == {1: 0, 2: 0}


def _req(
    rid: str,
    job: int,
    *,
    user: int = 1,
    weight: float = 1.0,
    order: float = 0.0,
    priority: int = 42,
    slots: int = 1,
    ws: int = 1,
) -> Request:
    return Request(
        id=rid,
        job_id=job,
        slots=slots,
        priority=priority,
        order=(order, 0),
        workspace_id=ws,
        user_id=user,
        weight=weight,
    )


def _order(requests: list[Request], share: FairShare, placed: bool = True) -> list[str]:
    order = FairOrder(requests, share, lambda reqs: sorted(reqs, key=lambda r: (r.order, r.id)))
    out = []
    for req in order:
        out.append(req.id)
        if placed:
            order.charge(req)
    return out


def test_the_user_with_less_usage_goes_first_then_the_job_then_submit_order() -> None:
    # User 2 used less than user 1 recently, so their later submit goes first.
    share = FairShare(by_user={(1, 1): 5000.0, (1, 2): 100.0}, start_charge_s=0.0)
    reqs = [_req("a1", 10, user=1, order=1.0), _req("b1", 20, user=2, order=2.0)]
    assert _order(reqs, share) == ["b1", "a1"]
    # Equal users: the job with less usage per weight (job 20: 300 / 3 = 100 < 200).
    share = FairShare(by_job={10: 200.0, 20: 300.0}, start_charge_s=0.0)
    reqs = [_req("a1", 10, order=1.0), _req("b1", 20, weight=3.0, order=2.0)]
    assert _order(reqs, share) == ["b1", "a1"]
    # Priority before any usage.
    reqs = [_req("a1", 10, order=1.0, priority=10), _req("b1", 20, weight=3.0, order=2.0)]
    assert _order(reqs, share) == ["a1", "b1"]


def test_start_charges_spread_one_pass_over_jobs_by_weight() -> None:
    """Four slots, two experiments of one user, weights 1 and 3, no history: the pass
    alternates by usage per weight and gives 1 and 3."""
    share = FairShare(start_charge_s=60.0)
    a = [_req(f"a{i}", 10, order=1.0 + i / 100) for i in range(4)]
    b = [_req(f"b{i}", 20, weight=3.0, order=2.0 + i / 100) for i in range(4)]
    order = _order(a + b, share)
    # a0 first (everything ties at 0; submitted first): a's usage per weight is 60. Then b's
    # 0, 20 and 40 (60 each, over weight 3) are below it; at 60 each, a1 was submitted first.
    assert order[:5] == ["a0", "b0", "b1", "b2", "a1"]
    assert sorted(order[:4]) == ["a0", "b0", "b1", "b2"]  # 1 and 3 of the first four slots
    # Without charges (nothing placed), the order is by submit time within the tie.
    assert _order(a + b, share, placed=False)[:4] == ["a0", "a1", "a2", "a3"]


def test_users_take_turns_before_their_experiments_do() -> None:
    share = FairShare(start_charge_s=60.0)
    reqs = [_req(f"x{i}", 10, user=1, order=float(i)) for i in range(3)] + [
        _req(f"y{i}", 20, user=2, order=10.0 + i) for i in range(3)
    ]
    assert _order(reqs, share) == ["x0", "y0", "x1", "y1", "x2", "y2"]
