"""Config templates: stored partial experiment configs, merged into configs at submit time."""

from __future__ import annotations

import logging
import re
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.expconf import validate_config
from master.db.models import TemplateModel, WorkspaceModel, utcnow
from master.errors import AlreadyExists, InvalidArgument, NotFound
from master.services.configs import config_errors_as_invalid_argument
from master.services.workspaces import default_workspace
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


async def template_workspace(session: AsyncSession, workspace_id: int | None) -> WorkspaceModel:
    """Where a template goes: workspaceId 0 (or none, as Determined's client sends for
    `det tpl set`) is the built-in workspace. An archived workspace takes no new templates,
    as it takes no new projects or experiments; Determined's client refuses it before asking."""
    if not workspace_id:
        return await default_workspace(session)
    ws = await session.get(WorkspaceModel, workspace_id)
    if ws is None:
        raise NotFound(f"workspaceId: workspace {workspace_id} not found")
    if ws.deleting or ws.archived:
        state = "being deleted" if ws.deleting else "archived; unarchive it to add templates"
        raise InvalidArgument(f"workspaceId: workspace {ws.name!r} ({ws.id}) is {state}")
    return ws


async def workspace_names(session: AsyncSession) -> dict[int, str]:
    """Every workspace's name by id, for showing where templates are, ordered by name.
    Archived and deleting workspaces included: their templates still exist."""
    found = await session.execute(
        select(WorkspaceModel.id, WorkspaceModel.name).order_by(WorkspaceModel.name)
    )
    return {ws_id: name for ws_id, name in found.all()}


async def get_template(session: AsyncSession, name: str) -> TemplateModel:
    row = await session.scalar(select(TemplateModel).where(TemplateModel.name == name))
    if row is None:
        raise NotFound(f"template {name} not found")
    return row


async def template_exists(session: AsyncSession, name: str) -> bool:
    found = await session.scalar(select(TemplateModel.id).where(TemplateModel.name == name))
    return found is not None


async def list_templates(
    session: AsyncSession,
    *,
    offset: int,
    limit: int,
    name: str | None = None,
    workspace_ids: list[int] | None = None,
    descending: bool = False,
    readable: ColumnElement[bool] | None = None,
) -> tuple[list[TemplateModel], int]:
    """The templates the caller may read (`readable`, access.readable); `workspace_ids`
    keeps those of the given workspaces (unknown ids match nothing)."""
    query = select(TemplateModel)
    if readable is not None:
        query = query.where(readable)
    if name:
        query = query.where(TemplateModel.name.contains(name, autoescape=True))
    if workspace_ids:
        query = query.where(TemplateModel.workspace_id.in_(workspace_ids))
    total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
    order = TemplateModel.name.desc() if descending else TemplateModel.name
    query = query.order_by(order).offset(offset)
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
    workspace = await template_workspace(session, workspace_id)
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
    """Create or replace (Determined's PUT). On a template that exists, a non-zero
    workspaceId moves it there; 0 or none leaves it where it is, as in Determined."""
    check_template_name(name)
    row = await session.scalar(select(TemplateModel).where(TemplateModel.name == name))
    config = check_template_config(config, row.config if row is not None else None)
    if row is None:
        return await create_template(session, name, config, workspace_id, owner_id)
    # Checked before anything changes: a refused move leaves the config as it was.
    destination = await template_workspace(session, workspace_id) if workspace_id else None
    row.config = config
    row.updated_at = utcnow()
    if destination is not None and destination.id != row.workspace_id:
        log.info("moved template %s to workspace %d", name, destination.id)
        row.workspace_id = destination.id
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
