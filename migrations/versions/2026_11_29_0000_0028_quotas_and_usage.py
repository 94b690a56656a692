"""workspace quotas and fair-share usage: slots a workspace is guaranteed in a pool, what it
may borrow and lend, and the decayed slot-seconds its users and jobs used

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-29 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workspace_quotas",
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("resource_pool", sa.String(length=256), nullable=False),
        sa.Column("nominal_slots", sa.Integer(), nullable=False),
        sa.Column("borrowing_limit", sa.Integer(), nullable=True),
        sa.Column("lending_limit", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_workspace_quotas_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "resource_pool", name=op.f("pk_workspace_quotas")),
    )
    op.create_table(
        "fair_share_usage",
        sa.Column("resource_pool", sa.String(length=256), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("slot_seconds", sa.Float(), nullable=False),
        sa.Column("as_of", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "resource_pool", "workspace_id", "user_id", "job_id", name=op.f("pk_fair_share_usage")
        ),
    )
    op.create_index("ix_allocations_ended_at", "allocations", ["ended_at"], unique=False)
    # Allocations that ended up to this time have their usage in fair_share_usage.
    with op.batch_alter_table("scheduler_state") as batch:
        batch.add_column(
            sa.Column("usage_accounted_until", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("scheduler_state") as batch:
        batch.drop_column("usage_accounted_until")
    op.drop_index("ix_allocations_ended_at", table_name="allocations")
    op.drop_table("fair_share_usage")
    op.drop_table("workspace_quotas")
