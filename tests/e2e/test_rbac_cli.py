"""Roles through our `det rbac`, against a real master: listing and describing the ten
built-in roles, assigning one to a user in a workspace and to a group across the cluster,
what each then sees, taking them back, and refusals that change nothing."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import (
    BACKENDS,
    MasterProcess,
    describe_run,
    lines,
    ok,
    running_master,
    unique,
)
from tests.e2e.test_user_groups_cli import AS_ADMIN, new_users, refused

pytestmark = [pytest.mark.e2e]

PASSWORD = "Correct-Horse-9"  # what new_users gives
EDITOR, VIEWER = 5, 4


@pytest.fixture(scope="module", params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    with running_master(request, tmp_path_factory, "rbac") as proc:
        yield proc


def admin_api(master: MasterProcess, method: str, path: str, **kwargs: Any) -> Any:
    """The master's own answer, as admin: what was stored, not what the CLI says."""
    headers = {"Authorization": f"Bearer {master.login('admin')}"}
    reply = master.session.request(method, path, headers=headers, **kwargs)
    assert reply.status_code == 200, f"{method} {path} -> {reply.status_code}: {reply.text}"
    return reply.json()


def as_user(name: str) -> dict[str, str]:
    return {"DET_USER": name, "DET_PASS": PASSWORD}


def rows(result: subprocess.CompletedProcess[str]) -> list[list[str]]:
    """Our table's lines, split at spaces (header first)."""
    return [line.split() for line in lines(ok(result).stdout)]


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result).stdout)


def setting(master: MasterProcess) -> tuple[str, int, str, int, str, int]:
    """A new user, a new group holding it and a new workspace (admin's), with their ids."""
    [user] = new_users(master, "rbac-u")
    user_id = admin_api(master, "GET", f"/api/v1/users/{user}/by-username")["user"]["id"]
    group = unique("rbac-g")
    created = admin_api(
        master, "POST", "/api/v1/groups", json={"name": group, "addUsers": [user_id]}
    )
    workspace = unique("rbac-ws")
    ws = admin_api(master, "POST", "/api/v1/workspaces", json={"name": workspace})["workspace"]
    return user, user_id, group, created["group"]["groupId"], workspace, ws["id"]


def held(master: MasterProcess, user_id: int, group_id: int) -> tuple[Any, Any]:
    return (
        admin_api(master, "GET", f"/api/v1/roles/search/by-user/{user_id}"),
        admin_api(master, "GET", f"/api/v1/roles/search/by-group/{group_id}"),
    )


def test_roles_are_listed_and_described(master: MasterProcess) -> None:
    listed = rows(master.det("rbac", "list-roles"))
    assert listed[0] == ["ID", "Name", "Scope", "#", "Permissions"], listed
    assert len(listed) == 11 and ["5", "Editor"] in [r[:2] for r in listed], listed
    every = as_json(master.det("rbac", "list-roles", "--json"))["roles"]
    assert len(every) == 10 and (EDITOR, "Editor") in [(r["roleId"], r["name"]) for r in every]
    local = as_json(master.det("rbac", "list-roles", "--exclude-global-roles", "--json"))
    assert len(local["roles"]) == 6, local
    assert "ClusterAdmin" not in {r["name"] for r in local["roles"]}
    assert len(rows(master.det("rbac", "list-roles", "--exclude-global-roles"))) == 7

    described = master.det("rbac", "describe-role", "Editor", env=AS_ADMIN)
    out = lines(ok(described).stdout)
    assert out[0].startswith("Role Editor (ID 5): "), describe_run(described)
    assert out[0].endswith("permissions, assigned in a workspace or across the cluster")
    assert ["CREATE_EXPERIMENT", "create", "experiment", "workspace", "or", "cluster"] in rows(
        described
    )
    assert "UPDATE_WORKSPACE" not in described.stdout
    assert "Held by" in described.stdout, describe_run(described)
    whole = as_json(master.det("rbac", "describe-role", "Editor", "--json", env=AS_ADMIN))
    assert (whole["role"]["roleId"], whole["role"]["name"]) == (EDITOR, "Editor"), whole

    # Who holds a role is for those who assign roles: `determined` sees the permissions only.
    plain = ok(master.det("rbac", "describe-role", "Viewer"))
    assert "VIEW_EXPERIMENT_METADATA" in plain.stdout
    assert "who holds the role is not shown: seeing who holds role Viewer is for" in plain.stderr
    refused(master.det("rbac", "describe-role", "Edtor"), "ROLE: role 'Edtor' not found (the")


