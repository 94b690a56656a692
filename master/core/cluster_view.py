"""The leader's picture of what the scheduling pass needs, kept in memory between passes:
the queue, the agents and their slots, and what each placed allocation holds.

Pure: no I/O. master.services.scheduler loads it from the database (at start, after a
takeover, and whenever it is not sure) and then keeps it exact by applying, in commit order,
the changes each committed transaction describes. Every transaction that changes what a pass
sees moves the scheduler epoch (master.services.allocations) by one, under the scheduler's
row lock, so commits are numbered without gaps: the view applies the change numbered
`epoch + 1` and nothing else. A change it is not told the details of (Unknown), a gap in the
numbers, or a pass that finds another epoch than the view's, makes it load afresh, so a view
can be out of date only until the next pass, never wrong in a pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from master.core import fair_share, placement
from master.core.fair_share import FairShare

# The job_id of a user's stored usage row (master.services.usage.USER_ROW).
USER_ROW = 0

# (pending code, message, blocking job): a pending allocation's stored reason.
Reason = tuple[str, str, int | None]


@dataclass(frozen=True)
class PendingEntry:
    """A PENDING allocation, as the pass asks the placement core about it."""

    id: str
    trial_id: int | None
    job_id: int
    slots: int
    single_node: bool
    pool: str
    priority: int
    order: tuple[float, int]
    reason: Reason
    label: str = ""
    max_slots: int | None = None  # the experiment's resources.max_slots
    # Whose it is (fair_share): an experiment's project (its workspace is looked up in the
    # view, since projects move) or a task's workspace, its owner, its resources.weight.
    project_id: int | None = None
    workspace_id: int = 0
    user_id: int = 0
    weight: float = 1.0

    def request(self, workspace_id: int | None = None) -> placement.Request:
        return placement.Request(
            id=self.id,
            job_id=self.job_id,
            slots=self.slots,
            priority=self.priority,
            order=self.order,
            single_node=self.single_node,
            label=self.label,
            max_slots=self.max_slots,
            workspace_id=self.workspace_id if workspace_id is None else workspace_id,
            user_id=self.user_id,
            weight=self.weight,
        )


@dataclass(frozen=True)
class AgentEntry:
    id: str
    pool: str
    slot_ids: tuple[int, ...]  # enabled slots
    enabled: bool = True
    draining: bool = False
    connected: bool = True


@dataclass(frozen=True)
class HeldEntry:
    """A placed allocation (ASSIGNED to TERMINATING) and what it holds."""

    running: placement.Running
    pool: str
    user_id: int = 0
    started_at: float = 0.0  # when it was placed (epoch seconds), for its usage so far

    @property
    def id(self) -> str:
        return self.running.id


# --- the changes a committed transaction describes ------------------------------------------


@dataclass(frozen=True)
class Enqueued:
    entries: tuple[PendingEntry, ...]


@dataclass(frozen=True)
class Cancelled:
    """Queued trials taken out of the queue (kill, pause): their pending allocations."""

    trial_ids: frozenset[int]


@dataclass(frozen=True)
class StopAsked:
    """Placed allocations asked to stop: their slots count as coming free for preemption."""

    allocation_ids: frozenset[str]


@dataclass(frozen=True)
class Released:
    allocation_id: str
    ended_at: float | None = None  # epoch seconds; its usage counts until accounted


@dataclass(frozen=True)
class Ended:
    """An ended allocation's usage not yet added to the stored usage (fair_share_usage)."""

    pool: str
    workspace_id: int
    user_id: int
    job_id: int
    slots: int
    started_at: float
    ended_at: float


@dataclass(frozen=True)
class StoredUsage:
    pool: str
    workspace_id: int
    user_id: int
    job_id: int
    slot_seconds: float
    as_of: float


@dataclass(frozen=True)
class Unknown:
    """A change the view is not told the details of: it must load afresh."""


Change = Enqueued | Cancelled | StopAsked | Released | Unknown


