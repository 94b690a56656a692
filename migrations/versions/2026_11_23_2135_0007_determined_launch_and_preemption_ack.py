"""determined launch layout and preemption ack

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 21:35:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        # Trial code acknowledged the preemption signal: an exit 0 then means "stopped
        # for preemption", not "finished" (Determined's rule).
        batch_op.add_column(
            sa.Column('preempt_acked', sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        # Why the experiment's launch layout is what it is (shown by describe and the UI).
        batch_op.add_column(
            sa.Column('launch_reason', sa.Text(), nullable=False, server_default='')
        )
    with op.batch_alter_table('trials', schema=None) as batch_op:
        # Why the trial ended the way it did, when that is not obvious from its state
        # (an invalid hyperparameter, a missing interpreter...).
        batch_op.add_column(
            sa.Column('end_reason', sa.Text(), nullable=False, server_default='')
        )
        # What trial code set with TrainContext.set_metadata (POST /api/v1/runs/{id}/metadata).
        batch_op.add_column(
            sa.Column(
                'run_metadata',
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table('trials', schema=None) as batch_op:
        batch_op.drop_column('run_metadata')
        batch_op.drop_column('end_reason')
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_column('launch_reason')
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.drop_column('preempt_acked')
