"""Placement core: which pending allocations of one resource pool start where, in one pass.

Pure and deterministic (no I/O, clock or randomness) so that a pass can be tested and
benchmarked alone: the scheduler loop loads a pool's state, calls `schedule` once and writes
the returned plan in one transaction. Filter, score, select: unusable agents and agents short
of free slots are filtered out, the fitting policy scores the rest and the lowest agent id
wins a tie, so the same input always gives the same plan.

Fitting follows Determined (single agent first, else whole idle agents of one size), with two
deliberate differences: a request that can never fit is skipped instead of blocking everyone
behind it, and lower-priority work may backfill around a blocked head of the queue, but never
on the capacity reserved for that head (see `schedule`).

Beyond sorting the queue, a request costs O(log agents), never O(agents): agents sit in
buckets keyed by free-slot count, and since free capacity only shrinks during a pass, a shape
that failed once fails for the rest of it and each reason is worked out once per shape.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from operator import attrgetter

from master.core import fair_share

# --- inputs and outputs --------------------------------------------------------------------


class FittingPolicy(StrEnum):
    """How a request that fits one agent chooses among the agents it fits."""

    BEST = "best"  # fewest free slots left: packs, keeping other agents idle for gangs
    WORST = "worst"  # largest free fraction: spreads load


@dataclass(frozen=True)
class PoolPolicy:
    """A resource pool's scheduler settings."""

    name: str
    fitting: FittingPolicy = FittingPolicy.BEST
    preemption: bool = False
    max_zero_slot_per_agent: int = 100


@dataclass(frozen=True)
class AgentState:
    """An agent as the pass sees it.

    `slot_ids` are its enabled slots. `used_slot_ids` must hold every slot that running work
    holds, disabled ones included: any used slot keeps the agent from being idle for a gang.
    """

    id: str
    slot_ids: tuple[int, ...]
    used_slot_ids: frozenset[int] = frozenset()
    enabled: bool = True
    draining: bool = False
    connected: bool = True
    zero_slot_used: int = 0

    @property
    def usable(self) -> bool:
        """Whether it may take new work; work already on it stays either way."""
        return self.enabled and not self.draining and self.connected


@dataclass(frozen=True)
class Request:
    """A pending allocation; `order` is its FIFO key (submit time, then a tiebreak id)."""

    id: str
    job_id: int
    slots: int
    priority: int  # 1..99, lower is more important
    order: tuple[float, int]
    single_node: bool = False
    # How pending reasons name its job ("job 12" by default; a task's is its own name).
    label: str = ""
    # The job's resources.max_slots: the most slots all its allocations may hold at once.
    max_slots: int | None = None
    # Whose it is, for quotas and the fair order (master.core.fair_share); 0: nobody's.
    workspace_id: int = 0
    user_id: int = 0
    weight: float = 1.0  # the job's resources.weight

    @property
    def job_name(self) -> str:
        return self.label or f"job {self.job_id}"


@dataclass(frozen=True)
class Running:
    """A placed allocation, consulted only to pick preemption victims.

    `stopping` marks one already asked to stop in an earlier pass: its slots count as coming
    free, so the same head does not make the scheduler ask for more victims every pass.
    """

    id: str
    job_id: int
    priority: int
    order: tuple[float, int]
    slots: tuple[tuple[str, tuple[int, ...]], ...]  # agent id -> slot indices held
    zero_slot_agent: str | None = None
    preemptible: bool = True
    stopping: bool = False
    workspace_id: int = 0
    started: float = 0.0  # when it was placed (epoch seconds; 0: unknown)


@dataclass(frozen=True)
class Assignment:
    """Slots by agent id, ascending; a zero-slot request gets `((agent_id, ()),)`."""

    request_id: str
    slots: tuple[tuple[str, tuple[int, ...]], ...]


class PendingCode(StrEnum):
    """Why a request was not placed, for machines; `Pending.message` says it for people."""

    NO_AGENTS = "NO_AGENTS"
    NO_USABLE_AGENTS = "NO_USABLE_AGENTS"  # every agent is disabled, draining or disconnected
    NEVER_FITS = "NEVER_FITS"  # not even with every usable agent idle
    WAITING_FOR_SLOTS = "WAITING_FOR_SLOTS"  # fits one agent, none has room now
    WAITING_FOR_IDLE_AGENTS = "WAITING_FOR_IDLE_AGENTS"  # a multi-agent gang
    RESERVED_FOR_HEAD = "RESERVED_FOR_HEAD"  # fits now, but only on the head's reservation
    WAITING_FOR_ZERO_SLOT_CAPACITY = "WAITING_FOR_ZERO_SLOT_CAPACITY"
    # fits the pool's agents, but not the ones usable now
    WAITING_FOR_USABLE_AGENTS = "WAITING_FOR_USABLE_AGENTS"
    AT_MAX_SLOTS = "AT_MAX_SLOTS"  # its job holds as many slots as resources.max_slots allows
    # its workspace would pass its quota plus its borrowing limit
    QUOTA_BORROWING_LIMIT = "QUOTA_BORROWING_LIMIT"
    # the free slots are other workspaces' idle quota, which they do not lend
    QUOTA_NOT_LENT = "QUOTA_NOT_LENT"


@dataclass(frozen=True)
class Pending:
    """A reason that is true of the state the pass ends in."""

    request_id: str
    code: PendingCode
    message: str
    blocking_job: int | None = None


@dataclass(frozen=True)
class Plan:
    """The outcome of one pass.

    `assignments` are in placement order and `pending` by request id. `preempt` lists the
    Running ids asked to stop (by id). `reserved` lists the agents held for the head of the
    queue (by id): nothing else was placed on them in this pass.
    """

    assignments: tuple[Assignment, ...]
    pending: tuple[Pending, ...]
    preempt: tuple[str, ...] = ()
    reserved: tuple[str, ...] = ()


# --- public API ----------------------------------------------------------------------------


