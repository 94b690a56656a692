"""The model registry: models, and their versions, each holding one completed checkpoint.

A version pins its checkpoint: retention skips it and a user's delete is refused until the
version goes (master.services.checkpoint_gc asks master.services.registered_checkpoints
which versions hold what). Ids in paths are a model's name or, when no model has that
name, its numeric id, as Determined's client sends either. Every refusal names the field
and changes nothing.
"""

from __future__ import annotations

import json
import logging
import re
import uuid as uuidlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import roles
from master.core.text import any_unstorable, unstorable
from master.db.models import (
    MAX_INT,
    CheckpointModel,
    ModelModel,
    ModelVersionModel,
    UserModel,
    WorkspaceModel,
    utcnow,
)
from master.errors import AlreadyExists, InvalidArgument, NotFound
from master.services import access
from master.services.access import Actor
from master.services.workspaces import default_workspace

log = logging.getLogger(__name__)

COMPLETED = "COMPLETED"  # checkpoint_gc.ACTIVE (not imported: checkpoint_gc imports this module)
MAX_NAME = 255
MAX_LABEL = 255
MAX_LABELS = 100
MAX_TEXT = 1_000_000  # notes are a readme: long, not unbounded
MAX_METADATA_BYTES = 1_000_000

MODEL_SORTS = (
    "SORT_BY_UNSPECIFIED",
    "SORT_BY_NAME",
    "SORT_BY_DESCRIPTION",
    "SORT_BY_CREATION_TIME",
    "SORT_BY_LAST_UPDATED_TIME",
    "SORT_BY_NUM_VERSIONS",
    "SORT_BY_WORKSPACE",
)
VERSION_SORTS = ("SORT_BY_UNSPECIFIED", "SORT_BY_VERSION", "SORT_BY_CREATION_TIME")
ORDERS = ("ORDER_BY_UNSPECIFIED", "ORDER_BY_ASC", "ORDER_BY_DESC")
_DIGITS = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class ModelView:
    """A model with what its reply shows beside its own columns."""

    row: ModelModel
    num_versions: int
    username: str


@dataclass(frozen=True)
class VersionView:
    row: ModelVersionModel
    model: ModelView
    checkpoint: CheckpointModel
    username: str


@dataclass(frozen=True)
class ModelFilter:
    archived: bool | None = None
    name: str | None = None
    description: str | None = None
    model_id: int | None = None
    labels: Sequence[str] = ()
    users: Sequence[str] = ()
    user_ids: Sequence[int] = ()
    workspace_ids: Sequence[int] = ()
    workspace_names: Sequence[str] = ()


# --- checks ---------------------------------------------------------------------------------


def check_model_name(value: Any, field: str = "name") -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{field}: a model needs a name that is not blank")
    if unstorable(value):
        raise InvalidArgument(f"{field}: holds a NUL character or a lone surrogate")
    if value != value.strip():
        raise InvalidArgument(f"{field}: {value!r} starts or ends with spaces")
    if len(value) > MAX_NAME:
        raise InvalidArgument(f"{field}: at most {MAX_NAME} characters, not {len(value)}")
    if "/" in value or any(ord(c) < 32 for c in value):
        raise InvalidArgument(f"{field}: {value!r} may contain neither '/' nor control characters")
    if _DIGITS.match(value):
        # Paths take a name or an id: a name of digits would read as another model's id.
        raise InvalidArgument(f"{field}: {value!r} is only digits, which reads as a model id")
    return value


def _text(value: Any, field: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidArgument(f"{field}: must be a string, not {type(value).__name__}")
    if unstorable(value):
        raise InvalidArgument(f"{field}: holds a NUL character or a lone surrogate")
    if len(value) > MAX_TEXT:
        raise InvalidArgument(f"{field}: at most {MAX_TEXT} characters, not {len(value)}")
    return value


def _short_text(value: Any, field: str) -> str:
    text = _text(value, field)
    if len(text) > MAX_NAME:
        raise InvalidArgument(f"{field}: at most {MAX_NAME} characters, not {len(text)}")
    return text


def check_labels(value: Any, field: str = "labels") -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"{field}: must be a list of strings")
    labels = list(dict.fromkeys(v.strip() for v in value))
    if any(unstorable(v) for v in labels):
        raise InvalidArgument(f"{field}: a label holds a NUL character or a lone surrogate")
    if "" in labels:
        raise InvalidArgument(f"{field}: a label cannot be blank")
    if len(labels) > MAX_LABELS or any(len(v) > MAX_LABEL for v in labels):
        raise InvalidArgument(
            f"{field}: at most {MAX_LABELS} labels of at most {MAX_LABEL} characters each"
        )
    return labels


