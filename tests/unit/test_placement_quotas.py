"""Quotas in the placement core: admission within nominal plus borrowing, lending limits,
reclaim by preemption, scaled quotas, and a property test over random histories."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from master.core import fair_share, placement
from master.core.fair_share import FairShare, Quota
from master.core.placement import AgentState, PendingCode, PoolPolicy, Request, Running

POOL = PoolPolicy("gpu")
A, B, C = 1, 2, 3


def agents(n: int, slots: int, used: dict[str, set[int]] | None = None) -> list[AgentState]:
    used = used or {}
    return [
        AgentState(
            id=f"ag{i}",
            slot_ids=tuple(range(slots)),
            used_slot_ids=frozenset(used.get(f"ag{i}", set())),
        )
        for i in range(n)
    ]


def req(
    rid: str,
    ws: int,
    slots: int = 1,
    *,
    order: float = 0.0,
    priority: int = 42,
    job: int | None = None,
) -> Request:
    return Request(
        id=rid,
        job_id=job if job is not None else ws * 1000,
        slots=slots,
        priority=priority,
        order=(order, 0),
        workspace_id=ws,
    )


def run(
    rid: str,
    ws: int,
    agent: str,
    slot_ids: tuple[int, ...],
    *,
    order: float = 0.0,
    priority: int = 42,
    stopping: bool = False,
) -> Running:
    return Running(
        id=rid,
        job_id=ws * 1000,
        priority=priority,
        order=(order, 0),
        slots=((agent, slot_ids),),
        workspace_id=ws,
        stopping=stopping,
    )


def with_running(n: int, slots: int, running: list[Running]) -> list[AgentState]:
    used: dict[str, set[int]] = {}
    for r in running:
        for agent, ids in r.slots:
            used.setdefault(agent, set()).update(ids)
    return agents(n, slots, used)


KUEUE = {A: Quota("vision", 6), B: Quota("nlp", 2)}


def test_a_workspace_borrows_idle_quota_of_another() -> None:
    """Kueue's basic scenario: 8 slots, A nominal 6, B nominal 2; A's 10 one-slot trials
    run 8 (borrowing 2)."""
    plan = placement.schedule(
        POOL, agents(2, 4), [req(f"a{i}", A, order=i) for i in range(10)], quotas=KUEUE
    )
    assert len(plan.assignments) == 8
    assert not plan.preempt


def test_a_workspace_below_its_nominal_reclaims_from_the_borrower_newest_first() -> None:
    # A runs 8 (6 own + 2 borrowed); B submits 2 within its nominal quota of 2.
    running = [run(f"a{i}", A, f"ag{i // 4}", (i % 4,), order=float(i)) for i in range(8)]
    plan = placement.schedule(
        POOL,
        with_running(2, 4, running),
        [req("b0", B, order=100.0), req("b1", B, order=101.0)],
        running,
        quotas=KUEUE,
    )
    assert plan.assignments == ()
    # b0 is the head: it needs one slot; the most recently started borrower stops.
    assert plan.preempt == ("a7",)
    head = {p.request_id: p for p in plan.pending}["b0"]
    assert "reclaiming 1 slot from vision for nlp" in head.message
    assert "a7" in head.message
    # Next pass, a7 is stopping and has freed its slot: b0 fits; b1 reclaims a6.
    running2 = [r for r in running if r.id != "a7"]
    plan2 = placement.schedule(
        POOL,
        with_running(2, 4, running2),
        [req("b0", B, order=100.0), req("b1", B, order=101.0)],
        running2,
        quotas=KUEUE,
    )
    assert [a.request_id for a in plan2.assignments] == ["b0"]
    assert plan2.preempt == ("a6",)


def test_reclaim_takes_lowest_priority_first_and_never_below_nominal() -> None:
    # A holds all 8 slots (6 + 2 borrowed); a0, its oldest, has the lowest priority.
    running = [run(f"a{i}", A, f"ag{i // 4}", (i % 4,), order=float(i)) for i in range(8)]
    running[0] = run("a0", A, "ag0", (0,), order=0.0, priority=80)
    agents_now = with_running(2, 4, running)
    plan = placement.schedule(POOL, agents_now, [req("b0", B, order=100.0)], running, quotas=KUEUE)
    assert plan.preempt == ("a0",)  # lowest priority before newest
    # A 2-slot request: both borrowed slots, on the agent whose victims have the lowest
    # priority (ag0: a0, then its newest, a3).
    plan = placement.schedule(
        POOL, agents_now, [req("b0", B, 2, order=100.0)], running, quotas=KUEUE
    )
    assert plan.preempt == ("a0", "a3")
    # One slot free on ag1 already: a 2-slot request needs one victim there, not the
    # lowest-priority a0, which would not make room on any one agent.
    running = [r for r in running if r.id != "a7"]
    plan = placement.schedule(
        POOL, with_running(2, 4, running), [req("b0", B, 2, order=100.0)], running, quotas=KUEUE
    )
    assert plan.preempt == ("a6",)


def test_reclaim_never_takes_a_workspace_below_its_nominal_quota() -> None:
    """A nominal quota is a number of slots, not agents: when B's 4-slot gang could only fit
    by taking A below its nominal 4, B waits for A's work to end."""
    quotas = {A: Quota("vision", 4), B: Quota("nlp", 4)}
    running = [run(f"a{i}", A, "ag0", (i,), order=float(i)) for i in range(3)] + [
        run(f"a{i}", A, "ag1", (i - 3,), order=float(i)) for i in range(3, 5)
    ]
    plan = placement.schedule(
        POOL, with_running(2, 4, running), [req("b0", B, 4, order=100.0)], running, quotas=quotas
    )
    assert plan.preempt == ()
    # With two more borrowed (one on each agent), the gang reclaims A's three on ag1.
    running.append(run("a5", A, "ag1", (2,), order=5.0))
    running.append(run("a6", A, "ag0", (3,), order=6.0))
    plan = placement.schedule(
        POOL, with_running(2, 4, running), [req("b0", B, 4, order=100.0)], running, quotas=quotas
    )
    assert plan.preempt == ("a3", "a4", "a5")


