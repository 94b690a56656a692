"""experiments.labels: each experiment's labels, an ordered list without repeats

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 09:00:00.000000
"""

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
# The table as this revision knows it, not the application's model (which moves on).
_experiments = sa.table(
    "experiments",
    sa.column("id", sa.Integer()),
    sa.column("config", sa.JSON()),
    sa.column("labels", sa.JSON()),
)
_BATCH = 500


def _config_labels(config: Any) -> list[str]:
    # Read through a plain JSON column, the value may come back as text on some drivers.
    if isinstance(config, str):
        config = json.loads(config)
    labels = config.get("labels") if isinstance(config, dict) else None
    if not isinstance(labels, list):
        return []
    # Until now the config's labels were stored as submitted: keep them, each once.
    return list(dict.fromkeys(label for label in labels if isinstance(label, str)))


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(
            sa.Column("labels", _JSON, server_default=sa.text("'[]'"), nullable=False)
        )
    # Backfilled in Python: SQLite and Postgres read JSON arrays differently.
    connection = op.get_bind()
    last_id = 0
    while True:
        experiments = connection.execute(
            sa.select(_experiments.c.id, _experiments.c.config)
            .where(_experiments.c.id > last_id)
            .order_by(_experiments.c.id)
            .limit(_BATCH)
        ).all()
        if not experiments:
            return
        last_id = experiments[-1].id
        for experiment_id, config in experiments:
            labels = _config_labels(config)
            if labels:
                connection.execute(
                    sa.update(_experiments)
                    .where(_experiments.c.id == experiment_id)
                    .values(labels=labels)
                )


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("labels")