def check_metadata(value: Any, field: str = "metadata") -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        kind = "a list" if isinstance(value, list) else type(value).__name__
        raise InvalidArgument(f"{field}: must be a JSON object, not {kind}")
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        raise InvalidArgument(
            f"{field}: holds a value JSON cannot carry (NaN or infinity)"
        ) from None
    if len(encoded) > MAX_METADATA_BYTES:
        raise InvalidArgument(f"{field}: at most {MAX_METADATA_BYTES} bytes of JSON")
    if any_unstorable(value):
        raise InvalidArgument(f"{field}: holds a NUL character or a lone surrogate")
    return value


# --- reading --------------------------------------------------------------------------------


async def find_model(session: AsyncSession, identifier: str) -> ModelModel:
    """By name, else by numeric id; NotFound names what was asked for."""
    if unstorable(identifier):  # no model has such a name; Postgres would refuse to look
        raise NotFound(f"modelName: no model named {identifier!r}")
    row = await session.scalar(select(ModelModel).where(ModelModel.name == identifier))
    if row is None and _DIGITS.match(identifier) and int(identifier) <= MAX_INT:
        row = await session.get(ModelModel, int(identifier))
    if row is None:
        raise NotFound(f"modelName: no model named {identifier!r} (nor with that id)")
    return row


async def _usernames(session: AsyncSession, ids: Collection[int | None]) -> dict[int, str]:
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return {}
    rows = await session.execute(
        select(UserModel.id, UserModel.username).where(UserModel.id.in_(wanted))
    )
    return {uid: name for uid, name in rows.all()}


async def _version_counts(session: AsyncSession, model_ids: Collection[int]) -> dict[int, int]:
    if not model_ids:
        return {}
    rows = await session.execute(
        select(ModelVersionModel.model_id, func.count())
        .where(ModelVersionModel.model_id.in_(list(model_ids)))
        .group_by(ModelVersionModel.model_id)
    )
    return {mid: int(count) for mid, count in rows.all()}


async def model_views(session: AsyncSession, rows: Sequence[ModelModel]) -> list[ModelView]:
    counts = await _version_counts(session, [r.id for r in rows])
    names = await _usernames(session, [r.owner_id for r in rows])
    return [
        ModelView(r, counts.get(r.id, 0), names.get(r.owner_id, "") if r.owner_id else "")
        for r in rows
    ]


async def model_view(session: AsyncSession, row: ModelModel) -> ModelView:
    return (await model_views(session, [row]))[0]


async def get_model(session: AsyncSession, identifier: str) -> ModelView:
    return await model_view(session, await find_model(session, identifier))


def _order(order_by: str, field: str = "orderBy") -> bool:
    """True for descending."""
    if order_by not in ORDERS:
        raise InvalidArgument(f"{field}: {order_by!r} is not one of {', '.join(ORDERS)}")
    return order_by == "ORDER_BY_DESC"


