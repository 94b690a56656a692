"""Several masters on one PostgreSQL: a leader's lease with a fencing epoch.

One row (master_leases, name 'leader') says who leads, until when (the database's clock)
and with which epoch. A standby takes the row once it has expired, raising the epoch;
the leader renews it every third of the lease. Three rules keep a leader that froze
(SIGSTOP) or lost the database from doing harm once another has taken over:

- every transaction of a master that wrote anything checks, just before its commit and
  holding the row FOR SHARE, that the row still names it with its epoch; otherwise the
  commit is refused (a takeover's UPDATE waits for that share lock, or came first);
- the leader acknowledges agents' heartbeats only while its lease surely runs
  (`valid()`): counted from when its last renewal *started*, so an agent's fence lease
  never outlasts the leadership that granted it;
- a leader that finds its lease gone, or cannot renew it before it runs out, exits at
  once (as Kubernetes' controllers do); a supervisor starts it again, as a standby.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import ORMExecuteState, Session

from master.errors import Unavailable

log = logging.getLogger(__name__)

LEASE = "leader"
POLL_S = 0.5  # how often a standby looks for an expired lease
EXIT_LOST = 3  # the exit status of a leader that lost its lease
FENCE = "leadership"  # session.info key
_WROTE = "wrote"

_ACQUIRE = text(
    """
    INSERT INTO master_leases (name, holder, epoch, expires_at, url)
    VALUES (:name, :me, 1, now() + make_interval(secs => :lease), :url)
    ON CONFLICT (name) DO UPDATE
        SET holder = :me, epoch = master_leases.epoch + 1,
            expires_at = now() + make_interval(secs => :lease), url = :url
        WHERE master_leases.expires_at < now()
    RETURNING epoch
    """
)
_RENEW = text(
    """
    UPDATE master_leases SET expires_at = now() + make_interval(secs => :lease)
    WHERE name = :name AND holder = :me AND epoch = :epoch
    RETURNING epoch
    """
)
_STILL_OURS = text(
    "SELECT 1 FROM master_leases WHERE name = :name AND holder = :me AND epoch = :epoch FOR SHARE"
)
_LEADER_URL = text("SELECT url FROM master_leases WHERE name = :name AND expires_at > now()")


class NotTheLeader(Unavailable):
    """A write by a master that does not hold the lease (or no longer does): refused at
    its commit, nothing written, 503 to a caller."""


class Leadership:
    def __init__(
        self,
        factory: async_sessionmaker[AsyncSession],
        *,
        master_id: str,
        url: str,
        lease_s: float,
    ) -> None:
        self.factory = factory
        self.master_id = master_id
        self.url = url
        self.lease_s = lease_s
        self.epoch = 0  # 0: has never led
        self.leading = False
        self.leader_url: str | None = None  # the leader's API, as a standby last saw it
        self._valid_until = float("-inf")  # time.monotonic()

    def valid(self) -> bool:
        """Whether this master surely still holds the lease, on its own clock."""
        return self.leading and time.monotonic() < self._valid_until

    async def try_acquire(self) -> bool:
        started = time.monotonic()
        async with self.factory() as session, session.begin():
            session.info[FENCE] = None  # the lease's own transactions are not fenced
            epoch = await session.scalar(
                _ACQUIRE,
                {"name": LEASE, "me": self.master_id, "lease": self.lease_s, "url": self.url},
            )
            if epoch is None:
                self.leader_url = await session.scalar(_LEADER_URL, {"name": LEASE})
                return False
        self.epoch, self.leading, self._valid_until = int(epoch), True, started + self.lease_s
        self.leader_url = self.url
        log.warning("this master leads now (epoch %d)", self.epoch)
        return True

    async def renew(self) -> bool:
        started = time.monotonic()
        async with self.factory() as session, session.begin():
            session.info[FENCE] = None
            epoch = await session.scalar(
                _RENEW,
                {"name": LEASE, "me": self.master_id, "epoch": self.epoch, "lease": self.lease_s},
            )
        if epoch is None:
            return False
        self._valid_until = started + self.lease_s
        return True

    async def campaign(self, on_elected: Callable[[], Awaitable[None]]) -> None:
        """Stand by until the lease is free, lead (calling `on_elected` once), renew; exit
        the process the moment the lease is lost. Runs until cancelled."""
        while not self.leading:
            try:
                if await self.try_acquire():
                    break
            except Exception as exc:  # an outage: keep standing by
                log.debug("could not look at the lease: %s", exc)
            await asyncio.sleep(POLL_S)
        try:
            await on_elected()
        except Exception as exc:  # a leader that cannot start must not keep the lease
            log.exception("could not take up the leadership")
            self._lost(f"starting to lead failed: {exc}")
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                renewed = await asyncio.wait_for(self.renew(), timeout=self.lease_s / 3)
            except Exception as exc:
                renewed = None
                log.warning("could not renew the leader's lease: %s", exc)
            if renewed is False:
                self._lost("another master holds the lease now")
            if not self.valid():
                self._lost("the lease ran out before it could be renewed")

    def _lost(self, why: str) -> None:
        self.leading = False
        log.error("lost the leadership (%s): exiting, deciding nothing more", why)
        logging.shutdown()
        os._exit(EXIT_LOST)

    def check_commit(self, session: Session) -> None:
        """Before a commit that writes: is the lease still ours, with our epoch? (Runs
        before the commit's own flush, so objects still pending count as writes.)"""
        pending = session.new or session.dirty or session.deleted
        if not (session.info.get(_WROTE) or pending):
            return
        if not self.leading:
            raise NotTheLeader("this master is a standby; writes go to the leader")
        still = session.execute(
            _STILL_OURS, {"name": LEASE, "me": self.master_id, "epoch": self.epoch}
        ).first()
        if still is None:
            raise NotTheLeader(f"this master's leadership (epoch {self.epoch}) has ended")


def _mark_write(state: ORMExecuteState) -> None:
    if not state.is_select:
        state.session.info[_WROTE] = True


def _mark_flush(session: Session, _context: Any, _instances: Any) -> None:
    if session.new or session.dirty or session.deleted:
        session.info[_WROTE] = True


def _before_commit(session: Session) -> None:
    fence = session.info.get(FENCE)
    if isinstance(fence, Leadership):
        fence.check_commit(session)


def _after_end(session: Session, *_args: Any) -> None:
    session.info.pop(_WROTE, None)


def install_fence(factory: async_sessionmaker[AsyncSession], leadership: Leadership) -> None:
    """Every session of `factory` is fenced by `leadership` at its commits."""
    factory.kw.setdefault("info", {})[FENCE] = leadership


# Registered once for every Session: they act only on sessions that carry a fence.
event.listen(Session, "do_orm_execute", _mark_write)
event.listen(Session, "before_flush", _mark_flush)
event.listen(Session, "before_commit", _before_commit)
event.listen(Session, "after_commit", _after_end)
event.listen(Session, "after_rollback", _after_end)
