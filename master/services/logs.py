"""Trial and task logs: the lines agents ship for each rank, stored and read back in order.

A trial's task id is "<experiment id>.<request id>" (`allocations.task_id`), the same for
every allocation of the trial, so a trial's logs and its task's logs are the same lines.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy import Select, false, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.db.models import (
    AllocationModel,
    AllocationSlotModel,
    AllocationState,
    TaskLogModel,
    TaskModel,
    TrialModel,
    TrialState,
)
from master.db.session import session_scope
from master.errors import NotFound
from master.services import counters, webhooks
from master.services.allocations import task_id as trial_task_id

log = logging.getLogger(__name__)

# Wire names, lowest first: a "this level or above" filter is a suffix of this tuple.
LOG_LEVELS = (
    "LOG_LEVEL_TRACE",
    "LOG_LEVEL_DEBUG",
    "LOG_LEVEL_INFO",
    "LOG_LEVEL_WARNING",
    "LOG_LEVEL_ERROR",
    "LOG_LEVEL_CRITICAL",
)
# Determined's client sends UNSPECIFIED too for `--level UNSPECIFIED`; no stored line has it.
FILTER_LEVELS = ("LOG_LEVEL_UNSPECIFIED", *LOG_LEVELS)
STDTYPES = ("stdout", "stderr", "agent")
# Determined's `source`: what wrote the line. A rank's output comes from its "container".
SOURCE_OF_STDTYPE = {"stdout": "container", "stderr": "container", "agent": "agent"}

MAX_MESSAGE_BYTES = 64 * 1024
READ_BATCH = 1000
POLL_INTERVAL_S = 0.25
# Postgres advisory locks with two int4 keys: (this namespace, trial id). See append_logs.
_LOG_LOCK_NAMESPACE = 0x6C6F6773  # "logs"

_LEVEL_WORDS = {
    "TRACE": "LOG_LEVEL_TRACE",
    "DEBUG": "LOG_LEVEL_DEBUG",
    "INFO": "LOG_LEVEL_INFO",
    "WARN": "LOG_LEVEL_WARNING",
    "WARNING": "LOG_LEVEL_WARNING",
    "ERROR": "LOG_LEVEL_ERROR",
    "CRITICAL": "LOG_LEVEL_CRITICAL",
    "FATAL": "LOG_LEVEL_CRITICAL",
}
_LEVEL_RE = re.compile(
    r"\s*"
    # An optional timestamp first: "[2026-11-21 01:02:03,123] " or "2026-11-21T01:02:03Z ".
    r"(?:\[[^\]\n]*\]\s*|\d{4}-\d\d-\d\d[T ][0-9:.,]+(?:Z|[+-]\d\d:?\d\d)?\s+)?"
    r"\[?(TRACE|DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?"
    # A whole word: "ERROR:root:", "[WARNING] x", "INFO x"; never "INFORMATION" or "ERRORS".
    r"(?=[:\s\]]|$)"
)


@dataclass(frozen=True)
class LogLine:
    """One line as an agent ships it; `message` keeps its trailing newline."""

    allocation_id: str
    rank: int | None
    stdtype: str
    timestamp: datetime
    message: str


@dataclass(frozen=True)
class LogTarget:
    """Whose logs: a trial's, read by trial id, or its task's, read by task id."""

    trial_id: int | None  # None: a command's, notebook's, shell's or TensorBoard's
    task_id: str
    by_task: bool = False


@dataclass(frozen=True)
class LogFilter:
    """Empty tuples and None mean "any"."""

    rank_ids: tuple[int, ...] = ()
    agent_ids: tuple[str, ...] = ()
    allocation_ids: tuple[str, ...] = ()
    # Bare processes have no containers, so any container filter matches no line.
    container_ids: tuple[str, ...] = ()
    stdtypes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    levels: tuple[str, ...] = ()
    timestamp_before: datetime | None = None
    timestamp_after: datetime | None = None
    search_text: str | None = None


def parse_level(message: str) -> str:
    """The LOG_LEVEL_* a line announces with a leading level word, else LOG_LEVEL_INFO."""
    match = _LEVEL_RE.match(message)
    return _LEVEL_WORDS[match.group(1)] if match else "LOG_LEVEL_INFO"


def levels_at_or_above(level: str) -> tuple[str, ...]:
    return LOG_LEVELS[LOG_LEVELS.index(level) :]


def clip_message(message: str) -> str:
    # "replace" also turns lone surrogates into "?", and NUL is the one character Postgres
    # text cannot hold: either would otherwise fail the whole batch.
    data = message.replace("\x00", "\ufffd").encode("utf-8", "replace")
    if len(data) <= MAX_MESSAGE_BYTES:
        return data.decode("utf-8")
    end = "\n" if message.endswith("\n") else ""
    clipped = data[: MAX_MESSAGE_BYTES - 64].decode("utf-8", "ignore")
    return f"{clipped}... [clipped: {len(data)} bytes]{end}"


class _Owner(NamedTuple):
    """Whose lines an allocation's are: a trial's (by trial id), or a task's."""

    trial_id: int | None
    task_id: str
    # Postgres serialises each owner's inserts under this advisory lock key.
    lock_key: int