async def list_models(
    session: AsyncSession,
    filters: ModelFilter,
    *,
    sort_by: str = "SORT_BY_UNSPECIFIED",
    order_by: str = "ORDER_BY_UNSPECIFIED",
    offset: int = 0,
    limit: int = 0,
    readable: ColumnElement[bool] | None = None,
) -> tuple[list[ModelView], int]:
    """A page of the models that pass every filter, and how many pass. Registries are
    small (models are chosen by hand), so labels, sorting and paging are done here."""
    if sort_by not in MODEL_SORTS:
        raise InvalidArgument(f"sortBy: {sort_by!r} is not one of {', '.join(MODEL_SORTS)}")
    descending = _order(order_by)
    for field, text in (("name", filters.name), ("description", filters.description)):
        if text and unstorable(text):
            raise InvalidArgument(f"{field}: holds a NUL character or a lone surrogate")
    query = select(ModelModel)
    if readable is not None:
        query = query.where(readable)
    if filters.archived is not None:
        query = query.where(ModelModel.archived == filters.archived)
    if filters.name:
        query = query.where(
            func.lower(ModelModel.name).contains(filters.name.lower(), autoescape=True)
        )
    if filters.description:
        query = query.where(
            func.lower(ModelModel.description).contains(
                filters.description.lower(), autoescape=True
            )
        )
    if filters.model_id is not None:
        query = query.where(ModelModel.id == filters.model_id)
    if filters.user_ids:
        query = query.where(ModelModel.owner_id.in_(list(filters.user_ids)))
    if filters.users:
        query = query.where(
            ModelModel.owner_id.in_(
                select(UserModel.id).where(UserModel.username.in_(list(filters.users)))
            )
        )
    if filters.workspace_ids:
        query = query.where(ModelModel.workspace_id.in_(list(filters.workspace_ids)))
    if filters.workspace_names:
        query = query.where(
            ModelModel.workspace_id.in_(
                select(WorkspaceModel.id).where(
                    WorkspaceModel.name.in_(list(filters.workspace_names))
                )
            )
        )
    rows = list((await session.scalars(query.order_by(ModelModel.id))).all())
    if filters.labels:
        wanted = set(filters.labels)
        rows = [r for r in rows if wanted <= set(r.labels or [])]
    views = await model_views(session, rows)
    workspaces: dict[int, str] = {}
    if sort_by == "SORT_BY_WORKSPACE":
        workspaces = dict(
            (await session.execute(select(WorkspaceModel.id, WorkspaceModel.name))).tuples().all()
        )
    keys: dict[str, Any] = {
        "SORT_BY_NAME": lambda v: v.row.name,
        "SORT_BY_DESCRIPTION": lambda v: v.row.description,
        "SORT_BY_CREATION_TIME": lambda v: v.row.creation_time,
        "SORT_BY_LAST_UPDATED_TIME": lambda v: v.row.last_updated_time,
        "SORT_BY_NUM_VERSIONS": lambda v: v.num_versions,
        "SORT_BY_WORKSPACE": lambda v: workspaces.get(v.row.workspace_id, ""),
    }
    key = keys.get(sort_by)
    views.sort(key=lambda v: v.row.id, reverse=descending)  # the tie-break, then the key
    if key is not None:
        views.sort(key=key, reverse=descending)
    total = len(views)
    page = views[offset : offset + limit] if limit else views[offset:]
    return page, total


async def labels_in_use(
    session: AsyncSession, readable: ColumnElement[bool] | None = None
) -> list[str]:
    """Every label on a model (the caller may read), the most used first (Determined's
    GetModelLabels)."""
    counts: dict[str, int] = {}
    query = select(ModelModel.labels)
    if readable is not None:
        query = query.where(readable)
    for labels in (await session.scalars(query)).all():
        for label in labels or []:
            counts[label] = counts.get(label, 0) + 1
    return sorted(counts, key=lambda label: (-counts[label], label))


async def _version_views(
    session: AsyncSession, model: ModelView, rows: Sequence[ModelVersionModel]
) -> list[VersionView]:
    uuids = [r.checkpoint_uuid for r in rows]
    checkpoints = {
        c.uuid: c
        for c in (
            await session.scalars(select(CheckpointModel).where(CheckpointModel.uuid.in_(uuids)))
        ).all()
    }
    names = await _usernames(session, [r.owner_id for r in rows])
    return [
        VersionView(
            r,
            model,
            checkpoints[r.checkpoint_uuid],
            names.get(r.owner_id, "") if r.owner_id else "",
        )
        for r in rows
    ]


async def _find_version(session: AsyncSession, model: ModelModel, number: int) -> ModelVersionModel:
    row = await session.scalar(
        select(ModelVersionModel).where(
            ModelVersionModel.model_id == model.id, ModelVersionModel.version == number
        )
    )
    if row is None:
        raise NotFound(f"modelVersionNum: model {model.name!r} has no version {number}")
    return row


async def get_version(session: AsyncSession, identifier: str, number: int) -> VersionView:
    model = await find_model(session, identifier)
    row = await _find_version(session, model, number)
    return (await _version_views(session, await model_view(session, model), [row]))[0]


