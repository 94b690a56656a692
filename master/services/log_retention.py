"""Task log retention: how many days a trial's logs outlive the trial, and the leader's
pass that deletes them once that is over.

The days come from the experiment's config (`retention_policy.log_retention_days`, which
`det experiment set log-retention` changes), else from the master's
`retention_policy.log_retention_days`; -1, or nothing set anywhere, keeps logs forever.
Counted from the trial's end, so running trials keep all of theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, select, true
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.db.models import ExperimentModel, TaskLogModel, TrialModel, utcnow
from master.db.session import session_scope
from master.errors import InvalidArgument
from master.services import experiments
from master.services.loops import Loop

log = logging.getLogger(__name__)

FOREVER = -1
MAX_DAYS = 32767  # Determined's bound (a SMALLINT there)


def checked_days(days: int, field: str = "numDays") -> int:
    if days < FOREVER or days > MAX_DAYS:
        raise InvalidArgument(
            f"{field}: {days} is not a number of days from -1 (forever) to {MAX_DAYS}"
        )
    return days


async def set_experiment_retention(
    session: AsyncSession, experiment_id: int, days: int, actor: str
) -> None:
    """Determined's PutExperimentRetainLogs: the experiment's trials keep their logs `days`
    after they end (-1: forever). Trials already past it lose theirs at the next pass."""
    checked_days(days)
    experiment = await experiments.experiment_for_update(session, experiment_id)
    policy = experiment.config.get("retention_policy") or {}
    if policy.get("log_retention_days") == days:
        return
    experiment.config = {
        **experiment.config,
        "retention_policy": {**policy, "log_retention_days": days},
    }
    await session.flush()
    log.info("experiment %d: log_retention_days=%d set by %s", experiment_id, days, actor)


async def expired_trials(
    session: AsyncSession,
    default_days: int | None,
    now: datetime | None = None,
    among: Sequence[int] | None = None,
) -> list[int]:
    """The ended trials that still have logs and whose retention is over (`among`: of
    these trials only)."""
    now = now or utcnow()
    days_column = ExperimentModel.config["retention_policy"]["log_retention_days"].as_integer()
    # Only trials that still have logs: those already cleared cost nothing on later passes.
    candidates = (
        await session.execute(
            select(TrialModel.id, TrialModel.end_time, days_column)
            .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
            .where(
                TrialModel.end_time.is_not(None),
                exists().where(TaskLogModel.trial_id == TrialModel.id),
                TrialModel.id.in_(among) if among is not None else true(),
            )
        )
    ).all()
    expired = []
    for trial_id, end_time, experiment_days in candidates:
        days = experiment_days if experiment_days is not None else default_days
        if days is None or days < 0 or end_time is None:
            continue
        if end_time + timedelta(days=days) <= now:
            expired.append(trial_id)
    return expired


async def delete_expired_logs(
    factory: async_sessionmaker[AsyncSession],
    default_days: int | None,
    now: datetime | None = None,
    trials_per_transaction: int = 20,
) -> int:
    """Delete the logs of every ended trial whose retention is over, a few trials per
    transaction: the first pass after retention is turned on may delete millions of lines,
    and one transaction would hold SQLite's single writer (and every request that writes)
    for all of it. Returns how many trials lost their logs."""
    async with session_scope(factory) as session:
        expired = await expired_trials(session, default_days, now)
    deleted = 0
    for start in range(0, len(expired), trials_per_transaction):
        async with session_scope(factory) as session:
            # Asked again in the deleting transaction: a trial continued meanwhile (running
            # again) or an experiment whose retention was lengthened keeps its logs.
            chunk = await expired_trials(
                session, default_days, now, expired[start : start + trials_per_transaction]
            )
            await session.execute(delete(TaskLogModel).where(TaskLogModel.trial_id.in_(chunk)))
            deleted += len(chunk)
    if deleted:
        log.info("log retention: deleted the task logs of %d trials", deleted)
    return deleted


class LogRetentionLoop(Loop):
    """The leader's periodic pass (Determined's log retention schedule)."""

    name = "log-retention"

    def __init__(
        self, factory: async_sessionmaker[AsyncSession], default_days: int | None, interval: float
    ) -> None:
        super().__init__(interval)
        self.factory = factory
        self.default_days = default_days
        self.wake()  # a first pass soon after taking the lead, not a whole interval later

    async def run_once(self) -> None:
        await delete_expired_logs(self.factory, self.default_days)
