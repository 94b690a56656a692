"""Which checkpoints model versions hold: what checkpoint deletion must spare. Apart from the
registry's own module so that checkpoint deletion needs nothing of workspaces or models."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import ModelModel, ModelVersionModel


async def holders(
    session: AsyncSession, uuids: Collection[str]
) -> dict[str, list[tuple[str, int]]]:
    """{checkpoint uuid: [(model name, version), ...]} for those of `uuids` a version holds."""
    if not uuids:
        return {}
    rows = await session.execute(
        select(ModelVersionModel.checkpoint_uuid, ModelModel.name, ModelVersionModel.version)
        .join(ModelModel, ModelModel.id == ModelVersionModel.model_id)
        .where(ModelVersionModel.checkpoint_uuid.in_(list(uuids)))
        .order_by(ModelModel.name, ModelVersionModel.version)
    )
    found: dict[str, list[tuple[str, int]]] = {}
    for uuid, name, version in rows.all():
        found.setdefault(uuid, []).append((name, version))
    return found


def describe_holders(held: list[tuple[str, int]]) -> str:
    return ", ".join(f"version {version} of model {name!r}" for name, version in held)