@dataclass
class ClusterView:
    # The epoch the view is exact at; None: load it before the next pass.
    epoch: int | None = None
    pending: dict[str, PendingEntry] = field(default_factory=dict)
    agents: dict[str, AgentEntry] = field(default_factory=dict)
    held: dict[str, HeldEntry] = field(default_factory=dict)
    # Quotas by pool and workspace id; a project's workspace; usage for the fair order.
    quotas: dict[str, dict[int, fair_share.Quota]] = field(default_factory=dict)
    project_workspace: dict[int, int] = field(default_factory=dict)
    stored_usage: list[StoredUsage] = field(default_factory=list)
    ended: list[Ended] = field(default_factory=list)
    # Usage sums by pool, built on a pass's first read and kept current by the changes.
    _books: dict[str, fair_share.UsageBook] = field(default_factory=dict)
    # The jobs whose stored usage rows were read, and the newest experiment at the load
    # (one created since has none).
    usage_jobs: set[int] = field(default_factory=set)
    newest_job_at_load: int = 0
    # Changes committed out of turn, kept until the ones before them arrive.
    _early: dict[int, tuple[Change, ...]] = field(default_factory=dict)

    # -- loading and trust ------------------------------------------------------------------

    def load(
        self,
        epoch: int,
        pending: Iterable[PendingEntry],
        agents: Iterable[AgentEntry],
        held: Iterable[HeldEntry],
        quotas: Mapping[str, Mapping[int, fair_share.Quota]] | None = None,
        project_workspace: Mapping[int, int] | None = None,
        stored_usage: Iterable[StoredUsage] = (),
        ended: Iterable[Ended] = (),
        usage_jobs: Iterable[int] = (),
        newest_job: int = 0,
    ) -> None:
        self.epoch = epoch
        self.pending = {p.id: p for p in pending}
        self.agents = {a.id: a for a in agents}
        self.held = {h.id: h for h in held}
        self.quotas = {pool: dict(q) for pool, q in (quotas or {}).items()}
        self.project_workspace = dict(project_workspace or {})
        self.stored_usage = list(stored_usage)
        self.ended = list(ended)
        self._books = {}
        self.usage_jobs = set(usage_jobs)
        self.newest_job_at_load = newest_job
        self._early = {k: v for k, v in self._early.items() if k > epoch}
        self._catch_up()

    def invalidate(self) -> None:
        self.epoch = None
        self._early.clear()

    def exact_at(self, epoch: int) -> bool:
        return self.epoch == epoch

    def committed(self, epoch: int, changes: Sequence[Change]) -> None:
        """A transaction committed the change numbered `epoch`, described by `changes`."""
        if self.epoch is None or epoch <= self.epoch:
            return  # to be loaded anyway, or already in what was loaded
        self._early[epoch] = tuple(changes)
        self._catch_up()

    def _catch_up(self) -> None:
        while self.epoch is not None and (self.epoch + 1) in self._early:
            changes = self._early.pop(self.epoch + 1)
            if any(isinstance(c, Unknown) for c in changes):
                self.invalidate()
                return
            for change in changes:
                self._apply(change)
            self.epoch += 1

    def _apply(self, change: Change) -> None:
        if isinstance(change, Enqueued):
            for entry in change.entries:
                self.pending[entry.id] = entry
        elif isinstance(change, Cancelled):
            for allocation_id in [
                p.id for p in self.pending.values() if p.trial_id in change.trial_ids
            ]:
                del self.pending[allocation_id]
        elif isinstance(change, StopAsked):
            for allocation_id in change.allocation_ids:
                held = self.held.get(allocation_id)
                if held is not None:
                    self.held[allocation_id] = replace(
                        held, running=replace(held.running, stopping=True)
                    )
        elif isinstance(change, Released):
            held = self.held.pop(change.allocation_id, None)
            self.pending.pop(change.allocation_id, None)
            if held is not None:
                self._ended(held, change.ended_at)

    # -- what a pass reads, and what it wrote ---------------------------------------------

    def agent_states(self) -> dict[str, list[placement.AgentState]]:
        """Agents by pool with the slots their allocations hold (as load_agent_states)."""
        used: dict[str, set[int]] = defaultdict(set)
        zero_used: dict[str, int] = defaultdict(int)
        for held in self.held.values():
            for agent_id, slot_ids in held.running.slots:
                used[agent_id].update(slot_ids)
            if held.running.zero_slot_agent is not None:
                zero_used[held.running.zero_slot_agent] += 1
        by_pool: dict[str, list[placement.AgentState]] = defaultdict(list)
        for agent in self.agents.values():
            by_pool[agent.pool].append(
                placement.AgentState(
                    id=agent.id,
                    slot_ids=agent.slot_ids,
                    used_slot_ids=frozenset(used.get(agent.id, ())),
                    enabled=agent.enabled,
                    draining=agent.draining,
                    connected=agent.connected,
                    zero_slot_used=zero_used.get(agent.id, 0),
                )
            )
        return by_pool

    def idle_agent_states(self, pool: str) -> list[placement.AgentState]:
        """A pool's agents pictured idle (enough for feasibility: load_agent_states
        without usage)."""
        return [
            placement.AgentState(
                id=a.id,
                slot_ids=a.slot_ids,
                enabled=a.enabled,
                draining=a.draining,
                connected=a.connected,
            )
            for a in self.agents.values()
            if a.pool == pool
        ]

    def held_slots(self, job_ids: Iterable[int]) -> dict[int, int]:
        """How many slots the placed allocations of each of these jobs hold."""
        return held_slots_of((held.running for held in self.held.values()), job_ids)

    def running_by_pool(self) -> dict[str, list[placement.Running]]:
        by_pool: dict[str, list[placement.Running]] = defaultdict(list)
        for held in self.held.values():
            by_pool[held.pool].append(held.running)
        return by_pool

    def workspace_of(self, entry: PendingEntry) -> int:
        if entry.project_id is None:
            return entry.workspace_id
        return self.project_workspace.get(entry.project_id, entry.workspace_id)

    def share_of(self, pool: str, now: float, decay: fair_share.Decay) -> FairShare:
        """The pool's usage by user and by job as of `now`: stored, ended since, running."""
        book = self._books.get(pool)
        if book is None or book.decay != decay or book.stale(now):
            book = self._books[pool] = self._book(pool, now, decay)
        return FairShare(start_charge_s=decay.start_charge_s, book=book, now=now)

    def _book(self, pool: str, origin: float, decay: fair_share.Decay) -> fair_share.UsageBook:
        book = fair_share.UsageBook(decay, origin)
        for row in self.stored_usage:
            if row.pool == pool:
                self._add_stored(book, row)
        for end in self.ended:
            if end.pool == pool:
                used = fair_share.allocation_usage(
                    end.slots,
                    end.ended_at - end.started_at,
                    decay.half_life_s,
                    decay.start_charge_s,
                )
                book.add_past((end.workspace_id, end.user_id), end.job_id, used, end.ended_at)
        for held in self.held.values():
            if held.pool == pool:
                run = held.running
                book.add_running(
                    (run.workspace_id, held.user_id), run.job_id, _slots(run), held.started_at
                )
        return book

    @staticmethod
    def _add_stored(book: fair_share.UsageBook, row: StoredUsage) -> None:
        # A user's row (job 0) holds the sum over their jobs; a job's row, that job's.
        if row.job_id == USER_ROW:
            book.add_past((row.workspace_id, row.user_id), None, row.slot_seconds, row.as_of)
        else:
            book.add_past(None, row.job_id, row.slot_seconds, row.as_of)

    def add_stored(self, rows: Iterable[StoredUsage], jobs: Iterable[int]) -> None:
        """Stored usage of `jobs` read after the load (jobs back in the queue)."""
        self.usage_jobs.update(jobs)
        for row in rows:
            self.stored_usage.append(row)
            book = self._books.get(row.pool)
            if book is not None:
                self._add_stored(book, row)

    def jobs_without_usage(self) -> set[int]:
        """Queued experiments that existed at the load and whose stored usage is not read."""
        return {
            p.job_id
            for p in self.pending.values()
            if 0 < p.job_id <= self.newest_job_at_load and p.job_id not in self.usage_jobs
        }

    def _ended(self, held: HeldEntry, ended_at: float | None) -> None:
        run = held.running
        book = self._books.get(held.pool)
        user = (run.workspace_id, held.user_id)
        if book is not None:
            book.remove_running(user, run.job_id, _slots(run), held.started_at)
        if ended_at is None:
            return
        end = Ended(
            held.pool,
            run.workspace_id,
            held.user_id,
            run.job_id,
            _slots(run),
            held.started_at,
            ended_at,
        )
        self.ended.append(end)
        if book is not None:
            d = book.decay
            used = fair_share.allocation_usage(
                end.slots, ended_at - end.started_at, d.half_life_s, d.start_charge_s
            )
            book.add_past(user, run.job_id, used, ended_at)

    def placed(
        self,
        assignments: Sequence[placement.Assignment],
        reasons: dict[str, Reason],
        preempted: Iterable[str],
        now: float = 0.0,
    ) -> None:
        """What a pass committed (at the view's epoch: a pass does not move it)."""
        for assignment in assignments:
            entry = self.pending.pop(assignment.request_id, None)
            if entry is None:
                continue
            zero_agent = assignment.slots[0][0] if entry.slots == 0 else None
            running = placement.Running(
                id=entry.id,
                job_id=entry.job_id,
                priority=entry.priority,
                order=entry.order,
                slots=tuple((a, tuple(sorted(ids))) for a, ids in sorted(assignment.slots) if ids),
                zero_slot_agent=zero_agent,
                preemptible=entry.trial_id is not None,
                workspace_id=self.workspace_of(entry),
                started=now,
            )
            self.held[entry.id] = HeldEntry(running, entry.pool, entry.user_id, now)
            book = self._books.get(entry.pool)
            if book is not None:
                book.add_running(
                    (running.workspace_id, entry.user_id), entry.job_id, _slots(running), now
                )
        for allocation_id, reason in reasons.items():
            entry = self.pending.get(allocation_id)
            if entry is not None and entry.reason != reason:
                self.pending[allocation_id] = replace(entry, reason=reason)
        self._apply(StopAsked(frozenset(preempted)))


def held_slots_of(running: Iterable[placement.Running], job_ids: Iterable[int]) -> dict[int, int]:
    """Slots held by job, for the jobs asked about (those with a resources.max_slots)."""
    wanted = set(job_ids)
    held: dict[int, int] = dict.fromkeys(wanted, 0)
    for run in running:
        if run.job_id in wanted:
            held[run.job_id] += sum(len(slot_ids) for _, slot_ids in run.slots)
    return held


def _slots(run: placement.Running) -> int:
    return sum(len(slot_ids) for _, slot_ids in run.slots)
