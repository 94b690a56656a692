"""asha searcher state

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        # The ASHA searcher's generator (MT19937 words and position) between creates.
        batch_op.add_column(
            sa.Column(
                'searcher_state',
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'),
                nullable=True,
            )
        )
    with op.batch_alter_table('trials', schema=None) as batch_op:
        batch_op.add_column(sa.Column('searcher_bracket', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('searcher_rung', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('searcher_stopped_rung', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('searcher_closed', sa.String(length=16), nullable=True))
    # One row per (trial, rung): a trial never enters a rung twice.
    op.create_table(
        'searcher_rung_entries',
        sa.Column('trial_id', sa.Integer(), nullable=False),
        sa.Column('rung', sa.Integer(), nullable=False),
        sa.Column('experiment_id', sa.Integer(), nullable=False),
        sa.Column('bracket', sa.Integer(), nullable=False),
        sa.Column('value', sa.Float(), nullable=False),
        sa.Column('time', sa.Float(), nullable=False),
        sa.Column('metric', sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ['experiment_id'],
            ['experiments.id'],
            name=op.f('fk_searcher_rung_entries_experiment_id_experiments'),
            ondelete='CASCADE',
        ),
        sa.ForeignKeyConstraint(
            ['trial_id'],
            ['trials.id'],
            name=op.f('fk_searcher_rung_entries_trial_id_trials'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('trial_id', 'rung', name=op.f('pk_searcher_rung_entries')),
    )
    # A report's rank in its rung is a count over this index.
    op.create_index(
        'ix_searcher_rung_entries_rank',
        'searcher_rung_entries',
        ['experiment_id', 'bracket', 'rung', 'value'],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index('ix_searcher_rung_entries_rank', table_name='searcher_rung_entries')
    op.drop_table('searcher_rung_entries')
    with op.batch_alter_table('trials', schema=None) as batch_op:
        batch_op.drop_column('searcher_closed')
        batch_op.drop_column('searcher_stopped_rung')
        batch_op.drop_column('searcher_rung')
        batch_op.drop_column('searcher_bracket')
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_column('searcher_state')
