"""The Alembic history itself: one head, and upgrade -> check -> downgrade on both databases."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from master.db.migrate import alembic_config, run_alembic
from master.db.session import create_engine
from master.settings import async_database_url


def test_exactly_one_head() -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1, f"migration history has several heads: {heads}"


async def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()


async def test_upgrade_check_downgrade(
    backend: str, database_url_factory: Callable[[str], str], tmp_path: pytest.TempPathFactory
) -> None:
    url = async_database_url(database_url_factory(backend), tmp_path)  # type: ignore[arg-type]
    engine = create_engine(url)
    try:
        await run_alembic(engine, "upgrade", "head")
        assert {"experiments", "trials", "templates", "users"} <= await _tables(url)
        # Fails when master/db/models.py and the migration history disagree.
        await run_alembic(engine, "check")
        await run_alembic(engine, "downgrade", "base")
        assert await _tables(url) <= {"alembic_version"}
        await run_alembic(engine, "upgrade", "head")
    finally:
        await engine.dispose()
