"""pool bindings: resource pools bound to workspaces, and a workspace's default pools

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
# 0023 (user groups) is chained in between where both branches meet; this one needs
# nothing of it.
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pool_bindings",
        sa.Column("pool_name", sa.String(length=256), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_pool_bindings_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pool_name", "workspace_id", name=op.f("pk_pool_bindings")),
    )
    op.create_index(
        op.f("ix_pool_bindings_workspace_id"), "pool_bindings", ["workspace_id"], unique=False
    )
    with op.batch_alter_table("workspaces") as batch:
        batch.add_column(sa.Column("default_compute_pool", sa.String(length=256), nullable=True))
        batch.add_column(sa.Column("default_aux_pool", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_column("default_aux_pool")
        batch.drop_column("default_compute_pool")
    op.drop_index(op.f("ix_pool_bindings_workspace_id"), table_name="pool_bindings")
    op.drop_table("pool_bindings")