def schedule(
    policy: PoolPolicy,
    agents: Sequence[AgentState],
    requests: Sequence[Request],
    running: Sequence[Running] = (),
    held_slots: Mapping[int, int] | None = None,
    quotas: Mapping[int, fair_share.Quota] | None = None,
    share: fair_share.FairShare | None = None,
) -> Plan:
    """Place what fits now, in queue order, and explain the rest.

    The queue order is (priority, order, id), or with `share` the fair order of
    fair_share.FairOrder (priority, then the least-used user and job, then order). Each
    placement takes its slots from a working copy of free capacity, so later requests see
    them taken. A request that can never fit is skipped. The first request that could fit
    but does not becomes the head: it reserves the capacity it waits for (for a gang, the
    agents of its size closest to idle; otherwise the agent with the most free slots that is
    big enough). Later requests, whatever their priority, backfill anywhere else but never
    on the reserved agents. With preemption on, lower-priority running work is asked to stop
    so the head fits next pass. Zero-slot requests use their own per-agent cap and neither
    block nor are blocked by slot requests.

    A request whose job has a max_slots waits (AT_MAX_SLOTS) while the slots its job holds
    (`held_slots`, by job id, plus what this pass gives it) and its own would pass the cap;
    it neither becomes the head nor reserves anything, so it holds up no one else.

    With `quotas` (by workspace id; `running` must then hold every placed allocation of the
    pool), requests within their workspace's nominal quota go first, then the rest, which
    borrow: a borrower waits, holding up no one, while its workspace would pass its borrowing
    limit or the free slots are others' idle quota they do not lend. The first request of
    each workspace that is within its nominal quota and does not fit reclaims: borrowers'
    preemptible work is asked to stop (lowest priority, then most recently started, first;
    never taking a workspace below its nominal quota) until it fits, and the agents it will
    use are reserved for it. Priority preemption never takes another workspace below its
    nominal quota either, and a borrower preempts only for slots it may be lent.

    Agent, request and running ids must each be unique: they are the final tie-breaks.
    """
    summary = _summarize(policy, agents)
    cap = _Capacity(policy, sorted(agents, key=_AGENT_ID), summary)
    ledger = _ledger(cap, running, quotas) if quotas else None
    p = _Pass(policy, summary, cap, running, held_slots, ledger, share)
    if ledger is None:
        for req in p.order(requests):
            p.consider(req, within=False)
    else:
        borrowers: list[Request] = []
        first = p.order(requests)
        for req in first:
            if req.slots == 0 or ledger.within_nominal(req.workspace_id, req.slots):
                p.consider(req, within=req.slots > 0)
            else:
                borrowers.append(req)
                w = req.workspace_id
                if isinstance(first, fair_share.FairOrder) and ledger.held.get(
                    w, 0
                ) >= ledger.nominal_of(w):
                    # Its workspace has no nominal slot left: the job's rest all borrow.
                    borrowers.extend(first.take_rest(req.job_id))
        # Borrowers in the fair order again, charged as they are placed; when no slot is
        # left free (a busy pool's usual case) only their reasons remain to be said, in the
        # order they came. Each job's borrowers came in its queue order: not sorted again.
        again = p.order(borrowers, seed=first, in_order=True) if cap.open_slots > 0 else borrowers
        for req in again:
            p.consider(req, within=False)
    return p.plan()


def _ledger(
    cap: _Capacity, running: Sequence[Running], quotas: Mapping[int, fair_share.Quota]
) -> fair_share.QuotaLedger:
    capacity = sum(t for t, u in zip(cap.total, cap.usable, strict=True) if u)
    free = sum(f for f, u in zip(cap.nfree, cap.usable, strict=True) if u)
    held: dict[int, int] = {}
    for run in running:
        slots = run.slots
        if not slots:
            continue
        # Most hold slots on one agent: counted without a generator (a pass's hot loop).
        n = len(slots[0][1]) if len(slots) == 1 else sum(len(ids) for _, ids in slots)
        if n:
            held[run.workspace_id] = held.get(run.workspace_id, 0) + n
    return fair_share.QuotaLedger(quotas, capacity, free, held)


