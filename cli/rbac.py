"""`det rbac`: the built-in roles, who holds them where, and one's own permissions, with
Determined's verbs and flags. Roles, users, groups and workspaces are named as people name
them; each name is turned into its id here, before anything is sent, so a name that matches
nothing is refused naming the argument that gave it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from cli.client import MasterClient
from cli.errors import CliError, NameNotFound
from cli.output import JsonOpt, cli_errors, print_json, print_table, stdout, warn
from cli.state import client
from cli.user_groups import group_by_name
from cli.workspaces import workspace_by_name

rbac_app = typer.Typer(help="Manage role-based access control.", no_args_is_help=True)

PERMISSION_HEADERS = ["Permission", "Name", "Scope"]
ROLE_HEADERS = ["ID", "Name", "Scope", "# Permissions"]
HOLDER_HEADERS = ["Holder", "Name", "ID", "Scope", "Workspace ID"]
USER_ROLE_HEADERS = ["Role", "Role ID", "Held By", "Scope", "Workspace ID"]
GROUP_ROLE_HEADERS = ["Role", "Role ID", "Scope", "Workspace ID"]
MY_PERMISSION_HEADERS = ["Permission", "Name", "From Roles"]

CLUSTER = "cluster"
# Determined's client asks for the roles assignable in workspace 1 to leave out the roles
# that exist only across the cluster; any workspace id does.
ANY_WORKSPACE = 1

RoleArg = typer.Argument(..., help="Name of the role (see `det rbac list-roles`).")
UserOpt = typer.Option(None, "-u", "--username-to-assign", help="The user (give -u or -g).")
GroupOpt = typer.Option(None, "-g", "--group-name-to-assign", help="The user group.")
WorkspaceOpt = typer.Option(
    None, "-w", "--workspace-name", help="In this workspace (omitted: across the cluster)."
)


# -- names to ids, and back --------------------------------------------------------------------


def _all_roles(api: MasterClient) -> list[dict[str, Any]]:
    roles: list[dict[str, Any]] = api.post("/api/v1/roles/search", json={"limit": 0})["roles"]
    return roles


def role_by_name(api: MasterClient, name: str) -> dict[str, Any]:
    roles = _all_roles(api)
    found = next((r for r in roles if r["name"] == name), None)
    if found is None:
        names = ", ".join(r["name"] for r in roles)
        raise NameNotFound(f"role '{name}' not found (the roles: {names})")
    return found


def user_named(api: MasterClient, username: str) -> dict[str, Any]:
    """The user whose username is `username` exactly (the master's filter matches parts)."""
    found = api.get("/api/v1/users", params={"name": username})["users"]
    user = next((u for u in found if u["username"] == username), None)
    if user is None:
        raise NameNotFound(f"user '{username}' not found")
    return dict(user)


def _resolve(
    what: str, lookup: Callable[[MasterClient, str], dict[str, Any]], api: MasterClient, name: str
) -> dict[str, Any]:
    """`lookup`'s answer; a name it does not find is refused naming `what` gave it."""
    try:
        return lookup(api, name)
    except NameNotFound as exc:
        raise CliError(f"{what}: {exc}") from None


def _workspace_names(api: MasterClient) -> dict[int, str]:
    found = api.get("/api/v1/workspaces", params={"limit": 0})["workspaces"]
    return {int(w["id"]): w["name"] for w in found}


def _group_names(api: MasterClient) -> dict[int, str]:
    found = api.post("/api/v1/groups/search", json={"limit": 0})["groups"]
    return {int(g["group"]["groupId"]): g["group"]["name"] for g in found}


def _usernames(api: MasterClient) -> dict[int, str]:
    return {int(u["id"]): u["username"] for u in api.get_all("/api/v1/users", "users")}


def _scope(workspace_id: int | None, workspaces: dict[int, str]) -> list[Any]:
    """The Scope and Workspace ID cells: a workspace by name, or the whole cluster."""
    if workspace_id is None:
        return [CLUSTER, ""]
    return [f"workspace {workspaces.get(workspace_id, '(deleted)')}", workspace_id]


def _permission_scope(mask: dict[str, Any]) -> str:
    return "workspace or cluster" if mask.get("workspace") else "cluster only"


def _permission_rows(role: dict[str, Any]) -> list[list[Any]]:
    return [
        [p["id"].removeprefix("PERMISSION_TYPE_"), p["name"], _permission_scope(p["scopeTypeMask"])]
        for p in role["permissions"]
    ]


# -- reading -------------------------------------------------------------------------------------


@rbac_app.command("list-roles")
def list_roles(
    ctx: typer.Context,
    exclude_global_roles: bool = typer.Option(
        False,
        "--exclude-global-roles",
        help="Only the roles that may be assigned in a workspace (not those holding "
        "cluster-only permissions).",
    ),
    limit: int = typer.Option(200, "--limit", min=0, help="At most this many (0: all)."),
    offset: int = typer.Option(0, "--offset", min=0, help="Skip this many first."),
    as_json: bool = JsonOpt,
) -> None:
    """List the roles, with where each may be assigned and how many permissions it gives."""
    with cli_errors():
        body: dict[str, Any] = {"limit": limit, "offset": offset}
        if exclude_global_roles:
            body["workspaceId"] = ANY_WORKSPACE
        reply = client(ctx).post("/api/v1/roles/search/by-assignability", json=body)
        if as_json:
            print_json(reply)
            return
        rows = [
            [r["roleId"], r["name"], _permission_scope(r["scopeTypeMask"]), len(r["permissions"])]
            for r in reply["roles"]
        ]
        print_table(ROLE_HEADERS, rows)


@rbac_app.command("describe-role")
def describe_role(ctx: typer.Context, role_name: str = RoleArg, as_json: bool = JsonOpt) -> None:
    """Show a role's permissions, and who holds it where (shown to those who assign roles)."""
    with cli_errors():
        api = client(ctx)
        role = _resolve("ROLE", role_by_name, api, role_name)
        if as_json:
            reply = api.post("/api/v1/roles/search/by-ids", json={"roleIds": [role["roleId"]]})
            print_json(reply["roles"][0])
            return
        scope = (
            "in a workspace or across the cluster"
            if role["scopeTypeMask"]["workspace"]
            else "across the cluster only"
        )
        stdout.print(
            f"Role {role['name']} (ID {role['roleId']}): {len(role['permissions'])} "
            f"permissions, assigned {scope}",
            markup=False,
        )
        print_table(PERMISSION_HEADERS, _permission_rows(role))
        try:
            reply = api.post("/api/v1/roles/search/by-ids", json={"roleIds": [role["roleId"]]})
        except CliError as exc:
            warn(f"who holds the role is not shown: {exc}")
            return
        _print_holders(api, reply["roles"][0])


def _print_holders(api: MasterClient, held: dict[str, Any]) -> None:
    users, groups = held["userRoleAssignments"], held["groupRoleAssignments"]
    stdout.print("")
    if not users and not groups:
        stdout.print("Held by no user or group", markup=False)
        return
    workspaces = _workspace_names(api)
    usernames = _usernames(api) if users else {}
    group_names = _group_names(api) if groups else {}
    rows = [
        [
            "user",
            usernames.get(u["userId"], ""),
            u["userId"],
            *_scope(u["roleAssignment"]["scopeWorkspaceId"], workspaces),
        ]
        for u in users
    ]
    rows += [
        [
            "group",
            group_names.get(g["groupId"], ""),
            g["groupId"],
            *_scope(g["roleAssignment"]["scopeWorkspaceId"], workspaces),
        ]
        for g in groups
    ]
    stdout.print("Held by:", markup=False)
    print_table(HOLDER_HEADERS, rows)


@rbac_app.command("my-permissions")
def my_permissions(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """List your permissions: those across the cluster, then each workspace's."""
    with cli_errors():
        api = client(ctx)
        reply = api.get("/api/v1/permissions/summary")
        if as_json:
            print_json(reply)
            return
        # The master pairs roles and assignments by position, as Determined's does.
        by_scope: dict[int | None, dict[str, tuple[str, list[str]]]] = {}
        for role, held in zip(reply["roles"], reply["assignments"], strict=True):
            scopes: list[int | None] = [None] if held["scopeCluster"] else []
            scopes += held["scopeWorkspaceIds"]
            for scope in scopes:
                perms = by_scope.setdefault(scope, {})
                for p in role["permissions"]:
                    perms.setdefault(p["id"], (p["name"], []))[1].append(role["name"])
        if not by_scope:
            stdout.print("No roles assigned: no permissions", markup=False)
            return
        workspaces = _workspace_names(api) if set(by_scope) - {None} else {}
        order = sorted(by_scope, key=lambda s: (s is not None, workspaces.get(s or 0, ""), s or 0))
        for index, scope in enumerate(order):
            if index:
                stdout.print("")
            if scope is None:
                heading = "Across the cluster (in every workspace too):"
            else:
                heading = f"In workspace {workspaces.get(scope, '(deleted)')} (ID {scope}):"
            stdout.print(heading, markup=False)
            rows = [
                [enum.removeprefix("PERMISSION_TYPE_"), name, ", ".join(holders)]
                for enum, (name, holders) in sorted(by_scope[scope].items())
            ]
            print_table(MY_PERMISSION_HEADERS, rows)


@rbac_app.command("list-users-roles")
def list_users_roles(
    ctx: typer.Context,
    username: str = typer.Argument(..., help="The user whose roles to list."),
    as_json: bool = JsonOpt,
) -> None:
    """List a user's roles, given directly and through groups, and where."""
    with cli_errors():
        api = client(ctx)
        user = _resolve("USERNAME", user_named, api, username)
        reply = api.get(f"/api/v1/roles/search/by-user/{user['id']}")
        if as_json:
            print_json(reply)
            return
        if not reply["roles"]:
            stdout.print(f"User {username} holds no roles", markup=False)
            return
        workspaces = _workspace_names(api)
        via_groups = any(r["groupRoleAssignments"] for r in reply["roles"])
        group_names = _group_names(api) if via_groups else {}
        rows = []
        for held in reply["roles"]:
            role = held["role"]
            for u in held["userRoleAssignments"]:
                where = _scope(u["roleAssignment"]["scopeWorkspaceId"], workspaces)
                rows.append([role["name"], role["roleId"], f"user {username}", *where])
            for g in held["groupRoleAssignments"]:
                where = _scope(g["roleAssignment"]["scopeWorkspaceId"], workspaces)
                group = group_names.get(g["groupId"], f"(ID {g['groupId']})")
                rows.append([role["name"], role["roleId"], f"group {group}", *where])
        print_table(USER_ROLE_HEADERS, rows)


@rbac_app.command("list-groups-roles")
def list_groups_roles(
    ctx: typer.Context,
    group_name: str = typer.Argument(..., help="The user group whose roles to list."),
    as_json: bool = JsonOpt,
) -> None:
    """List a user group's roles and where."""
    with cli_errors():
        api = client(ctx)
        group = _resolve("GROUP_NAME", group_by_name, api, group_name)
        reply = api.get(f"/api/v1/roles/search/by-group/{group['groupId']}")
        if as_json:
            print_json(reply)
            return
        if not reply["roles"]:
            stdout.print(f"User group {group_name} holds no roles", markup=False)
            return
        workspaces = _workspace_names(api)
        rows = []
        for role, held in zip(reply["roles"], reply["assignments"], strict=True):
            scopes: list[int | None] = [None] if held["scopeCluster"] else []
            for scope in scopes + held["scopeWorkspaceIds"]:
                rows.append([role["name"], role["roleId"], *_scope(scope, workspaces)])
        print_table(GROUP_ROLE_HEADERS, rows)


# -- assigning -----------------------------------------------------------------------------------


def _change(
    ctx: typer.Context,
    path: str,
    role_name: str,
    username: str | None,
    group_name: str | None,
    workspace_name: str | None,
) -> tuple[str, str, str]:
    """One assignment sent to `path` once every name is found; the role, the holder and the
    scope, in words."""
    if (username is None) == (group_name is None):
        raise CliError("give exactly one of -u/--username-to-assign and -g/--group-name-to-assign")
    api = client(ctx)
    role = _resolve("ROLE", role_by_name, api, role_name)
    assignment: dict[str, Any] = {"role": {"roleId": role["roleId"]}}
    where = "across the cluster"
    if workspace_name is not None:
        ws = _resolve("-w/--workspace-name", workspace_by_name, api, workspace_name)
        assignment["scopeWorkspaceId"] = ws["id"]
        where = f"in workspace {workspace_name} (ID {ws['id']})"
    else:
        assignment["scopeCluster"] = True
    body: dict[str, Any] = {"userRoleAssignments": [], "groupRoleAssignments": []}
    if username is not None:
        user = _resolve("-u/--username-to-assign", user_named, api, username)
        body["userRoleAssignments"].append({"userId": user["id"], "roleAssignment": assignment})
        holder = f"user {username} (ID {user['id']})"
    else:
        assert group_name is not None
        group = _resolve("-g/--group-name-to-assign", group_by_name, api, group_name)
        body["groupRoleAssignments"].append(
            {"groupId": group["groupId"], "roleAssignment": assignment}
        )
        holder = f"user group {group_name} (ID {group['groupId']})"
    api.post(path, json=body)
    return f"role {role['name']} (ID {role['roleId']})", holder, where


@rbac_app.command("assign-role")
def assign_role(
    ctx: typer.Context,
    role_name: str = RoleArg,
    username: str | None = UserOpt,
    group_name: str | None = GroupOpt,
    workspace_name: str | None = WorkspaceOpt,
) -> None:
    """Give a role to a user or a user group, in a workspace or across the cluster."""
    with cli_errors():
        role, holder, where = _change(
            ctx, "/api/v1/roles/add-assignments", role_name, username, group_name, workspace_name
        )
        stdout.print(f"Assigned {role} to {holder} {where}", markup=False)


@rbac_app.command("unassign-role")
def unassign_role(
    ctx: typer.Context,
    role_name: str = RoleArg,
    username: str | None = UserOpt,
    group_name: str | None = GroupOpt,
    workspace_name: str | None = WorkspaceOpt,
) -> None:
    """Take a role from a user or a user group, in a workspace or across the cluster."""
    with cli_errors():
        role, holder, where = _change(
            ctx, "/api/v1/roles/remove-assignments", role_name, username, group_name, workspace_name
        )
        stdout.print(f"Removed {role} from {holder} {where}", markup=False)
