"""access_state: a generation that triggers change with every write deciding who reads what

A master keeps each user's readable workspaces in memory while the generation it read them
under is current (master.services.access). Triggers rather than the master's own code bump
it, so that a change made through any master, a standby's forwarded write or plain SQL is
never missed.

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-29 10:00:00.000000
"""

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


def _trigger_name(table: str, event: str) -> str:
    return f"access_changed_{table}_{event.split()[0].lower()}"


def upgrade() -> None:
    op.create_table(
        "access_state",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "generation", sa.Integer().with_variant(sa.BigInteger(), "postgresql"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_access_state")),
    )
    op.execute("INSERT INTO access_state (id, generation) VALUES (1, 0)")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION access_changed() RETURNS trigger AS $$ "
            f"BEGIN {BUMP}; RETURN NULL; END $$ LANGUAGE plpgsql"
        )
        for table, events in WATCHED.items():
            op.execute(
                f"CREATE TRIGGER access_changed_{table} AFTER {' OR '.join(events)} "
                f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION access_changed()"
            )
        return
    # SQLite has row triggers only, one event each.
    for table, events in WATCHED.items():
        for event in events:
            op.execute(
                f"CREATE TRIGGER {_trigger_name(table, event)} AFTER {event} ON {table} "
                f"BEGIN {BUMP}; END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in WATCHED:
            op.execute(f"DROP TRIGGER access_changed_{table} ON {table}")
        op.execute("DROP FUNCTION access_changed()")
    else:
        for table, events in WATCHED.items():
            for event in events:
                op.execute(f"DROP TRIGGER {_trigger_name(table, event)}")
    op.drop_table("access_state")
