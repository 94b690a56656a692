"""revoked task tokens are kept, so a stale run's report is recognised and counted

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 09:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import master.db.models

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        # Set when the allocation whose ranks held the token ended; NULL while it is valid.
        batch_op.add_column(
            sa.Column('revoked_at', master.db.models.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.drop_column('revoked_at')