async def list_versions(
    session: AsyncSession,
    identifier: str,
    *,
    sort_by: str = "SORT_BY_UNSPECIFIED",
    order_by: str = "ORDER_BY_UNSPECIFIED",
    offset: int = 0,
    limit: int = 0,
) -> tuple[ModelView, list[VersionView], int]:
    if sort_by not in VERSION_SORTS:
        raise InvalidArgument(f"sortBy: {sort_by!r} is not one of {', '.join(VERSION_SORTS)}")
    descending = _order(order_by)
    model = await find_model(session, identifier)
    column = (
        ModelVersionModel.creation_time
        if sort_by == "SORT_BY_CREATION_TIME"
        else ModelVersionModel.version
    )
    query = select(ModelVersionModel).where(ModelVersionModel.model_id == model.id)
    total = int(await session.scalar(select(func.count()).select_from(query.subquery())) or 0)
    query = query.order_by(
        column.desc() if descending else column.asc(),
        ModelVersionModel.version.desc() if descending else ModelVersionModel.version.asc(),
    ).offset(offset)
    if limit:
        query = query.limit(limit)
    rows = list((await session.scalars(query)).all())
    view = await model_view(session, model)
    return view, await _version_views(session, view, rows), total


# --- changes (in the caller's transaction) --------------------------------------------------


async def _name_is_free(session: AsyncSession, name: str, field: str = "name") -> None:
    if await session.scalar(select(ModelModel.id).where(ModelModel.name == name)) is not None:
        raise AlreadyExists(f"{field}: a model named {name!r} already exists")


async def _workspace(
    session: AsyncSession, actor: Actor, workspace_id: int | None, workspace_name: str | None
) -> WorkspaceModel:
    """Where a model goes; one the actor may not see is named as one that does not exist."""
    if workspace_name:
        if unstorable(workspace_name):
            raise NotFound(f"workspaceName: no workspace named {workspace_name!r}")
        ws = await session.scalar(
            select(WorkspaceModel).where(WorkspaceModel.name == workspace_name)
        )
        if ws is None or await access.hidden(session, actor, "workspace_id", str(ws.id)):
            raise NotFound(f"workspaceName: no workspace named {workspace_name!r}")
        return ws
    if workspace_id:
        found = await session.get(WorkspaceModel, workspace_id)
        if found is None or await access.hidden(session, actor, "workspace_id", str(found.id)):
            raise NotFound(f"workspaceId: no workspace {workspace_id}")
        return found
    return await default_workspace(session)


async def _destination(
    session: AsyncSession,
    actor: Actor,
    workspace_id: int | None,
    workspace_name: str | None,
    now_in: int | None = None,
) -> WorkspaceModel:
    """Where a model is put (made or moved): a workspace the actor sees, and where they may
    make models (CREATE_MODEL_REGISTRY, an Editor's; its owner; anyone in Uncategorized),
    unless the model is there already (`now_in`)."""
    ws = await _workspace(session, actor, workspace_id, workspace_name)
    if ws.id != now_in:
        what = f"put models in workspace {ws.name!r}"
        await access.require_creator(session, actor, ws, roles.CREATE_MODEL_REGISTRY, what)
    return ws


async def create_model(
    session: AsyncSession,
    actor: Actor,
    *,
    name: Any,
    description: Any = None,
    notes: Any = None,
    labels: Any = None,
    metadata: Any = None,
    workspace_id: int | None = None,
    workspace_name: str | None = None,
) -> ModelView:
    name = check_model_name(name)
    row = ModelModel(
        name=name,
        description=_text(description, "description"),
        notes=_text(notes, "notes"),
        labels=check_labels(labels),
        metadata_=check_metadata(metadata),
        archived=False,
        workspace_id=(await _destination(session, actor, workspace_id, workspace_name)).id,
        owner_id=actor.user_id,
    )
    await _name_is_free(session, name)
    session.add(row)
    await session.flush()
    log.info("model %d %r created by %s", row.id, name, actor.username)
    return await model_view(session, row)


async def _owned_model(
    session: AsyncSession,
    actor: Actor,
    identifier: str,
    what: str,
    permission: int = roles.EDIT_MODEL_REGISTRY,
) -> ModelModel:
    """The model, if the actor may change it. Deleting someone else's model or versions
    takes permissions of their own (WorkspaceAdmin holds them, Editor does not)."""
    row = await find_model(session, identifier)
    await access.require_model_owner(
        session, actor, row.name, row.owner_id, what, row.workspace_id, permission
    )
    return row


