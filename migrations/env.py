"""Alembic environment: one history for SQLite and Postgres, targeting master.db.models."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from master.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode rebuilds tables.
        compare_type=True,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `det-master migrate`, which passes a connection")
run_with(connection)