async def _owners(session: AsyncSession, allocation_ids: list[str]) -> dict[str, _Owner]:
    rows = (
        await session.execute(
            select(AllocationModel.id, TrialModel, TaskModel.id, TaskModel.uuid)
            .outerjoin(TrialModel, TrialModel.id == AllocationModel.trial_id)
            .outerjoin(TaskModel, TaskModel.id == AllocationModel.task_id)
            .where(AllocationModel.id.in_(allocation_ids))
        )
    ).all()
    owners = {}
    for allocation_id, trial, task_row_id, task_uuid in rows:
        if trial is not None:
            owners[allocation_id] = _Owner(trial.id, trial_task_id(trial), trial.id)
        elif task_uuid is not None:
            # Negative keys: never a trial's.
            owners[allocation_id] = _Owner(None, task_uuid, -task_row_id)
    return owners


async def _placed_on(session: AsyncSession, agent_id: str, owners: dict[str, _Owner]) -> set[str]:
    """Of these allocations, those placed on the agent: held on its slots (or its zero-slot
    task) now, or ended with lines of this agent already stored (slot rows go at release,
    and an agent's last lines may follow its exit report after a reconnect)."""
    ids = sorted(owners)
    held = set(
        (
            await session.scalars(
                select(AllocationSlotModel.allocation_id).where(
                    AllocationSlotModel.agent_id == agent_id,
                    AllocationSlotModel.allocation_id.in_(ids),
                )
            )
        ).all()
    )
    held |= set(
        (
            await session.scalars(
                select(AllocationModel.id).where(
                    AllocationModel.id.in_(ids), AllocationModel.zero_slot_agent_id == agent_id
                )
            )
        ).all()
    )
    rest = [i for i in ids if i not in held]
    if rest:
        trial_ids = sorted({t for i in rest if (t := owners[i].trial_id) is not None})
        task_ids = sorted({owners[i].task_id for i in rest if owners[i].trial_id is None})
        held |= set(
            (
                await session.scalars(
                    select(TaskLogModel.allocation_id)
                    .where(
                        TaskLogModel.trial_id.in_(trial_ids) | TaskLogModel.task_id.in_(task_ids),
                        TaskLogModel.allocation_id.in_(rest),
                        TaskLogModel.agent_id == agent_id,
                    )
                    .distinct()
                )
            ).all()
        )
    return held


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