def test_a_borrowing_limit_of_zero_leaves_idle_slots_and_says_so() -> None:
    quotas = {A: Quota("vision", 6, borrowing_limit=0), B: Quota("nlp", 2)}
    plan = placement.schedule(
        POOL, agents(2, 4), [req(f"a{i}", A, order=i) for i in range(10)], quotas=quotas
    )
    assert len(plan.assignments) == 6
    reasons = {p.request_id: p for p in plan.pending}
    assert reasons["a6"].code == PendingCode.QUOTA_BORROWING_LIMIT
    assert reasons["a6"].message == (
        "workspace vision holds 6 of its 6-slot quota in pool gpu; 2 idle slots are lent to "
        "no one because its borrowing limit is 0"
    )
    assert not plan.reserved  # a quota wait holds up no one


def test_a_lending_limit_keeps_part_of_an_idle_quota() -> None:
    quotas = {A: Quota("vision", 4), B: Quota("nlp", 4, lending_limit=1)}
    plan = placement.schedule(
        POOL, agents(2, 4), [req(f"a{i}", A, order=i) for i in range(8)], quotas=quotas
    )
    assert len(plan.assignments) == 5  # 4 own + 1 lent by nlp; 3 kept for nlp
    reasons = {p.request_id: p for p in plan.pending}
    assert reasons["a5"].code == PendingCode.QUOTA_NOT_LENT
    assert "3 of them are other workspaces' idle quota" in reasons["a5"].message


