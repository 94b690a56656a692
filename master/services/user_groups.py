"""User groups: named sets of users, as Determined's `det user-group` manages them.

Every check runs before anything is written, so a refused request changes nothing.
Memberships go with their group or their user through the foreign keys' cascade.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.text import unstorable
from master.db.models import UserGroupMemberModel, UserGroupModel, UserModel
from master.errors import AlreadyExists, InvalidArgument, NotFound
from master.services.workspaces import checked_name

log = logging.getLogger(__name__)

# One request's user ids stay well under the databases' limits on bound parameters.
MAX_USERS_PER_REQUEST = 1_000
MAX_LIMIT = 10_000


@dataclass(frozen=True)
class GroupSummary:
    id: int
    name: str
    num_members: int


@dataclass(frozen=True)
class GroupDetails:
    id: int
    name: str
    members: list[UserModel]  # by user id


# -- checks -----------------------------------------------------------------------------


def _checked_user_ids(ids: Sequence[int] | None, field: str) -> list[int]:
    """The ids once each, in the order given."""
    unique = list(dict.fromkeys(ids or []))
    if len(unique) > MAX_USERS_PER_REQUEST:
        raise InvalidArgument(
            f"{field}: {len(unique)} users in one request; at most {MAX_USERS_PER_REQUEST}"
        )
    return unique


async def _users(session: AsyncSession, ids: list[int], field: str) -> dict[int, UserModel]:
    """The users with these ids, or a 400 naming the ids that are no user's."""
    if not ids:
        return {}
    found = {u.id: u for u in await session.scalars(select(UserModel).where(UserModel.id.in_(ids)))}
    missing = [i for i in ids if i not in found]
    if missing:
        raise InvalidArgument(f"{field}: no user has id {', '.join(map(str, missing))}")
    return found


async def _refuse_clashing_name(
    session: AsyncSession, name: str, field: str, except_id: int | None = None
) -> None:
    existing = await session.scalar(select(UserGroupModel.id).where(UserGroupModel.name == name))
    if existing is not None and existing != except_id:
        raise AlreadyExists(f"{field}: a user group named {name!r} already exists ({existing})")


async def _member_ids(session: AsyncSession, group_id: int) -> set[int]:
    rows = await session.scalars(
        select(UserGroupMemberModel.user_id).where(UserGroupMemberModel.group_id == group_id)
    )
    return set(rows)


def _names(users: dict[int, UserModel], ids: list[int]) -> str:
    return ", ".join(f"{users[i].username!r} ({i})" for i in ids)


# -- reads ------------------------------------------------------------------------------


async def get_group(session: AsyncSession, group_id: int) -> UserGroupModel:
    group = await session.get(UserGroupModel, group_id)
    if group is None:
        raise NotFound(f"user group {group_id} not found")
    return group


async def describe_group(session: AsyncSession, group_id: int) -> GroupDetails:
    group = await get_group(session, group_id)
    members = await session.scalars(
        select(UserModel)
        .join(UserGroupMemberModel, UserGroupMemberModel.user_id == UserModel.id)
        .where(UserGroupMemberModel.group_id == group_id)
        .order_by(UserModel.id)
    )
    return GroupDetails(id=group.id, name=group.name, members=list(members))