async def patch_model(
    session: AsyncSession, actor: Actor, identifier: str, changes: dict[str, Any]
) -> ModelView:
    """Only the keys present in `changes` (a request's non-null fields) change."""
    moving = bool(changes.get("workspace_id") or changes.get("workspace_name"))
    # Taking someone else's model out of its workspace is deleting it there (WorkspaceAdmin).
    permission = roles.DELETE_OTHER_USER_MODEL_REGISTRY if moving else roles.EDIT_MODEL_REGISTRY
    row = await _owned_model(session, actor, identifier, "change it", permission)
    updates: dict[str, Any] = {}
    if changes.get("name") is not None and changes["name"] != row.name:
        updates["name"] = check_model_name(changes["name"])
        await _name_is_free(session, updates["name"])
    if changes.get("description") is not None:
        updates["description"] = _text(changes["description"], "description")
    if changes.get("notes") is not None:
        updates["notes"] = _text(changes["notes"], "notes")
    if changes.get("labels") is not None:
        updates["labels"] = check_labels(changes["labels"])
    if changes.get("metadata") is not None:
        updates["metadata_"] = check_metadata(changes["metadata"])
    if moving:
        updates["workspace_id"] = (
            await _destination(
                session,
                actor,
                changes.get("workspace_id"),
                changes.get("workspace_name"),
                now_in=row.workspace_id,
            )
        ).id
    for key, value in updates.items():
        setattr(row, key, value)
    if updates:
        row.last_updated_time = utcnow()
    await session.flush()
    return await model_view(session, row)


async def move_model(
    session: AsyncSession, actor: Actor, identifier: str, workspace_id: int
) -> ModelView:
    """Determined's MoveModel: the model (with its versions) now belongs to another workspace,
    which must exist and take new things (not archived, not being deleted)."""
    row = await _owned_model(
        session, actor, identifier, "move it", roles.DELETE_OTHER_USER_MODEL_REGISTRY
    )
    destination = await session.get(WorkspaceModel, workspace_id) if workspace_id else None
    if destination is None or await access.hidden(
        session, actor, "workspace_id", str(destination.id)
    ):
        raise NotFound(f"destinationWorkspaceId: no workspace {workspace_id}")
    if destination.deleting or destination.archived:
        state = "being deleted" if destination.deleting else "archived"
        raise InvalidArgument(
            f"destinationWorkspaceId: workspace {destination.name!r} ({destination.id}) is {state}"
        )
    if destination.id != row.workspace_id:
        what = f"put models in workspace {destination.name!r}"
        await access.require_creator(session, actor, destination, roles.CREATE_MODEL_REGISTRY, what)
    if row.workspace_id != destination.id:
        row.workspace_id = destination.id
        row.last_updated_time = utcnow()
        await session.flush()
        log.info("model %r moved to workspace %r by %s", row.name, destination.name, actor.username)
    return await model_view(session, row)


async def set_archived(
    session: AsyncSession, actor: Actor, identifier: str, archived: bool
) -> None:
    row = await _owned_model(
        session, actor, identifier, "archive it" if archived else "unarchive it"
    )
    if row.archived != archived:
        row.archived = archived
        row.last_updated_time = utcnow()


async def delete_model(session: AsyncSession, actor: Actor, identifier: str) -> None:
    """The model and its versions; their checkpoints stay, no longer held by them."""
    row = await _owned_model(
        session, actor, identifier, "delete it", roles.DELETE_OTHER_USER_MODEL_REGISTRY
    )
    # Explicitly, not left to the foreign key's cascade: SQLite connections may have it off.
    removed = await session.execute(
        delete(ModelVersionModel).where(ModelVersionModel.model_id == row.id)
    )
    await session.execute(delete(ModelModel).where(ModelModel.id == row.id))
    versions = getattr(removed, "rowcount", 0)
    log.info("model %r deleted by %s with %d versions", row.name, actor.username, versions)


