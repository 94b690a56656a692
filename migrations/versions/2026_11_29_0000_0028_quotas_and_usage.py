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


def downgrade() -> None:
    op.drop_table("fair_share_usage")
    op.drop_table("workspace_quotas")