async def search_groups(
    session: AsyncSession,
    *,
    name: str | None = None,
    user_id: int | None = None,
    offset: int = 0,
    limit: int = 0,
) -> tuple[list[GroupSummary], int]:
    """Groups by id, with the name given exactly and those `user_id` is in; `limit` 0
    returns every one. Also the number matching, for the pagination."""
    if limit > MAX_LIMIT:
        raise InvalidArgument(f"limit: {limit} is more than {MAX_LIMIT}")
    matching = select(UserGroupModel.id)
    if name is not None:
        if unstorable(name):
            return [], 0  # no stored name holds such text (and Postgres would not take it)
        matching = matching.where(UserGroupModel.name == name)
    if user_id is not None:
        matching = matching.where(
            UserGroupModel.id.in_(
                select(UserGroupMemberModel.group_id).where(UserGroupMemberModel.user_id == user_id)
            )
        )
    total = await session.scalar(select(func.count()).select_from(matching.subquery())) or 0
    members = (
        select(UserGroupMemberModel.group_id, func.count().label("n"))
        .group_by(UserGroupMemberModel.group_id)
        .subquery()
    )
    page = (
        select(UserGroupModel.id, UserGroupModel.name, func.coalesce(members.c.n, 0))
        .outerjoin(members, members.c.group_id == UserGroupModel.id)
        .where(UserGroupModel.id.in_(matching))
        .order_by(UserGroupModel.id)
        .offset(offset)
    )
    if limit:
        page = page.limit(limit)
    rows = (await session.execute(page)).all()
    return [GroupSummary(id=r[0], name=r[1], num_members=r[2]) for r in rows], total


# -- changes ----------------------------------------------------------------------------


async def create_group(
    session: AsyncSession, name: object, add_user_ids: Sequence[int] | None
) -> UserGroupModel:
    checked = checked_name(name, "name")
    ids = _checked_user_ids(add_user_ids, "addUsers")
    await _refuse_clashing_name(session, checked, "name")
    await _users(session, ids, "addUsers")
    group = UserGroupModel(name=checked)
    session.add(group)
    await session.flush()
    session.add_all(UserGroupMemberModel(group_id=group.id, user_id=i) for i in ids)
    await session.flush()
    log.info("created user group %s (%d) with %d users", checked, group.id, len(ids))
    return group


async def update_group(
    session: AsyncSession,
    group_id: int,
    *,
    name: object | None = None,
    add_user_ids: Sequence[int] | None = None,
    remove_user_ids: Sequence[int] | None = None,
) -> None:
    """Rename, add and remove in one change: all of it or, refused, none."""
    group = await get_group(session, group_id)
    checked = None if name is None else checked_name(name, "name")
    adding = _checked_user_ids(add_user_ids, "addUsers")
    removing = _checked_user_ids(remove_user_ids, "removeUsers")
    both = [i for i in adding if i in set(removing)]
    if both:
        raise InvalidArgument(
            f"addUsers, removeUsers: user ids {', '.join(map(str, both))} are in both"
        )
    if checked is not None:
        await _refuse_clashing_name(session, checked, "name", group.id)
    users = await _users(session, adding, "addUsers")
    users |= await _users(session, removing, "removeUsers")
    members = await _member_ids(session, group.id)
    already = [i for i in adding if i in members]
    if already:
        raise InvalidArgument(
            f"addUsers: already in user group {group.name!r}: {_names(users, already)}"
        )
    absent = [i for i in removing if i not in members]
    if absent:
        raise InvalidArgument(
            f"removeUsers: not in user group {group.name!r}: {_names(users, absent)}"
        )

    if checked is not None and checked != group.name:
        log.info("renamed user group %d from %s to %s", group.id, group.name, checked)
        group.name = checked
    session.add_all(UserGroupMemberModel(group_id=group.id, user_id=i) for i in adding)
    if removing:
        await session.execute(
            delete(UserGroupMemberModel).where(
                UserGroupMemberModel.group_id == group.id,
                UserGroupMemberModel.user_id.in_(removing),
            )
        )
    await session.flush()
    if adding or removing:
        log.info("user group %s (%d): added %s, removed %s", group.name, group.id, adding, removing)


async def delete_group(session: AsyncSession, group_id: int) -> None:
    group = await get_group(session, group_id)
    # The members' rows go by the foreign key's cascade (SQLite: foreign_keys is on).
    await session.execute(delete(UserGroupModel).where(UserGroupModel.id == group.id))
    log.info("deleted user group %s (%d)", group.name, group.id)
