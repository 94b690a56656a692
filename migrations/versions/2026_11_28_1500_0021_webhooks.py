"""webhooks: their triggers, an outbox written with the events, and a delivery queue

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("webhook_type", sa.String(length=16), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_webhooks_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_index(op.f("ix_webhooks_workspace_id"), "webhooks", ["workspace_id"], unique=False)
    op.create_table(
        "webhook_triggers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("trigger_type", sa.String(length=32), nullable=False),
        sa.Column("condition", _JSON, nullable=False),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["webhooks.id"],
            name=op.f("fk_webhook_triggers_webhook_id_webhooks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_triggers")),
    )
    op.create_index(
        op.f("ix_webhook_triggers_webhook_id"), "webhook_triggers", ["webhook_id"], unique=False
    )
    op.create_table(
        "webhook_outbox",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        sa.Column("data", _JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_outbox")),
    )
    op.create_table(
        "webhook_events",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["webhooks.id"],
            name=op.f("fk_webhook_events_webhook_id_webhooks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_events")),
        sa.UniqueConstraint("event_id", name=op.f("uq_webhook_events_event_id")),
    )
    op.create_index(
        op.f("ix_webhook_events_webhook_id"), "webhook_events", ["webhook_id"], unique=False
    )
    op.create_index(
        op.f("ix_webhook_events_next_attempt_at"),
        "webhook_events",
        ["next_attempt_at"],
        unique=False,
    )
    op.create_table(
        "webhook_log_matches",
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("trigger_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trigger_id"],
            ["webhook_triggers.id"],
            name=op.f("fk_webhook_log_matches_trigger_id_webhook_triggers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "trigger_id", name=op.f("pk_webhook_log_matches")),
    )


def downgrade() -> None:
    op.drop_table("webhook_log_matches")
    op.drop_index(op.f("ix_webhook_events_next_attempt_at"), table_name="webhook_events")
    op.drop_index(op.f("ix_webhook_events_webhook_id"), table_name="webhook_events")
    op.drop_table("webhook_events")
    op.drop_table("webhook_outbox")
    op.drop_index(op.f("ix_webhook_triggers_webhook_id"), table_name="webhook_triggers")
    op.drop_table("webhook_triggers")
    op.drop_index(op.f("ix_webhooks_workspace_id"), table_name="webhooks")
    op.drop_table("webhooks")