async def _registrable_checkpoint(
    session: AsyncSession, actor: Actor, uuid: Any, field: str
) -> CheckpointModel:
    """A completed checkpoint the actor may read (one they may not is "no checkpoint", as
    one that does not exist)."""
    if not isinstance(uuid, str) or not uuid.strip():
        raise InvalidArgument(f"{field}: give the uuid of a checkpoint to register")
    try:
        canonical = str(uuidlib.UUID(uuid.strip()))
    except ValueError:
        canonical = None  # not a uuid, so not a checkpoint's
    checkpoint = await session.get(CheckpointModel, canonical) if canonical else None
    if checkpoint is None or await access.hidden(session, actor, "uuid", checkpoint.uuid):
        raise NotFound(f"{field}: no checkpoint {uuid}")
    if checkpoint.state != COMPLETED:
        shown = (
            "being deleted"
            if checkpoint.state in ("DELETING", "PARTIALLY_DELETED")
            else checkpoint.state
        )
        raise InvalidArgument(
            f"{field}: checkpoint {checkpoint.uuid} is {shown}; only a completed checkpoint "
            "can be registered"
        )
    # Take the checkpoint's row lock, still COMPLETED: a retention decision or a delete
    # running beside this one either went first (nothing matches: refused) or waits for
    # this transaction, and its deleter then finds the version (checkpoint_gc).
    held = await session.execute(
        update(CheckpointModel)
        .where(CheckpointModel.uuid == checkpoint.uuid, CheckpointModel.state == COMPLETED)
        .values(state=COMPLETED)
        .execution_options(synchronize_session=False)
    )
    if getattr(held, "rowcount", 1) == 0:
        raise InvalidArgument(
            f"{field}: checkpoint {checkpoint.uuid} is being deleted; only a completed "
            "checkpoint can be registered"
        )
    return checkpoint


async def register_version(
    session: AsyncSession,
    actor: Actor,
    identifier: str,
    *,
    checkpoint_uuid: Any,
    name: Any = None,
    comment: Any = None,
    notes: Any = None,
    labels: Any = None,
    metadata: Any = None,
) -> VersionView:
    """The model's next version (its highest number plus one) holding the checkpoint."""
    model = await _owned_model(session, actor, identifier, "register versions of it")
    if model.archived:
        raise InvalidArgument(
            f"modelName: model {model.name!r} is archived; unarchive it to register versions"
        )
    checkpoint = await _registrable_checkpoint(session, actor, checkpoint_uuid, "checkpointUuid")
    fields = dict(
        name=_short_text(name, "name"),
        comment=_text(comment, "comment"),
        notes=_text(notes, "notes"),
        labels=check_labels(labels),
        metadata_=check_metadata(metadata),
    )
    # Two registrations at once may pick the same number: the (model, version) unique
    # constraint refuses the second, a 409 to retry, never a duplicate.
    highest = await session.scalar(
        select(func.max(ModelVersionModel.version)).where(ModelVersionModel.model_id == model.id)
    )
    row = ModelVersionModel(
        model_id=model.id,
        version=(highest or 0) + 1,
        checkpoint_uuid=checkpoint.uuid,
        owner_id=actor.user_id,
        **fields,
    )
    session.add(row)
    model.last_updated_time = utcnow()
    await session.flush()
    log.info(
        "model %r version %d holds checkpoint %s (by %s)",
        model.name,
        row.version,
        checkpoint.uuid,
        actor.username,
    )
    return (await _version_views(session, await model_view(session, model), [row]))[0]


async def patch_version(
    session: AsyncSession, actor: Actor, identifier: str, number: int, changes: dict[str, Any]
) -> VersionView:
    model = await _owned_model(session, actor, identifier, "change its versions")
    row = await _find_version(session, model, number)
    updates: dict[str, Any] = {}
    checkpoint = changes.get("checkpoint")
    if checkpoint is not None:
        uuid = checkpoint.get("uuid") if isinstance(checkpoint, dict) else None
        if uuid != row.checkpoint_uuid:
            updates["checkpoint_uuid"] = (
                await _registrable_checkpoint(session, actor, uuid, "checkpoint.uuid")
            ).uuid
    if changes.get("name") is not None:
        updates["name"] = _short_text(changes["name"], "name")
    for key in ("comment", "notes"):
        if changes.get(key) is not None:
            updates[key] = _text(changes[key], key)
    if changes.get("labels") is not None:
        updates["labels"] = check_labels(changes["labels"])
    if changes.get("metadata") is not None:
        updates["metadata_"] = check_metadata(changes["metadata"])
    for key, value in updates.items():
        setattr(row, key, value)
    if updates:
        row.last_updated_time = utcnow()
    await session.flush()
    return (await _version_views(session, await model_view(session, model), [row]))[0]


async def delete_version(session: AsyncSession, actor: Actor, identifier: str, number: int) -> None:
    """The version goes; its checkpoint stays, and is the retention's and users' again."""
    model = await _owned_model(
        session, actor, identifier, "delete its versions", roles.DELETE_OTHER_USER_MODEL_VERSION
    )
    row = await _find_version(session, model, number)
    await session.delete(row)
    model.last_updated_time = utcnow()
    await session.flush()
    log.info("model %r version %d deleted by %s", model.name, number, actor.username)
