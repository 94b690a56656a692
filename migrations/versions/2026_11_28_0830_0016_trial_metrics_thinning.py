"""trial_metrics.ordinal and thinning_level: read every 2**L-th report of a trial

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 08:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The level of ordinal 0; no other 32-bit ordinal reaches it (master.core.thinning, as of
# this revision).
_FIRST_REPORT_LEVEL = 31


def _level_case() -> str:
    # Trailing zero bits of `ordinal`, in SQL both databases run: n % 2**(k+1) == 2**k.
    branches = " ".join(
        f"WHEN ordinal % {2 ** (k + 1)} = {2**k} THEN {k}" for k in range(_FIRST_REPORT_LEVEL)
    )
    return f"CASE WHEN ordinal = 0 THEN {_FIRST_REPORT_LEVEL} {branches} ELSE 0 END"


def upgrade() -> None:
    with op.batch_alter_table("trial_metrics") as batch:
        batch.add_column(sa.Column("ordinal", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(
            sa.Column("thinning_level", sa.SmallInteger(), server_default="0", nullable=False)
        )
    # Existing reports are numbered in step order within their trial and group, as the
    # report path numbers new ones; one statement each, in the database (UPDATE ... FROM
    # runs on SQLite >= 3.33 and Postgres alike).
    op.execute(
        "UPDATE trial_metrics SET ordinal = numbered.n FROM ("
        " SELECT id, ROW_NUMBER() OVER ("
        "  PARTITION BY trial_id, group_name ORDER BY steps_completed) - 1 AS n"
        " FROM trial_metrics) AS numbered"
        " WHERE numbered.id = trial_metrics.id"
    )
    op.execute(f"UPDATE trial_metrics SET thinning_level = {_level_case()}")
    op.create_index(
        "ix_trial_metrics_thinning",
        "trial_metrics",
        ["trial_id", "group_name", "thinning_level"],
    )


def downgrade() -> None:
    op.drop_index("ix_trial_metrics_thinning", table_name="trial_metrics")
    with op.batch_alter_table("trial_metrics") as batch:
        batch.drop_column("thinning_level")
        batch.drop_column("ordinal")