def test_a_gang_is_admitted_whole_within_quota_or_not_at_all() -> None:
    quotas = {A: Quota("vision", 6, borrowing_limit=0), B: Quota("nlp", 2)}
    # A holds 3; a 4-slot gang would take it to 7 > 6 + 0.
    running = [run(f"a{i}", A, "ag0", (i,)) for i in range(3)]
    plan = placement.schedule(
        POOL, with_running(2, 4, running), [req("g", A, 4)], running, quotas=quotas
    )
    assert plan.assignments == ()
    assert {p.request_id: p.code for p in plan.pending} == {"g": PendingCode.QUOTA_BORROWING_LIMIT}
    # Within quota but split 1 + 4 free over two agents... the gang takes the idle agent.
    plan = placement.schedule(
        POOL,
        with_running(2, 4, running),
        [req("g", A, 4)],
        running,
        quotas={A: Quota("vision", 8)},
    )
    assert [(a.request_id, a.slots) for a in plan.assignments] == [("g", (("ag1", (0, 1, 2, 3)),))]


def test_quotas_shrink_when_agents_are_gone() -> None:
    # One of two agents is disconnected: 4 usable slots for 6 + 2 promised -> 3 and 1.
    pool = agents(2, 4)
    pool[1] = AgentState(id="ag1", slot_ids=(0, 1, 2, 3), connected=False)
    quotas = {A: Quota("vision", 6, borrowing_limit=0), B: Quota("nlp", 2, lending_limit=0)}
    plan = placement.schedule(
        POOL, pool, [req(f"a{i}", A, order=i) for i in range(4)], quotas=quotas
    )
    assert len(plan.assignments) == 3
    message = {p.request_id: p.message for p in plan.pending}["a3"]
    assert "scaled from 6 while the pool's 4 usable slots are fewer than the 8" in message


def test_priority_preemption_spares_other_workspaces_within_their_quota() -> None:
    policy = PoolPolicy("gpu", preemption=True)
    quotas = {A: Quota("vision", 4), B: Quota("nlp", 4)}
    # B holds its 4 at low priority; A's high-priority trial finds A's own 4 taken by... A.
    running = [run(f"b{i}", B, "ag1", (i,), priority=90) for i in range(4)] + [
        run(f"a{i}", A, "ag0", (i,), priority=90) for i in range(4)
    ]
    plan = placement.schedule(
        policy,
        with_running(2, 4, running),
        [req("x", A, 1, priority=1)],
        running,
        quotas=quotas,
    )
    # Only A's own lower-priority work may make room: B is within its nominal quota.
    assert plan.preempt and all(victim.startswith("a") for victim in plan.preempt)


def test_no_quotas_keeps_the_plain_order() -> None:
    reqs = [req(f"r{i}", A if i % 2 else B, order=i) for i in range(6)]
    plain = placement.schedule(POOL, agents(1, 4), reqs)
    assert [a.request_id for a in plain.assignments] == ["r0", "r1", "r2", "r3"]


# --- properties ----------------------------------------------------------------------------

QUOTA = st.builds(
    Quota,
    st.just("w"),
    st.integers(0, 8),
    st.one_of(st.none(), st.integers(0, 8)),
    st.one_of(st.none(), st.integers(0, 8)),
)


