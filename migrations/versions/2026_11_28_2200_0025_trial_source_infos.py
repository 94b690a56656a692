"""trial source infos: which checkpoint or model version a trial used (inference metrics)

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "trial_source_infos",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_uuid", sa.String(length=64), nullable=False),
        sa.Column("model_version_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["trials.id"],
            name=op.f("fk_trial_source_infos_trial_id_trials"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["checkpoint_uuid"],
            ["checkpoints.uuid"],
            name=op.f("fk_trial_source_infos_checkpoint_uuid_checkpoints"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["model_version_id"],
            ["model_versions.id"],
            name=op.f("fk_trial_source_infos_model_version_id_model_versions"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trial_source_infos")),
    )
    op.create_index(
        op.f("ix_trial_source_infos_trial_id"),
        "trial_source_infos",
        ["trial_id"],
    )
    op.create_index(
        op.f("ix_trial_source_infos_checkpoint_uuid"),
        "trial_source_infos",
        ["checkpoint_uuid"],
    )
    op.create_index(
        op.f("ix_trial_source_infos_model_version_id"),
        "trial_source_infos",
        ["model_version_id"],
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_trial_source_infos_model_version_id"), table_name="trial_source_infos")
    op.drop_index(op.f("ix_trial_source_infos_checkpoint_uuid"), table_name="trial_source_infos")
    op.drop_index(op.f("ix_trial_source_infos_trial_id"), table_name="trial_source_infos")
    op.drop_table("trial_source_infos")
