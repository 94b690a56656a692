"""The Alembic history itself: one head, and upgrade -> check -> downgrade on both databases."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from master.db.migrate import alembic_config, head_revision, run_alembic, upgrade_to_head
from master.db.session import create_engine
from master.settings import async_database_url


def test_exactly_one_head() -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1, f"migration history has several heads: {heads}"
    # A master's start compares the database with this reading of the files, not Alembic's.
    assert head_revision() == heads[0]


async def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()


async def _version(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        return str(await conn.scalar(text("SELECT version_num FROM alembic_version")))


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
        # A master's start: a database a revision behind is upgraded, not taken as at head.
        await run_alembic(engine, "downgrade", "-1")
        assert await _version(engine) != head_revision()
        await upgrade_to_head(engine)
        assert await _version(engine) == head_revision()
    finally:
        await engine.dispose()


async def test_every_access_trigger_exists_at_head(
    backend: str, database_url_factory: Callable[[str], str], tmp_path: pytest.TempPathFactory
) -> None:
    """The triggers that move the access generation (0031): a later migration that rebuilds
    one of their tables on SQLite (Alembic's batch mode) drops them without a word, and
    masters would then keep stale readers' workspaces."""
    url = async_database_url(database_url_factory(backend), tmp_path)  # type: ignore[arg-type]
    engine = create_engine(url)
    access_migration = ScriptDirectory.from_config(alembic_config()).get_revision("0031").module
    try:
        await run_alembic(engine, "upgrade", "head")
        async with engine.connect() as conn:
            if backend == "sqlite":
                listed = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
            else:
                listed = "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
            found = set((await conn.scalars(text(listed))).all())
        dialect = "postgresql" if backend == "postgres" else "sqlite"
        expected = access_migration.trigger_names(dialect)
        assert expected and expected <= found, expected - found
    finally:
        await engine.dispose()


async def test_reports_are_numbered_in_step_order_when_0016_upgrades(
    backend: str, database_url_factory: Callable[[str], str], tmp_path: Path
) -> None:
    """Existing reports get the ordinal and thinning level the report path would give."""
    from benchmarks.bench_compare_view import seed  # a small experiment, inserted in bulk
    from master.core.thinning import thinning_level

    url = database_url_factory(backend)
    await seed(url, trials=2, reports=40, naive=False)
    engine = create_engine(async_database_url(url, tmp_path))  # type: ignore[arg-type]
    try:
        await run_alembic(engine, "downgrade", "0015")
        await run_alembic(engine, "upgrade", "head")
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT trial_id, steps_completed, ordinal, thinning_level"
                        " FROM trial_metrics ORDER BY trial_id, steps_completed"
                    )
                )
            ).all()
    finally:
        await engine.dispose()
    assert len(rows) == 80
    by_trial: dict[int, list[tuple[int, int]]] = {}
    for trial_id, _steps, ordinal, level in rows:
        by_trial.setdefault(trial_id, []).append((ordinal, level))
    for numbered in by_trial.values():
        assert numbered == [(n, thinning_level(n)) for n in range(40)]


async def test_a_sqlite_downgrade_keeps_every_row_and_foreign_keys_stay_on(
    database_url_factory: Callable[[str], str], tmp_path: Path
) -> None:
    """Batch mode rebuilds `experiments` to drop a column; with foreign keys on, the drop
    cascaded into every trial and report (found when 0017's downgrade emptied
    trial_metrics). Migrations turn them off, and the pooled connection gets them back."""
    from benchmarks.bench_compare_view import seed

    url = database_url_factory("sqlite")
    await seed(url, trials=2, reports=5, naive=False)
    engine = create_engine(async_database_url(url, tmp_path))  # type: ignore[arg-type]

    async def counts() -> tuple[int, int, int]:
        async with engine.connect() as conn:
            # The pool hands back the connection the migration used.
            assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
            found = []
            for table in ("experiments", "trials", "trial_metrics"):
                found.append((await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar())
            return found[0], found[1], found[2]

    try:
        before = await counts()
        await run_alembic(engine, "downgrade", "0014")  # drops columns of experiments
        await run_alembic(engine, "upgrade", "head")
        after = await counts()
    finally:
        await engine.dispose()
    assert before[2] == 10
    assert after == before


async def test_projects_found_by_0018_get_keys_and_stay_unarchived(
    backend: str, database_url_factory: Callable[[str], str], tmp_path: Path
) -> None:
    """Projects made before 0018 (by hand here: nothing made them through the API) get a
    unique key from their name, an empty description, and are neither archived nor being
    deleted; the downgrade keeps them."""
    url = database_url_factory(backend)
    engine = create_engine(async_database_url(url, tmp_path))  # type: ignore[arg-type]
    try:
        await run_alembic(engine, "upgrade", "0017")
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO workspaces (id, name, immutable, created_at) VALUES"
                    " (1, 'Uncategorized', true, CURRENT_TIMESTAMP),"
                    " (2, 'team', false, CURRENT_TIMESTAMP)"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO projects (id, name, workspace_id, immutable, created_at) VALUES"
                    " (1, 'Uncategorized', 1, true, CURRENT_TIMESTAMP),"
                    " (2, 'uncategorized!', 2, false, CURRENT_TIMESTAMP),"
                    " (3, '---', 2, false, CURRENT_TIMESTAMP)"
                )
            )
        await run_alembic(engine, "upgrade", "head")
        async with engine.connect() as conn:
            projects = (
                await conn.execute(
                    text(
                        "SELECT id, key, description, archived, deleting FROM projects ORDER BY id"
                    )
                )
            ).all()
            workspaces = (
                await conn.execute(
                    text("SELECT id, archived, deleting FROM workspaces ORDER BY id")
                )
            ).all()
        await run_alembic(engine, "downgrade", "0017")
        async with engine.connect() as conn:
            kept = (await conn.execute(text("SELECT id, name FROM projects ORDER BY id"))).all()
    finally:
        await engine.dispose()
    assert [tuple(p) for p in projects] == [
        (1, "UNCAT", "", False, False),
        (2, "UNCAT2", "", False, False),
        (3, "PROJ", "", False, False),
    ]
    assert [tuple(w) for w in workspaces] == [(1, False, False), (2, False, False)]
    assert [tuple(p) for p in kept] == [(1, "Uncategorized"), (2, "uncategorized!"), (3, "---")]
