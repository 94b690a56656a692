"""Experiment labels: what a label may be, changing an experiment's labels, listing and
filtering by them.

An experiment's labels are an ordered list without repeats in `experiments.labels`; its
config's `labels` key is rewritten with it, as Determined keeps labels in the config."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, func, literal, literal_column, select, true
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import ExperimentModel
from master.errors import InvalidArgument

MAX_LABEL_CHARS = 255
MAX_LABELS = 100
# Unicode's control characters, and lone surrogates (no database can store them as text).
_REFUSED_CATEGORIES = {"Cc": "a control character", "Cs": "a lone surrogate"}


def label_problem(label: object) -> str | None:
    """Why `label` cannot be a label, or None."""
    if not isinstance(label, str):
        return f"must be a string, not {type(label).__name__}"
    if not label:
        return "is empty"
    if len(label) > MAX_LABEL_CHARS:
        return f"is {len(label)} characters long; at most {MAX_LABEL_CHARS}"
    for char in label:
        kind = _REFUSED_CATEGORIES.get(unicodedata.category(char))
        if kind is not None:
            return f"holds {kind} (U+{ord(char):04X})"
    if not label.strip():
        return "is only spaces"
    return None


def checked_label(label: object, where: str) -> str:
    problem = label_problem(label)
    if problem is not None:
        raise InvalidArgument(f"{where}: the label {problem}")
    return str(label)


def checked_labels(labels: object, where: str, kept: Sequence[str] = ()) -> list[str]:
    """The labels in their order, each once; a 400 naming the first bad one otherwise.
    Labels in `kept` (the experiment's own, stored before these rules) pass as they are,
    and so does a count that does not grow."""
    if not isinstance(labels, list | tuple):
        raise InvalidArgument(f"{where}: must be a list of strings")
    old = set(kept)
    result = list(
        dict.fromkeys(
            value
            if isinstance(value, str) and value in old
            else checked_label(value, f"{where}[{i}]")
            for i, value in enumerate(labels)
        )
    )
    if len(result) > max(MAX_LABELS, len(kept)):
        raise InvalidArgument(
            f"{where}: {len(result)} labels; an experiment may have at most {MAX_LABELS}"
        )
    return result


def set_labels(experiment: ExperimentModel, labels: Sequence[str]) -> None:
    """Give the experiment these (checked) labels, in the column and in its config."""
    experiment.labels = list(labels)
    experiment.config = {**experiment.config, "labels": list(labels)}


def with_label(experiment: ExperimentModel, label: str) -> list[str]:
    """The experiment's labels with `label` added at the end; unchanged if it is there."""
    label = checked_label(label, "label")
    current = list(experiment.labels)
    if label in current:
        return current
    if len(current) >= MAX_LABELS:
        raise InvalidArgument(
            f"label: experiment {experiment.id} has {len(current)} labels already; "
            f"at most {MAX_LABELS}"
        )
    return [*current, label]


def has_label(session: AsyncSession, label: str) -> Any:
    """A WHERE condition: the experiment carries `label` (exactly: case and spaces count)."""
    if session.get_bind().dialect.name == "postgresql":
        # jsonb containment: some element of the array equals the label.
        return ExperimentModel.labels.op("@>")(literal([label], JSONB))
    elements = func.json_each(ExperimentModel.labels).table_valued("value")
    match: Select[Any] = (
        select(literal_column("1")).select_from(elements).where(elements.c.value == label)
    )
    return exists(match)


def _elements(session: AsyncSession) -> Any:
    """The experiment's labels as a table of one `value` column, to join to experiments
    (both databases let a function in FROM read the columns of the tables before it)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.jsonb_array_elements_text(ExperimentModel.labels).table_valued("value")
    return func.json_each(ExperimentModel.labels).table_valued("value")


async def label_counts(
    session: AsyncSession,
    project_id: int | None = None,
    limit: int | None = None,
    readable: ColumnElement[bool] | None = None,
) -> list[str]:
    """Every label in use (or the `limit` most used), the most used first, then A to Z, as
    Determined lists them. Counted in the database: the list page asks on every load."""
    elements = _elements(session)
    uses = func.count().label("uses")
    query = (
        select(elements.c.value, uses)
        .select_from(ExperimentModel)
        .join(elements, true())
        .group_by(elements.c.value)
        .order_by(uses.desc(), elements.c.value)
    )
    if project_id is not None:
        query = query.where(ExperimentModel.project_id == project_id)
    if readable is not None:  # only the labels of experiments the caller may read
        query = query.where(readable)
    if limit is not None:
        query = query.limit(limit)
    return [str(label) for label, _ in (await session.execute(query)).all()]
