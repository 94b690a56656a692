"""Placement core: fitting, queue order, head reservation, preemption and pending reasons."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest

from master.core.placement import (
    AgentState,
    Assignment,
    FittingPolicy,
    Pending,
    PendingCode,
    Plan,
    PoolPolicy,
    Request,
    Running,
    feasibility,
    schedule,
)

POOL = PoolPolicy("default")
WORST = PoolPolicy("default", fitting=FittingPolicy.WORST)
PREEMPT = PoolPolicy("default", preemption=True)

Slots = tuple[tuple[str, tuple[int, ...]], ...]


def agent(
    agent_id: str,
    slots: int = 8,
    used: Iterable[int] = (),
    *,
    enabled: bool = True,
    draining: bool = False,
    connected: bool = True,
    zero_slot_used: int = 0,
) -> AgentState:
    return AgentState(
        agent_id,
        tuple(range(slots)),
        frozenset(used),
        enabled=enabled,
        draining=draining,
        connected=connected,
        zero_slot_used=zero_slot_used,
    )


def busy(agent_id: str, used: int, slots: int = 8) -> AgentState:
    """An agent whose lowest `used` slots are taken."""
    return agent(agent_id, slots, range(used))


def req(
    request_id: str,
    slots: int,
    *,
    priority: int = 42,
    t: float = 0.0,
    job: int = 1,
    single_node: bool = False,
) -> Request:
    return Request(request_id, job, slots, priority, (t, 0), single_node)


def running(
    run_id: str,
    holds: Slots,
    *,
    priority: int = 50,
    t: float = 0.0,
    preemptible: bool = True,
    stopping: bool = False,
) -> Running:
    return Running(run_id, 100, priority, (t, 0), holds, preemptible=preemptible, stopping=stopping)


def placements(plan: Plan) -> dict[str, Slots]:
    return {a.request_id: a.slots for a in plan.assignments}


def agents_of(plan: Plan) -> dict[str, tuple[str, ...]]:
    return {a.request_id: tuple(agent_id for agent_id, _ in a.slots) for a in plan.assignments}


def reasons(plan: Plan) -> dict[str, Pending]:
    return {p.request_id: p for p in plan.pending}


def eight_slot(count: int) -> list[AgentState]:
    return [agent(f"a{i}") for i in range(1, count + 1)]


# --- fitting: the seed docs' examples on 8-slot agents -------------------------------------


@pytest.mark.parametrize(
    ("slots", "expected"),
    [
        (1, ("a1",)),
        (2, ("a1",)),
        (4, ("a1",)),
        (8, ("a1",)),
        (16, ("a1", "a2")),
        (24, ("a1", "a2", "a3")),
        (32, ("a1", "a2", "a3", "a4")),
    ],
)
def test_slots_per_trial_on_idle_eight_slot_agents(slots: int, expected: tuple[str, ...]) -> None:
    plan = schedule(POOL, eight_slot(4), [req("r", slots)])
    assert agents_of(plan) == {"r": expected}
    for _, held in plan.assignments[0].slots:  # a gang takes every slot of each agent
        assert held == tuple(range(8)) or len(expected) == 1
    assert sum(len(held) for _, held in plan.assignments[0].slots) == slots


def test_one_two_and_four_share_an_agent_and_eight_takes_another() -> None:
    plan = schedule(
        POOL,
        eight_slot(2),
        [req("r1", 1, t=1), req("r2", 2, t=2), req("r4", 4, t=3), req("r8", 8, t=4)],
    )
    assert placements(plan) == {
        "r1": (("a1", (0,)),),
        "r2": (("a1", (1, 2)),),
        "r4": (("a1", (3, 4, 5, 6)),),
        "r8": (("a2", tuple(range(8))),),
    }
    assert plan.pending == ()


def test_two_four_slot_trials_share_one_agent() -> None:
    plan = schedule(POOL, eight_slot(2), [req("x", 4, t=1), req("y", 4, t=2)])
    assert placements(plan) == {"x": (("a1", (0, 1, 2, 3)),), "y": (("a1", (4, 5, 6, 7)),)}


def test_twelve_never_fits_eight_slot_agents_with_the_documented_message() -> None:
    plan = schedule(POOL, eight_slot(4), [req("r", 12)])
    assert plan.assignments == ()
    assert plan.pending == (
        Pending(
            "r",
            PendingCode.NEVER_FITS,
            "slots_per_trial=12 can never be placed in pool default: its agents have 8 slots, "
            "so a multi-agent trial needs a multiple of 8",
        ),
    )


def test_a_gang_never_takes_part_of_a_busy_agent() -> None:
    plan = schedule(POOL, [busy("a1", 1), agent("a2"), agent("a3")], [req("g", 16)])
    assert agents_of(plan) == {"g": ("a2", "a3")}


def test_gang_prefers_the_largest_agent_size_that_divides_and_has_enough_idle_agents() -> None:
    agents = [agent("big1"), agent("big2"), *(agent(f"s{i}", 4) for i in range(4))]
    assert agents_of(schedule(POOL, agents, [req("g", 16)])) == {"g": ("big1", "big2")}
    agents[0] = busy("big1", 1)
    assert agents_of(schedule(POOL, agents, [req("g", 16)])) == {"g": ("s0", "s1", "s2", "s3")}


def test_no_heterogeneous_gangs() -> None:
    plan = schedule(POOL, [agent("a", 8), agent("b", 4)], [req("g", 12)])
    assert plan.assignments == ()
    assert reasons(plan)["g"].code is PendingCode.NEVER_FITS


def test_a_request_that_fits_no_single_agent_may_span_smaller_whole_agents() -> None:
    plan = schedule(POOL, [agent("a", 2), agent("b", 2)], [req("r", 4)])
    assert agents_of(plan) == {"r": ("a", "b")}


def test_single_node_fits_one_agent_or_never() -> None:
    agents = [agent("a", 2), agent("b", 2), agent("c", 8)]
    plan = schedule(POOL, agents, [req("one", 4, single_node=True)])
    assert agents_of(plan) == {"one": ("c",)}
    plan = schedule(POOL, agents, [req("big", 16, single_node=True)])
    assert plan.pending == (
        Pending(
            "big",
            PendingCode.NEVER_FITS,
            "slots_per_trial=16 can never be placed in pool default: is_single_node forbids "
            "spanning agents and the largest agent has 8 slots",
        ),
    )
    plan = schedule(POOL, [agent("a", 2), agent("b", 2)], [req("r", 4, single_node=True)])
    assert reasons(plan)["r"].code is PendingCode.NEVER_FITS


def test_slots_taken_are_the_lowest_free_indices() -> None:
    a = AgentState("a", (0, 1, 2, 3, 5, 7), frozenset({0, 2}))  # slots 4 and 6 are disabled
    plan = schedule(POOL, [a], [req("x", 1, t=1), req("y", 3, t=2)])
    assert placements(plan) == {"x": (("a", (1,)),), "y": (("a", (3, 5, 7)),)}


# --- scoring and tie-breaks ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "agents", "slots", "expected"),
    [
        # best fit: the agent left with the fewest free slots
        (POOL, [busy("a", 0), busy("b", 6), busy("c", 4)], 2, "b"),
        (POOL, [busy("a", 0), busy("b", 7), busy("c", 4)], 2, "c"),
        (POOL, [agent("small", 4), agent("large", 8)], 4, "small"),
        (POOL, [busy("x", 2, slots=4), busy("y", 6)], 2, "x"),  # equal free: lower id
        # worst fit: the largest free fraction
        (WORST, [busy("a", 4), busy("b", 2), busy("c", 6)], 2, "b"),
        (WORST, [agent("small", 4), busy("large", 1)], 2, "small"),
        (WORST, [busy("y", 4), busy("x", 2, slots=4)], 1, "x"),  # 4/8 == 2/4: lower id
        # ties on score: lower agent id
        (POOL, [agent("b"), agent("a"), agent("c")], 1, "a"),
        (WORST, [agent("b"), agent("a"), agent("c")], 1, "a"),
    ],
)
def test_fitting_policy_and_tie_break(
    policy: PoolPolicy, agents: list[AgentState], slots: int, expected: str
) -> None:
    for order in itertools.permutations(agents):
        assert agents_of(schedule(policy, order, [req("r", slots)])) == {"r": (expected,)}


def test_best_fit_packs_and_worst_fit_spreads() -> None:
    queue = [req(f"r{i}", 1, t=i) for i in range(4)]
    assert {a[0] for a in agents_of(schedule(POOL, eight_slot(4), queue)).values()} == {"a1"}
    spread = agents_of(schedule(WORST, eight_slot(4), queue))
    assert spread == {"r0": ("a1",), "r1": ("a2",), "r2": ("a3",), "r3": ("a4",)}


# --- usable agents -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "unusable",
    [
        agent("a0", enabled=False),
        agent("a0", draining=True),
        agent("a0", connected=False),
    ],
)
def test_unusable_agents_take_nothing_new(unusable: AgentState) -> None:
    queue = [req("one", 1, t=1), req("gang", 16, t=2), req("zero", 0, t=3)]
    plan = schedule(POOL, [unusable, agent("a1"), agent("a2")], queue)
    assert all(agent_id != "a0" for a in plan.assignments for agent_id, _ in a.slots)
    plan = schedule(POOL, [unusable], queue)
    assert plan.assignments == ()
    assert {p.code for p in plan.pending} == {PendingCode.NO_USABLE_AGENTS}
    assert plan.pending[0].message == (
        "pool default has 1 agent but none is usable (disabled, draining or disconnected)"
    )


def test_no_agents() -> None:
    plan = schedule(PoolPolicy("gpu-a100"), [], [req("r", 1)])
    assert plan.pending == (Pending("r", PendingCode.NO_AGENTS, "pool gpu-a100 has no agents"),)


def test_a_gang_needs_usable_agents() -> None:
    agents = [agent("a1"), agent("a2", draining=True), agent("a3", enabled=False)]
    plan = schedule(POOL, agents, [req("g", 16)])
    # Not "never": it fits once an agent is usable again.
    assert plan.pending == (
        Pending(
            "g",
            PendingCode.WAITING_FOR_USABLE_AGENTS,
            "slots_per_trial=16 fits pool default only with agents that are disabled, "
            "draining or disconnected now (1 of 3 agents usable)",
        ),
    )


def test_a_gang_too_big_even_with_every_agent_is_never() -> None:
    agents = [agent("a1"), agent("a2", draining=True)]
    [pending] = schedule(POOL, agents, [req("g", 24)]).pending
    assert pending.code == PendingCode.NEVER_FITS
    assert "it needs 3 whole 8-slot agents (the pool has 1 usable)" in pending.message


# --- zero-slot requests --------------------------------------------------------------------


def test_zero_slot_cap_and_best_fit_on_the_zero_slot_count() -> None:
    policy = PoolPolicy("default", max_zero_slot_per_agent=2)
    agents = [agent("a"), agent("b", zero_slot_used=1), agent("c", zero_slot_used=2)]
    queue = [req(f"z{i}", 0, t=i) for i in range(4)]
    plan = schedule(policy, agents, queue)
    assert placements(plan) == {"z0": (("b", ()),), "z1": (("a", ()),), "z2": (("a", ()),)}
    assert reasons(plan)["z3"] == Pending(
        "z3",
        PendingCode.WAITING_FOR_ZERO_SLOT_CAPACITY,
        "waiting for zero-slot capacity: each of the 3 usable agents is at the pool's limit "
        "of 2 zero-slot tasks",
    )


def test_zero_slot_worst_fit_spreads() -> None:
    agents = [agent("a", zero_slot_used=3), agent("b", zero_slot_used=1)]
    plan = schedule(WORST, agents, [req("z", 0)])
    assert placements(plan) == {"z": (("b", ()),)}


def test_zero_slot_requests_neither_block_nor_are_blocked_by_slot_requests() -> None:
    policy = PoolPolicy("default", max_zero_slot_per_agent=1)
    agents = [busy("full", 8), busy("half", 4, slots=8)]
    queue = [
        req("big", 8, priority=1),  # the head: reserves "half"
        req("z1", 0, priority=2),
        req("z2", 0, priority=3),
        req("z3", 0, priority=4),  # no zero-slot capacity left
        req("small", 1, priority=99),
    ]
    plan = schedule(policy, agents, queue)
    assert agents_of(plan) == {"z1": ("full",), "z2": ("half",)}
    assert plan.reserved == ("half",)
    codes = {p.request_id: p.code for p in plan.pending}
    assert codes == {
        "big": PendingCode.WAITING_FOR_SLOTS,
        "z3": PendingCode.WAITING_FOR_ZERO_SLOT_CAPACITY,
        "small": PendingCode.RESERVED_FOR_HEAD,
    }


def test_zero_slot_request_with_no_cap_never_fits() -> None:
    policy = PoolPolicy("default", max_zero_slot_per_agent=0)
    plan = schedule(policy, eight_slot(1), [req("z", 0)])
    assert reasons(plan)["z"].code is PendingCode.NEVER_FITS


# --- queue order ---------------------------------------------------------------------------


def test_priority_goes_first_even_when_submitted_later() -> None:
    queue = [req("late-urgent", 8, priority=1, t=9), req("early", 8, priority=42, t=1)]
    plan = schedule(POOL, eight_slot(1), queue)
    assert agents_of(plan) == {"late-urgent": ("a1",)}
    assert reasons(plan)["early"].code is PendingCode.WAITING_FOR_SLOTS


def test_fifo_within_a_priority_then_tiebreak_then_id() -> None:
    def req_at(request_id: str, t: float, tiebreak: int) -> Request:
        return Request(request_id, 1, 8, 42, (t, tiebreak))

    queue = [req_at("c", 2.0, 0), req_at("b", 1.0, 5), req_at("a", 1.0, 5), req_at("d", 1.0, 1)]
    for order in itertools.permutations(queue):
        plan = schedule(POOL, eight_slot(3), order)
        assert [a.request_id for a in plan.assignments] == ["d", "a", "b"]
        assert reasons(plan)["c"].code is PendingCode.WAITING_FOR_SLOTS


def test_assignments_are_in_placement_order_and_pending_by_id() -> None:
    queue = [req("z", 1, t=1), req("y", 1, t=2), req("b", 16, t=3), req("a", 12, t=4)]
    plan = schedule(POOL, eight_slot(1), queue)
    assert [a.request_id for a in plan.assignments] == ["z", "y"]
    assert [p.request_id for p in plan.pending] == ["a", "b"]


# --- backfill and the head reservation -----------------------------------------------------


def test_never_fits_requests_do_not_block_anyone() -> None:
    queue = [req("impossible", 12, priority=1), req("ok", 8, priority=99)]
    plan = schedule(POOL, eight_slot(2), queue)
    assert agents_of(plan) == {"ok": ("a1",)}
    assert reasons(plan)["impossible"].code is PendingCode.NEVER_FITS
    assert plan.reserved == ()


def test_backfill_within_a_priority_outside_the_reservation() -> None:
    agents = [busy("a1", 2), busy("a2", 1), agent("a3")]
    queue = [req("gang", 16, t=1, job=5), req("small", 2, t=2, job=6)]
    plan = schedule(POOL, agents, queue)
    # the gang reserves the idle a3 and a2 (one used slot); the small one backfills a1
    assert plan.reserved == ("a2", "a3")
    assert agents_of(plan) == {"small": ("a1",)}
    assert reasons(plan)["gang"] == Pending(
        "gang", PendingCode.WAITING_FOR_IDLE_AGENTS, "waiting for 2 idle 8-slot agents, 1 is idle"
    )


def test_backfill_across_priorities_outside_the_reservation() -> None:
    agents = [busy("a1", 7), agent("a2")]
    queue = [req("head", 16, priority=10, job=17), req("low", 1, priority=90, job=18)]
    plan = schedule(POOL, agents, queue)
    assert plan.reserved == ("a1", "a2")
    assert agents_of(plan) == {}
    assert reasons(plan)["low"] == Pending(
        "low", PendingCode.RESERVED_FOR_HEAD, "behind higher-priority job 17", blocking_job=17
    )
    agents.append(agent("a3", 4))  # capacity outside the reservation takes the backfill
    plan = schedule(POOL, agents, queue)
    assert agents_of(plan) == {"low": ("a3",)}


def test_gang_head_reserves_the_agents_closest_to_idle() -> None:
    agents = [busy("a", 2), busy("b", 6), agent("c"), busy("d", 8), busy("e", 5), busy("f", 2)]
    queue = [
        req("gang", 16, priority=10, job=7),
        req("x", 1, priority=50, job=8),
        req("y", 4, priority=50, job=9),
        req("z", 4, priority=10, t=1, job=10),
    ]
    plan = schedule(POOL, agents, queue)
    assert plan.reserved == ("a", "c")  # fewest used slots: 0, then 2 with the lower id
    # z (same priority as the gang) backfills f; x backfills b; y fits only a or c
    assert agents_of(plan) == {"z": ("f",), "x": ("b",)}
    got = reasons(plan)
    assert got["gang"].code is PendingCode.WAITING_FOR_IDLE_AGENTS
    assert got["gang"].message == "waiting for 2 idle 8-slot agents, 1 is idle"
    assert got["y"] == Pending(
        "y", PendingCode.RESERVED_FOR_HEAD, "behind higher-priority job 7", blocking_job=7
    )
    plan = schedule(POOL, agents[:-1], queue)  # without f, z waits behind the gang too
    assert reasons(plan)["z"] == Pending(
        "z", PendingCode.RESERVED_FOR_HEAD, "behind job 7 at the head of the queue", 7
    )


def test_single_agent_head_reserves_the_agent_with_the_most_free_slots() -> None:
    agents = [busy("a", 6), busy("b", 5), busy("c", 5), agent("tiny", 2)]
    queue = [
        req("head", 4, priority=5, job=3),
        req("three", 3, priority=9, job=4),
        req("one", 1, priority=9, job=5),
    ]
    plan = schedule(POOL, agents, queue)
    assert plan.reserved == ("b",)  # 3 free, tied with c, lower id; tiny is too small
    assert agents_of(plan) == {"three": ("c",), "one": ("a",)}  # a and tiny tie: lower id
    assert reasons(plan)["head"] == Pending(
        "head",
        PendingCode.WAITING_FOR_SLOTS,
        "waiting for an agent with 4 free slots; the most free on any usable agent is 3",
    )


def test_only_one_head_per_pass() -> None:
    agents = [busy("a", 7), busy("b", 6)]
    queue = [req("first", 4, t=1, job=1), req("second", 8, t=2, job=2), req("third", 2, t=3, job=3)]
    plan = schedule(POOL, agents, queue)
    assert plan.reserved == ("b",)
    got = reasons(plan)
    assert got["second"].code is PendingCode.WAITING_FOR_SLOTS
    assert got["third"] == Pending(
        "third", PendingCode.RESERVED_FOR_HEAD, "behind job 1 at the head of the queue", 1
    )


def test_messages_describe_the_state_the_pass_ends_in() -> None:
    agents = [busy("a", 6), agent("b")]
    queue = [req("gang", 16, t=1), req("fill", 8, t=2), req("four", 4, t=3)]
    plan = schedule(POOL, agents, queue)
    # The gang reserves a and b; nothing else fits anywhere.
    got = reasons(plan)
    assert got["gang"].message == "waiting for 2 idle 8-slot agents, 1 is idle"
    assert got["fill"].code is PendingCode.RESERVED_FOR_HEAD
    assert got["four"].code is PendingCode.RESERVED_FOR_HEAD


def test_waiting_for_slots_when_nothing_is_reserved_that_would_help() -> None:
    plan = schedule(POOL, [busy("a", 6), busy("b", 7)], [req("x", 4, t=1), req("y", 3, t=2)])
    got = reasons(plan)
    assert plan.reserved == ("a",)
    assert got["x"].message == (
        "waiting for an agent with 4 free slots; the most free on any usable agent is 2"
    )
    assert got["y"].code is PendingCode.WAITING_FOR_SLOTS


# --- preemption ----------------------------------------------------------------------------


def _preemption_cluster() -> tuple[list[AgentState], list[Running]]:
    agents = [busy("a", 8), busy("b", 4)]
    runs = [
        running("old-low", (("a", (0, 1)),), priority=50, t=1),
        running("new-lowest", (("b", (0, 1, 2, 3)),), priority=60, t=2),
        running("newer-lowest", (("a", (2, 3, 4, 5, 6, 7)),), priority=60, t=3),
    ]
    return agents, runs


def test_preemption_is_off_by_default() -> None:
    agents, runs = _preemption_cluster()
    plan = schedule(POOL, agents, [req("head", 8, priority=10)], runs)
    assert plan.preempt == ()
    assert plan.reserved == ("b",)


def test_preemption_picks_lowest_priority_newest_first_and_keeps_only_useful_victims() -> None:
    agents, runs = _preemption_cluster()
    plan = schedule(PREEMPT, agents, [req("head", 8, priority=10)], runs)
    # newer-lowest goes first but frees only 6 of a; new-lowest then frees b entirely,
    # so only new-lowest (the victim on the agent the head will use) is asked to stop
    assert plan.preempt == ("new-lowest",)
    assert plan.reserved == ("b",)
    assert plan.assignments == ()
    assert reasons(plan)["head"].message.endswith("; asked 1 lower-priority allocation to stop")


def test_preemption_for_a_gang_empties_whole_agents() -> None:
    agents, runs = _preemption_cluster()
    plan = schedule(PREEMPT, agents, [req("head", 16, priority=10)], runs)
    assert plan.preempt == ("new-lowest", "newer-lowest", "old-low")
    assert plan.reserved == ("a", "b")


def test_preemption_spares_equal_or_higher_priority_and_non_preemptible_work() -> None:
    agents = [busy("a", 8)]
    runs = [
        running("same", (("a", (0, 1, 2, 3)),), priority=10),
        running("pinned", (("a", (4, 5, 6, 7)),), priority=90, preemptible=False),
    ]
    plan = schedule(PREEMPT, agents, [req("head", 4, priority=10)], runs)
    assert plan.preempt == ()


def test_preemption_asks_nothing_when_the_head_can_never_fit_even_then() -> None:
    agents = [busy("a", 8), busy("b", 8)]
    runs = [
        running("victim", (("a", tuple(range(8))),), priority=90),
        running("keeper", (("b", tuple(range(8))),), priority=1),
    ]
    plan = schedule(PREEMPT, agents, [req("head", 16, priority=10)], runs)
    assert plan.preempt == ()


def test_work_already_stopping_counts_before_new_victims() -> None:
    agents = [busy("a", 8), busy("b", 8)]
    runs = [
        running("stopping", (("a", tuple(range(8))),), priority=90, stopping=True),
        running("other", (("b", tuple(range(8))),), priority=90),
    ]
    plan = schedule(PREEMPT, agents, [req("head", 8, priority=10)], runs)
    assert plan.preempt == ()
    assert plan.reserved == ("a",)
    assert reasons(plan)["head"].message.endswith("; waiting for 1 stopping allocation to exit")


def test_preemption_does_not_place_the_head_in_the_same_pass() -> None:
    agents = [busy("a", 8)]
    runs = [running("victim", (("a", tuple(range(8))),), priority=90)]
    queue = [req("head", 8, priority=10), req("low", 1, priority=95)]
    plan = schedule(PREEMPT, agents, queue, runs)
    assert plan.preempt == ("victim",)
    assert plan.assignments == ()
    assert reasons(plan)["low"].code is PendingCode.WAITING_FOR_SLOTS


# --- feasibility (the submit-time warning) -------------------------------------------------


@pytest.mark.parametrize(
    ("agents", "slots", "single_node", "expected"),
    [
        (eight_slot(2), 8, False, None),
        (eight_slot(2), 16, False, None),
        ([busy("a1", 8), busy("a2", 8)], 16, False, None),  # busy agents still count
        (eight_slot(2), 0, False, None),
        (
            eight_slot(2),
            12,
            False,
            (
                PendingCode.NEVER_FITS,
                "slots_per_trial=12 can never be placed in pool default: its agents have 8 "
                "slots, so a multi-agent trial needs a multiple of 8",
            ),
        ),
        (
            eight_slot(2),
            24,
            False,
            (
                PendingCode.NEVER_FITS,
                "slots_per_trial=24 can never be placed in pool default: it needs 3 whole "
                "8-slot agents (the pool has 2)",
            ),
        ),
        (
            eight_slot(2),
            16,
            True,
            (
                PendingCode.NEVER_FITS,
                "slots_per_trial=16 can never be placed in pool default: is_single_node "
                "forbids spanning agents and the largest agent has 8 slots",
            ),
        ),
        (
            [agent("a", 8), agent("b", 4)],
            12,
            False,
            (
                PendingCode.NEVER_FITS,
                "slots_per_trial=12 can never be placed in pool default: it needs 3 whole "
                "4-slot agents (the pool has 1)",
            ),
        ),
        (
            [agent("a", 8), agent("b", 4)],
            10,
            False,
            (
                PendingCode.NEVER_FITS,
                "slots_per_trial=10 can never be placed in pool default: its agents have 4 or "
                "8 slots, so a multi-agent trial needs a multiple of one of those sizes",
            ),
        ),
        (
            [agent("a", 8), agent("b", 16, enabled=False)],
            16,
            True,
            (
                PendingCode.WAITING_FOR_USABLE_AGENTS,
                "slots_per_trial=16 fits pool default only with agents that are disabled, "
                "draining or disconnected now (1 of 2 agents usable)",
            ),
        ),
        (
            [agent("a", 0)],
            1,
            False,
            (
                PendingCode.NEVER_FITS,
                "slots_per_trial=1 can never be placed in pool default: its agents have no slots",
            ),
        ),
        ([], 1, False, (PendingCode.NO_AGENTS, "pool default has no agents")),
        (
            [agent("a", draining=True), agent("b", connected=False), agent("c", enabled=False)],
            1,
            False,
            (
                PendingCode.NO_USABLE_AGENTS,
                "pool default has 3 agents but none is usable (disabled, draining or disconnected)",
            ),
        ),
    ],
)
def test_feasibility(
    agents: list[AgentState],
    slots: int,
    single_node: bool,
    expected: tuple[PendingCode, str] | None,
) -> None:
    got = feasibility(POOL, agents, slots, single_node)
    if expected is None:
        assert got is None
    else:
        assert got == Pending("", expected[0], expected[1])


def test_feasibility_matches_never_fits_in_a_pass() -> None:
    agents = [agent("a", 8), agent("b", 4), agent("c", 4)]
    for slots, single_node in itertools.product(range(0, 33), (False, True)):
        verdict = feasibility(POOL, agents, slots, single_node)
        pending = reasons(schedule(POOL, agents, [req("r", slots, single_node=single_node)]))
        if verdict is None:
            assert "r" not in pending
        else:
            assert pending["r"] == Pending("r", verdict.code, verdict.message)


# --- determinism ---------------------------------------------------------------------------


def test_same_input_in_any_order_gives_the_same_plan() -> None:
    agents = [busy("a", 3), agent("b"), agent("c", 4), busy("d", 1, slots=2), agent("e")]
    queue = [
        req("r1", 2, priority=5, t=3),
        req("r2", 16, priority=5, t=1),
        req("r3", 1, priority=7, t=0),
        req("r4", 4, priority=5, t=1),
        req("r5", 0, priority=1, t=0),
        req("r6", 12, priority=1, t=0),
    ]
    expected = schedule(POOL, agents, queue)
    assert expected.assignments and expected.pending
    for a_order, q_order in zip(
        itertools.islice(itertools.permutations(agents), 0, None, 13),
        itertools.islice(itertools.permutations(queue), 0, None, 7),
        strict=False,
    ):
        assert schedule(POOL, a_order, q_order) == expected


def test_plan_types() -> None:
    plan = schedule(POOL, eight_slot(1), [req("r", 2)])
    assert plan == Plan((Assignment("r", (("a1", (0, 1)),)),), ())


# --- resources.max_slots ---------------------------------------------------------------------


def capped(request_id: str, slots: int, max_slots: int, *, job: int = 7, t: float = 0.0) -> Request:
    return Request(request_id, job, slots, 42, (t, 0), label="experiment 7", max_slots=max_slots)


def test_a_job_never_holds_more_than_its_max_slots_and_others_use_the_rest() -> None:
    # 16 one-slot trials of a job capped at 4, on 16 idle slots, with another job behind it.
    trials = [capped(f"t{i:02d}", 1, 4, t=i) for i in range(16)]
    other = req("other", 2, t=99, job=8)
    plan = schedule(POOL, eight_slot(2), [*trials, other])
    assert sorted(placements(plan)) == ["other", "t00", "t01", "t02", "t03"]
    waiting = reasons(plan)
    assert {waiting[t.id].code for t in trials[4:]} == {PendingCode.AT_MAX_SLOTS}
    assert waiting["t04"].message == (
        "experiment 7 holds 4 slots of its resources.max_slots 4; this one needs 1 more, "
        "so it waits for one of them to end"
    )
    # Capped trials reserve nothing: no agent is held for them.
    assert plan.reserved == ()


def test_slots_the_job_holds_already_count_against_its_cap() -> None:
    # It holds 3 of its 4: a 2-slot trial waits and a 1-slot one of the same job fits.
    plan = schedule(
        POOL,
        [busy("a1", 3), agent("a2")],
        [capped("two", 2, 4, t=0), capped("one", 1, 4, t=1)],
        held_slots={7: 3},
    )
    assert sorted(placements(plan)) == ["one"]
    assert reasons(plan)["two"].code == PendingCode.AT_MAX_SLOTS
    assert "holds 3 slots of its resources.max_slots 4; this one needs 2 more" in (
        reasons(plan)["two"].message
    )


def test_a_gang_is_placed_whole_within_the_cap_or_waits() -> None:
    plan = schedule(POOL, eight_slot(4), [capped("g1", 16, 24, t=0), capped("g2", 16, 24, t=1)])
    assert agents_of(plan) == {"g1": ("a1", "a2")}
    assert reasons(plan)["g2"].code == PendingCode.AT_MAX_SLOTS


def test_a_cap_on_one_job_leaves_other_jobs_alone() -> None:
    plan = schedule(
        POOL,
        [agent("a1", 2)],
        [capped("c", 1, 1, job=7, t=0), capped("d", 1, 1, job=9, t=1)],
        held_slots={7: 1},
    )
    assert sorted(placements(plan)) == ["d"]
