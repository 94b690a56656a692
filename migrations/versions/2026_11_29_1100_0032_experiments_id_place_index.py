"""experiments: an index of (id, project_id, owner_id), through which a readable page is found

A page of the experiments a user may read, in id order, tests each experiment's project and
owner: from this index instead of the table's rows (master.services.access.readable).

Revision ID: 0032
Revises: 0031
Create Date: 2026-11-29 11:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_experiments_id_project_id_owner_id", "experiments", ["id", "project_id", "owner_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_experiments_id_project_id_owner_id", table_name="experiments")
