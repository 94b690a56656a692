"""experiments.parent_id: the experiment a fork was made from (Determined's forked_from)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 12:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        # A fork outlives its parent: deleting the parent forgets where the fork came from.
        batch.create_foreign_key(
            "fk_experiments_parent_id_experiments",
            "experiments",
            ["parent_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index("ix_experiments_parent_id", ["parent_id"])


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_index("ix_experiments_parent_id")
        batch.drop_constraint("fk_experiments_parent_id_experiments", type_="foreignkey")
        batch.drop_column("parent_id")
