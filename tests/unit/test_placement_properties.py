"""Placement core, property-based: random clusters and queues against brute-force checks."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from master.core.placement import (
    AgentState,
    FittingPolicy,
    PendingCode,
    Plan,
    PoolPolicy,
    Request,
    Running,
    feasibility,
    schedule,
)

SETTINGS = settings(max_examples=100, deadline=None)


@dataclass(frozen=True)
class Case:
    policy: PoolPolicy
    agents: tuple[AgentState, ...]
    requests: tuple[Request, ...]
    running: tuple[Running, ...]


@st.composite
def agents_st(draw: st.DrawFn) -> tuple[AgentState, ...]:
    count = draw(st.integers(1, 12))
    # One or two sizes per cluster, so that gangs of whole same-size agents are common.
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=2))
    out = []
    for i in range(count):
        size = draw(st.sampled_from(sizes))
        used = frozenset[int]()
        if draw(st.integers(0, 2)) == 0:
            used = draw(st.frozensets(st.integers(0, size - 1), max_size=size))
        flags = draw(st.sampled_from(["ok"] * 7 + ["disabled", "draining", "gone"]))
        out.append(
            AgentState(
                f"a{i:02d}",
                tuple(range(size)),
                used,
                enabled=flags != "disabled",
                draining=flags == "draining",
                connected=flags != "gone",
                zero_slot_used=draw(st.integers(0, 3)),
            )
        )
    return tuple(out)


@st.composite
def requests_st(draw: st.DrawFn) -> tuple[Request, ...]:
    count = draw(st.integers(0, 14))
    out = []
    for i in range(count):
        out.append(
            Request(
                f"r{i:02d}",
                job_id=draw(st.integers(1, 5)),
                slots=draw(st.sampled_from([0, 1, 1, 2, 2, 3, 4, 4, 6, 8, 8, 12, 16, 16, 24, 32])),
                priority=draw(st.sampled_from([1, 42, 42, 99])),
                order=(float(draw(st.integers(0, 4))), draw(st.integers(0, 3))),
                single_node=draw(st.booleans()),
            )
        )
    return tuple(out)


@st.composite
def cases(draw: st.DrawFn, preemption: bool | None = None) -> Case:
    agents = draw(agents_st())
    policy = PoolPolicy(
        "p",
        fitting=draw(st.sampled_from(list(FittingPolicy))),
        preemption=draw(st.booleans()) if preemption is None else preemption,
        max_zero_slot_per_agent=draw(st.sampled_from([0, 1, 2, 4, 100])),
    )
    # Work already running: each agent's used slots, held by one allocation.
    running = tuple(
        Running(
            f"run-{a.id}",
            job_id=100 + i,
            priority=draw(st.sampled_from([1, 42, 99])),
            order=(float(draw(st.integers(0, 4))), i),
            slots=((a.id, tuple(sorted(a.used_slot_ids))),),
            preemptible=draw(st.booleans()),
            stopping=draw(st.integers(0, 5)) == 0,
        )
        for i, a in enumerate(agents)
        if a.used_slot_ids
    )
    return Case(policy, agents, draw(requests_st()), running)


# --- brute-force helpers -------------------------------------------------------------------


def end_state(case: Case, plan: Plan) -> dict[str, tuple[AgentState, set[int], int]]:
    """Agent id -> (agent, used slots after the plan, zero-slot tasks after the plan)."""
    state = {a.id: (a, set(a.used_slot_ids), a.zero_slot_used) for a in case.agents}
    for assignment in plan.assignments:
        for agent_id, slots in assignment.slots:
            a, used, zero = state[agent_id]
            state[agent_id] = (a, used | set(slots), zero + (0 if slots else 1))
    return state


def free_count(a: AgentState, used: set[int]) -> int:
    return len(set(a.slot_ids) - used)


def fits(agents: Sequence[tuple[AgentState, set[int]]], slots: int, single_node: bool) -> bool:
    """Whether `slots` fits these (usable) agents as they are: one agent, else whole idle ones."""
    if any(free_count(a, used) >= slots for a, used in agents):
        return True
    if single_node or slots <= 1:
        return False
    idle = Counter(len(a.slot_ids) for a, used in agents if not used and a.slot_ids)
    return any(slots % n == 0 and count * n >= slots for n, count in idle.items())


def fits_idle_pool(case: Case, slots: int, single_node: bool, *, all_usable: bool = False) -> bool:
    usable = [(a, set[int]()) for a in case.agents if a.usable or all_usable]
    if slots == 0:
        return bool(usable) and case.policy.max_zero_slot_per_agent > 0
    return slots > 0 and fits(usable, slots, single_node)


def _key(r: Request) -> tuple[int, tuple[float, int], str]:
    return (r.priority, r.order, r.id)


def queue_order(requests: Sequence[Request]) -> list[Request]:
    return sorted(requests, key=_key)


# --- properties ----------------------------------------------------------------------------


@SETTINGS
@given(cases())
def test_no_slot_is_given_twice_and_nothing_goes_to_unusable_agents(case: Case) -> None:
    plan = schedule(case.policy, case.agents, case.requests, case.running)
    by_id = {a.id: a for a in case.agents}
    requests = {r.id: r for r in case.requests}
    waiting = [
        requests[p.request_id]
        for p in plan.pending
        if p.code in (PendingCode.WAITING_FOR_SLOTS, PendingCode.WAITING_FOR_IDLE_AGENTS)
    ]
    head = queue_order(waiting)[0] if waiting else None
    given_out: set[tuple[str, int]] = set()
    zero = Counter[str]()
    for assignment in plan.assignments:
        request = requests[assignment.request_id]
        assert [agent_id for agent_id, _ in assignment.slots] == sorted(
            {agent_id for agent_id, _ in assignment.slots}
        )
        for agent_id, slots in assignment.slots:
            a = by_id[agent_id]
            assert a.usable
            if request.slots and head is not None and _key(head) < _key(request):
                assert agent_id not in plan.reserved  # backfill stays off the reservation
            for slot in slots:
                assert slot in a.slot_ids
                assert slot not in a.used_slot_ids
                assert (agent_id, slot) not in given_out
                given_out.add((agent_id, slot))
        if request.slots == 0:
            assert len(assignment.slots) == 1 and assignment.slots[0][1] == ()
            zero[assignment.slots[0][0]] += 1
        else:
            assert sum(len(slots) for _, slots in assignment.slots) == request.slots
    for agent_id, placed in zero.items():
        assert by_id[agent_id].zero_slot_used + placed <= case.policy.max_zero_slot_per_agent
    # every request is answered exactly once
    answered = [a.request_id for a in plan.assignments] + [p.request_id for p in plan.pending]
    assert sorted(answered) == sorted(requests)
    assert [p.request_id for p in plan.pending] == sorted(p.request_id for p in plan.pending)


@SETTINGS
@given(cases())
def test_multi_agent_placements_use_whole_idle_agents_of_one_size(case: Case) -> None:
    plan = schedule(case.policy, case.agents, case.requests, case.running)
    by_id = {a.id: a for a in case.agents}
    requests = {r.id: r for r in case.requests}
    for assignment in plan.assignments:
        if len(assignment.slots) < 2:
            continue
        assert not requests[assignment.request_id].single_node
        agents = [by_id[agent_id] for agent_id, _ in assignment.slots]
        assert len({len(a.slot_ids) for a in agents}) == 1
        for a, (_, slots) in zip(agents, assignment.slots, strict=True):
            assert not a.used_slot_ids
            assert slots == a.slot_ids


@SETTINGS
@given(cases(), st.randoms(use_true_random=False))
def test_the_plan_is_a_pure_function_of_the_input(case: Case, rnd: random.Random) -> None:
    plan = schedule(case.policy, case.agents, case.requests, case.running)
    agents, requests, running = list(case.agents), list(case.requests), list(case.running)
    rnd.shuffle(agents)
    rnd.shuffle(requests)
    rnd.shuffle(running)
    assert schedule(case.policy, agents, requests, running) == plan
    assert schedule(case.policy, case.agents, case.requests, case.running) == plan


@SETTINGS
@given(cases())
def test_every_feasible_request_is_placed_while_the_cluster_drains(case: Case) -> None:
    policy = replace(case.policy, preemption=False)
    feasible = {
        r.id
        for r in case.requests
        if feasibility(policy, case.agents, r.slots, r.single_node) is None
    }
    drained = tuple(replace(a, used_slot_ids=frozenset(), zero_slot_used=0) for a in case.agents)
    queue = list(case.requests)
    agents = case.agents
    placed: set[str] = set()
    for _ in range(len(case.requests) + 1):
        plan = schedule(policy, agents, queue)
        done = {a.request_id for a in plan.assignments}
        placed |= done
        queue = [r for r in queue if r.id not in done]
        agents = drained  # everything running finishes before the next pass
    assert placed == feasible


@SETTINGS
@given(cases())
def test_every_pending_reason_is_true(case: Case) -> None:
    plan = schedule(case.policy, case.agents, case.requests, case.running)
    state = end_state(case, plan)
    usable = [(a, used) for a, used, _ in state.values() if a.usable]
    unreserved = [(a, used) for a, used in usable if a.id not in plan.reserved]
    requests = {r.id: r for r in case.requests}
    waiting = [
        requests[p.request_id]
        for p in plan.pending
        if p.code in (PendingCode.WAITING_FOR_SLOTS, PendingCode.WAITING_FOR_IDLE_AGENTS)
    ]
    head = queue_order(waiting)[0] if waiting else None
    assert bool(plan.reserved) == (head is not None)
    for p in plan.pending:
        r = requests[p.request_id]
        if p.code is PendingCode.NO_AGENTS:
            assert not case.agents
        elif p.code is PendingCode.NO_USABLE_AGENTS:
            assert case.agents and not usable
        elif p.code is PendingCode.NEVER_FITS:
            assert not fits_idle_pool(case, r.slots, r.single_node)
            assert not fits_idle_pool(case, r.slots, r.single_node, all_usable=True)
        elif p.code is PendingCode.WAITING_FOR_USABLE_AGENTS:
            assert not fits_idle_pool(case, r.slots, r.single_node)
            assert fits_idle_pool(case, r.slots, r.single_node, all_usable=True)
        elif p.code is PendingCode.WAITING_FOR_ZERO_SLOT_CAPACITY:
            assert r.slots == 0
            assert all(
                zero >= case.policy.max_zero_slot_per_agent
                for a, _, zero in state.values()
                if a.usable
            )
        elif p.code is PendingCode.WAITING_FOR_SLOTS:
            assert fits_idle_pool(case, r.slots, r.single_node)
            assert not fits(usable, r.slots, r.single_node)
            most = max(free_count(a, used) for a, used in usable)
            assert f"the most free on any usable agent is {most}" in p.message
        elif p.code is PendingCode.WAITING_FOR_IDLE_AGENTS:
            assert fits_idle_pool(case, r.slots, r.single_node)
            assert not fits(usable, r.slots, r.single_node)
        else:
            assert p.code is PendingCode.RESERVED_FOR_HEAD
            assert head is not None and p.blocking_job == head.job_id
            assert _key(head) < _key(r)
            assert fits(usable, r.slots, r.single_node)
            assert not fits(unreserved, r.slots, r.single_node)
        if p.code is not PendingCode.RESERVED_FOR_HEAD:
            assert p.blocking_job is None


@SETTINGS
@given(cases(preemption=False))
def test_no_preemption_unless_the_pool_enables_it(case: Case) -> None:
    assert schedule(case.policy, case.agents, case.requests, case.running).preempt == ()


@SETTINGS
@given(cases(preemption=True))
def test_preemption_asks_only_less_important_preemptible_work_to_stop(case: Case) -> None:
    plan = schedule(case.policy, case.agents, case.requests, case.running)
    runs = {run.id: run for run in case.running}
    requests = {r.id: r for r in case.requests}
    waiting = [
        requests[p.request_id]
        for p in plan.pending
        if p.code in (PendingCode.WAITING_FOR_SLOTS, PendingCode.WAITING_FOR_IDLE_AGENTS)
    ]
    assert list(plan.preempt) == sorted(plan.preempt)
    if plan.preempt:
        head = queue_order(waiting)[0]
        for run_id in plan.preempt:
            run = runs[run_id]
            assert run.preemptible and not run.stopping and run.priority > head.priority
            assert {agent_id for agent_id, _ in run.slots} & set(plan.reserved)
        # once the victims (and what is already stopping) exit, the head fits the reservation
        leaving = {run_id for run_id in plan.preempt} | {r.id for r in case.running if r.stopping}
        freed = {
            (agent_id, slot)
            for run in case.running
            if run.id in leaving
            for agent_id, slots in run.slots
            for slot in slots
        }
        state = end_state(case, plan)
        after = [
            (a, {s for s in used if (a.id, s) not in freed})
            for a, used, _ in state.values()
            if a.id in plan.reserved
        ]
        assert fits(after, head.slots, head.single_node)


# --- resources.max_slots ---------------------------------------------------------------------


@st.composite
def capped_st(
    draw: st.DrawFn,
) -> tuple[tuple[AgentState, ...], tuple[Request, ...], dict[int, int], dict[int, int]]:
    """A cluster and a queue whose jobs may have a cap (one per job, as an experiment's
    resources.max_slots) and slots they hold already (possibly past a cap lowered since)."""
    agents = draw(agents_st())
    caps = {
        job: cap
        for job in range(1, 6)
        if (cap := draw(st.one_of(st.none(), st.integers(0, 24)))) is not None
    }
    held = {job: draw(st.integers(0, 10)) for job in caps}
    requests = tuple(replace(r, max_slots=caps.get(r.job_id)) for r in draw(requests_st()))
    return agents, requests, held, caps


@SETTINGS
@given(capped_st())
def test_no_capped_job_is_placed_past_its_max_slots_and_waiting_ones_change_nothing(
    case: tuple[tuple[AgentState, ...], tuple[Request, ...], dict[int, int], dict[int, int]],
) -> None:
    agents, requests, held, caps = case
    policy = PoolPolicy("default")
    plan = schedule(policy, agents, requests, held_slots=held)
    by_id = {r.id: r for r in requests}
    placed: Counter[int] = Counter()
    for assignment in plan.assignments:
        placed[by_id[assignment.request_id].job_id] += by_id[assignment.request_id].slots
    for job, cap in caps.items():
        assert placed[job] == 0 or held[job] + placed[job] <= cap, (job, cap, held, placed)
    at_cap = {p.request_id for p in plan.pending if p.code == PendingCode.AT_MAX_SLOTS}
    assert all(by_id[i].max_slots is not None for i in at_cap)
    # A request waiting at its cap holds up no one: without it, the same plan.
    others = tuple(r for r in requests if r.id not in at_cap)
    again = schedule(policy, agents, others, held_slots=held)
    assert again.assignments == plan.assignments and again.reserved == plan.reserved