@settings(max_examples=500, deadline=None)
@given(
    quotas=st.fixed_dictionaries({A: QUOTA, B: QUOTA, C: QUOTA}),
    events=st.lists(
        st.tuples(
            st.sampled_from(["submit", "submit", "finish", "pass"]),
            st.sampled_from([A, B, C]),
            st.sampled_from([1, 1, 2, 4]),
        ),
        min_size=5,
        max_size=60,
    ),
)
def test_quotas_hold_and_reclaim_never_cycles(
    quotas: dict[int, Quota], events: list[tuple[str, int, int]]
) -> None:
    """Random submits, finishes and passes on 2 agents x 4 slots. After every pass:
    - no workspace that was given slots holds more than its nominal plus borrowing limit;
    - only borrowers' work is asked to stop, never taking a workspace below its nominal
      quota (and the work that reclaims is within its own: no two workspaces can take
      slots back and forth);
    - a workspace with a pending one-slot request within its nominal quota, while another
      holds work it can lose without falling below its own, sees the pass act: something
      placed, or something asked or already asked to stop."""
    quotas = {
        w: q for w, q in quotas.items() if q.lending_limit is None or q.lending_limit <= q.nominal
    }
    nominal = fair_share.scaled_nominals(quotas, 8)
    pending: list[Request] = []
    running: list[Running] = []
    counter = 0

    def held_by_ws() -> dict[int, int]:
        held: dict[int, int] = {}
        for r in running:
            held[r.workspace_id] = held.get(r.workspace_id, 0) + sum(len(s) for _, s in r.slots)
        return held

    # A fills the cluster first, so that the others' submits often find it borrowing.
    fill = [("submit", A, 1)] * 8 + [("pass", A, 1)]
    for kind, ws, slots in fill + events:
        counter += 1
        if kind == "submit":
            pending.append(req(f"r{counter}", ws, slots, order=float(counter), job=ws))
            continue
        if kind == "finish":
            mine = [r for r in running if r.workspace_id == ws and not r.stopping]
            if mine:
                running.remove(mine[0])
            continue
        # What was asked to stop has exited by the next pass.
        running = [r for r in running if not r.stopping]
        before = held_by_ws()
        plan = placement.schedule(
            POOL,
            with_running(2, 4, running),
            pending,
            running,
            quotas=quotas,
            share=FairShare(start_charge_s=60.0),
        )
        by_id = {p.id: p for p in pending}
        for a in plan.assignments:
            p = by_id[a.request_id]
            running.append(
                Running(
                    id=p.id,
                    job_id=p.job_id,
                    priority=p.priority,
                    order=p.order,
                    slots=a.slots,
                    workspace_id=p.workspace_id,
                )
            )
        placed = {a.request_id for a in plan.assignments}
        pending = [p for p in pending if p.id not in placed]
        after = held_by_ws()
        given = {by_id[i].workspace_id for i in placed}
        for w in given:
            limit = quotas[w].borrowing_limit if w in quotas else None
            if limit is not None:
                assert after[w] <= nominal.get(w, 0) + limit, (w, after, quotas)
        victims = [r for r in running if r.id in set(plan.preempt)]
        by_ws: dict[int, list[Running]] = {}
        for v in victims:
            by_ws.setdefault(v.workspace_id, []).append(v)
        for w, runs in by_ws.items():
            sizes = [sum(len(s) for _, s in r.slots) for r in runs]
            # Never below its nominal quota once they have stopped.
            assert before.get(w, 0) - sum(sizes) >= nominal.get(w, 0), (w, before)
        # A borrower holds work that can stop without taking it below its nominal quota.
        borrowing = any(
            before.get(r.workspace_id, 0) - sum(len(s) for _, s in r.slots)
            >= nominal.get(r.workspace_id, 0)
            for r in running
        )
        # A one-slot request fits as soon as any borrowed slot is free (a gang may need
        # slots that only taking a borrower below its nominal would free: it waits; and a
        # borrower's gang bigger than what it borrows is not stopped for it either).
        starved = [
            p
            for p in pending
            if p.slots == 1 and before.get(p.workspace_id, 0) + 1 <= nominal.get(p.workspace_id, 0)
        ]
        if starved and borrowing:
            asked = any(r.stopping for r in running)
            assert plan.assignments or plan.preempt or asked or not running, (before, starved)
        running = [
            Running(
                id=r.id,
                job_id=r.job_id,
                priority=r.priority,
                order=r.order,
                slots=r.slots,
                workspace_id=r.workspace_id,
                stopping=r.stopping or r.id in set(plan.preempt),
            )
            for r in running
        ]


# --- cases a review found ------------------------------------------------------------------


