"""per-agent credentials and revocation; token kinds and task scope; template owners

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 12:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import master.db.models

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        # SHA-256 of the secret the agent got for its join token; NULL until it enrolls.
        batch_op.add_column(sa.Column('credential_hash', sa.String(length=64), nullable=True))
        # False until the agent first shows the secret back: a Welcome lost on the way
        # must not lock the id out, so until then the join token enrolls it again.
        batch_op.add_column(
            sa.Column(
                'credential_confirmed', sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )
        batch_op.add_column(
            sa.Column('revoked_at', master.db.models.UTCDateTime(timezone=True), nullable=True)
        )
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('kind', sa.String(length=16), nullable=False, server_default='login')
        )
        batch_op.add_column(
            sa.Column('description', sa.String(length=256), nullable=False, server_default='')
        )
        # A task token opens only this trial's routes.
        batch_op.add_column(sa.Column('trial_id', sa.Integer(), nullable=True))
    with op.batch_alter_table('templates', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner_id', sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            'fk_templates_owner_id_users', 'users', ['owner_id'], ['id'], ondelete='SET NULL'
        )
    # Runs in flight across the upgrade keep working: their tokens become task tokens of
    # their own trial.
    op.execute(
        "UPDATE user_sessions SET kind = 'task', trial_id = "
        "(SELECT a.trial_id FROM allocations a WHERE a.task_session_id = user_sessions.id) "
        "WHERE id IN (SELECT task_session_id FROM allocations WHERE task_session_id IS NOT NULL)"
    )


def downgrade() -> None:
    with op.batch_alter_table('templates', schema=None) as batch_op:
        batch_op.drop_constraint('fk_templates_owner_id_users', type_='foreignkey')
        batch_op.drop_column('owner_id')
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.drop_column('trial_id')
        batch_op.drop_column('description')
        batch_op.drop_column('kind')
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_column('revoked_at')
        batch_op.drop_column('credential_confirmed')
        batch_op.drop_column('credential_hash')
