"""Config templates: stored partial experiment configs, merged into configs at submit time."""

from __future__ import annotations

import logging
import re
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.expconf import validate_config
from master.db.models import TemplateModel, utcnow
from master.errors import AlreadyExists, InvalidArgument, NotFound
from master.services.configs import config_errors_as_invalid_argument
from master.services.workspaces import resolve_workspace
from resolute.storage import hidden_secret_keys, keep_hidden_secrets

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+ -]{0,254}$")


def check_template_name(name: str) -> None:
    if not _NAME.match(name) or name != name.strip():
        raise InvalidArgument(
            f"template name {name!r}: use 1-255 letters, digits, spaces or ._@+- "
            "starting with a letter or digit"
        )


def check_template_config(config: Any, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Same checks as an experiment config, except that nothing is required. Secrets sent
    back masked (********) keep `previous`'s values."""
    if not isinstance(config, dict):
        raise InvalidArgument("template config: must be a mapping of config keys")
    restored = keep_hidden_secrets(config, previous)
    with config_errors_as_invalid_argument("template config"):
        validate_config(restored, complete=False)
    refuse_hidden_secrets(restored, "template config")
    return restored


def refuse_hidden_secrets(config: dict[str, Any], what: str) -> None:
    hidden = hidden_secret_keys(config)
    if hidden:
        raise InvalidArgument(
            f"{what}: {', '.join(hidden)}: ******** is how the master shows a secret, not the "
            "secret itself; give the real value"
        )


async def get_template(session: AsyncSession, name: str) -> TemplateModel:
    row = await session.scalar(select(TemplateModel).where(TemplateModel.name == name))
    if row is None:
        raise NotFound(f"template {name} not found")
    return row


async def template_exists(session: AsyncSession, name: str) -> bool:
    found = await session.scalar(select(TemplateModel.id).where(TemplateModel.name == name))
    return found is not None


async def list_templates(
    session: AsyncSession, *, offset: int, limit: int, name: str | None = None
) -> tuple[list[TemplateModel], int]:
    query = select(TemplateModel)
    if name:
        query = query.where(TemplateModel.name.contains(name, autoescape=True))
    total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
    query = query.order_by(TemplateModel.name).offset(offset)
    if limit > 0:
        query = query.limit(limit)
    return list((await session.scalars(query)).all()), total


async def create_template(
    session: AsyncSession,
    name: str,
    config: Any,
    workspace_id: int | None,
    owner_id: int | None = None,
) -> TemplateModel:
    check_template_name(name)
    config = check_template_config(config)
    workspace = await resolve_workspace(session, workspace_id)
    existing = await session.scalar(select(TemplateModel.id).where(TemplateModel.name == name))
    if existing is not None:
        raise AlreadyExists(f"template {name} already exists")
    row = TemplateModel(name=name, config=config, workspace_id=workspace.id, owner_id=owner_id)
    session.add(row)
    await session.flush()
    log.info("created template %s", name)
    return row


async def replace_template_config(session: AsyncSession, name: str, config: Any) -> TemplateModel:
    row = await get_template(session, name)
    config = check_template_config(config, row.config)
    row.config = config
    row.updated_at = utcnow()
    await session.flush()
    log.info("replaced the config of template %s", name)
    return row


async def put_template(
    session: AsyncSession,
    name: str,
    config: Any,
    workspace_id: int | None,
    owner_id: int | None = None,
) -> TemplateModel:
    """Create or replace (Determined's PUT)."""
    check_template_name(name)
    row = await session.scalar(select(TemplateModel).where(TemplateModel.name == name))
    config = check_template_config(config, row.config if row is not None else None)
    if row is None:
        return await create_template(session, name, config, workspace_id, owner_id)
    row.config = config
    row.updated_at = utcnow()
    if workspace_id:
        row.workspace_id = (await resolve_workspace(session, workspace_id)).id
    await session.flush()
    return row


async def rename_template(session: AsyncSession, old_name: str, new_name: str) -> TemplateModel:
    check_template_name(new_name)
    row = await get_template(session, old_name)
    if old_name != new_name:
        taken = await session.scalar(select(TemplateModel.id).where(TemplateModel.name == new_name))
        if taken is not None:
            raise AlreadyExists(f"template {new_name} already exists")
        row.name = new_name
        row.updated_at = utcnow()
        await session.flush()
    return row


async def delete_template(session: AsyncSession, name: str) -> None:
    row = await get_template(session, name)
    await session.delete(row)
    await session.flush()
    log.info("deleted template %s", name)
