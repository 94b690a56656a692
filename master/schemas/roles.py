"""Determined's RBAC messages (v1Role, v1Permission, v1RoleAssignment, v1RoleWithAssignments,
v1RoleAssignmentSummary and their requests), as its `det rbac` sends and parses them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from master.core import roles
from master.schemas.common import DbInt, Pagination, WireInput, WireModel
from master.services.roles import Held


class ScopeTypeMask(WireModel):
    cluster: bool = True
    workspace: bool


class Permission(WireModel):
    id: str  # the PermissionType enum name
    name: str
    scope_type_mask: ScopeTypeMask

    @classmethod
    def of(cls, p: roles.Permission) -> Permission:
        return cls(
            id=p.enum, name=p.name, scope_type_mask=ScopeTypeMask(workspace=not p.cluster_only)
        )


class Role(WireModel):
    role_id: int
    name: str
    permissions: list[Permission]
    scope_type_mask: ScopeTypeMask

    @classmethod
    def of(cls, role: roles.Role, with_permissions: bool = True) -> Role:
        return cls(
            role_id=role.id,
            name=role.name,
            permissions=[Permission.of(p) for p in role.permissions] if with_permissions else [],
            scope_type_mask=ScopeTypeMask(workspace=not role.cluster_only),
        )


class RoleAssignment(WireModel):
    role: Role
    scope_workspace_id: int | None
    scope_cluster: bool

    @classmethod
    def of(cls, held: Held) -> RoleAssignment:
        return cls(
            role=Role.of(held.role, with_permissions=False),
            scope_workspace_id=held.workspace_id,
            scope_cluster=held.workspace_id is None,
        )


class UserRoleAssignment(WireModel):
    user_id: int
    role_assignment: RoleAssignment


class GroupRoleAssignment(WireModel):
    group_id: int
    role_assignment: RoleAssignment


class RoleWithAssignments(WireModel):
    role: Role
    group_role_assignments: list[GroupRoleAssignment]
    user_role_assignments: list[UserRoleAssignment]

    @classmethod
    def of(cls, role: roles.Role, held: Sequence[Held]) -> RoleWithAssignments:
        mine = [h for h in held if h.role.id == role.id]
        return cls(
            role=Role.of(role),
            group_role_assignments=[
                GroupRoleAssignment(group_id=h.group_id, role_assignment=RoleAssignment.of(h))
                for h in mine
                if h.group_id is not None
            ],
            user_role_assignments=[
                UserRoleAssignment(user_id=h.user_id, role_assignment=RoleAssignment.of(h))
                for h in mine
                if h.user_id is not None
            ],
        )

    @classmethod
    def each(cls, held: Sequence[Held]) -> list[RoleWithAssignments]:
        """One per role held, in the order of `held` (by role name)."""
        seen: dict[int, roles.Role] = {}
        for h in held:
            seen.setdefault(h.role.id, h.role)
        return [cls.of(role, held) for role in seen.values()]


class RoleAssignmentSummary(WireModel):
    role_id: int
    scope_workspace_ids: list[int]
    scope_cluster: bool

    @classmethod
    def each(cls, held: Sequence[Held]) -> tuple[list[Role], list[RoleAssignmentSummary]]:
        """One summary per role held, and the roles in the same order (the client pairs
        them by position)."""
        by_role: dict[int, tuple[roles.Role, set[int], bool]] = {}
        for h in held:
            role, workspaces, cluster = by_role.get(h.role.id, (h.role, set(), False))
            if h.workspace_id is None:
                cluster = True
            else:
                workspaces.add(h.workspace_id)
            by_role[h.role.id] = (role, workspaces, cluster)
        return (
            [Role.of(role) for role, _, _ in by_role.values()],
            [
                cls(role_id=role.id, scope_workspace_ids=sorted(ws), scope_cluster=cluster)
                for role, ws, cluster in by_role.values()
            ],
        )


class PermissionsSummary(WireModel):
    roles: list[Role]
    assignments: list[RoleAssignmentSummary]


class GroupRoles(WireModel):
    roles: list[Role]
    assignments: list[RoleAssignmentSummary]


class RolesWithAssignments(WireModel):
    roles: list[RoleWithAssignments]


class RoleList(WireModel):
    roles: list[Role]
    pagination: Pagination


class RoleSearch(WireInput):
    """v1ListRolesRequest / v1SearchRolesAssignableToScopeRequest: with a workspace, only
    the roles that may be assigned in one. A limit of 0 lists up to 500."""

    limit: DbInt = 0
    offset: DbInt = 0
    workspace_id: DbInt | None = None


class RolesById(WireInput):
    role_ids: list[DbInt] | None = None


class RoleRef(WireInput):
    """The client sends the role's id; a whole v1Role sent back is accepted too."""

    role_id: DbInt
    name: Any = None
    permissions: Any = None
    scope_type_mask: Any = None


class RoleAssignmentInput(WireInput):
    role: RoleRef
    scope_workspace_id: DbInt | None = None
    scope_cluster: bool | None = None


class UserRoleAssignmentInput(WireInput):
    user_id: DbInt
    role_assignment: RoleAssignmentInput


class GroupRoleAssignmentInput(WireInput):
    group_id: DbInt
    role_assignment: RoleAssignmentInput


class AssignmentsRequest(WireInput):
    """v1AssignRolesRequest and v1RemoveAssignmentsRequest."""

    user_role_assignments: list[UserRoleAssignmentInput] | None = None
    group_role_assignments: list[GroupRoleAssignmentInput] | None = None
