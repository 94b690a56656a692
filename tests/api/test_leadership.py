"""The leader's lease on PostgreSQL, with two Leadership objects standing for two masters:
one lease at a time, a takeover only once it has run out, and a deposed leader's commits
refused (the fence a frozen master meets when it wakes)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from master.db.migrate import upgrade_to_head
from master.db.models import UserModel
from master.db.session import create_engine, create_session_factory, session_scope
from master.services.leadership import Leadership, NotTheLeader, install_fence
from tests.conftest import PostgresServer

pytestmark = pytest.mark.postgres


async def test_one_leader_at_a_time_and_a_deposed_one_commits_nothing(
    postgres: PostgresServer,
) -> None:
    url = postgres.new_database().replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_engine(url)
    try:
        await upgrade_to_head(engine)
        masters = {}
        for name in ("a", "b"):
            factory = create_session_factory(engine)
            leadership = Leadership(factory, master_id=name, url=f"http://{name}", lease_s=1.0)
            install_fence(factory, leadership)
            masters[name] = (factory, leadership)
        (factory_a, a), (factory_b, b) = masters["a"], masters["b"]

        assert await a.try_acquire() and a.valid() and a.epoch == 1
        assert not await b.try_acquire()
        assert b.leader_url == "http://a"  # where the standby sends writes
        with pytest.raises(NotTheLeader, match="standby"):
            async with session_scope(factory_b) as session:
                session.add(UserModel(username="by-the-standby", password_hash="x"))
        async with session_scope(factory_a) as session:
            session.add(UserModel(username="by-the-leader", password_hash="x"))
        assert await a.renew()

        await asyncio.sleep(1.2)  # a is frozen past its lease
        assert not a.valid()
        assert await b.try_acquire() and b.epoch == 2
        assert not await a.renew()
        with pytest.raises(NotTheLeader, match="epoch 1"):
            async with session_scope(factory_a) as session:
                session.add(UserModel(username="by-the-deposed-leader", password_hash="x"))
        # Reads still work for everyone; only writes are fenced.
        async with session_scope(factory_a) as session:
            names = set(await session.scalars(select(UserModel.username)))
        assert "by-the-leader" in names
        assert not names & {"by-the-standby", "by-the-deposed-leader"}
    finally:
        await engine.dispose()
