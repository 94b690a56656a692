"""access_state: a generation that triggers change with every write deciding who reads what

A master keeps each user's readable workspaces in memory while the generation it read them
under is current (master.services.access). Triggers rather than the master's own code bump
it, so that a change made through any master, a standby's forwarded write or plain SQL is
never missed (not a Postgres restore with triggers disabled: bump the row after one).

A SQLite table rebuilt by a later migration (Alembic's batch mode) loses its triggers:
such a migration must create them again (WATCHED and create_triggers below);
tests/test_migrations.py checks that every one exists at head.

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-29 10:00:00.000000
"""

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BUMP = "UPDATE access_state SET generation = generation + 1"

# table -> the events that change a reader's workspaces
WATCHED = {
    "role_assignments": ("INSERT", "UPDATE", "DELETE"),
    "user_group_members": ("INSERT", "UPDATE", "DELETE"),
    "user_groups": ("DELETE",),
    "workspaces": ("INSERT", "UPDATE OF user_id, immutable", "DELETE"),
}


def trigger_names(dialect: str) -> set[str]:
    """The triggers create_triggers makes on `dialect`."""
    if dialect == "postgresql":
        return {f"access_changed_{table}" for table in WATCHED}
    return {_sqlite_trigger(table, event) for table, events in WATCHED.items() for event in events}


def _sqlite_trigger(table: str, event: str) -> str:
    return f"access_changed_{table}_{event.split()[0].lower()}"


def create_triggers(table: str) -> None:
    events = WATCHED[table]
    if op.get_bind().dialect.name == "postgresql":
        # BEFORE the statement: the row lock on access_state is taken before the statement's
        # own locks (a foreign key's on its workspace), so two writers meet in one order.
        # TRUNCATE too: it fires no DELETE trigger.
        op.execute(
            f"CREATE TRIGGER access_changed_{table} BEFORE {' OR '.join(events)} OR TRUNCATE "
            f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION access_changed()"
        )
        return
    # SQLite has row triggers only, one event each, and one writer at a time.
    for event in events:
        op.execute(
            f"CREATE TRIGGER {_sqlite_trigger(table, event)} AFTER {event} ON {table} "
            f"BEGIN {BUMP}; END"
        )


def upgrade() -> None:
    op.create_table(
        "access_state",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "generation", sa.Integer().with_variant(sa.BigInteger(), "postgresql"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_access_state")),
    )
    # A random start: a database restored to an older generation (or this row made again)
    # never meets a master's cache at a value it already knew with other data.
    start = secrets.randbelow(2**62)
    op.execute(f"INSERT INTO access_state (id, generation) VALUES (1, {start})")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION access_changed() RETURNS trigger AS $$ "
            f"BEGIN {BUMP}; RETURN NULL; END $$ LANGUAGE plpgsql"
        )
    for table in WATCHED:
        create_triggers(table)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in WATCHED:
            op.execute(f"DROP TRIGGER access_changed_{table} ON {table}")
        op.execute("DROP FUNCTION access_changed()")
    else:
        for name in trigger_names("sqlite"):
            op.execute(f"DROP TRIGGER {name}")
    op.drop_table("access_state")
