"""role assignments: a role given to a user or a group, in a workspace or across the cluster

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-29 04:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "role_assignments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("role_id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=True),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("group_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(user_id IS NULL) <> (group_id IS NULL)",
            name=op.f("ck_role_assignments_user_or_group"),
        ),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["user_groups.id"],
            name=op.f("fk_role_assignments_group_id_user_groups"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_role_assignments_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_role_assignments_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_role_assignments")),
    )
    for column in ("group_id", "user_id", "workspace_id"):
        op.create_index(
            op.f(f"ix_role_assignments_{column}"), "role_assignments", [column], unique=False
        )
    # Each assignment at most once: a partial unique index per kind of holder and scope.
    for holder in ("user", "group"):
        for scope, neg in (("cluster", ""), ("workspace", "NOT ")):
            where = sa.text(f"{holder}_id IS NOT NULL AND workspace_id IS {neg}NULL")
            op.create_index(
                f"uq_role_assignments_{holder}_{scope}",
                "role_assignments",
                ["role_id", *(["workspace_id"] if scope == "workspace" else []), f"{holder}_id"],
                unique=True,
                sqlite_where=where,
                postgresql_where=where,
            )


def downgrade() -> None:
    for holder in ("user", "group"):
        for scope in ("cluster", "workspace"):
            op.drop_index(f"uq_role_assignments_{holder}_{scope}", table_name="role_assignments")
    for column in ("group_id", "user_id", "workspace_id"):
        op.drop_index(op.f(f"ix_role_assignments_{column}"), table_name="role_assignments")
    op.drop_table("role_assignments")
