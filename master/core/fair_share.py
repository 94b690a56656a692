"""Fair sharing: workspaces' slot quotas in a pool, and the order of equal-priority work by
recent usage. Pure: no I/O, no clock (callers pass `now`), so golden values can be worked
out by hand in a test.

Quotas follow Kueue's ClusterQueue in a cohort, counted in slots per pool: a workspace is
guaranteed its nominal quota, may use idle slots of others up to its borrowing limit, and
lends at most its lending limit of the nominal it leaves idle. When the pool's usable
capacity is below the sum of nominal quotas (agents down), every nominal quota is scaled
down in proportion (largest remainders get the odd slots, ties to the lower workspace id),
so the guarantees still add up to what exists.

Usage follows Slurm's decayed usage: an allocation counts `start_charge_s` seconds of its
slots the moment it is placed, then one slot-second per slot per second while it runs, and
every slot-second halves in value each `half_life_s`. The start charge is what spreads one
pass's free slots over users and experiments: without it a pass would hand every free slot to
whoever used least, since nothing they were given has run yet.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

LN2 = math.log(2)


# --- usage ---------------------------------------------------------------------------------


def decayed(slot_seconds: float, age_s: float, half_life_s: float) -> float:
    """What `slot_seconds` recorded `age_s` ago count for now."""
    return slot_seconds * math.exp(-LN2 * max(age_s, 0.0) / half_life_s)


def allocation_usage(
    slots: int, elapsed_s: float, half_life_s: float, start_charge_s: float
) -> float:
    """Decayed slot-seconds of an allocation of `slots` placed `elapsed_s` ago (or that ran
    that long, seen at its end): the start charge decayed over the whole time, plus the
    integral of one slot-second per second decayed from each moment to now."""
    d = math.exp(-LN2 * max(elapsed_s, 0.0) / half_life_s)
    return slots * (start_charge_s * d + half_life_s / LN2 * (1.0 - d))


@dataclass(frozen=True)
class Decay:
    """The master's fair_share settings: how fast usage fades, what a start costs."""

    half_life_s: float = 7 * 24 * 3600.0
    start_charge_s: float = 60.0


class UsageBook:
    """Usage sums by user and by job, kept current as allocations start and end, and read
    at any moment in O(1) per key (a pass reads only the keys its queue names).

    Every amount is kept scaled to one reference moment (`origin`): a past amount `v` as of
    `at` is stored as v * 2^((at - origin) / h), and reading at `t` multiplies by
    2^(-(t - origin) / h). A running allocation of s slots placed at t0 contributes, at t,
    s * (E * d + h / ln 2 * (1 - d)) with d = 2^(-(t - t0) / h): linear in s and in
    s * 2^((t0 - origin) / h), so two sums per key suffice. Callers rebuild the book when
    `stale(t)` (the scale factors would grow too large).
    """

    REBASE_AFTER_HALF_LIVES = 30.0

    def __init__(self, decay: Decay, origin: float) -> None:
        self.decay = decay
        self.origin = origin
        self._past_user: dict[tuple[int, int], float] = {}
        self._past_job: dict[int, float] = {}
        # key -> [slots running, slots * 2^((start - origin) / h)]
        self._run_user: dict[tuple[int, int], list[float]] = {}
        self._run_job: dict[int, list[float]] = {}

    def _scale(self, at: float) -> float:
        # Bounded: a moment far from the origin only happens in a book that should have
        # been rebuilt (stale), and must not overflow meanwhile.
        return math.exp(min(LN2 * (at - self.origin) / self.decay.half_life_s, 700.0))

    def stale(self, t: float) -> bool:
        return abs(t - self.origin) > self.REBASE_AFTER_HALF_LIVES * self.decay.half_life_s

    def add_past(
        self, user: tuple[int, int] | None, job: int | None, slot_seconds: float, at: float
    ) -> None:
        """Usage that ended: `slot_seconds` as of `at` (then decaying), the user's and the
        job's (None: only the other's)."""
        scaled = slot_seconds * self._scale(at)
        if user is not None:
            self._past_user[user] = self._past_user.get(user, 0.0) + scaled
        if job is not None:
            self._past_job[job] = self._past_job.get(job, 0.0) + scaled

    def add_running(self, user: tuple[int, int], job: int, slots: int, started: float) -> None:
        self._running(user, job, slots, started, 1.0)

    def remove_running(self, user: tuple[int, int], job: int, slots: int, started: float) -> None:
        self._running(user, job, slots, started, -1.0)

    def _running(
        self, user: tuple[int, int], job: int, slots: int, started: float, sign: float
    ) -> None:
        scaled = slots * self._scale(started)
        for sums in (
            self._run_user.setdefault(user, [0.0, 0.0]),
            self._run_job.setdefault(job, [0.0, 0.0]),
        ):
            sums[0] += sign * slots
            sums[1] += sign * scaled

    def _read(self, past: float, running: list[float] | None, t: float) -> float:
        d = math.exp(-LN2 * (t - self.origin) / self.decay.half_life_s)
        value = past * d
        if running is not None:
            h_ln2 = self.decay.half_life_s / LN2
            value += running[0] * h_ln2 + (self.decay.start_charge_s - h_ln2) * running[1] * d
        return max(value, 0.0)

    def user(self, key: tuple[int, int], t: float) -> float:
        return self._read(self._past_user.get(key, 0.0), self._run_user.get(key), t)

    def job(self, job: int, t: float) -> float:
        return self._read(self._past_job.get(job, 0.0), self._run_job.get(job), t)


