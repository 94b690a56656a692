"""Roles through Determined's official `det rbac` 0.38.1, unchanged, against a real master:
listing and describing the ten built-in roles, assigning them to users and groups in a
workspace or across the cluster, who holds what, one's own permissions, and the refusals a
user sees. And what a role gives: an Editor in a workspace kills another user's experiment
there. The official client runs these verbs only where the master says RBAC is on, so this
file's master sets security.authz.rbac_ui_enabled."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from harness.cluster import wait_until
from master.core.credentials import client_side_hash
from tests.e2e.concurrently import concurrently
from tests.e2e.conftest import (
    BACKENDS,
    MasterProcess,
    describe_run,
    lines,
    ok,
    running_master,
    unique,
)
from tests.e2e.test_official_client_workspaces import table

pytestmark = [pytest.mark.e2e, pytest.mark.official_client]

PASSWORD = "Correct-Horse-9"

# By name, as ListRoles orders them; the ids and workspace-assignability are Determined's.
ALL_ROLES = [
    ("ClusterAdmin", 1),
    ("Editor", 5),
    ("EditorProjectRestricted", 9),
    ("EditorRestricted", 7),
    ("GenAIUser", 8),
    ("ModelRegistryViewer", 6),
    ("TokenCreator", 10),
    ("Viewer", 4),
    ("WorkspaceAdmin", 2),
    ("WorkspaceCreator", 3),
]
CLUSTER_ONLY = {"ClusterAdmin", "GenAIUser", "TokenCreator", "WorkspaceCreator"}
VIEWER_PERMISSIONS = {
    "PERMISSION_TYPE_VIEW_EXPERIMENT_ARTIFACTS",
    "PERMISSION_TYPE_VIEW_EXPERIMENT_METADATA",
    "PERMISSION_TYPE_VIEW_NSC",
    "PERMISSION_TYPE_VIEW_WORKSPACE",
    "PERMISSION_TYPE_VIEW_PROJECT",
    "PERMISSION_TYPE_VIEW_MODEL_REGISTRY",
    "PERMISSION_TYPE_VIEW_TEMPLATES",
    "PERMISSION_TYPE_VIEW_RESOURCE_QUOTAS",
    "PERMISSION_TYPE_VIEW_GLOBAL_CONFIG_POLICIES",
    "PERMISSION_TYPE_VIEW_WORKSPACE_CONFIG_POLICIES",
    "PERMISSION_TYPE_VIEW_WEBHOOKS",
}

SINGLE = """\
name: {name}
entrypoint: python3 train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 10}}}}
workspace: {workspace}
project: {project}
"""


@pytest.fixture(scope="module", params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    """A master of this file's own with RBAC on for the client, and no agent: an
    experiment stays queued until it is killed."""
    env = {"DET_MASTER_SECURITY__AUTHZ__RBAC_UI_ENABLED": "true"}
    with running_master(request, tmp_path_factory, "rbac", env=env) as proc:
        yield proc


def rows_of(text: str) -> list[dict[str, str]]:
    """A table's rows as header → cell."""
    header, *rows = table(text)
    return [dict(zip(header, row, strict=True)) for row in rows]