class _Pass:
    """The state of one pass over one pool: what is placed, what waits and why, the head."""

    def __init__(
        self,
        policy: PoolPolicy,
        summary: _Summary,
        cap: _Capacity,
        running: Sequence[Running],
        held_slots: Mapping[int, int] | None,
        ledger: fair_share.QuotaLedger | None,
        share: fair_share.FairShare | None,
    ) -> None:
        self.policy, self.summary, self.cap = policy, summary, cap
        self.running, self.ledger, self.share = running, ledger, share
        self.held_by_job = dict(held_slots or {})
        self.never: dict[tuple[int, bool], Pending | None] = {}
        self.assignments: list[Assignment] = []
        self.done: list[Pending] = []
        self.waiting: list[Request] = []
        self.head: Request | None = None
        self.preempt: tuple[str, ...] = ()
        # What a waiting request's reason adds (a reclaim or a preemption it asked for).
        self.notes: dict[str, str] = {}
        self.reclaimed_for: set[int] = set()  # workspaces that reclaimed this pass
        self.reclaim_tried: set[tuple[int, int, bool]] = set()
        self.quota_reasons: dict[tuple[object, int, int, int, int, int], Pending] = {}
        self.min_failed_single = summary.max_total + 1  # a single-agent fit this size fails
        self.failed_gangs: set[int] = set()
        self._fair: fair_share.FairOrder[Request] | None = None

    def order(
        self,
        requests: Sequence[Request],
        seed: Iterable[Request] | None = None,
        in_order: bool = False,
    ) -> Iterable[Request]:
        """The queue order; with `seed` (an earlier round's order), its start charges go on.
        `in_order`: the requests already are in queue order (an earlier round's rest)."""
        if self.share is None:
            return requests if in_order else _queue_order(requests)
        earlier = seed if isinstance(seed, fair_share.FairOrder) else None
        within_job = list if in_order else _queue_order
        self._fair = fair_share.FairOrder(requests, self.share, within_job, earlier)
        return self._fair

    def consider(self, req: Request, *, within: bool) -> None:
        """Place `req` if it may and fits; else note why it waits, or make it the head.
        `within`: it fits its workspace's nominal quota (only with quotas)."""
        s = req.slots
        shape = (s, req.single_node)
        impossible = self.never.get(shape, _UNKNOWN)
        if impossible is _UNKNOWN:
            impossible = self.never[shape] = _feasibility(self.summary, s, req.single_node)
        if impossible is not None:
            self.done.append(Pending(req.id, impossible.code, impossible.message))
            return
        max_slots = req.max_slots
        if max_slots is not None:
            held = self.held_by_job.get(req.job_id, 0)
            if held + s > max_slots:
                self.done.append(
                    Pending(req.id, PendingCode.AT_MAX_SLOTS, _at_max_slots(req, held))
                )
                return
        cap = self.cap
        if s == 0:
            r = cap.place_zero()
            if r < 0:
                self.waiting.append(req)
            else:
                self.assignments.append(Assignment(req.id, ((cap.ids[r], ()),)))
            return
        ledger = self.ledger
        owed = False  # within its nominal quota, but the free slots are others' to keep
        if ledger is not None:
            w = req.workspace_id
            if not within and ledger.over_borrowing_limit(w, s):
                self.done.append(self._quota_reason(_borrowing_limit, req, ledger))
                return
            # Short of free slots, it waits like any request; with enough free slots that
            # are others' idle quota, a borrower waits for quota and one within its nominal
            # quota reclaims from borrowers.
            if ledger.free >= s and not ledger.lendable(w, s):
                if not within:
                    self.done.append(self._quota_reason(_not_lent, req, ledger))
                    return
                owed = True
        if not owed:
            placed = self._place(req)
            if placed is not None:
                self.assignments.append(Assignment(req.id, placed))
                if max_slots is not None:
                    self.held_by_job[req.job_id] = self.held_by_job.get(req.job_id, 0) + s
                if ledger is not None:
                    ledger.take(req.workspace_id, s)
                if self._fair is not None:
                    self._fair.charge(req)
                return
        if ledger is not None and within and self._reclaim(req, ledger):
            return
        if owed and ledger is not None:
            self.done.append(_owed(req, ledger, self.summary.pool))
            return
        if self.head is None:
            self._become_head(req)
        self.waiting.append(req)
        self._after_waiting()

    def _quota_reason(
        self,
        explain: Callable[[Request, fair_share.QuotaLedger, str], Pending],
        req: Request,
        ledger: fair_share.QuotaLedger,
    ) -> Pending:
        """explain()'s reason, written once per workspace, size and ledger state: a busy
        pool's borrowers wait by the thousand with the same few reasons."""
        w = req.workspace_id
        key = (explain, w, req.slots, ledger.held.get(w, 0), ledger.free, ledger.unlent_total)
        reason = self.quota_reasons.get(key)
        if reason is None:
            reason = self.quota_reasons[key] = explain(req, ledger, self.summary.pool)
        return Pending(req.id, reason.code, reason.message)

    def _reclaim(self, req: Request, ledger: fair_share.QuotaLedger) -> bool:
        """A request within its nominal quota that is not placed reclaims from borrowers:
        the first of each workspace in a pass (so one workspace's gang that cannot be
        helped does not keep another's quota from it). True if it asked for victims."""
        w = req.workspace_id
        shape = (w, req.slots, req.single_node)
        if w in self.reclaimed_for or shape in self.reclaim_tried:
            return False
        self.reclaim_tried.add(shape)  # a shape that found nothing finds nothing again
        # Victims already chosen this pass are someone else's room: not candidates, and
        # their slots are not counted as coming free for this one.
        chosen = set(self.preempt)
        running = [r for r in self.running if r.id not in chosen] if chosen else self.running
        outcome = _plan_reclaim(self.policy, self.cap, self.summary, req, running, ledger)
        if outcome is None:
            return False
        agents, victims, note = outcome
        self.reclaimed_for.add(w)
        self._leave(victims)
        self.preempt = tuple(sorted(chosen | set(victims)))
        self.notes[req.id] = note
        if self.head is None:
            self.head = req
        for r in agents:
            self.cap.reserve(r)
        self.waiting.append(req)
        self._after_waiting()
        return True

    def _leave(self, victims: Iterable[str]) -> None:
        if self.ledger is None:
            return
        wanted = set(victims)
        for run in self.running:
            if run.id in wanted:
                self.ledger.leave(run.workspace_id, _slots_of(run))

    def _after_waiting(self) -> None:
        if self._fair is not None and self.cap.open_slots <= 0:
            # Nothing more can be placed (the head holds what it waits for): the rest only
            # need their reasons, which do not depend on the order.
            self._fair.stop_ordering()

    def _place(self, req: Request) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
        s, cap = req.slots, self.cap
        if s < self.min_failed_single:
            r = cap.pick(s)
            if r >= 0:
                return ((cap.ids[r], cap.take(r, s)),)
            self.min_failed_single = s
        if not req.single_node and s > 1 and s not in self.failed_gangs:
            gang = cap.place_gang(s)
            if gang is not None:
                return gang
            self.failed_gangs.add(s)
        return None

    def _become_head(self, req: Request) -> None:
        self.head = req
        cap, summary = self.cap, self.summary
        reserve: list[int] | None = None
        if self.policy.preemption:
            chosen = set(self.preempt)
            running = [r for r in self.running if r.id not in chosen] if chosen else self.running
            outcome = _plan_preemption(self.policy, cap, summary, req, running, self.ledger)
            if outcome is not None:
                reserve, victims, self.notes[req.id] = outcome
                self._leave(victims)
                self.preempt = tuple(sorted(chosen | set(victims)))
        if reserve is None:
            reserve = cap.head_reservation(req.slots, summary)
        for r in reserve:
            cap.reserve(r)

    def plan(self) -> Plan:
        cap = self.cap
        explained = _explain_waiting(self.policy, cap, self.summary, self.waiting, self.head, "")
        head_id = self.head.id if self.head is not None else ""
        for item in explained:
            note = self.notes.get(item.request_id)
            if note and item.request_id != head_id:
                # It reclaims for itself: it does not wait behind the head.
                item = Pending(
                    item.request_id,
                    PendingCode.WAITING_FOR_SLOTS,
                    "waiting for its workspace's quota",
                )
            self.done.append(replace(item, message=item.message + note) if note else item)
        self.done.sort(key=_PENDING_ID)
        reserved = tuple(cap.ids[r] for r in range(len(cap.ids)) if cap.reserved[r])
        return Plan(tuple(self.assignments), tuple(self.done), self.preempt, reserved)


