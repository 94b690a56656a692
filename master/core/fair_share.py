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


@dataclass(frozen=True)
class FairShare:
    """The pool's usage as of the pass, and how much a placement adds to it."""

    # Decayed slot-seconds by (workspace id, user id) and by job id (ended and running).
    by_user: Mapping[tuple[int, int], float] = field(default_factory=dict)
    by_job: Mapping[int, float] = field(default_factory=dict)
    start_charge_s: float = 60.0


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
        self._unlent = {w: self._unlent_of(w) for w in quotas}
        self.unlent_total = sum(self._unlent.values())

    @property
    def scaled(self) -> bool:
        return self.total_nominal > self.capacity

    def quota(self, w: int) -> Quota:
        return self.quotas.get(w, NO_QUOTA)

    def nominal_of(self, w: int) -> int:
        return self.nominal.get(w, 0)

    def lending_limit(self, w: int) -> int:
        limit = self.quota(w).lending_limit
        n = self.nominal_of(w)
        return n if limit is None else min(limit, n)

    def _unlent_of(self, w: int) -> int:
        idle = max(0, self.nominal_of(w) - self.held.get(w, 0))
        return max(0, idle - self.lending_limit(w))

    def within_nominal(self, w: int, slots: int) -> bool:
        return self.held.get(w, 0) + slots <= self.nominal_of(w)

    def borrowing(self, w: int) -> int:
        return max(0, self.held.get(w, 0) - self.nominal_of(w))

    def over_borrowing_limit(self, w: int, slots: int) -> bool:
        limit = self.quota(w).borrowing_limit
        if limit is None:
            return False
        return self.held.get(w, 0) + slots - self.nominal_of(w) > limit

    def kept_for_others(self, w: int) -> int:
        """Free slots that other workspaces' unlent idle nominal keeps from `w`."""
        return self.unlent_total - self._unlent.get(w, 0)

    def lendable(self, w: int, slots: int) -> bool:
        return self.free - slots >= self.kept_for_others(w)

    def take(self, w: int, slots: int) -> None:
        self.held[w] = self.held.get(w, 0) + slots
        self.free -= slots
        if w in self._unlent:
            after = self._unlent_of(w)
            self.unlent_total += after - self._unlent[w]
            self._unlent[w] = after

    def name(self, w: int) -> str:
        return self.quota(w).workspace or f"workspace {w}"


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
    ) -> None:
        self.share = share
        self.by_user: dict[tuple[int, int], float] = dict(share.by_user)
        self.by_job: dict[int, float] = dict(share.by_job)
        streams: dict[int, list[Request]] = {}
        for req in requests:
            streams.setdefault(req.job_id, []).append(req)
        self._streams = {job: sort_within_job(reqs) for job, reqs in streams.items()}
        self._next = dict.fromkeys(self._streams, 0)
        # Bumped by each charge: a key computed at the current version is still fresh.
        self._version = 0
        self._heap = [self._key(job) for job in self._streams]
        heapq.heapify(self._heap)

    def _key(self, job: int) -> tuple[int, float, float, float, int, str, int, int]:
        req = self._streams[job][self._next[job]]
        user = self.by_user.get((req.workspace_id, req.user_id), 0.0)
        mine = self.by_job.get(job, 0.0) / req.weight
        # Request ids are unique, so the comparison never reaches the version or the job.
        return (req.priority, user, mine, req.order[0], req.order[1], req.id, self._version, job)

    def __iter__(self) -> Iterator[Request]:
        heap = self._heap
        while heap:
            key = heap[0]
            job = key[-1]
            if key[-2] != self._version:
                fresh = self._key(job)
                if fresh[:3] != key[:3]:
                    heapq.heapreplace(heap, fresh)
                    continue
            streams, at = self._streams[job], self._next[job]
            req = streams[at]
            self._next[job] = at + 1
            if at + 1 < len(streams):
                heapq.heapreplace(heap, self._key(job))
            else:
                heapq.heappop(heap)
            yield req

    def charge(self, req: Request) -> None:
        """`req` was placed: its user and job count its start charge from now on."""
        cost = req.slots * self.share.start_charge_s
        if cost <= 0:
            return
        self._version += 1
        user = (req.workspace_id, req.user_id)
        self.by_user[user] = self.by_user.get(user, 0.0) + cost
        self.by_job[req.job_id] = self.by_job.get(req.job_id, 0.0) + cost
