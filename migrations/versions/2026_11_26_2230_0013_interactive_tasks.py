"""commands, notebooks, shells and TensorBoards: tasks, and allocations that are not trials'

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 22:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import master.db.models

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("config", _JSON, nullable=False),
        sa.Column("template_name", sa.String(length=256), nullable=True),
        sa.Column("resource_pool", sa.String(length=256), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("experiment_ids", _JSON, nullable=False),
        sa.Column("trial_ids", _JSON, nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("idle_timeout_s", sa.Float(), nullable=True),
        sa.Column("last_activity_at", master.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("created_at", master.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("ended_at", master.db.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("end_reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"], name=op.f("fk_tasks_owner_id_users")),
        sa.ForeignKeyConstraint(
            ["workspace_id"], ["workspaces.id"], name=op.f("fk_tasks_workspace_id_workspaces")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
        sa.UniqueConstraint("uuid", name=op.f("uq_tasks_uuid")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_type"), ["type"], unique=False)
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("task_id", sa.Integer(), nullable=True))
        batch_op.alter_column("trial_id", existing_type=sa.Integer(), nullable=True)
        batch_op.alter_column("experiment_id", existing_type=sa.Integer(), nullable=True)
        batch_op.create_index(batch_op.f("ix_allocations_task_id"), ["task_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_allocations_task_id_tasks"),
            "tasks",
            ["task_id"],
            ["id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    # Tasks' allocations cannot be kept without their trial columns.
    op.execute("DELETE FROM allocations WHERE task_id IS NOT NULL")
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_allocations_task_id_tasks"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_allocations_task_id"))
        batch_op.alter_column("experiment_id", existing_type=sa.Integer(), nullable=False)
        batch_op.alter_column("trial_id", existing_type=sa.Integer(), nullable=False)
        batch_op.drop_column("task_id")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_type"))
        batch_op.drop_index(batch_op.f("ix_tasks_owner_id"))
    op.drop_table("tasks")
