"""Role assignments (`det rbac`): which roles users and groups hold, in which workspaces.

ClusterAdmin given to a user is that user's admin flag (`det user create --admin`): one
truth for "is an admin", read on every request without a join. It is given to users only,
never to groups. Every other role is a row of role_assignments.

Every check of a request runs before anything is written, so a refused request changes
nothing (Determined applies a request's assignments all or none, too).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import roles
from master.core.roles import Role
from master.db.models import (
    RoleAssignmentModel,
    UserGroupMemberModel,
    UserGroupModel,
    UserModel,
    WorkspaceModel,
)
from master.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from master.services import access
from master.services.access import Actor, assigned_to, forget_grants, may

log = logging.getLogger(__name__)

MAX_ASSIGNMENTS_PER_REQUEST = 1_000


@dataclass(frozen=True)
class Assignment:
    """One role given to a user or a group (exactly one set), in a workspace or (None)
    across the cluster. `field` names it in the request, for refusals."""

    role_id: int
    workspace_id: int | None
    user_id: int | None = None
    group_id: int | None = None
    field: str = ""


# -- what the wire lists ---------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """An assignment as the routes list it: to a user (directly) or to a group."""

    role: Role
    workspace_id: int | None
    user_id: int | None
    group_id: int | None


async def _admin_ids(session: AsyncSession) -> list[int]:
    return list(
        (
            await session.scalars(
                select(UserModel.id).where(UserModel.admin.is_(True)).order_by(UserModel.id)
            )
        ).all()
    )


async def assignments_of_role(session: AsyncSession, role: Role) -> list[Held]:
    """Everyone holding the role, anywhere (`det rbac describe-role`)."""
    if role.id == roles.CLUSTER_ADMIN:
        return [Held(role, None, uid, None) for uid in await _admin_ids(session)]
    rows = await session.execute(
        select(
            RoleAssignmentModel.workspace_id,
            RoleAssignmentModel.user_id,
            RoleAssignmentModel.group_id,
        )
        .where(RoleAssignmentModel.role_id == role.id)
        .order_by(RoleAssignmentModel.id)
    )
    return [Held(role, ws, uid, gid) for ws, uid, gid in rows.all()]


async def held_by_user(session: AsyncSession, user_id: int) -> list[Held]:
    """The user's assignments, direct and through groups, by role name."""
    user = await session.get(UserModel, user_id)
    if user is None:
        raise NotFound(f"user {user_id} not found")
    found: list[Held] = []
    if user.admin:
        found.append(Held(roles.ROLES[roles.CLUSTER_ADMIN], None, user_id, None))
    rows = await session.execute(assigned_to(user_id))
    found += [
        Held(roles.ROLES[role_id], ws, uid, gid)
        for role_id, ws, uid, gid in rows.all()
        if role_id in roles.ROLES
    ]
    return sorted(found, key=lambda h: h.role.name)


async def held_by_group(session: AsyncSession, group_id: int) -> list[Held]:
    rows = await session.execute(
        select(RoleAssignmentModel.role_id, RoleAssignmentModel.workspace_id)
        .where(RoleAssignmentModel.group_id == group_id)
        .order_by(RoleAssignmentModel.id)
    )
    held = [
        Held(roles.ROLES[role_id], ws, None, group_id)
        for role_id, ws in rows.all()
        if role_id in roles.ROLES
    ]
    return sorted(held, key=lambda h: h.role.name)


@dataclass(frozen=True)
class Member:
    """Someone holding a role in a workspace, as the dashboard lists them."""

    name: str
    kind: str  # "user" or "group"
    role: str


async def members_of_workspace(session: AsyncSession, workspace_id: int) -> list[Member]:
    """The users and groups holding a role in the workspace, by name then role."""
    rows = await session.execute(
        select(RoleAssignmentModel.role_id, UserModel.username, UserGroupModel.name)
        .outerjoin(UserModel, UserModel.id == RoleAssignmentModel.user_id)
        .outerjoin(UserGroupModel, UserGroupModel.id == RoleAssignmentModel.group_id)
        .where(RoleAssignmentModel.workspace_id == workspace_id)
    )
    members = [
        Member(user or group or "", "user" if user else "group", roles.ROLES[role_id].name)
        for role_id, user, group in rows.all()
        if role_id in roles.ROLES
    ]
    return sorted(members, key=lambda m: (m.name, m.kind, m.role))


