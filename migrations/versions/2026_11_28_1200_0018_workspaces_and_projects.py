"""workspaces and projects as Determined serves them: archived and deleting flags,
per-user pins, a project's key and description, project names unique within their workspace

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 12:00:00.000000
"""

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import master.db.models

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The table as this revision knows it, not the application's model (which moves on).
_projects = sa.table(
    "projects",
    sa.column("id", sa.Integer()),
    sa.column("name", sa.String()),
    sa.column("key", sa.String()),
)


def _key_of(name: str, taken: set[str]) -> str:
    # The same rule as master.services.workspaces.project_key, frozen here.
    stem = re.sub(r"[^A-Z0-9]", "", name.upper())[:5] or "PROJ"
    key, n = stem, 1
    while key in taken:
        n += 1
        key = f"{stem}{n}"
    taken.add(key)
    return key


def upgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.add_column(
            sa.Column("archived", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(
            sa.Column("deleting", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("projects") as batch:
        batch.add_column(sa.Column("key", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("description", sa.Text(), nullable=False, server_default=""))
        batch.add_column(
            sa.Column("archived", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(
            sa.Column("deleting", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    connection = op.get_bind()
    taken: set[str] = set()
    # Few rows: until now only the built-in project existed.
    for project_id, name in connection.execute(
        sa.select(_projects.c.id, _projects.c.name).order_by(_projects.c.id)
    ).all():
        connection.execute(
            sa.update(_projects)
            .where(_projects.c.id == project_id)
            .values(key=_key_of(name, taken))
        )
    with op.batch_alter_table("projects") as batch:
        batch.alter_column("key", existing_type=sa.String(length=16), nullable=False)
        batch.create_unique_constraint(batch.f("uq_projects_key"), ["key"])
        batch.create_unique_constraint(
            batch.f("uq_projects_workspace_id_name"), ["workspace_id", "name"]
        )
    op.create_table(
        "workspace_pins",
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("pinned_at", master.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_workspace_pins_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_workspace_pins_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "user_id", name=op.f("pk_workspace_pins")),
    )


def downgrade() -> None:
    op.drop_table("workspace_pins")
    with op.batch_alter_table("projects") as batch:
        batch.drop_constraint(batch.f("uq_projects_workspace_id_name"), type_="unique")
        batch.drop_constraint(batch.f("uq_projects_key"), type_="unique")
        batch.drop_column("deleting")
        batch.drop_column("archived")
        batch.drop_column("description")
        batch.drop_column("key")
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_column("deleting")
        batch.drop_column("archived")