def test_roles_assigned_listed_and_taken_back(master: MasterProcess) -> None:
    user, user_id, group, group_id, workspace, ws_id = setting(master)

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return ok(master.det("rbac", *args, env=AS_ADMIN))

    given = admin("assign-role", "Editor", "-u", user, "-w", workspace)
    assert lines(given.stdout) == [
        f"Assigned role Editor (ID 5) to user {user} (ID {user_id}) in workspace {workspace} "
        f"(ID {ws_id})"
    ], describe_run(given)
    holder = ["user", user, str(user_id), "workspace", workspace, str(ws_id)]
    assert holder in rows(admin("describe-role", "Editor")), "describe-role lists the holder"

    # A group across the cluster: the group's roles, and its member's through it.
    given = admin("assign-role", "Viewer", "-g", group)
    assert lines(given.stdout) == [
        f"Assigned role Viewer (ID 4) to user group {group} (ID {group_id}) across the cluster"
    ], describe_run(given)
    assert rows(admin("list-groups-roles", group))[1:] == [["Viewer", "4", "cluster"]]
    group_json = as_json(admin("list-groups-roles", group, "--json"))
    assert [(r["roleId"], r["name"]) for r in group_json["roles"]] == [(VIEWER, "Viewer")]
    assert rows(admin("list-users-roles", user))[1:] == [
        ["Editor", "5", "user", user, "workspace", workspace, str(ws_id)],
        ["Viewer", "4", "group", group, "cluster"],
    ]
    user_json = as_json(admin("list-users-roles", user, "--json"))
    assert [(r["role"]["roleId"], r["role"]["name"]) for r in user_json["roles"]] == [
        (EDITOR, "Editor"),
        (VIEWER, "Viewer"),
    ]

    # The user sees both among their own permissions, by scope: the cluster's, then the
    # workspace's.
    perms = master.det("rbac", "my-permissions", env=as_user(user))
    out = lines(ok(perms).stdout)
    assert out[0] == "Across the cluster (in every workspace too):", describe_run(perms)
    assert f"In workspace {workspace} (ID {ws_id}):" in out, describe_run(perms)
    assert ["CREATE_EXPERIMENT", "create", "experiment", "Editor"] in rows(perms)
    # VIEW_PROJECT twice: from Viewer across the cluster, from Editor in the workspace.
    project_rows = [r for r in rows(perms) if r[0] == "VIEW_PROJECT"]
    assert project_rows == [["VIEW_PROJECT", "view", "project", r] for r in ("Viewer", "Editor")]
    summary = as_json(master.det("rbac", "my-permissions", "--json", env=as_user(user)))
    assert [(r["roleId"], r["name"]) for r in summary["roles"]] == [
        (EDITOR, "Editor"),
        (VIEWER, "Viewer"),
    ]
    assert [a["scopeWorkspaceIds"] for a in summary["assignments"]] == [[ws_id], []], summary

    taken = admin("unassign-role", "Editor", "-u", user, "-w", workspace)
    assert lines(taken.stdout)[0].startswith(f"Removed role Editor (ID 5) from user {user} ")
    admin("unassign-role", "Viewer", "-g", group)
    assert held(master, user_id, group_id) == (
        {"roles": []},
        {"roles": [], "assignments": []},
    )
    assert lines(admin("list-users-roles", user).stdout) == [f"User {user} holds no roles"]


def test_refusals_say_why_and_change_nothing(master: MasterProcess) -> None:
    user, user_id, group, group_id, workspace, _ = setting(master)
    ok(master.det("rbac", "assign-role", "Editor", "-u", user, "-w", workspace, env=AS_ADMIN))
    before = held(master, user_id, group_id)
    missing = unique("nobody")

    def assign(*args: str, env: dict[str, str] = AS_ADMIN) -> subprocess.CompletedProcess[str]:
        return master.det("rbac", "assign-role", *args, env=env)

    # Names nothing has: refused here, naming the argument and the name.
    refused(assign("Edtor", "-u", user), "Error: ROLE: role 'Edtor' not found")
    refused(
        assign("Editor", "-u", missing, "-w", workspace),
        f"Error: -u/--username-to-assign: user '{missing}' not found",
    )
    refused(
        assign("Editor", "-g", missing),
        f"Error: -g/--group-name-to-assign: user group '{missing}' not found",
    )
    refused(
        assign("Editor", "-u", user, "-w", missing),
        f"Error: -w/--workspace-name: workspace '{missing}' not found",
    )
    refused(
        master.det("rbac", "unassign-role", "Editor", "-u", user, "-g", group, env=AS_ADMIN),
        "give exactly one of -u/--username-to-assign and -g/--group-name-to-assign",
    )

    # The master's refusals, printed as it words them.
    refused(
        assign("Editor", "-u", user, "-w", workspace),
        f"userRoleAssignments[0]: user {user_id} already holds Editor in workspace '{workspace}'",
    )
    refused(
        assign("Viewer", "-g", group, env=as_user(user)),
        f"assigning roles across the cluster is for ClusterAdmins; user {user} is not one",
    )
    assert held(master, user_id, group_id) == before