@dataclass(frozen=True)
class FairShare:
    """The pool's usage as of the pass (`now`), and how much a placement adds to it: read
    from a UsageBook, or given by key (tests; a key given wins over the book)."""

    # Decayed slot-seconds by (workspace id, user id) and by job id (ended and running).
    by_user: Mapping[tuple[int, int], float] = field(default_factory=dict)
    by_job: Mapping[int, float] = field(default_factory=dict)
    start_charge_s: float = 60.0
    book: UsageBook | None = None
    now: float = 0.0

    def user(self, key: tuple[int, int]) -> float:
        value = self.by_user.get(key)
        if value is not None:
            return value
        return self.book.user(key, self.now) if self.book is not None else 0.0

    def job(self, job: int) -> float:
        value = self.by_job.get(job)
        if value is not None:
            return value
        return self.book.job(job, self.now) if self.book is not None else 0.0


# --- quotas --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quota:
    """One workspace's quota in one pool; limits of None are unlimited (borrow any idle
    slot; lend all of its idle nominal)."""

    workspace: str  # its name, for the reasons people read
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


NO_QUOTA = Quota("", 0)  # a workspace without a quota: no guarantee, borrows freely


def scaled_nominals(quotas: Mapping[int, Quota], capacity: int) -> dict[int, int]:
    """Each workspace's nominal quota, scaled down in proportion when `capacity` is below
    their sum (largest remainder first, then the lower workspace id)."""
    total = sum(q.nominal for q in quotas.values())
    if total <= capacity:
        return {w: q.nominal for w, q in quotas.items()}
    capacity = max(capacity, 0)
    scaled = {w: q.nominal * capacity // total for w, q in quotas.items()}
    left = capacity - sum(scaled.values())
    by_remainder = sorted(quotas, key=lambda w: (-(quotas[w].nominal * capacity % total), w))
    for w in by_remainder[:left]:
        scaled[w] += 1
    return scaled


class QuotaLedger:
    """Slots held by workspace against their quotas during one pass of one pool.

    `free` counts the free slots of the pool's usable agents; a workspace's idle nominal that
    it does not lend (`unlent`) must stay free for it, whoever else asks.
    """

    def __init__(
        self,
        quotas: Mapping[int, Quota],
        capacity: int,
        free: int,
        held: Mapping[int, int],
    ) -> None:
        self.quotas = quotas
        self.capacity = capacity
        self.total_nominal = sum(q.nominal for q in quotas.values())
        self.nominal = scaled_nominals(quotas, capacity)
        self.free = free
        self.held: dict[int, int] = dict(held)
        # Kept by workspace for the hot path (a pass asks per request).
        self._lend = {w: self._lending_limit(w) for w in quotas}
        self._borrow = {w: q.borrowing_limit for w, q in quotas.items()}
        self._unlent = {w: self._unlent_of(w) for w in quotas}
        self.unlent_total = sum(self._unlent.values())
        self._leaving: dict[int, int] = {}

    @property
    def scaled(self) -> bool:
        return self.total_nominal > self.capacity

    def quota(self, w: int) -> Quota:
        return self.quotas.get(w, NO_QUOTA)

    def nominal_of(self, w: int) -> int:
        return self.nominal.get(w, 0)

    def _lending_limit(self, w: int) -> int:
        limit = self.quota(w).lending_limit
        n = self.nominal_of(w)
        return n if limit is None else min(limit, n)

    def _unlent_of(self, w: int) -> int:
        idle = self.nominal.get(w, 0) - self.held.get(w, 0)
        return max(0, idle - self._lend[w]) if idle > 0 else 0

    def within_nominal(self, w: int, slots: int) -> bool:
        return self.held.get(w, 0) + slots <= self.nominal.get(w, 0)

    def borrowing(self, w: int) -> int:
        return max(0, self.held.get(w, 0) - self.nominal_of(w))

    def over_borrowing_limit(self, w: int, slots: int) -> bool:
        limit = self._borrow.get(w)
        if limit is None:
            return False
        return self.held.get(w, 0) + slots - self.nominal.get(w, 0) > limit

    def kept_for_others(self, w: int) -> int:
        """Free slots that other workspaces' unlent idle nominal keeps from `w`."""
        return self.unlent_total - self._unlent.get(w, 0)

    def lendable(self, w: int, slots: int) -> bool:
        # kept_for_others, inline: asked for every request a pass places.
        return self.free - slots >= self.unlent_total - self._unlent.get(w, 0)

    def take(self, w: int, slots: int) -> None:
        self.held[w] = self.held.get(w, 0) + slots
        self.free -= slots
        before = self._unlent.get(w)
        if before:  # only an idle nominal that is not lent shrinks as the workspace uses it
            after = self._unlent_of(w)
            self.unlent_total += after - before
            self._unlent[w] = after

    def name(self, w: int) -> str:
        return self.quota(w).workspace or f"workspace {w}"

    def leave(self, w: int, slots: int) -> None:
        """Work of `w` holding `slots` was asked to stop in this pass."""
        self._leaving[w] = self._leaving.get(w, 0) + slots

    def staying(self) -> dict[int, int]:
        """Slots held by workspace once what this pass asked to stop has stopped (what a
        further victim must not take below a nominal quota)."""
        held = dict(self.held)
        for w, slots in self._leaving.items():
            held[w] = held.get(w, 0) - slots
        return held


# --- fair order ----------------------------------------------------------------------------


class Queued(Protocol):
    """What the fair order reads of a request (master.core.placement.Request)."""

    @property
    def id(self) -> str: ...
    @property
    def job_id(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def order(self) -> tuple[float, int]: ...
    @property
    def workspace_id(self) -> int: ...
    @property
    def user_id(self) -> int: ...
    @property
    def weight(self) -> float: ...


Request = TypeVar("Request", bound=Queued)


class FairOrder(Generic[Request]):
    """Requests in the order a pass considers them: priority first; at equal priority the
    user (in their workspace) with the least usage, then the job with the least usage per
    unit of `weight`, then the job's requests by submit order.

    Usage grows as the pass places work (`charge`), so the order is decided one request at
    a time: a heap of jobs, each keyed by its next request. Keys only ever grow, so a job
    whose key went stale is pushed back with the fresh one when it reaches the top.
    """

    def __init__(
        self,
        requests: Sequence[Request],
        share: FairShare,
        sort_within_job: Callable[[list[Request]], list[Request]],
        earlier: FairOrder[Request] | None = None,
    ) -> None:
        self.share = share
        # Usage read once per key, plus this pass's start charges (an earlier round's too).
        self.by_user: dict[tuple[int, int], float] = dict(earlier.by_user) if earlier else {}
        self.by_job: dict[int, float] = dict(earlier.by_job) if earlier else {}
        streams: dict[int, list[Request]] = {}
        for req in requests:
            streams.setdefault(req.job_id, []).append(req)
        self._streams = {job: sort_within_job(reqs) for job, reqs in streams.items()}
        self._next = dict.fromkeys(self._streams, 0)
        self._unordered = False
        self._heap = [self._key(job) for job in self._streams]
        heapq.heapify(self._heap)

    def _key(self, job: int) -> tuple[int, float, float, float, int, str, int]:
        req = self._streams[job][self._next[job]]
        user_key = (req.workspace_id, req.user_id)
        user = self.by_user.get(user_key)
        if user is None:
            user = self.by_user[user_key] = self.share.user(user_key)
        mine = self.by_job.get(job)
        if mine is None:
            mine = self.by_job[job] = self.share.job(job)
        # Request ids are unique, so the comparison never reaches the job.
        return (req.priority, user, mine / req.weight, req.order[0], req.order[1], req.id, job)

    def stop_ordering(self) -> None:
        """Yield the rest in any order from now on (cheaply): nothing more will be placed."""
        self._unordered = True

    def __iter__(self) -> Iterator[Request]:
        heap, streams, by_user, by_job = self._heap, self._streams, self.by_user, self.by_job
        while heap and not self._unordered:
            key = heap[0]
            job = key[-1]
            jobs_requests, at = streams[job], self._next[job]
            if at >= len(jobs_requests):  # taken out (take_rest)
                heapq.heappop(heap)
                continue
            req = jobs_requests[at]
            # A charge since the key was made (to its user or job) makes it stale.
            user = by_user[(req.workspace_id, req.user_id)]
            mine = by_job[job] / req.weight
            if user != key[1] or mine != key[2]:
                heapq.heapreplace(heap, (key[0], user, mine, *key[3:]))
                continue
            self._next[job] = at + 1
            if at + 1 < len(jobs_requests):
                heapq.heapreplace(heap, self._key(job))
            else:
                heapq.heappop(heap)
            yield req
        if self._unordered:
            for job, reqs in streams.items():
                at = self._next[job]
                self._next[job] = len(reqs)
                yield from reqs[at:]

    def charge(self, req: Request) -> None:
        """`req` was placed: its user and job count its start charge from now on."""
        cost = req.slots * self.share.start_charge_s
        if cost <= 0:
            return
        user = (req.workspace_id, req.user_id)
        # Both were read when the request's key was made.
        self.by_user[user] += cost
        self.by_job[req.job_id] += cost

    def take_rest(self, job: int) -> list[Request]:
        """The job's requests not yielded yet, taken out of the order."""
        reqs, at = self._streams[job], self._next[job]
        self._next[job] = len(reqs)
        return reqs[at:]
