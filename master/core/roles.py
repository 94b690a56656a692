"""Roles and permissions, with the ids and names Determined's wire uses (its official client
resolves roles by name and prints permissions by their enum names). Pure: no I/O.

A role is a set of permissions, given to a user or a group in one workspace or across the
cluster (a grant). A permission marked cluster-only can only be held across the cluster, so
a role holding one is assigned only there. What each permission lets one do is decided by
master.services.access, which asks `holds`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    id: int
    enum: str  # the name Determined's wire gives it (PermissionType)
    name: str
    cluster_only: bool = False


def _p(id: int, enum: str, name: str, cluster_only: bool = False) -> Permission:
    return Permission(id, f"PERMISSION_TYPE_{enum}", name, cluster_only)


PERMISSIONS: dict[int, Permission] = {
    p.id: p
    for p in (
        _p(2001, "CREATE_EXPERIMENT", "create experiment"),
        _p(2002, "VIEW_EXPERIMENT_ARTIFACTS", "view experiment artifacts"),
        _p(2003, "VIEW_EXPERIMENT_METADATA", "view experiment metadata"),
        _p(2004, "UPDATE_EXPERIMENT", "update experiment"),
        _p(2005, "UPDATE_EXPERIMENT_METADATA", "update experiment metadata"),
        _p(2006, "DELETE_EXPERIMENT", "delete experiment"),
        _p(3001, "CREATE_NSC", "create notebooks/shells/commands"),
        _p(3002, "VIEW_NSC", "view notebooks/shells/commands"),
        _p(3003, "UPDATE_NSC", "update notebooks/shells/commands"),
        _p(4002, "VIEW_WORKSPACE", "view workspace"),
        _p(4003, "UPDATE_WORKSPACE", "update workspace"),
        _p(4004, "DELETE_WORKSPACE", "delete workspace"),
        _p(4005, "SET_WORKSPACE_AGENT_USER_GROUP", "set agent user group on workspace"),
        _p(
            4006,
            "SET_WORKSPACE_CHECKPOINT_STORAGE_CONFIG",
            "set checkpoint storage config on workspace",
        ),
        _p(4007, "SET_WORKSPACE_DEFAULT_RESOURCE_POOL", "set default resource pool on workspace"),
        _p(5001, "CREATE_PROJECT", "create project"),
        _p(5002, "VIEW_PROJECT", "view project"),
        _p(5003, "UPDATE_PROJECT", "update project"),
        _p(5004, "DELETE_PROJECT", "delete project"),
        _p(6002, "ASSIGN_ROLES", "assign roles"),
        _p(7001, "VIEW_MODEL_REGISTRY", "view model registry"),
        _p(7002, "EDIT_MODEL_REGISTRY", "edit model registry"),
        _p(7003, "CREATE_MODEL_REGISTRY", "create model registry"),
        _p(7004, "DELETE_MODEL_REGISTRY", "delete model registry"),
        _p(7005, "DELETE_MODEL_VERSION", "delete model version"),
        _p(7006, "DELETE_OTHER_USER_MODEL_REGISTRY", "delete other user model registry"),
        _p(7007, "DELETE_OTHER_USER_MODEL_VERSION", "delete other user model version"),
        _p(8001, "VIEW_MASTER_LOGS", "view master logs", True),
        _p(8002, "VIEW_CLUSTER_USAGE", "view detailed cluster usage", True),
        _p(8003, "UPDATE_AGENTS", "update agents", True),
        _p(8004, "VIEW_SENSITIVE_AGENT_INFO", "view sensitive agent info", True),
        _p(8005, "VIEW_MASTER_CONFIG", "view master config", True),
        _p(8006, "UPDATE_MASTER_CONFIG", "update master config", True),
        _p(8007, "VIEW_EXTERNAL_JOBS", "view external jobs", True),
        _p(8101, "CONTROL_STRICT_JOB_QUEUE", "control strict job queue", True),
        _p(9001, "VIEW_TEMPLATES", "view templates"),
        _p(9002, "UPDATE_TEMPLATES", "update templates"),
        _p(9003, "CREATE_TEMPLATES", "create templates"),
        _p(9004, "DELETE_TEMPLATES", "delete templates"),
        _p(10001, "MODIFY_RP_WORKSPACE_BINDINGS", "modify rp workspace bindings", True),
        _p(
            11001,
            "SET_WORKSPACE_NAMESPACE_BINDINGS",
            "set workspace-namespace bindings",
            True,
        ),
        _p(11002, "SET_RESOURCE_QUOTAS", "set resource quotas", True),
        _p(11003, "VIEW_RESOURCE_QUOTAS", "view resource quotas"),
        _p(11004, "MODIFY_GLOBAL_CONFIG_POLICIES", "modify global config policies", True),
        _p(11005, "MODIFY_WORKSPACE_CONFIG_POLICIES", "modify workspace config policies"),
        _p(11006, "VIEW_GLOBAL_CONFIG_POLICIES", "view global config policies"),
        _p(11007, "VIEW_WORKSPACE_CONFIG_POLICIES", "view workspace config policies"),
        _p(12001, "ADMINISTRATE_TOKEN", "administrate access token", True),
        _p(12002, "UPDATE_TOKEN", "update own access token", True),
        _p(12003, "CREATE_TOKEN", "create access token", True),
        _p(12004, "CREATE_OTHER_TOKEN", "create other access token", True),
        _p(12005, "VIEW_OTHER_TOKEN", "view other access token", True),
        _p(12006, "VIEW_TOKEN", "view own access token", True),
        _p(91001, "ADMINISTRATE_USER", "administrate user", True),
        _p(91002, "ADMINISTRATE_OAUTH", "manage oauth", True),
        _p(93001, "UPDATE_GROUP", "update group", True),
        _p(94001, "CREATE_WORKSPACE", "create workspace", True),
        _p(96001, "UPDATE_ROLES", "update roles", True),
        _p(97001, "EDIT_WEBHOOKS", "edit webhooks"),
        _p(97002, "VIEW_WEBHOOKS", "view webhooks"),
    )
}

# The permissions access checks and tests name (the rest are listed for the wire and docs).
CREATE_EXPERIMENT = 2001
VIEW_EXPERIMENT_METADATA = 2003
VIEW_NSC = 3002
VIEW_WORKSPACE = 4002
VIEW_PROJECT = 5002
VIEW_MODEL_REGISTRY = 7001
VIEW_TEMPLATES = 9001
UPDATE_EXPERIMENT = 2004
DELETE_EXPERIMENT = 2006
CREATE_NSC = 3001
UPDATE_NSC = 3003
UPDATE_WORKSPACE = 4003
DELETE_WORKSPACE = 4004
CREATE_PROJECT = 5001
UPDATE_PROJECT = 5003
DELETE_PROJECT = 5004
ASSIGN_ROLES = 6002
EDIT_MODEL_REGISTRY = 7002
CREATE_MODEL_REGISTRY = 7003
DELETE_OTHER_USER_MODEL_REGISTRY = 7006
DELETE_OTHER_USER_MODEL_VERSION = 7007
UPDATE_TEMPLATES = 9002
CREATE_TEMPLATES = 9003
DELETE_TEMPLATES = 9004
EDIT_WEBHOOKS = 97001
VIEW_WEBHOOKS = 97002


@dataclass(frozen=True)
class Role:
    id: int
    name: str
    permission_ids: frozenset[int]

    @property
    def cluster_only(self) -> bool:
        """Holds a cluster-only permission, so it is assigned across the cluster only."""
        return any(PERMISSIONS[p].cluster_only for p in self.permission_ids)

    @property
    def permissions(self) -> list[Permission]:
        return [PERMISSIONS[p] for p in sorted(self.permission_ids)]


def _ids(*spans: int | tuple[int, int]) -> frozenset[int]:
    out: set[int] = set()
    for span in spans:
        if isinstance(span, tuple):
            out.update(p for p in PERMISSIONS if span[0] <= p <= span[1])
        else:
            out.add(span)
    return frozenset(out)


_VIEW_POLICIES = (11003, 11006, 11007)
_EDITOR = _ids(
    (2001, 2006),
    (3001, 3003),
    4002,
    5001,
    5002,
    5003,
    (7001, 7005),
    (9001, 9004),
    *_VIEW_POLICIES,
    97001,
    97002,
)

CLUSTER_ADMIN = 1
WORKSPACE_ADMIN = 2

ROLES: dict[int, Role] = {
    r.id: r
    for r in (
        Role(CLUSTER_ADMIN, "ClusterAdmin", frozenset(PERMISSIONS)),
        Role(
            WORKSPACE_ADMIN,
            "WorkspaceAdmin",
            _ids(
                (2001, 2006),
                (3001, 3003),
                4002,
                4003,
                4004,
                4006,
                4007,
                (5001, 5004),
                6002,
                (7001, 7007),
                (9001, 9004),
                11003,
                11005,
                11006,
                11007,
                97001,
                97002,
            ),
        ),
        Role(3, "WorkspaceCreator", _ids(94001, 11006, 11007)),
        Role(
            4,
            "Viewer",
            _ids(2002, 2003, 3002, 4002, 5002, 7001, 9001, 11003, 11006, 11007, 97002),
        ),
        Role(5, "Editor", _EDITOR),
        Role(6, "ModelRegistryViewer", _ids(7001, 11006, 11007)),
        Role(7, "EditorRestricted", _EDITOR - {3001, 3003}),
        Role(
            8,
            "GenAIUser",
            _ids(
                (2001, 2006),
                (3001, 3003),
                4002,
                (5001, 5004),
                (7001, 7005),
                (9001, 9004),
                *_VIEW_POLICIES,
                94001,
            ),
        ),
        Role(9, "EditorProjectRestricted", _EDITOR - {5001, 5003}),
        Role(10, "TokenCreator", _ids(12002, 12003, 12006)),
    )
}


def role_named(name: str) -> Role | None:
    return next((r for r in ROLES.values() if r.name == name), None)


@dataclass(frozen=True)
class Grant:
    """A role held, in one workspace or (workspace_id None) across the cluster."""

    role_id: int
    workspace_id: int | None


def holds(grants: Iterable[Grant], permission: int, workspace_id: int | None) -> bool:
    """Whether the grants give `permission` in `workspace_id` (None: across the cluster,
    which only a cluster-wide grant gives)."""
    for grant in grants:
        if grant.workspace_id is not None and grant.workspace_id != workspace_id:
            continue
        role = ROLES.get(grant.role_id)
        if role is not None and permission in role.permission_ids:
            return True
    return False


def holds_anywhere(grants: Iterable[Grant], permission: int) -> bool:
    """Whether any grant, in any workspace or across the cluster, gives `permission`."""
    return any(permission in ROLES[g.role_id].permission_ids for g in grants if g.role_id in ROLES)


def workspaces_giving(grants: Iterable[Grant], permission: int) -> set[int]:
    """The workspaces where a grant made there gives `permission` (cluster-wide grants,
    which give it everywhere, are the caller's to check with holds(..., None))."""
    return {
        g.workspace_id
        for g in grants
        if g.workspace_id is not None
        and g.role_id in ROLES
        and permission in ROLES[g.role_id].permission_ids
    }
