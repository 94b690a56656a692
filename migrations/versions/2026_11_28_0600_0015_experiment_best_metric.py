"""experiments.best_metric: the searcher metric's best validation value, kept for the list

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 06:00:00.000000
"""

import json
import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The tables as this revision knows them, not the application's models (which move on).
_experiments = sa.table(
    "experiments",
    sa.column("id", sa.Integer()),
    sa.column("config", sa.JSON()),
    sa.column("best_metric", sa.Float()),
)
_trials = sa.table(
    "trials", sa.column("id", sa.Integer()), sa.column("experiment_id", sa.Integer())
)
_metrics = sa.table(
    "trial_metrics",
    sa.column("id", sa.Integer()),
    sa.column("trial_id", sa.Integer()),
    sa.column("group_name", sa.String()),
    sa.column("metrics", sa.JSON()),
)
_BATCH = 500


def _finite_number(value: Any) -> float | None:
    # Stored non-finite values are the strings "NaN" and "Infinity": never a best.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _as_dict(value: Any) -> dict[str, Any]:
    # Read through a plain JSON column, the value may come back as text on some drivers.
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("best_metric", sa.Float(), nullable=True))
    # Backfill in Python: the searcher metric's name and direction are in each experiment's
    # config, which SQLite and Postgres query differently as JSON.
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
            searcher = _as_dict(_as_dict(config).get("searcher"))
            metric = searcher.get("metric")
            if not metric:
                continue
            values = [
                number
                for (metrics,) in connection.execute(
                    sa.select(_metrics.c.metrics)
                    .join(_trials, _trials.c.id == _metrics.c.trial_id)
                    .where(
                        _trials.c.experiment_id == experiment_id,
                        _metrics.c.group_name == "validation",
                    )
                )
                if (number := _finite_number(_as_dict(metrics).get(metric))) is not None
            ]
            if values:
                best = min(values) if searcher.get("smaller_is_better", True) else max(values)
                connection.execute(
                    sa.update(_experiments)
                    .where(_experiments.c.id == experiment_id)
                    .values(best_metric=best)
                )


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("best_metric")
