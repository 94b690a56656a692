"""Roles, on Determined's routes (`det rbac ...`): anyone signed in may list the roles and
their own permissions; who holds what is for those who assign roles (ClusterAdmins, and
WorkspaceAdmins for their workspaces); assigning needs ASSIGN_ROLES where it applies."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from master.api.deps import CurrentActor, ObjectId, SessionDep
from master.core import roles
from master.errors import InvalidArgument, NotFound, PermissionDenied
from master.schemas.common import Pagination
from master.schemas.roles import (
    AssignmentsRequest,
    GroupRoles,
    PermissionsSummary,
    Role,
    RoleAssignmentInput,
    RoleAssignmentSummary,
    RoleList,
    RolesById,
    RoleSearch,
    RolesWithAssignments,
    RoleWithAssignments,
)
from master.services import access, user_groups
from master.services import roles as role_service
from master.services.access import Actor

router = APIRouter(prefix="/api/v1", tags=["Roles"])

DEFAULT_LIMIT = 500


def _listed(body: RoleSearch) -> RoleList:
    """The roles by name; with a workspace, those that may be assigned in one."""
    found = sorted(roles.ROLES.values(), key=lambda r: r.name)
    if body.workspace_id is not None:
        found = [r for r in found if not r.cluster_only]
    limit = body.limit or DEFAULT_LIMIT
    page = found[body.offset : body.offset + limit]
    return RoleList(
        roles=[Role.of(r) for r in page],
        pagination=Pagination.of(body.offset, limit, len(page), len(found)),
    )


@router.post("/roles/search")
async def list_roles(body: RoleSearch, _actor: CurrentActor) -> RoleList:
    return _listed(body)


@router.post("/roles/search/by-assignability")
async def roles_assignable(body: RoleSearch, _actor: CurrentActor) -> RoleList:
    return _listed(body)


def _not_a_role_reader(actor: Actor, what: str) -> PermissionDenied:
    return PermissionDenied(
        f"{what} is for those who assign roles (ClusterAdmin, WorkspaceAdmin); user "
        f"{actor.username} holds {roles.PERMISSIONS[roles.ASSIGN_ROLES].enum} nowhere"
    )


async def _require_role_reader(session: SessionDep, actor: Actor, what: str) -> None:
    if not await access.may_anywhere(session, actor, roles.ASSIGN_ROLES):
        raise _not_a_role_reader(actor, what)


async def _in_sight(
    session: SessionDep, actor: Actor, held: list[role_service.Held]
) -> list[role_service.Held]:
    """Assignments as `actor` may see them: those across the cluster, in workspaces the
    actor reads, and the actor's own and their groups' (known to them wherever they are);
    another's elsewhere would name a workspace kept from them."""
    seen = await access.sight(session, actor, roles.VIEW_WORKSPACE)
    mine = await role_service.groups_of(session, actor.user_id)
    return [
        h
        for h in held
        if h.workspace_id is None
        or seen.sees(h.workspace_id)
        or h.user_id == actor.user_id
        or (h.group_id is not None and h.group_id in mine)
    ]


@router.post("/roles/search/by-ids")
async def roles_by_id(
    body: RolesById, session: SessionDep, actor: CurrentActor
) -> RolesWithAssignments:
    """Each role with everyone holding it; for those who do not assign roles, only roles
    they hold themselves, with their own assignments (`det rbac describe-role` of a role
    one holds)."""
    reader = await access.may_anywhere(session, actor, roles.ASSIGN_ROLES)
    mine = [] if reader else await role_service.held_by_user(session, actor.user_id)
    found = []
    for i, role_id in enumerate(body.role_ids or []):
        role = roles.ROLES.get(role_id)
        if role is None:
            raise NotFound(f"roleIds[{i}]: role {role_id} not found")
        if reader:
            held = await _in_sight(
                session, actor, await role_service.assignments_of_role(session, role)
            )
        else:
            held = [h for h in mine if h.role.id == role_id]
            if not held:
                raise _not_a_role_reader(actor, f"seeing who holds role {role.name}")
        found.append(RoleWithAssignments.of(role, held))
    return RolesWithAssignments(roles=found)


@router.get("/roles/search/by-user/{user_id}")
async def roles_of_user(
    user_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> RolesWithAssignments:
    if user_id == actor.user_id:
        held = await role_service.held_by_user(session, user_id)
    else:
        await _require_role_reader(session, actor, "seeing another user's roles")
        held = await _in_sight(session, actor, await role_service.held_by_user(session, user_id))
    return RolesWithAssignments(roles=RoleWithAssignments.each(held))


@router.get("/roles/search/by-group/{group_id}")
async def roles_of_group(
    group_id: ObjectId, session: SessionDep, actor: CurrentActor
) -> GroupRoles:
    # A group one may not see is answered as one that does not exist.
    member = await role_service.is_group_member(session, actor.user_id, group_id)
    if not member and not await access.may_anywhere(session, actor, roles.ASSIGN_ROLES):
        raise NotFound(f"user group {group_id} not found")
    await user_groups.get_group(session, group_id)  # 404 for an unknown group
    held = await _in_sight(session, actor, await role_service.held_by_group(session, group_id))
    found, summaries = RoleAssignmentSummary.each(held)
    return GroupRoles(roles=found, assignments=summaries)


@router.get("/permissions/summary")
async def my_permissions(session: SessionDep, actor: CurrentActor) -> PermissionsSummary:
    found, summaries = RoleAssignmentSummary.each(
        await role_service.held_by_user(session, actor.user_id)
    )
    return PermissionsSummary(roles=found, assignments=summaries)


def _item(
    field: str, given: RoleAssignmentInput, user_id: int | None = None, group_id: int | None = None
) -> role_service.Assignment:
    if given.scope_cluster and given.scope_workspace_id is not None:
        raise InvalidArgument(
            f"{field}.roleAssignment: scopeCluster and scopeWorkspaceId name two scopes; give one"
        )
    return role_service.Assignment(
        role_id=given.role.role_id,
        workspace_id=given.scope_workspace_id,
        user_id=user_id,
        group_id=group_id,
        field=field,
    )


def _assignments(body: AssignmentsRequest) -> list[role_service.Assignment]:
    users = body.user_role_assignments or []
    groups = body.group_role_assignments or []
    return [
        _item(f"userRoleAssignments[{i}]", a.role_assignment, user_id=a.user_id)
        for i, a in enumerate(users)
    ] + [
        _item(f"groupRoleAssignments[{i}]", a.role_assignment, group_id=a.group_id)
        for i, a in enumerate(groups)
    ]


@router.post("/roles/add-assignments")
async def assign_roles(
    body: AssignmentsRequest, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    await role_service.assign(session, actor, _assignments(body))
    return {}


@router.post("/roles/remove-assignments")
async def remove_assignments(
    body: AssignmentsRequest, session: SessionDep, actor: CurrentActor
) -> dict[str, Any]:
    await role_service.remove(session, actor, _assignments(body))
    return {}