def feasibility(
    policy: PoolPolicy, agents: Sequence[AgentState], slots: int, single_node: bool
) -> Pending | None:
    """None if the request would fit the pool were every usable agent idle, else why not.

    For the submit-time warning; the returned Pending has request_id "".
    """
    return _feasibility(_summarize(policy, agents), slots, single_node)


# --- pool summary and feasibility ----------------------------------------------------------

_AGENT_ID = attrgetter("id")


def _queue_order(requests: Sequence[Request]) -> list[Request]:
    """Sorted by (priority, order, id).

    Stable passes on one plain key each, least significant first: about twice as fast as one
    pass on nested tuples, and linear when the caller already loaded the queue in this order.
    """
    queue = sorted(requests, key=attrgetter("id"))
    queue.sort(key=lambda r: r.order[1])
    queue.sort(key=lambda r: r.order[0])
    queue.sort(key=attrgetter("priority"))
    return queue


_PENDING_ID = attrgetter("request_id")
_UNKNOWN = Pending("", PendingCode.NEVER_FITS, "not checked yet")  # a sentinel, never returned


@dataclass(frozen=True)
class _Summary:
    """What never changes during a pass: the usable agents' sizes."""

    pool: str
    agents: int
    usable: int
    sizes: dict[int, int]  # usable agents by slot count, counts > 0 only
    sizes_desc: tuple[int, ...]  # nonzero sizes, largest first
    max_total: int
    zero_cap: int
    # The same pool as if every agent were usable; None when every agent already is.
    everyone: _Summary | None = None

    @property
    def qualifier(self) -> str:
        """ "usable " when some agents are not, so that a message names what it counted."""
        return "" if self.usable == self.agents else "usable "


def _summarize(
    policy: PoolPolicy, agents: Sequence[AgentState], *, all_usable: bool = False
) -> _Summary:
    sizes: dict[int, int] = {}
    usable = 0
    for a in agents:
        if a.usable or all_usable:
            usable += 1
            n = len(a.slot_ids)
            sizes[n] = sizes.get(n, 0) + 1
    everyone = None
    if usable < len(agents):
        everyone = _summarize(policy, agents, all_usable=True)
    return _Summary(
        pool=policy.name,
        agents=len(agents),
        usable=usable,
        sizes=sizes,
        sizes_desc=tuple(sorted((n for n in sizes if n > 0), reverse=True)),
        max_total=max(sizes, default=0),
        zero_cap=policy.max_zero_slot_per_agent,
        everyone=everyone,
    )


def _gang_size(slots: int, counts: dict[int, int], sizes_desc: tuple[int, ...]) -> int | None:
    """The agent size a gang of `slots` would use given `counts` agents per size, if any.

    Largest size first; only whole agents of one size, so the size must divide `slots`.
    """
    for n in sizes_desc:
        if slots % n == 0 and counts.get(n, 0) * n >= slots:
            return n
    return None


def _feasibility(summary: _Summary, slots: int, single_node: bool) -> Pending | None:
    """Why the request cannot fit the usable agents even when idle, if it cannot.

    "Never" is kept for what the pool's agents could not host at all; a request that only
    needs a disabled, draining or disconnected agent back waits for it instead.
    """
    problem = _feasibility_among(summary, slots, single_node)
    if (
        problem is not None
        and problem.code == PendingCode.NEVER_FITS
        and summary.everyone is not None
        and slots >= 0
        and _feasibility_among(summary.everyone, slots, single_node) is None
    ):
        return Pending(
            "",
            PendingCode.WAITING_FOR_USABLE_AGENTS,
            f"slots_per_trial={slots} fits pool {summary.pool} only with agents that are "
            f"disabled, draining or disconnected now ({summary.usable} of "
            f"{_plural(summary.agents, 'agent')} usable)",
        )
    return problem


def _feasibility_among(summary: _Summary, slots: int, single_node: bool) -> Pending | None:
    pool = summary.pool
    if slots < 0:
        return _never(f"slots_per_trial={slots} is negative")
    if summary.agents == 0:
        return Pending("", PendingCode.NO_AGENTS, f"pool {pool} has no agents")
    if summary.usable == 0:
        return Pending(
            "",
            PendingCode.NO_USABLE_AGENTS,
            f"pool {pool} has {_plural(summary.agents, 'agent')} but none is usable "
            "(disabled, draining or disconnected)",
        )
    if slots == 0:
        if summary.zero_cap > 0:
            return None
        return _never(
            f"zero-slot tasks can never be placed in pool {pool}: "
            f"max_zero_slot_per_agent is {summary.zero_cap}"
        )
    if slots <= summary.max_total:
        return None
    head = f"slots_per_trial={slots} can never be placed in pool {pool}: "
    usable = summary.qualifier
    have = " usable" if usable else ""
    if single_node:
        return _never(
            f"{head}is_single_node forbids spanning agents and the largest {usable}agent has "
            f"{_plural(summary.max_total, 'slot')}"
        )
    if _gang_size(slots, summary.sizes, summary.sizes_desc) is not None:
        return None
    if not summary.sizes_desc:
        return _never(f"{head}its {usable}agents have no slots")
    dividing = [n for n in summary.sizes_desc if slots % n == 0]
    if not dividing:
        if len(summary.sizes_desc) == 1:
            n = summary.sizes_desc[0]
            return _never(
                f"{head}its {usable}agents have {n} slots, "
                f"so a multi-agent trial needs a multiple of {n}"
            )
        return _never(
            f"{head}its {usable}agents have {_or(summary.sizes_desc)} slots, "
            "so a multi-agent trial needs a multiple of one of those sizes"
        )
    needs = " or ".join(
        f"{slots // n} whole {n}-slot agents (the pool has {summary.sizes[n]}{have})"
        for n in dividing
    )
    return _never(f"{head}it needs {needs}")


def _never(message: str) -> Pending:
    return Pending("", PendingCode.NEVER_FITS, message)


# --- working capacity ----------------------------------------------------------------------


