"""Runs the Alembic history in migrations/ against the master's database."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

# Any fixed 64-bit number; all resolute masters sharing a Postgres database use it.
MIGRATION_LOCK_ID = 0x7265736F6C757465


def migrations_dir() -> Path:
    """The migrations folder: beside the packages in a checkout, inside `master` in a wheel."""
    here = Path(__file__).resolve().parent.parent  # master/
    for candidate in (here.parent / "migrations", here / "_migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError("cannot find the migrations folder; is the installation complete?")


def alembic_config(connection: object | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # Version files named YYYY_MM_DD_HHMM_<rev>_<slug>.py.
    cfg.set_main_option(
        "file_template",
        "%%(year)d_%%(month).2d_%%(day).2d_%%(hour).2d%%(minute).2d_%%(rev)s_%%(slug)s",
    )
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@asynccontextmanager
async def _migration_connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection to migrate on. On SQLite, foreign keys are off while it migrates: batch
    mode rebuilds a table by copy, drop and rename, and with them on the drop cascades into
    every row that references the table (a downgrade of a column of `experiments` deleted
    every trial). SQLite's ALTER TABLE guide does the same. The pragma only takes effect
    outside a transaction, so it is set and restored around commits, and restored before
    the connection goes back to the pool."""
    async with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            await conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            await conn.commit()
        try:
            yield conn
        finally:
            if sqlite:
                await conn.rollback()  # nothing: every path commits before this
                await conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                await conn.commit()


_REVISION = re.compile(r"^revision(?:: [^=]+)? = [\"']([^\"']+)[\"']", re.M)
_DOWN_REVISION = re.compile(r"^down_revision(?:: [^=]+)? = [\"']([^\"']+)[\"']", re.M)


def head_revision() -> str | None:
    """The newest revision, read from the version files' text: the one no other file names
    as its down_revision (tests/test_migrations.py checks it against Alembic's own head).
    None when the files do not say it plainly."""
    revisions, parents = set(), set()
    for path in (migrations_dir() / "versions").glob("*.py"):
        source = path.read_text()
        revision = _REVISION.search(source)
        if revision is None:
            return None
        revisions.add(revision.group(1))
        parents.update(_DOWN_REVISION.findall(source))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


async def _at_head(engine: AsyncEngine) -> bool:
    head = head_revision()
    if head is None:
        return False
    try:
        async with engine.connect() as conn:
            versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
    except DBAPIError:  # no such table yet: a new database
        return False
    return [tuple(v) for v in versions] == [(head,)]


async def upgrade_to_head(engine: AsyncEngine) -> None:
    """Upgrade under an advisory lock on Postgres, so concurrent masters migrate once. A
    database already at head costs one query: Alembic and the 20-odd migration modules it
    would load cost each master start about 0.2 s of CPU, and tests start hundreds."""
    if await _at_head(engine):
        log.info("database schema is at head")
        return
    async with _migration_connection(engine) as conn:
        postgres = conn.dialect.name == "postgresql"
        if postgres:
            await conn.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK_ID})")
            await conn.commit()
        try:
            await conn.run_sync(_upgrade)
            await conn.commit()
        finally:
            if postgres:
                await conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_ID})")
                await conn.commit()
    log.info("database schema is at head")


def _upgrade(sync_conn: object) -> None:
    from alembic import command

    command.upgrade(alembic_config(sync_conn), "head")


async def run_alembic(engine: AsyncEngine, fn: str, *args: str) -> None:
    """Run one alembic command (`upgrade`, `downgrade`, `check`, ...) on the engine's database."""
    async with _migration_connection(engine) as conn:
        await conn.run_sync(_run_command, fn, args)
        await conn.commit()


def _run_command(sync_conn: object, fn: str, args: tuple[str, ...]) -> None:
    from alembic import command

    getattr(command, fn)(alembic_config(sync_conn), *args)


__all__ = ["AsyncConnection", "alembic_config", "migrations_dir", "run_alembic", "upgrade_to_head"]