def test_reclaim_takes_the_victim_that_keeps_the_lender_at_its_nominal() -> None:
    """A borrows 1 slot: its 4-slot gang on a1 (the newest) or its 1-slot trial on a2. B
    needs 1: the 1-slot trial stops; stopping the gang would take A to 1 of its 4."""
    running = [
        Running("G", 1, 42, (1.0, 1), (("ag0", (0, 1, 2, 3)),), workspace_id=A, started=100.0),
        Running("s1", 2, 42, (1.0, 2), (("ag1", (0,)),), workspace_id=A, started=50.0),
    ] + [run(f"b{i}", B, "ag1", (i,)) for i in (1, 2, 3)]
    quotas = {A: Quota("A", 4), B: Quota("B", 4)}
    plan = placement.schedule(
        POOL, with_running(2, 4, running), [req("r1", B)], running, quotas=quotas
    )
    assert plan.preempt == ("s1",)


def test_a_borrower_preempts_by_priority_only_for_slots_it_may_be_lent() -> None:
    """X keeps 4 idle slots unlent; B (no quota) at priority 1 asks for 5 on an 8-slot agent
    where Y borrows 2: stopping Y's work would free slots B may not take, so nothing stops
    (it used to stop one, see it placed again, and stop it again, pass after pass)."""
    policy = PoolPolicy("gpu", preemption=True)
    quotas = {A: Quota("X", 4, lending_limit=0), B: Quota("Y", 2)}
    running = [run(f"y{i}", B, "ag0", (i,), order=float(i)) for i in range(4)]
    for _ in range(3):
        plan = placement.schedule(
            policy,
            with_running(1, 8, running),
            [req("b", C, 5, priority=1)],
            running,
            quotas=quotas,
        )
        assert plan.preempt == () and plan.assignments == ()


def test_one_workspace_that_cannot_reclaim_does_not_keep_another_from_its_quota() -> None:
    """A's 8-slot gang (within its quota) fits no two agents, since B's trials sit on two of
    them; B, below its quota while C borrows a whole agent, still reclaims from C."""
    quotas = {A: Quota("A", 8), B: Quota("B", 4)}
    running = [run("b1", B, "ag0", (0,)), run("b2", B, "ag1", (0,))] + [
        run(f"c{i}", C, "ag2", (i,), order=float(i)) for i in range(4)
    ]
    plan = placement.schedule(
        POOL,
        with_running(3, 4, running),
        [req("A8", A, 8, order=3.0), req("B1", B, order=4.0), req("B2", B, order=4.5)],
        running,
        quotas=quotas,
        share=FairShare(),
    )
    assert plan.preempt == ("c3",)
    reasons = {p.request_id: p for p in plan.pending}
    assert reasons["B1"].code == PendingCode.WAITING_FOR_SLOTS
    assert "reclaiming 1 slot from workspace 3 for B" in reasons["B1"].message


def test_borrowers_keep_the_start_charges_of_the_first_round() -> None:
    """Two users of a workspace with a nominal quota of 2: u1's two priority-10 trials use
    it; at priority 42 the users then alternate, as they would with no quota at all."""
    reqs = [Request(f"hi{i}", 1, 1, 10, (1.0, i), workspace_id=A, user_id=1) for i in range(2)] + [
        Request(f"u1-{i}", 2, 1, 42, (2.0, i), workspace_id=A, user_id=1) for i in range(5)
    ]
    reqs += [Request(f"u2-{i}", 3, 1, 42, (3.0, i), workspace_id=A, user_id=2) for i in range(5)]
    share = FairShare(start_charge_s=60.0)
    with_quota = placement.schedule(
        POOL, agents(1, 8), reqs, quotas={A: Quota("W", 2)}, share=share
    )
    without = placement.schedule(POOL, agents(1, 8), reqs, share=share)
    placed = [a.request_id for a in with_quota.assignments]
    assert placed == [a.request_id for a in without.assignments]
    assert sum(r.startswith("u2") for r in placed) == 4  # u1 had 2 at priority 10