class _Capacity:
    """Free capacity of one pool during one pass, indexed by agent rank (position by id).

    Free slots only shrink during a pass (placements and the head's reservation take them;
    releases arrive next pass). That is what keeps the lazy heaps valid: an entry whose agent
    has since moved to another bucket, or been reserved, never becomes valid again.
    """

    def __init__(self, policy: PoolPolicy, agents: Sequence[AgentState], summary: _Summary):
        self.agents = agents
        self.ids = [a.id for a in agents]
        self.rank = {a.id: r for r, a in enumerate(agents)}
        self.usable = [a.usable for a in agents]
        self.total = [len(a.slot_ids) for a in agents]
        self.free = [
            sorted(set(a.slot_ids) - a.used_slot_ids) if a.used_slot_ids else sorted(a.slot_ids)
            for a in agents
        ]
        self.nfree = [len(f) for f in self.free]
        self.used = [len(a.used_slot_ids) for a in agents]
        self.idle = [
            u and not used and n > 0
            for u, used, n in zip(self.usable, self.used, self.total, strict=True)
        ]
        self.reserved = [False] * len(agents)
        # Free slots of usable, unreserved agents: once 0, no slot request can be placed.
        self.open_slots = sum(f for f, u in zip(self.nfree, self.usable, strict=True) if u)
        self.sizes_desc = summary.sizes_desc
        # Best fit only: (slots, rank) of the last single-agent placement while it was the only
        # change since its pick. The buckets below that agent's old free count were empty then,
        # so if it still has room it is again the best fit for the same size: no scan needed.
        self.repeat = (0, -1) if policy.fitting == FittingPolicy.BEST else (-1, -1)

        # Buckets: one lazy min-heap of ranks per (free, total) key with free > 0, and an
        # exact count of the usable, unreserved agents in it.
        totals = sorted(summary.sizes_desc)
        keys = [(f, t) for t in totals for f in range(1, t + 1)]
        self.key_free = [f for f, _ in keys]
        self.key_of = {t: [-1] * (t + 1) for t in totals}  # total -> free -> key index
        for k, (f, t) in enumerate(keys):
            self.key_of[t][f] = k
        self.heaps: list[list[int]] = [[] for _ in keys]
        self.count = [0] * len(keys)
        self.idle_heaps: dict[int, list[int]] = {t: [] for t in totals}
        self.idle_count: dict[int, int] = dict.fromkeys(totals, 0)
        for r in range(len(agents)):  # ascending rank, so each list is already a heap
            if not self.usable[r] or self.nfree[r] == 0:
                continue
            t = self.total[r]
            k = self.key_of[t][self.nfree[r]]
            self.heaps[k].append(r)
            self.count[k] += 1
            if self.idle[r]:
                self.idle_heaps[t].append(r)
                self.idle_count[t] += 1

        # Score: the groups of equally scored keys, best group first, for each request size.
        if policy.fitting == FittingPolicy.WORST:
            score = {k: -Fraction(f, t) for k, (f, t) in enumerate(keys)}
        else:
            score = {k: Fraction(f) for k, (f, _) in enumerate(keys)}
        self.groups_for: list[list[list[int]]] = [[]]
        for s in range(1, summary.max_total + 1):
            grouped: dict[Fraction, list[int]] = {}
            for k in sorted((k for k, (f, _) in enumerate(keys) if f >= s), key=score.__getitem__):
                grouped.setdefault(score[k], []).append(k)
            self.groups_for.append(list(grouped.values()))

        # Zero-slot capacity: one exact heap; best fit packs the agent running the most.
        self.zero_cap = policy.max_zero_slot_per_agent
        self.zero_sign = -1 if policy.fitting == FittingPolicy.BEST else 1
        self.zero_used = [a.zero_slot_used for a in agents]
        self.zero_heap = [
            (self.zero_sign * self.zero_used[r], r)
            for r in range(len(agents))
            if self.usable[r] and self.zero_used[r] < self.zero_cap
        ]
        heapq.heapify(self.zero_heap)

    def pick(self, slots: int) -> int:
        """The unreserved usable agent a single-agent fit of `slots` goes to, or -1.

        The caller must `take` from the agent it returns before anything else changes.
        """
        nfree = self.nfree
        last_slots, last = self.repeat
        if last_slots == slots and last >= 0 and nfree[last] >= slots:
            return last
        heaps, count, key_free, reserved = self.heaps, self.count, self.key_free, self.reserved
        for group in self.groups_for[slots]:
            best = -1
            for k in group:
                if not count[k]:
                    continue
                h, f = heaps[k], key_free[k]
                while nfree[h[0]] != f or reserved[h[0]]:
                    heapq.heappop(h)
                if best < 0 or h[0] < best:
                    best = h[0]
            if best >= 0:
                if last_slots >= 0:
                    self.repeat = (slots, best)
                return best
        return -1

    def take(self, r: int, slots: int) -> tuple[int, ...]:
        """Give `slots` of agent r's lowest free slot indices to a placement."""
        if self.repeat != (slots, r) and self.repeat[0] >= 0:
            self.repeat = (0, -1)
        free = self.free[r]
        taken = tuple(free[:slots])
        del free[:slots]
        before = self.nfree[r]
        after = self.nfree[r] = before - slots
        self.open_slots -= slots
        keys = self.key_of[self.total[r]]
        count = self.count
        count[keys[before]] -= 1
        if after > 0:
            k = keys[after]
            count[k] += 1
            heapq.heappush(self.heaps[k], r)
        self.used[r] += slots
        if self.idle[r]:
            self.idle[r] = False
            self.idle_count[self.total[r]] -= 1
        return taken

    def place_gang(self, slots: int) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
        """Whole idle agents of one size, lowest ids first, or None if no size has enough."""
        n = _gang_size(slots, self.idle_count, self.sizes_desc)
        if n is None:
            return None
        h = self.idle_heaps[n]
        chosen: list[int] = []
        while len(chosen) < slots // n:
            r = heapq.heappop(h)
            if self.idle[r] and not self.reserved[r]:
                chosen.append(r)
        return tuple((self.ids[r], self.take(r, n)) for r in chosen)

    def place_zero(self) -> int:
        h = self.zero_heap
        if not h:
            return -1
        r = h[0][1]
        used = self.zero_used[r] + 1
        self.zero_used[r] = used
        if used >= self.zero_cap:
            heapq.heappop(h)
        else:
            heapq.heapreplace(h, (self.zero_sign * used, r))
        return r

    def reserve(self, r: int) -> None:
        if self.repeat[0] >= 0:
            self.repeat = (0, -1)
        if self.reserved[r]:
            return
        self.reserved[r] = True
        if self.nfree[r] > 0:
            self.count[self.key_of[self.total[r]][self.nfree[r]]] -= 1
            if self.usable[r]:
                self.open_slots -= self.nfree[r]
        if self.idle[r]:
            self.idle_count[self.total[r]] -= 1

    def head_reservation(self, slots: int, summary: _Summary) -> list[int]:
        """The agents a feasible head that does not fit now waits for.

        One agent when it fits one: the one with the most free slots among those big enough.
        Otherwise the agents of its gang size that are closest to idle.
        """
        usable = [r for r in range(len(self.ids)) if self.usable[r]]
        if slots <= summary.max_total:
            big = [r for r in usable if self.total[r] >= slots]
            return [min(big, key=lambda r: (-self.nfree[r], r))]
        n = _gang_size(slots, summary.sizes, summary.sizes_desc)
        assert n is not None  # the head is feasible
        same = sorted((self.used[r], r) for r in usable if self.total[r] == n)
        return [r for _, r in same[: slots // n]]


# --- preemption ----------------------------------------------------------------------------


class _Release:
    """Running work released in simulation, to see when a head would fit."""

    def __init__(self, policy: PoolPolicy, cap: _Capacity, summary: _Summary, head: Request):
        self.policy, self.cap, self.summary, self.head = policy, cap, summary, head
        self.sim_free: dict[int, int] = {}
        self.sim_used: dict[int, int] = {}
        self.idle_count = dict(cap.idle_count)  # no reservation exists yet for the head
        self.made_idle: set[int] = set()
        self.released: set[tuple[int, int]] = set()
        self.freed = 0  # usable slots released

    def release(self, run: Running) -> bool:
        """Free run's slots; True if the head now fits the agents."""
        cap, s = self.cap, self.head.slots
        fits = False
        for agent_id, slot_ids in run.slots:
            r = cap.rank.get(agent_id)
            if r is None or not cap.usable[r]:
                continue
            agent = cap.agents[r]
            for slot in slot_ids:
                if (r, slot) in self.released or slot not in agent.used_slot_ids:
                    continue
                self.released.add((r, slot))
                used = self.sim_used[r] = self.sim_used.get(r, cap.used[r]) - 1
                free = self.sim_free.get(r, cap.nfree[r])
                if slot in agent.slot_ids:
                    free = self.sim_free[r] = free + 1
                    self.freed += 1
                if cap.reserved[r]:
                    continue  # held for an earlier head of this pass: not this one's room
                fits = fits or (s <= self.summary.max_total and free >= s)
                if used == 0 and cap.total[r] > 0:
                    self.made_idle.add(r)
                    self.idle_count[cap.total[r]] += 1
        return fits or self.fits_gang()

    def fits_gang(self) -> bool:
        s = self.head.slots
        if self.head.single_node or s <= 1:
            return False
        return _gang_size(s, self.idle_count, self.cap.sizes_desc) is not None

    def fit_agents(self) -> list[int]:
        """The agents the head would use once the released work exits."""
        cap, s = self.cap, self.head.slots
        if s <= self.summary.max_total:
            roomy = [
                r
                for r in range(len(cap.ids))
                if cap.usable[r] and not cap.reserved[r] and self.free_of(r) >= s
            ]
            if roomy:
                if self.policy.fitting == FittingPolicy.WORST:
                    return [min(roomy, key=lambda r: (-Fraction(self.free_of(r), cap.total[r]), r))]
                return [min(roomy, key=lambda r: (self.free_of(r), r))]
        n = _gang_size(s, self.idle_count, cap.sizes_desc)
        assert n is not None
        idle = sorted(
            r
            for r in range(len(cap.ids))
            if cap.total[r] == n and not cap.reserved[r] and (cap.idle[r] or r in self.made_idle)
        )
        return idle[: s // n]

    def free_of(self, r: int) -> int:
        return self.sim_free.get(r, self.cap.nfree[r])

    def touching(self, runs: list[Running], agents: list[int]) -> list[Running]:
        ids = {self.cap.ids[r] for r in agents}
        return [run for run in runs if any(a in ids for a, _ in run.slots)]


def _plan_preemption(
    policy: PoolPolicy,
    cap: _Capacity,
    summary: _Summary,
    head: Request,
    running: Sequence[Running],
    ledger: fair_share.QuotaLedger | None = None,
) -> tuple[list[int], tuple[str, ...], str] | None:
    """Victims that let the head fit once they exit, the agents to hold for it, and a note.

    Releases already asked for count first. Then preemptible work of strictly lower priority
    is added, lowest priority and newest first, until the head would fit; only the victims on
    the agents it would use are kept. None when the head cannot fit even then. With quotas,
    work of another workspace is a candidate only if stopping it leaves that workspace at
    or above its nominal quota, and the head must be lent what it would take.
    """
    sim = _Release(policy, cap, summary, head)
    stopping = sorted((run for run in running if run.stopping), key=_RUNNING_ID)
    fits = False
    for run in stopping:
        fits = sim.release(run) or fits
    if fits:
        agents = sim.fit_agents()
        exiting = len(sim.touching(stopping, agents))
        return agents, (), f"; waiting for {_plural(exiting, 'stopping allocation')} to exit"
    candidates = sorted(
        (
            run
            for run in running
            if run.preemptible and not run.stopping and run.priority > head.priority
        ),
        key=_victim_order,
    )
    held = ledger.staying() if ledger is not None else {}
    kept = ledger.kept_for_others(head.workspace_id) if ledger is not None else 0
    chosen: list[Running] = []
    for run in candidates:
        w = run.workspace_id
        if ledger is not None and w != head.workspace_id:
            n = _slots_of(run)
            if held.get(w, 0) - n < ledger.nominal_of(w):
                continue  # it would take that workspace below its nominal quota
            held[w] -= n
        chosen.append(run)
        fits = sim.release(run) or fits
        # With quotas the head must also be lent what it takes (else it would be refused
        # next pass and the victims placed again, over and over).
        if fits and (ledger is None or ledger.free + sim.freed - head.slots >= kept):
            agents = sim.fit_agents()
            victims = sim.touching(chosen, agents)
            if (
                ledger is not None
                and ledger.free + sum(map(_slots_of, victims)) - head.slots < kept
            ):
                victims = chosen  # the others' slots are needed to leave what is not lent
            note = f"; asked {_plural(len(victims), 'lower-priority allocation')} to stop"
            return agents, tuple(sorted(v.id for v in victims)), note
    return None


def _plan_reclaim(
    policy: PoolPolicy,
    cap: _Capacity,
    summary: _Summary,
    head: Request,
    running: Sequence[Running],
    ledger: fair_share.QuotaLedger,
) -> tuple[list[int], tuple[str, ...], str] | None:
    """Borrowers' work to stop so that a head within its nominal quota fits, the agents to
    hold for it, and a note saying whose slots are reclaimed for whom.

    The head needs to fit the agents and to leave free the idle quota other workspaces do not
    lend. Stopping work counts first. Then borrowers' preemptible work, lowest priority and
    newest first, whatever its priority against the head's (a nominal quota is a guarantee),
    and only while its workspace still borrows: no workspace is taken below its nominal
    quota, and none is preempted so that another rises above its own, so two workspaces can
    never keep preempting each other. None when there is nothing to reclaim.
    """
    w, s = head.workspace_id, head.slots
    sim = _Release(policy, cap, summary, head)
    held = ledger.staying()
    kept = ledger.kept_for_others(w)  # borrowers' releases do not change others' idle quota

    def counts_ok() -> bool:
        return ledger.free + sim.freed - s >= kept

    stopping = sorted((run for run in running if run.stopping), key=_RUNNING_ID)
    fits = False
    for run in stopping:
        fits = sim.release(run) or fits
    if fits and counts_ok():
        agents = sim.fit_agents()
        exiting = len(sim.touching(stopping, agents)) or len(stopping)
        return agents, (), f"; waiting for {_plural(exiting, 'stopping allocation')} to exit"
    candidates = sorted(
        (
            run
            for run in running
            if run.preemptible
            and not run.stopping
            and run.workspace_id != w
            and ledger.borrowing(run.workspace_id) > 0
        ),
        key=_victim_order,
    )
    if s <= summary.max_total:
        one_agent = _reclaim_on_one_agent(policy, cap, summary, head, stopping, candidates, ledger)
        if one_agent is not None:
            return one_agent
    chosen: list[Running] = []
    for run in candidates:
        v = run.workspace_id
        n = _slots_of(run)
        if held.get(v, 0) - n < ledger.nominal_of(v):
            continue  # it would take that workspace below its nominal quota
        held[v] -= n
        chosen.append(run)
        fits = sim.release(run) or fits
        if fits and counts_ok():
            agents = sim.fit_agents()
            victims = sim.touching(chosen, agents)
            if ledger.free + sum(map(_slots_of, victims)) - s < kept:
                victims = chosen
            return agents, *_reclaimed(victims, ledger, w)
    return None


def _reclaim_on_one_agent(
    policy: PoolPolicy,
    cap: _Capacity,
    summary: _Summary,
    head: Request,
    stopping: list[Running],
    candidates: list[Running],
    ledger: fair_share.QuotaLedger,
) -> tuple[list[int], tuple[str, ...], str] | None:
    """For a head that fits one agent: the agent where the fewest borrowers' allocations
    (then the lowest-priority, newest ones) must stop for it, each taken in victim order
    and only while its workspace still borrows. None when no agent can be freed so."""
    w, s = head.workspace_id, head.slots
    kept = ledger.kept_for_others(w)
    on_agent: dict[str, list[Running]] = defaultdict(list)
    for run in candidates:
        for agent_id, _ in run.slots:
            on_agent[agent_id].append(run)
    best: (
        tuple[tuple[int, list[tuple[int, float, float, int, str]], int], list[Running], int] | None
    )
    best = None
    for r in range(len(cap.ids)):
        if not cap.usable[r] or cap.reserved[r] or cap.total[r] < s:
            continue
        sim = _Release(policy, cap, summary, head)
        for run in stopping:
            sim.release(run)
        held = ledger.staying()
        chosen: list[Running] = []
        for run in on_agent.get(cap.ids[r], ()):
            if sim.free_of(r) >= s and ledger.free + sim.freed - s >= kept:
                break
            v = run.workspace_id
            n = _slots_of(run)
            if held.get(v, 0) - n < ledger.nominal_of(v):
                continue  # it would take that workspace below its nominal quota
            held[v] -= n
            chosen.append(run)
            sim.release(run)
        if not chosen or sim.free_of(r) < s or ledger.free + sim.freed - s < kept:
            continue
        key = (len(chosen), [_victim_order(run) for run in chosen], r)
        if best is None or key < best[0]:
            best = (key, chosen, r)
    if best is None:
        return None
    _, victims, r = best
    return [r], *_reclaimed(victims, ledger, w)


def _reclaimed(
    victims: Sequence[Running], ledger: fair_share.QuotaLedger, w: int
) -> tuple[tuple[str, ...], str]:
    """The victims' ids, and the note the reclaiming request's reason ends with."""
    slots = sum(map(_slots_of, victims))
    lenders = sorted({ledger.name(run.workspace_id) for run in victims})
    ids = tuple(sorted(run.id for run in victims))
    note = (
        f"; reclaiming {_plural(slots, 'slot')} from {', '.join(lenders)} for "
        f"{ledger.name(w)} (allocation{'s' if len(ids) > 1 else ''} {', '.join(ids)} asked "
        "to checkpoint and stop)"
    )
    return ids, note


_RUNNING_ID = attrgetter("id")


def _slots_of(run: Running) -> int:
    return sum(len(slot_ids) for _, slot_ids in run.slots)


def _victim_order(run: Running) -> tuple[int, float, float, int, str]:
    """Lowest priority (largest number) first, then the most recently started, then the
    most recently submitted."""
    return (-run.priority, -run.started, -run.order[0], -run.order[1], run.id)


# --- explaining what waits -----------------------------------------------------------------


def _explain_waiting(
    policy: PoolPolicy,
    cap: _Capacity,
    summary: _Summary,
    waiting: list[Request],
    head: Request | None,
    head_note: str,
) -> list[Pending]:
    """Reasons for the feasible requests left unplaced, judged on the state the pass ends in.

    None of them fits the unreserved capacity now (it only shrank since each was tried), so
    one that fits once the reservation is counted waits only for the head.
    """
    if not waiting:
        return []
    usable = [r for r in range(len(cap.ids)) if cap.usable[r]]
    max_free = max((cap.nfree[r] for r in usable), default=0)
    idle: dict[int, int] = {}
    for r in usable:
        if cap.idle[r]:
            idle[cap.total[r]] = idle.get(cap.total[r], 0) + 1
    reasons: dict[tuple[int, bool, bool], tuple[PendingCode, str, int | None]] = {}
    head_priority = head.priority if head is not None else 0
    out: list[Pending] = []
    for req in waiting:
        # Only the priority relation to the head changes a message within one shape.
        key = (req.slots, req.single_node, req.priority > head_priority)
        reason = reasons.get(key)
        if reason is None:
            reason = reasons[key] = _reason(
                policy, summary, req, head, key[2], max_free, idle, len(usable)
            )
        if req is head:
            out.append(Pending(req.id, reason[0], reason[1] + head_note, reason[2]))
        else:
            out.append(Pending(req.id, *reason))
    return out


def _reason(
    policy: PoolPolicy,
    summary: _Summary,
    req: Request,
    head: Request | None,
    behind: bool,
    max_free: int,
    idle: dict[int, int],
    usable: int,
) -> tuple[PendingCode, str, int | None]:
    s = req.slots
    if s == 0:
        return (
            PendingCode.WAITING_FOR_ZERO_SLOT_CAPACITY,
            f"waiting for zero-slot capacity: {_plural_each(usable, 'usable agent')} is at "
            f"the pool's limit of {policy.max_zero_slot_per_agent} zero-slot tasks",
            None,
        )
    fits_with_reservation = s <= max_free or (
        not req.single_node and s > 1 and _gang_size(s, idle, summary.sizes_desc) is not None
    )
    if fits_with_reservation and head is not None:
        if behind:
            return (
                PendingCode.RESERVED_FOR_HEAD,
                f"behind higher-priority {head.job_name}",
                head.job_id,
            )
        return (
            PendingCode.RESERVED_FOR_HEAD,
            f"behind {head.job_name} at the head of the queue",
            head.job_id,
        )
    if s <= summary.max_total:
        return (
            PendingCode.WAITING_FOR_SLOTS,
            f"waiting for an agent with {_plural(s, 'free slot')}; "
            f"the most free on any usable agent is {max_free}",
            None,
        )
    n = _gang_size(s, summary.sizes, summary.sizes_desc)
    assert n is not None  # feasible, so some size has enough agents
    have = idle.get(n, 0)
    idle_now = "none is idle" if have == 0 else f"{have} {'is' if have == 1 else 'are'} idle"
    return (
        PendingCode.WAITING_FOR_IDLE_AGENTS,
        f"waiting for {_plural(s // n, f'idle {n}-slot agent')}, {idle_now}",
        None,
    )


def _scaled_note(ledger: fair_share.QuotaLedger, w: int) -> str:
    if not ledger.scaled or w not in ledger.quotas:
        return ""
    return (
        f" (scaled from {ledger.quota(w).nominal} while the pool's {ledger.capacity} usable "
        f"slots are fewer than the {ledger.total_nominal} its quotas promise)"
    )


def _borrowing_limit(req: Request, ledger: fair_share.QuotaLedger, pool: str) -> Pending:
    w = req.workspace_id
    name, held, nominal = ledger.name(w), ledger.held.get(w, 0), ledger.nominal_of(w)
    limit = ledger.quota(w).borrowing_limit
    quota = f"its {nominal}-slot quota{_scaled_note(ledger, w)}"
    if limit == 0:
        idle = f"{_plural(ledger.free, 'idle slot')} {'is' if ledger.free == 1 else 'are'}"
        message = (
            f"workspace {name} holds {held} of {quota} in pool {pool}; {idle} lent to no one "
            "because its borrowing limit is 0"
        )
    else:
        message = (
            f"workspace {name} holds {_plural(held, 'slot')} in pool {pool}, {quota} plus "
            f"{ledger.borrowing(w)} borrowed, and its borrowing limit is {limit}; this needs "
            f"{_plural(req.slots, 'slot')}"
        )
    return Pending(req.id, PendingCode.QUOTA_BORROWING_LIMIT, message)


def _owed(req: Request, ledger: fair_share.QuotaLedger, pool: str) -> Pending:
    """Within its nominal quota, but the free slots are others' idle quota and no borrower's
    work could be stopped for it."""
    w = req.workspace_id
    message = (
        f"workspace {ledger.name(w)} holds {ledger.held.get(w, 0)} of its "
        f"{ledger.nominal_of(w)}-slot quota{_scaled_note(ledger, w)} in pool {pool}, but "
        f"{ledger.kept_for_others(w)} of the {_plural(ledger.free, 'free slot')} are other "
        "workspaces' idle quota, which they do not lend, and no borrowed slot can be "
        "reclaimed for it"
    )
    return Pending(req.id, PendingCode.QUOTA_NOT_LENT, message)


def _not_lent(req: Request, ledger: fair_share.QuotaLedger, pool: str) -> Pending:
    w = req.workspace_id
    kept = ledger.kept_for_others(w)
    message = (
        f"pool {pool} has {_plural(ledger.free, 'free slot')}, but {kept} of them are other "
        f"workspaces' idle quota, which they do not lend (lending_limit); workspace "
        f"{ledger.name(w)} holds {ledger.held.get(w, 0)} of its {ledger.nominal_of(w)}-slot "
        f"quota{_scaled_note(ledger, w)} and this needs {_plural(req.slots, 'slot')} more"
    )
    return Pending(req.id, PendingCode.QUOTA_NOT_LENT, message)


def _at_max_slots(req: Request, held: int) -> str:
    return (
        f"{req.job_name} holds {_plural(held, 'slot')} of its resources.max_slots "
        f"{req.max_slots}; this one needs {req.slots} more, so it waits for one of them to end"
    )


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _plural_each(n: int, noun: str) -> str:
    return f"the only {noun}" if n == 1 else f"each of the {n} {noun}s"


def _or(sizes: Sequence[int]) -> str:
    words = [str(n) for n in sorted(sizes)]
    return ", ".join(words[:-1]) + " or " + words[-1]
