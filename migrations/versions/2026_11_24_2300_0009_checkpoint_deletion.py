"""checkpoint deletion: states with a reason, retries with backoff

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 23:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import master.db.models

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        # Why a checkpoint is DELETING or PARTIALLY_DELETED (the store's last error).
        batch_op.add_column(sa.Column('state_reason', sa.Text(), nullable=False, server_default=''))
        batch_op.add_column(
            sa.Column('delete_attempts', sa.Integer(), nullable=False, server_default='0')
        )
        # When the deleter tries again; NULL for checkpoints not being deleted.
        batch_op.add_column(
            sa.Column(
                'delete_next_at', master.db.models.UTCDateTime(timezone=True), nullable=True
            )
        )
    op.create_index('ix_checkpoints_delete_next_at', 'checkpoints', ['delete_next_at'])


def downgrade() -> None:
    op.drop_index('ix_checkpoints_delete_next_at', table_name='checkpoints')
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_column('delete_next_at')
        batch_op.drop_column('delete_attempts')
        batch_op.drop_column('state_reason')
