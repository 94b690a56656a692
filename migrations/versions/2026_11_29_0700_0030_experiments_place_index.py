"""experiments: an index of (project_id, owner_id), from which a user's readable list is counted

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-29 07:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_experiments_project_id_owner_id", "experiments", ["project_id", "owner_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_experiments_project_id_owner_id", table_name="experiments")
