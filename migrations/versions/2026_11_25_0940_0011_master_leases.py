"""the leader's lease, for several masters on one database

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 09:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import master.db.models

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'master_leases',
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('holder', sa.String(length=64), nullable=False),
        # Raised by every takeover: a write of an older epoch is refused at its commit.
        sa.Column('epoch', sa.BigInteger(), nullable=False),
        sa.Column('expires_at', master.db.models.UTCDateTime(timezone=True), nullable=False),
        # Where the holder serves its API: standbys redirect writes there.
        sa.Column('url', sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint('name'),
    )


def downgrade() -> None:
    op.drop_table('master_leases')