async def append_logs(
    session: AsyncSession, agent_id: str, lines: Sequence[LogLine], *, placed_only: bool = False
) -> int:
    """Store a batch an agent sent; returns how many lines were kept.

    Lines of allocations this master does not know are dropped with a warning, never the
    whole batch; with `placed_only` (an agent's batch), so are lines of allocations that
    were never placed on `agent_id`: a node writes only into its own trials' logs. The
    caller commits, and soon: on Postgres this holds a lock per trial until then, so call
    it first in its transaction (or alone) to avoid lock-order waits.
    """
    if not lines:
        return 0
    allocation_ids = sorted({line.allocation_id for line in lines})
    owners = await _owners(session, allocation_ids)
    if placed_only and owners:
        placed = await _placed_on(session, agent_id, owners)
        foreign = sorted(owners.keys() - placed)
        if foreign:
            counted = sum(1 for line in lines if line.allocation_id in foreign)
            counters.foreign_agent_messages["logs"] += counted
            log.warning(
                "dropped %d log lines from agent %s for allocations not placed on it: %s",
                counted,
                agent_id,
                ", ".join(foreign[:5]),
            )
            owners = {k: v for k, v in owners.items() if k in placed}
            lines = [line for line in lines if line.allocation_id in placed]
    rows = []
    dropped = 0
    for line in lines:
        owner = owners.get(line.allocation_id)
        if owner is None:
            dropped += 1
            continue
        rows.append(
            {
                "task_id": owner.task_id,
                "trial_id": owner.trial_id,
                "allocation_id": line.allocation_id,
                "agent_id": agent_id,
                "rank": line.rank,
                "stdtype": line.stdtype if line.stdtype in STDTYPES else "stdout",
                "level": parse_level(line.message),
                "timestamp": _utc(line.timestamp),
                "message": clip_message(line.message),
            }
        )
    if dropped:
        unknown = sorted({line.allocation_id for line in lines} - owners.keys())
        log.warning(
            "dropped %d log lines from agent %s: unknown allocations %s",
            dropped,
            agent_id,
            ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else ""),
        )
    if not rows:
        return 0
    if session.get_bind().dialect.name == "postgresql":
        # Sequence ids are drawn at insert but become visible at commit, so two batches
        # of one trial could commit out of id order and a follower reading "id > last
        # seen" would skip the earlier one. Serialising each trial's inserts keeps its id
        # order and commit order the same. SQLite serialises all writers already.
        for key in sorted({owner.lock_key for owner in owners.values()}):
            await session.execute(
                text("SELECT pg_advisory_xact_lock(:namespace, :key)"),
                {"namespace": _LOG_LOCK_NAMESPACE, "key": key},
            )
    await session.execute(insert(TaskLogModel), rows)
    await webhooks.record_log_matches(session, rows)
    return len(rows)


async def get_trial_target(session: AsyncSession, trial_id: int) -> LogTarget:
    trial = await session.get(TrialModel, trial_id)
    if trial is None:
        raise NotFound(f"trial {trial_id} not found")
    return LogTarget(trial_id=trial.id, task_id=trial_task_id(trial))


async def get_task_target(session: AsyncSession, task_id: str) -> LogTarget:
    experiment_id, dot, request_id = task_id.partition(".")
    trial = None
    if dot and experiment_id.isascii() and experiment_id.isdigit() and len(experiment_id) <= 10:
        trial = await session.scalar(
            select(TrialModel).where(
                TrialModel.experiment_id == int(experiment_id),
                TrialModel.request_id == request_id,
            )
        )
    if trial is not None:
        return LogTarget(trial_id=trial.id, task_id=task_id, by_task=True)
    if await session.scalar(select(TaskModel.id).where(TaskModel.uuid == task_id)) is None:
        raise NotFound(f"task {task_id} not found")
    return LogTarget(trial_id=None, task_id=task_id, by_task=True)