async def is_group_member(session: AsyncSession, user_id: int, group_id: int) -> bool:
    found = await session.scalar(
        select(UserGroupMemberModel.user_id).where(
            UserGroupMemberModel.user_id == user_id, UserGroupMemberModel.group_id == group_id
        )
    )
    return found is not None


async def groups_of(session: AsyncSession, user_id: int) -> set[int]:
    rows = await session.scalars(
        select(UserGroupMemberModel.group_id).where(UserGroupMemberModel.user_id == user_id)
    )
    return set(rows.all())


# -- assigning -------------------------------------------------------------------------------


async def _existing(session: AsyncSession, item: Assignment) -> list[int]:
    scope = (
        RoleAssignmentModel.workspace_id.is_(None)
        if item.workspace_id is None
        else RoleAssignmentModel.workspace_id == item.workspace_id
    )
    holder = (
        RoleAssignmentModel.user_id == item.user_id
        if item.user_id is not None
        else RoleAssignmentModel.group_id == item.group_id
    )
    rows = await session.scalars(
        select(RoleAssignmentModel.id).where(
            RoleAssignmentModel.role_id == item.role_id, scope, holder
        )
    )
    return list(rows.all())


async def _check(session: AsyncSession, actor: Actor, item: Assignment) -> tuple[Role, str]:
    """Refuses what cannot be assigned or removed, naming the field; returns the role and
    words for the log."""
    role = roles.ROLES.get(item.role_id)
    if role is None:
        raise NotFound(f"{item.field}.roleAssignment.role.roleId: role {item.role_id} not found")
    where = "across the cluster"
    if item.workspace_id is not None:
        ws = await session.get(WorkspaceModel, item.workspace_id)
        if ws is None or await access.hidden(
            session, actor, "workspace_id", str(item.workspace_id)
        ):
            raise NotFound(
                f"{item.field}.roleAssignment.scopeWorkspaceId: workspace {item.workspace_id} "
                "not found"
            )
        if role.cluster_only:
            raise InvalidArgument(
                f"{item.field}.roleAssignment.scopeWorkspaceId: role {role.name} holds "
                "permissions that exist only across the cluster, so it is assigned without a "
                "workspace"
            )
        where = f"in workspace {ws.name!r}"
        # A workspace's owner (its creator) manages it, roles included, as its WorkspaceAdmin.
        owner = ws.user_id is not None and ws.user_id == actor.user_id
        if not owner and not await may(session, actor, roles.ASSIGN_ROLES, item.workspace_id):
            raise PermissionDenied(
                f"{item.field}: assigning roles in workspace {ws.name!r} needs "
                f"{_enum(roles.ASSIGN_ROLES)} there (WorkspaceAdmin or ClusterAdmin); user "
                f"{actor.username} does not hold it"
            )
    elif not actor.admin:
        raise PermissionDenied(
            f"{item.field}: assigning roles across the cluster is for ClusterAdmins; user "
            f"{actor.username} is not one"
        )
    if item.user_id is not None:
        if await session.get(UserModel, item.user_id) is None:
            raise NotFound(f"{item.field}.userId: user {item.user_id} not found")
    elif await session.get(UserGroupModel, item.group_id) is None:
        raise NotFound(f"{item.field}.groupId: group {item.group_id} not found")
    elif role.id == roles.CLUSTER_ADMIN:
        raise InvalidArgument(
            f"{item.field}.roleAssignment.role.roleId: ClusterAdmin is given to users (it is "
            "their admin flag), not to groups"
        )
    return role, where


def _enum(permission: int) -> str:
    return roles.PERMISSIONS[permission].enum


def _holder(item: Assignment) -> str:
    return f"user {item.user_id}" if item.user_id is not None else f"group {item.group_id}"


def _refuse_too_many(items: Sequence[Assignment]) -> None:
    if not items:
        raise InvalidArgument(
            "userRoleAssignments, groupRoleAssignments: name at least one assignment"
        )
    if len(items) > MAX_ASSIGNMENTS_PER_REQUEST:
        raise InvalidArgument(
            f"userRoleAssignments, groupRoleAssignments: at most "
            f"{MAX_ASSIGNMENTS_PER_REQUEST:,} assignments per request"
        )