def as_user(master: MasterProcess, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The official client signed in as `name` (it reads the password from stdin)."""
    password = "" if name == "admin" else PASSWORD
    result = master.official("-u", name, *args, input=password + "\n")
    assert "Traceback" not in result.stdout + result.stderr, describe_run(result)
    return result


def admin(master: MasterProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return ok(as_user(master, "admin", "rbac", *args))


def said(result: subprocess.CompletedProcess[str]) -> list[str]:
    return lines(ok(result).stdout)


def refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode != 0, describe_run(result)
    assert message in result.stderr, describe_run(result)


def admin_api(
    master: MasterProcess, method: str, path: str, body: dict[str, Any] | None = None
) -> Any:
    """A request as admin through the API, for what the client under test is not for."""
    headers = {"Authorization": f"Bearer {master.login('admin')}"}
    reply = master.session.request(method, path, json=body, headers=headers)
    assert reply.status_code == 200, f"{method} {path} -> {reply.status_code}: {reply.text}"
    return reply.json()


def new_user(master: MasterProcess, prefix: str) -> tuple[str, int]:
    name = unique(prefix)
    body = {
        "user": {"username": name, "active": True},
        "password": client_side_hash(PASSWORD),
        "isHashed": True,
    }
    return name, int(admin_api(master, "POST", "/api/v1/users", body)["user"]["id"])


def new_workspace(master: MasterProcess, prefix: str) -> tuple[str, int]:
    name = unique(prefix)
    return name, int(
        admin_api(master, "POST", "/api/v1/workspaces", {"name": name})["workspace"]["id"]
    )


def test_roles_listed_and_described(master: MasterProcess) -> None:
    # Nothing here changes the master: the four reads run side by side.
    listed, as_json_run, local, described = concurrently(
        lambda: admin(master, "list-roles"),
        lambda: admin(master, "list-roles", "--json"),
        lambda: admin(master, "list-roles", "--exclude-global-roles"),
        # A role no test here assigns.
        lambda: admin(master, "describe-role", "ModelRegistryViewer"),
    )
    heads = [line for line in lines(listed.stdout) if line.startswith("role '")]
    assert heads == [f"role '{name}' with ID {rid} with permissions" for name, rid in ALL_ROLES], (
        describe_run(listed)
    )
    assert table(listed.stdout)[0] == ["Id", "Name", "Scopetypemask"], describe_run(listed)
    assert "PERMISSION_TYPE_ASSIGN_ROLES" in listed.stdout

    as_json = json.loads(as_json_run.stdout)
    by_name = {r["name"]: r for r in as_json["roles"]}
    assert [(r["name"], r["roleId"]) for r in as_json["roles"]] == ALL_ROLES
    assert {p["id"] for p in by_name["Viewer"]["permissions"]} == VIEWER_PERMISSIONS
    assert len(by_name["ClusterAdmin"]["permissions"]) == 60
    assert {n for n, r in by_name.items() if not r["scopeTypeMask"]["workspace"]} == CLUSTER_ONLY
    assert as_json["pagination"]["total"] == 10

    heads = [line for line in lines(local.stdout) if line.startswith("role '")]
    assert heads == [
        f"role '{name}' with ID {rid} with permissions"
        for name, rid in ALL_ROLES
        if name not in CLUSTER_ONLY
    ], describe_run(local)

    shown = lines(described.stdout)
    assert shown[0] == "role 'ModelRegistryViewer' with ID 6 with permissions"
    assert shown[-2:] == ["role is not assigned to any group", "role is not assigned to any users"]
    mask = "{'cluster': True, 'workspace': True}"
    assert table(described.stdout) == [
        ["Id", "Name", "Scopetypemask"],
        ["PERMISSION_TYPE_VIEW_MODEL_REGISTRY", "view model registry", mask],
        ["PERMISSION_TYPE_VIEW_GLOBAL_CONFIG_POLICIES", "view global config policies", mask],
        ["PERMISSION_TYPE_VIEW_WORKSPACE_CONFIG_POLICIES", "view workspace config policies", mask],
    ], describe_run(described)


def test_assigning_roles(master: MasterProcess) -> None:
    """Calls that cannot change what another sees run side by side, in steps: carol's
    permissions before her role (beside the group's, which she is not in), the
    assignments, what they give and the refusals (each changes nothing), the removals,
    and what is left."""
    (carol, carol_id), (dave, dave_id) = new_user(master, "carol"), new_user(master, "dave")
    ws, ws_id = new_workspace(master, "ws")
    group = unique("readers")
    created = admin_api(master, "POST", "/api/v1/groups", {"name": group, "addUsers": [dave_id]})
    group_id = created["group"]["groupId"]
    carol_before, group_assigned = concurrently(
        lambda: as_user(master, carol, "rbac", "my-permissions"),
        lambda: admin(master, "assign-role", "Viewer", "-g", group),
    )
    assert said(carol_before) == ["no permissions assigned"]
    assert said(group_assigned) == [
        f"assigned role 'Viewer' with ID 4 to group '{group}' with ID {group_id} globally"
    ]
    assert said(admin(master, "assign-role", "Editor", "-w", ws, "-u", carol)) == [
        f"assigned role 'Editor' with ID 5 to user '{carol}' with ID {carol_id} to workspace {ws}"
    ]
    (
        described_editor,
        described_viewer,
        mine,
        through_group,
        theirs,
        perms,
        summary_run,
        again,
        across,
        cluster_only,
    ) = concurrently(
        lambda: admin(master, "describe-role", "Editor"),
        lambda: admin(master, "describe-role", "Viewer"),
        lambda: admin(master, "list-users-roles", carol),
        lambda: admin(master, "list-users-roles", dave),
        lambda: admin(master, "list-groups-roles", group),
        lambda: as_user(master, carol, "rbac", "my-permissions"),
        lambda: as_user(master, dave, "rbac", "my-permissions", "--json"),
        lambda: as_user(master, "admin", "rbac", "assign-role", "Editor", "-w", ws, "-u", carol),
        lambda: as_user(master, carol, "rbac", "assign-role", "Viewer", "-u", dave),
        lambda: as_user(
            master, "admin", "rbac", "assign-role", "ClusterAdmin", "-w", ws, "-u", dave
        ),
    )

    # Who holds a role: Editor by carol in the workspace, Viewer by the group everywhere.
    described = described_editor
    shown = lines(described.stdout)
    assert shown[0] == "role 'Editor' with ID 5 with permissions", describe_run(described)
    assert "role is not assigned to any group" in shown and "role is assigned to users" in shown
    permissions = table(described.stdout.split("role is not assigned to any group")[0])
    assert permissions[0] == ["Id", "Name", "Scopetypemask"], describe_run(described)
    ids = [row[0] for row in permissions[1:]]
    assert len(ids) == 27 and "PERMISSION_TYPE_UPDATE_EXPERIMENT" in ids, describe_run(described)
    # As in Determined since its 2023 migrations: an Editor neither edits nor deletes the
    # workspace, nor deletes projects.
    assert not {"PERMISSION_TYPE_UPDATE_WORKSPACE", "PERMISSION_TYPE_DELETE_PROJECT"} & set(ids)
    # (Other tests of this file hold roles on the same master: only this test's rows count.)
    header, *holders = table(described.stdout.split("role is assigned to users")[1])
    assert header == ["Userid", "Username", "Workspaceid", "Workspacename", "Assignedglobally"]
    assert [row for row in holders if row[1] == carol] == [
        [str(carol_id), carol, str(ws_id), ws, "False"]
    ], describe_run(described)
    described = described_viewer
    header, *groups = table(described.stdout.split("role is assigned to groups")[1])
    assert header == ["Groupid", "Groupname", "Workspaceid", "Workspacename", "Assignedglobally"]
    assert [row for row in groups if row[1] == group] == [
        [str(group_id), group, "N/A", "N/A", "True"]
    ], describe_run(described)

    assert rows_of(mine.stdout) == [
        {
            "Rolename": "Editor",
            "Roleid": "5",
            "Assigneddirectlytouser": "True",
            "Assignedtogroupname": "N/A",
            "Assignedtogroupid": "N/A",
            "Scopecluster": "False",
            "Scopeworkspacename": ws,
            "Scopeworkspaceid": str(ws_id),
        }
    ], describe_run(mine)
    assert [
        (r["Rolename"], r["Assignedtogroupname"], r["Scopecluster"])
        for r in rows_of(through_group.stdout)
    ] == [("Viewer", group, "True")], describe_run(through_group)
    assert lines(theirs.stdout)[0] == "role 'Viewer' with ID 4 assigned", describe_run(theirs)
    assert rows_of(theirs.stdout) == [
        {"Assignedglobally": "True", "Workspaceid": "N/A", "Workspacename": "N/A"}
    ], describe_run(theirs)

    # One's own permissions, by where they hold.
    ok(perms)
    assert lines(perms.stdout)[0] == (
        f"permissions assigned over workspace '{ws}' with ID '{ws_id}'"
    ), describe_run(perms)
    assert "PERMISSION_TYPE_UPDATE_EXPERIMENT" in {r["Id"] for r in rows_of(perms.stdout)}
    summary = json.loads(ok(summary_run).stdout)
    assert summary["assignments"] == [
        {"roleId": 4, "scopeCluster": True, "scopeWorkspaceIds": []}
    ], summary
    assert [r["name"] for r in summary["roles"]] == ["Viewer"], summary
    assert {p["id"] for p in summary["roles"][0]["permissions"]} == VIEWER_PERMISSIONS

    # Refusals, with the master's reasons.
    refused(
        again,
        f"Failed to assign a role to a user or group: userRoleAssignments[0]: user {carol_id} "
        f"already holds Editor in workspace '{ws}'",
    )
    refused(
        across,
        "Forbidden(userRoleAssignments[0]: assigning roles across the cluster is for "
        f"ClusterAdmins; user {carol} is not one): Please contact your administrator",
    )
    refused(
        cluster_only,
        "scopeWorkspaceId: role ClusterAdmin holds permissions that exist only across the "
        "cluster, so it is assigned without a workspace",
    )

    removed_editor, removed_viewer = concurrently(
        lambda: admin(master, "unassign-role", "Editor", "-w", ws, "-u", carol),
        lambda: admin(master, "unassign-role", "Viewer", "-g", group),
    )
    assert said(removed_editor) == [
        f"removed role 'Editor' with ID 5 from user '{carol}' with ID {carol_id} to workspace {ws}"
    ]
    assert said(removed_viewer) == [
        f"removed role 'Viewer' with ID 4 from group '{group}' with ID {group_id} globally"
    ]
    removed_again, dave_left, group_left = concurrently(
        lambda: as_user(master, "admin", "rbac", "unassign-role", "Viewer", "-g", group),
        lambda: admin(master, "list-users-roles", dave),
        lambda: admin(master, "list-groups-roles", group),
    )
    refused(
        removed_again,
        f"groupRoleAssignments[0]: group {group_id} does not hold Viewer across the cluster",
    )
    assert said(dave_left) == ["user has no role assignments"]
    assert said(group_left) == ["group has no role assignments"]


def test_editor_kills_another_users_experiment(master: MasterProcess) -> None:
    """Bob may not kill alice's experiment in `vision` until he is its Editor there: without
    a role he does not see it, as a Viewer he is refused naming whom to ask."""
    (alice, _), (bob, _) = new_user(master, "alice"), new_user(master, "bob")
    vision, vision_id = new_workspace(master, "vision")
    admin_api(master, "POST", f"/api/v1/workspaces/{vision_id}/projects", {"name": "detection"})
    admin(master, "assign-role", "Editor", "-w", vision, "-u", alice)
    config = SINGLE.format(name="alice-run", workspace=vision, project="detection")
    reply = master.session.post(
        "/api/v1/experiments",
        json={"config": config},
        headers={"Authorization": f"Bearer {master.login(alice, PASSWORD)}"},
    )
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]

    def state() -> str:
        found = admin_api(master, "GET", f"/api/v1/experiments/{experiment_id}")
        return str(found["experiment"]["state"])

    refused(
        as_user(master, bob, "experiment", "kill", str(experiment_id)),
        f"experiment {experiment_id} not found",
    )
    admin(master, "assign-role", "Viewer", "-w", vision, "-u", bob)
    refused(
        as_user(master, bob, "experiment", "kill", str(experiment_id)),
        f"Failed to kill experiment: Forbidden(experiment {experiment_id} belongs to {alice}; "
        "only its owner or an admin may kill it, or whoever holds "
        "PERMISSION_TYPE_UPDATE_EXPERIMENT in its workspace",
    )
    assert state() == "STATE_ACTIVE"

    admin(master, "assign-role", "Editor", "-w", vision, "-u", bob)
    killed = as_user(master, bob, "experiment", "kill", str(experiment_id))
    assert said(killed) == [f"Killed experiment {experiment_id}"]
    wait_until("the killed experiment to end", lambda: state() == "STATE_CANCELED", timeout=30)