def _logs_query(target: LogTarget, where: LogFilter) -> Select[TaskLogModel]:
    query = select(TaskLogModel)
    if target.by_task:
        query = query.where(TaskLogModel.task_id == target.task_id)
    else:
        query = query.where(TaskLogModel.trial_id == target.trial_id)
    if where.container_ids:
        return query.where(false())
    if where.rank_ids:
        query = query.where(TaskLogModel.rank.in_(where.rank_ids))
    if where.agent_ids:
        query = query.where(TaskLogModel.agent_id.in_(where.agent_ids))
    if where.allocation_ids:
        query = query.where(TaskLogModel.allocation_id.in_(where.allocation_ids))
    stdtypes = set(where.stdtypes) if where.stdtypes else set(STDTYPES)
    if where.sources:
        stdtypes &= {s for s, source in SOURCE_OF_STDTYPE.items() if source in where.sources}
    if where.stdtypes or where.sources:
        query = query.where(TaskLogModel.stdtype.in_(sorted(stdtypes)))
    if where.levels:
        query = query.where(TaskLogModel.level.in_(where.levels))
    if where.timestamp_before is not None:
        query = query.where(TaskLogModel.timestamp < where.timestamp_before)
    if where.timestamp_after is not None:
        query = query.where(TaskLogModel.timestamp > where.timestamp_after)
    if where.search_text:
        query = query.where(TaskLogModel.message.contains(where.search_text, autoescape=True))
    return query


async def read_logs(
    session: AsyncSession,
    target: LogTarget,
    where: LogFilter,
    *,
    descending: bool = False,
    after_id: int | None = None,
    before_id: int | None = None,
    limit: int = 0,
) -> list[TaskLogModel]:
    """Lines ordered by id (arrival order); `after_id`/`before_id` page through them."""
    query = _logs_query(target, where)
    if after_id is not None:
        query = query.where(TaskLogModel.id > after_id)
    if before_id is not None:
        query = query.where(TaskLogModel.id < before_id)
    query = query.order_by(TaskLogModel.id.desc() if descending else TaskLogModel.id)
    if limit > 0:
        query = query.limit(limit)
    return list((await session.scalars(query)).all())


async def is_finished(session: AsyncSession, target: LogTarget) -> bool:
    """True once the trial is terminal (or the task ended, or either is gone): no new
    lines can come."""
    if target.trial_id is None:
        allocation_state = await session.scalar(
            select(AllocationModel.state)
            .join(TaskModel, TaskModel.id == AllocationModel.task_id)
            .where(TaskModel.uuid == target.task_id)
        )
        return allocation_state in (None, AllocationState.TERMINATED)
    state = await session.scalar(select(TrialModel.state).where(TrialModel.id == target.trial_id))
    return state is None or TrialState(state).is_terminal


async def stream_logs(
    factory: async_sessionmaker[AsyncSession],
    target: LogTarget,
    where: LogFilter,
    *,
    descending: bool = False,
    limit: int = 0,
    follow: bool = False,
    poll_interval: float = POLL_INTERVAL_S,
    batch_size: int = READ_BATCH,
) -> AsyncIterator[list[TaskLogModel]]:
    """Every matching line, in batches, each batch read in a short session of its own.

    With `follow` (ascending only), it then polls for new lines and ends once the trial is
    terminal and a read made after seeing that found nothing more.
    """
    if follow and descending:
        raise ValueError("following reads in ascending order only")
    sent = 0
    last_id: int | None = None
    finished = False
    while True:
        size = batch_size if limit <= 0 else min(batch_size, limit - sent)
        async with session_scope(factory) as session:
            if follow and not finished:
                # Read before the lines: a line stored before the trial ended shows up below.
                finished = await is_finished(session, target)
            rows = await read_logs(
                session,
                target,
                where,
                descending=descending,
                after_id=None if descending else last_id,
                before_id=last_id if descending else None,
                limit=size,
            )
        if rows:
            yield rows
            sent += len(rows)
            last_id = rows[-1].id
        if limit > 0 and sent >= limit:
            return
        if len(rows) == size:
            continue  # more may be waiting right now
        if not follow or finished:
            return
        await asyncio.sleep(poll_interval)