async def assign(session: AsyncSession, actor: Actor, items: Sequence[Assignment]) -> None:
    _refuse_too_many(items)
    checked = [(item, *await _check(session, actor, item)) for item in items]
    for item, _role, _where in checked:
        ws = await session.get(WorkspaceModel, item.workspace_id) if item.workspace_id else None
        if ws is not None and ws.deleting:
            # Nothing new goes into a workspace on its way out (and a role's row must not
            # wait on the deletion's locks: Postgres would end one of the two as a deadlock).
            raise InvalidArgument(
                f"{item.field}.roleAssignment.scopeWorkspaceId: workspace {ws.name!r} "
                f"({ws.id}) is being deleted"
            )
    seen: set[tuple[int, int | None, int | None, int | None]] = set()
    for item, role, where in checked:
        key = (item.role_id, item.workspace_id, item.user_id, item.group_id)
        held = key in seen
        if role.id == roles.CLUSTER_ADMIN:
            user = await session.get(UserModel, item.user_id)
            held = held or bool(user and user.admin)
        else:
            held = held or bool(await _existing(session, item))
        if held:
            raise AlreadyExists(f"{item.field}: {_holder(item)} already holds {role.name} {where}")
        seen.add(key)
    for item, role, where in checked:
        if role.id == roles.CLUSTER_ADMIN:
            user = await session.get(UserModel, item.user_id)
            assert user is not None  # checked above
            user.admin = True
        else:
            session.add(
                RoleAssignmentModel(
                    role_id=item.role_id,
                    workspace_id=item.workspace_id,
                    user_id=item.user_id,
                    group_id=item.group_id,
                )
            )
        log.info("role %s given to %s %s by %s", role.name, _holder(item), where, actor.username)
    await session.flush()
    forget_grants(session)


async def remove(session: AsyncSession, actor: Actor, items: Sequence[Assignment]) -> None:
    """Removing ClusterAdmin needs a ClusterAdmin and never takes the caller's own; the
    admins' rows are locked first, so two admins removing each other at once cannot leave
    none (the second waits, then sees the first's change)."""
    _refuse_too_many(items)
    if any(item.role_id == roles.CLUSTER_ADMIN for item in items):
        await session.execute(
            select(UserModel.id).where(UserModel.admin.is_(True)).with_for_update()
        )
    checked = [(item, *await _check(session, actor, item)) for item in items]
    seen: set[tuple[int, int | None, int | None, int | None]] = set()
    rows: list[int] = []  # the role_assignments rows to delete
    for item, role, where in checked:
        key = (item.role_id, item.workspace_id, item.user_id, item.group_id)
        if key in seen:  # named twice: the second finds nothing left to remove
            raise NotFound(f"{item.field}: {_holder(item)} does not hold {role.name} {where}")
        seen.add(key)
        if role.id == roles.CLUSTER_ADMIN:
            # Read again: a change the lock waited for is committed now.
            user = await session.get(UserModel, item.user_id, populate_existing=True)
            if user is None or not user.admin:
                raise NotFound(f"{item.field}: {_holder(item)} does not hold {role.name} {where}")
            if user.id == actor.user_id:
                raise InvalidArgument(
                    f"{item.field}: an admin cannot remove their own ClusterAdmin; ask another "
                    "admin"
                )
        else:
            existing = await _existing(session, item)
            if not existing:
                raise NotFound(f"{item.field}: {_holder(item)} does not hold {role.name} {where}")
            rows += existing
    if any(role.id == roles.CLUSTER_ADMIN for _, role, _ in checked):
        actor_row = await session.get(UserModel, actor.user_id, populate_existing=True)
        if actor_row is None or not (actor_row.admin and actor_row.active):
            # The caller's own ClusterAdmin went while this request waited for the lock.
            raise PermissionDenied(f"user {actor.username} is no longer a ClusterAdmin")
    if rows:
        await session.execute(delete(RoleAssignmentModel).where(RoleAssignmentModel.id.in_(rows)))
    for item, role, where in checked:
        if role.id == roles.CLUSTER_ADMIN:
            user = await session.get(UserModel, item.user_id)
            assert user is not None  # checked above
            user.admin = False
        log.info(
            "role %s removed from %s %s by %s", role.name, _holder(item), where, actor.username
        )
    await session.flush()
    forget_grants(session)
