"""Roles (issue 29, item 3): Determined's roles listed, assigned and removed on its routes,
bad assignments refused naming the field and changing nothing, and what each role lets a
user change, from the table README.md shows."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.exc import IntegrityError

from master.db.models import RoleAssignmentModel
from master.db.session import session_scope
from tests.api.test_access import create_user, give_viewer, refusal, sign_in

README = Path(__file__).resolve().parents[2] / "README.md"
PASSWORD = "Sekret-Passw0rd"
ROLE_IDS = {
    "ClusterAdmin": 1,
    "WorkspaceAdmin": 2,
    "WorkspaceCreator": 3,
    "Viewer": 4,
    "Editor": 5,
    "ModelRegistryViewer": 6,
    "EditorRestricted": 7,
    "GenAIUser": 8,
    "EditorProjectRestricted": 9,
    "TokenCreator": 10,
}


def readme_table() -> tuple[list[str], dict[str, dict[str, str]]]:
    """The roles table of README.md: its role columns, and for each action what each gets:
    yes, no (refused, 403) or unseen (404, as for something that does not exist)."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- roles table[^>]*-->\n(.*?)<!-- end of roles table -->", text, re.S)
    assert found, "README.md has no roles table"
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in found.group(1).strip().splitlines()
    ]
    header, body = rows[0], rows[2:]
    columns = header[1:]
    table = {row[0]: dict(zip(columns, row[1:], strict=True)) for row in body}
    return columns, table


COLUMNS, TABLE = readme_table()


def assignment(
    role: str, *, user: int | None = None, group: int | None = None, ws: int | None = None
) -> dict[str, Any]:
    scope = {"role": {"roleId": ROLE_IDS[role]}, "scopeWorkspaceId": ws}
    if user is not None:
        return {"userRoleAssignments": [{"userId": user, "roleAssignment": scope}]}
    return {"groupRoleAssignments": [{"groupId": group, "roleAssignment": scope}]}


async def user_id(client: httpx.AsyncClient) -> int:
    return int((await ok(await client.get("/api/v1/me")))["user"]["id"])


async def ok(reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


class Scene:
    """alice's workspaces vision and nlp, each with a project p; bob acts."""

    def __init__(
        self, alice: httpx.AsyncClient, alice_id: int, bob: httpx.AsyncClient, bob_id: int
    ) -> None:
        self.alice, self.alice_id, self.bob, self.bob_id = alice, alice_id, bob, bob_id
        self.workspaces: dict[str, int] = {}
        self.projects: dict[str, int] = {}

    async def build(self, suffix: str) -> None:
        for name in ("vision", "nlp"):
            ws = await ok(
                await self.alice.post("/api/v1/workspaces", json={"name": f"{name}-{suffix}"})
            )
            self.workspaces[name] = ws["workspace"]["id"]
            project = await ok(
                await self.alice.post(
                    f"/api/v1/workspaces/{ws['workspace']['id']}/projects", json={"name": "p"}
                )
            )
            self.projects[name] = project["project"]["id"]

    async def experiment(self, workspace: str = "vision") -> int:
        config = (
            "name: hers\nentrypoint: python3 train.py\n"
            "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n"
        )
        reply = await self.alice.post(
            "/api/v1/experiments", json={"config": config, "projectId": self.projects[workspace]}
        )
        return int((await ok(reply))["experiment"]["id"])


async def kill(s: Scene) -> httpx.Response:
    return await s.bob.post(f"/api/v1/experiments/{await s.experiment()}/kill")


async def label(s: Scene) -> httpx.Response:
    return await s.bob.put(f"/api/v1/experiments/{await s.experiment()}/labels/bobs")


async def delete_experiment(s: Scene) -> httpx.Response:
    experiment = await s.experiment()
    await ok(await s.alice.post(f"/api/v1/experiments/{experiment}/kill"))
    return await s.bob.delete(f"/api/v1/experiments/{experiment}")


async def rename_project(s: Scene) -> httpx.Response:
    return await s.bob.patch(f"/api/v1/projects/{s.projects['vision']}", json={"name": "renamed"})


async def delete_project(s: Scene) -> httpx.Response:
    ws = s.workspaces["vision"]
    empty = await ok(
        await s.alice.post(f"/api/v1/workspaces/{ws}/projects", json={"name": "empty"})
    )
    return await s.bob.delete(f"/api/v1/projects/{empty['project']['id']}")


async def rename_workspace(s: Scene) -> httpx.Response:
    ws = s.workspaces["vision"]
    return await s.bob.patch(f"/api/v1/workspaces/{ws}", json={"name": f"renamed-{ws}"})


async def give_role(s: Scene) -> httpx.Response:
    body = assignment("Viewer", user=s.alice_id, ws=s.workspaces["vision"])
    return await s.bob.post("/api/v1/roles/add-assignments", json=body)


async def kill_command(s: Scene) -> httpx.Response:
    body = {"config": {"entrypoint": "true"}, "workspaceId": s.workspaces["vision"]}
    command = await ok(await s.alice.post("/api/v1/commands", json=body))
    return await s.bob.post(f"/api/v1/commands/{command['command']['id']}/kill")


def webhook(workspace_id: int) -> dict[str, Any]:
    return {
        "name": "team",
        "url": "http://127.0.0.1:9/hook",
        "webhookType": "WEBHOOK_TYPE_DEFAULT",
        "mode": "WEBHOOK_MODE_WORKSPACE",
        "workspaceId": workspace_id,
        "triggers": [
            {
                "triggerType": "TRIGGER_TYPE_EXPERIMENT_STATE_CHANGE",
                "condition": {"state": "COMPLETED"},
            }
        ],
    }


async def start_command(s: Scene) -> httpx.Response:
    body = {"config": {"entrypoint": "true"}, "workspaceId": s.workspaces["vision"]}
    return await s.bob.post("/api/v1/commands", json=body)


async def put_template(s: Scene) -> httpx.Response:
    body = {"config": {"description": "x"}, "workspaceId": s.workspaces["vision"]}
    return await s.bob.post(f"/api/v1/templates/bobs-{s.bob_id}", json=body)


async def create_project(s: Scene) -> httpx.Response:
    ws = s.workspaces["vision"]
    return await s.bob.post(f"/api/v1/workspaces/{ws}/projects", json={"name": f"bobs-{s.bob_id}"})


async def create_model(s: Scene) -> httpx.Response:
    body = {"name": f"bobs-{s.bob_id}", "workspaceId": s.workspaces["vision"]}
    return await s.bob.post("/api/v1/models", json=body)


async def add_webhook(s: Scene) -> httpx.Response:
    return await s.bob.post("/api/v1/webhooks", json=webhook(s.workspaces["vision"]))


async def kill_elsewhere(s: Scene) -> httpx.Response:
    return await s.bob.post(f"/api/v1/experiments/{await s.experiment('nlp')}/kill")


async def move_project(s: Scene) -> httpx.Response:
    mine = await ok(await s.bob.post("/api/v1/workspaces", json={"name": f"bobs-{s.bob_id}"}))
    body = {"destinationWorkspaceId": mine["workspace"]["id"]}
    return await s.bob.post(f"/api/v1/projects/{s.projects['vision']}/move", json=body)


async def list_webhooks(s: Scene) -> bool:
    made = await ok(await s.alice.post("/api/v1/webhooks", json=webhook(s.workspaces["vision"])))
    listed = await ok(await s.bob.get("/api/v1/webhooks"))
    return made["webhook"]["id"] in [w["id"] for w in listed["webhooks"]]


async def see_experiment(s: Scene) -> httpx.Response:
    return await s.bob.get(f"/api/v1/experiments/{await s.experiment()}")


async def list_experiments(s: Scene) -> bool:
    experiment = await s.experiment()
    listed = await ok(await s.bob.get("/api/v1/experiments"))
    return experiment in [e["id"] for e in listed["experiments"]]


async def give_role_elsewhere(s: Scene) -> httpx.Response:
    body = assignment("Viewer", user=s.alice_id, ws=s.workspaces["nlp"])
    return await s.bob.post("/api/v1/roles/add-assignments", json=body)


ACTIONS: dict[str, Callable[[Scene], Awaitable[httpx.Response | bool]]] = {
    "see an experiment": see_experiment,
    "find an experiment in the list": list_experiments,
    "kill an experiment": kill,
    "label an experiment": label,
    "delete an experiment": delete_experiment,
    "rename a project": rename_project,
    "delete a project": delete_project,
    "rename the workspace": rename_workspace,
    "give a role in the workspace": give_role,
    "kill a command": kill_command,
    "start a command in the workspace": start_command,
    "put a template in the workspace": put_template,
    "create a project in the workspace": create_project,
    "create a model in the workspace": create_model,
    "add a webhook to the workspace": add_webhook,
    "move a project to a workspace of one's own": move_project,
    "list the workspace's webhooks": list_webhooks,
    "kill an experiment in another workspace": kill_elsewhere,
    "give a role in another workspace": give_role_elsewhere,
}


def test_the_readme_table_names_each_action_this_test_performs() -> None:
    assert set(TABLE) == set(ACTIONS)
    assert COLUMNS == [
        "no role",
        "Viewer",
        "EditorRestricted",
        "Editor",
        "WorkspaceAdmin",
        "ClusterAdmin",
    ]


@pytest.mark.parametrize("role", COLUMNS)
async def test_what_each_role_lets_a_user_change(
    app: FastAPI, admin: httpx.AsyncClient, role: str
) -> None:
    suffix = re.sub(r"\W", "", role).lower()
    alice_id = await create_user(admin, f"alice-{suffix}")
    bob_id = await create_user(admin, f"bob-{suffix}")
    async with (
        sign_in(app, f"alice-{suffix}", PASSWORD) as alice,
        sign_in(app, f"bob-{suffix}", PASSWORD) as bob,
    ):
        scene = Scene(alice, alice_id, bob, bob_id)
        await scene.build(suffix)
        if role == "ClusterAdmin":
            await ok(
                await admin.post(
                    "/api/v1/roles/add-assignments", json=assignment(role, user=bob_id)
                )
            )
        elif role != "no role":
            body = assignment(role, user=bob_id, ws=scene.workspaces["vision"])
            await ok(await admin.post("/api/v1/roles/add-assignments", json=body))
        seen = {}
        for action, perform in ACTIONS.items():
            reply = await perform(scene)
            if isinstance(reply, bool):  # a list: whether it shows alice's
                seen[action] = "yes" if reply else "no"
                continue
            answers = {200: "yes", 403: "no", 404: "unseen"}
            assert reply.status_code in answers, (action, reply.text)
            seen[action] = answers[reply.status_code]
        assert seen == {action: TABLE[action][role] for action in ACTIONS}


async def test_roles_are_listed_with_their_permissions(api: httpx.AsyncClient) -> None:
    listed = await ok(await api.post("/api/v1/roles/search", json={"limit": 0, "offset": 0}))
    names = [r["name"] for r in listed["roles"]]
    assert names == sorted(ROLE_IDS)
    assert {r["name"]: r["roleId"] for r in listed["roles"]} == ROLE_IDS
    assert listed["pagination"]["total"] == 10
    editor = next(r for r in listed["roles"] if r["name"] == "Editor")
    assert len(editor["permissions"]) == 27
    assert {
        "id": "PERMISSION_TYPE_UPDATE_EXPERIMENT",
        "name": "update experiment",
        "scopeTypeMask": {"cluster": True, "workspace": True},
    } in editor["permissions"]
    assert editor["scopeTypeMask"] == {"cluster": True, "workspace": True}
    admin_role = next(r for r in listed["roles"] if r["name"] == "ClusterAdmin")
    assert admin_role["scopeTypeMask"] == {"cluster": True, "workspace": False}
    # With a workspace: only the roles that may be assigned in one.
    in_ws = await ok(
        await api.post("/api/v1/roles/search/by-assignability", json={"workspaceId": 1})
    )
    assert [r["name"] for r in in_ws["roles"]] == [
        "Editor",
        "EditorProjectRestricted",
        "EditorRestricted",
        "ModelRegistryViewer",
        "Viewer",
        "WorkspaceAdmin",
    ]


async def test_assignments_are_listed_for_users_groups_and_roles(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient
) -> None:
    bob = await create_user(admin, "bob")
    group = (
        await ok(await admin.post("/api/v1/groups", json={"name": "team", "addUsers": [bob]}))
    )["group"]["groupId"]
    ws = (await ok(await admin.post("/api/v1/workspaces", json={"name": "vision"})))["workspace"][
        "id"
    ]
    await ok(
        await admin.post(
            "/api/v1/roles/add-assignments",
            json={
                **assignment("Editor", user=bob, ws=ws),
                **assignment("Viewer", group=group),
            },
        )
    )
    described = await ok(await admin.post("/api/v1/roles/search/by-ids", json={"roleIds": [5, 4]}))
    editor, viewer = described["roles"]
    assert editor["role"]["name"] == "Editor"
    assert editor["userRoleAssignments"] == [
        {
            "userId": bob,
            "roleAssignment": {
                "role": {
                    "roleId": 5,
                    "name": "Editor",
                    "permissions": [],
                    "scopeTypeMask": {"cluster": True, "workspace": True},
                },
                "scopeWorkspaceId": ws,
                "scopeCluster": False,
            },
        }
    ]
    assert viewer["groupRoleAssignments"][0]["groupId"] == group
    assert viewer["groupRoleAssignments"][0]["roleAssignment"]["scopeCluster"] is True

    of_bob = await ok(await admin.get(f"/api/v1/roles/search/by-user/{bob}"))
    assert [
        (r["role"]["name"], len(r["userRoleAssignments"]), len(r["groupRoleAssignments"]))
        for r in of_bob["roles"]
    ] == [("Editor", 1, 0), ("Viewer", 0, 1)]
    of_group = await ok(await admin.get(f"/api/v1/roles/search/by-group/{group}"))
    assert [r["name"] for r in of_group["roles"]] == ["Viewer"]
    assert of_group["assignments"] == [{"roleId": 4, "scopeWorkspaceIds": [], "scopeCluster": True}]
    # An admin's ClusterAdmin is its admin flag.
    admins = await ok(await admin.post("/api/v1/roles/search/by-ids", json={"roleIds": [1]}))
    admin_ids = [a["userId"] for a in admins["roles"][0]["userRoleAssignments"]]
    assert admin_ids == [await user_id(admin)]

    # Bob's own permissions; another user's roles are for those who assign roles.
    async with sign_in(app, "bob", PASSWORD) as as_bob:
        mine = await ok(await as_bob.get("/api/v1/permissions/summary"))
        assert [r["name"] for r in mine["roles"]] == ["Editor", "Viewer"]
        assert mine["assignments"] == [
            {"roleId": 5, "scopeWorkspaceIds": [ws], "scopeCluster": False},
            {"roleId": 4, "scopeWorkspaceIds": [], "scopeCluster": True},
        ]
        assert (await as_bob.get(f"/api/v1/roles/search/by-user/{bob}")).status_code == 200
        assert (await as_bob.get(f"/api/v1/roles/search/by-group/{group}")).status_code == 200
    assert refusal(await admin.get("/api/v1/roles/search/by-user/4242"), 404) == (
        "user 4242 not found"
    )
    nobody = await ok(await api.get("/api/v1/permissions/summary"))
    assert nobody == {"roles": [], "assignments": []}
    assert "holds PERMISSION_TYPE_ASSIGN_ROLES nowhere" in refusal(
        await api.get(f"/api/v1/roles/search/by-user/{bob}"), 403
    )
    assert refusal(await api.post("/api/v1/roles/search/by-ids", json={"roleIds": [5]}), 403)
    # A group one is not in is answered as one that does not exist.
    hidden = refusal(await api.get(f"/api/v1/roles/search/by-group/{group}"), 404)
    unknown = refusal(await api.get("/api/v1/roles/search/by-group/4242"), 404)
    assert (hidden, unknown) == (f"user group {group} not found", "user group 4242 not found")


async def test_a_workspace_admin_sees_the_assignments_of_workspaces_it_reads_only(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    """Who holds what in a workspace names the workspace: a WorkspaceAdmin of vision lists
    the assignments in vision and across the cluster, never those in nlp, kept from it."""
    carol = await create_user(admin, "carol")
    dave = await create_user(admin, "dave")
    group = (
        await ok(await admin.post("/api/v1/groups", json={"name": "team", "addUsers": [dave]}))
    )["group"]["groupId"]
    vision, nlp = [
        (await ok(await admin.post("/api/v1/workspaces", json={"name": name})))["workspace"]["id"]
        for name in ("vision", "nlp")
    ]
    for body in (
        assignment("WorkspaceAdmin", user=carol, ws=vision),
        assignment("Editor", user=dave, ws=vision),
        assignment("Editor", user=dave, ws=nlp),
        assignment("Viewer", group=group, ws=nlp),
        assignment("Viewer", user=dave),
    ):
        await ok(await admin.post("/api/v1/roles/add-assignments", json=body))

    def scopes(described: dict[str, Any]) -> list[tuple[str, int]]:
        return sorted(  # 0: across the cluster
            (r["role"]["name"], a["roleAssignment"].get("scopeWorkspaceId") or 0)
            for r in described["roles"]
            for a in r["userRoleAssignments"] + r["groupRoleAssignments"]
        )

    async with sign_in(app, "carol", PASSWORD) as as_carol:
        of_dave = await ok(await as_carol.get(f"/api/v1/roles/search/by-user/{dave}"))
        assert scopes(of_dave) == [("Editor", vision), ("Viewer", 0)]
        editors = await ok(
            await as_carol.post("/api/v1/roles/search/by-ids", json={"roleIds": [5]})
        )
        assert scopes(editors) == [("Editor", vision)]
        of_group = await ok(await as_carol.get(f"/api/v1/roles/search/by-group/{group}"))
        assert of_group == {"roles": [], "assignments": []}
    # The cluster's admins see them all, dave's group's included.
    of_dave = await ok(await admin.get(f"/api/v1/roles/search/by-user/{dave}"))
    assert scopes(of_dave) == sorted(
        [("Editor", vision), ("Editor", nlp), ("Viewer", nlp), ("Viewer", 0)]
    )
    # One's own and one's groups' assignments are one's to see wherever they are: dave's
    # group holds ModelRegistryViewer in audio, which shows dave no workspace there.
    audio = (await ok(await admin.post("/api/v1/workspaces", json={"name": "audio"})))["workspace"][
        "id"
    ]
    for body in (
        assignment("ModelRegistryViewer", group=group, ws=audio),
        assignment("WorkspaceAdmin", user=dave, ws=vision),  # so he reads assignments
    ):
        await ok(await admin.post("/api/v1/roles/add-assignments", json=body))
    async with sign_in(app, "dave", PASSWORD) as as_dave:
        of_group = await ok(await as_dave.get(f"/api/v1/roles/search/by-group/{group}"))
        assert sorted((a["roleId"], a["scopeWorkspaceIds"]) for a in of_group["assignments"]) == [
            (4, [nlp]),
            (6, [audio]),
        ]
        held = await ok(await as_dave.post("/api/v1/roles/search/by-ids", json={"roleIds": [6]}))
        assert scopes(held) == [("ModelRegistryViewer", audio)]


async def test_a_viewer_may_not_start_tasks_where_it_only_reads(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    bob = await create_user(admin, "bob")
    ws = (await ok(await admin.post("/api/v1/workspaces", json={"name": "vision"})))["workspace"][
        "id"
    ]
    await ok(
        await admin.post(
            "/api/v1/roles/add-assignments", json=assignment("Viewer", user=bob, ws=ws)
        )
    )
    async with sign_in(app, "bob", PASSWORD) as as_bob:
        for kind in ("commands", "notebooks", "shells"):
            body = {"config": {"entrypoint": "true"}, "workspaceId": ws}
            refused = refusal(await as_bob.post(f"/api/v1/{kind}", json=body), 403)
            assert refused.startswith(f"user bob may not start a {kind[:-1]} in workspace 'vision'")
            assert "PERMISSION_TYPE_CREATE_NSC" in refused
        # Nothing was queued.
        assert (await ok(await admin.get("/api/v1/commands")))["commands"] == []
        # In the shared workspace anyone may.
        await ok(await as_bob.post("/api/v1/commands", json={"config": {"entrypoint": "true"}}))


async def assignments_now(admin: httpx.AsyncClient) -> list[Any]:
    """Every role's assignments, to show that a refused request changed nothing."""
    found = await ok(
        await admin.post("/api/v1/roles/search/by-ids", json={"roleIds": list(ROLE_IDS.values())})
    )
    return found["roles"]


async def test_bad_assignments_are_refused_naming_the_field_and_change_nothing(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient
) -> None:
    bob = await create_user(admin, "bob")
    group = (await ok(await admin.post("/api/v1/groups", json={"name": "team"})))["group"][
        "groupId"
    ]
    ws = (await ok(await admin.post("/api/v1/workspaces", json={"name": "vision"})))["workspace"][
        "id"
    ]
    await ok(
        await admin.post(
            "/api/v1/roles/add-assignments", json=assignment("Viewer", user=bob, ws=ws)
        )
    )
    before = await assignments_now(admin)
    good = assignment("Editor", user=bob, ws=ws)["userRoleAssignments"][0]
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({}, 400, "userRoleAssignments, groupRoleAssignments: name at least one assignment"),
        (
            {
                "userRoleAssignments": [
                    good,
                    {"userId": bob, "roleAssignment": {"role": {"roleId": 99}}},
                ]
            },
            404,
            "userRoleAssignments[1].roleAssignment.role.roleId: role 99 not found",
        ),
        (
            assignment("Editor", user=4242, ws=ws),
            404,
            "userRoleAssignments[0].userId: user 4242 not found",
        ),
        (
            assignment("Editor", group=4242, ws=ws),
            404,
            "groupRoleAssignments[0].groupId: group 4242 not found",
        ),
        (
            assignment("Editor", user=bob, ws=4242),
            404,
            "userRoleAssignments[0].roleAssignment.scopeWorkspaceId: workspace 4242 not found",
        ),
        (
            assignment("ClusterAdmin", user=bob, ws=ws),
            400,
            "userRoleAssignments[0].roleAssignment.scopeWorkspaceId: role ClusterAdmin holds "
            "permissions that exist only across the cluster, so it is assigned without a workspace",
        ),
        (
            assignment("ClusterAdmin", group=group),
            400,
            "groupRoleAssignments[0].roleAssignment.role.roleId: ClusterAdmin is given to users "
            "(it is their admin flag), not to groups",
        ),
        (
            assignment("Viewer", user=bob, ws=ws),
            409,
            f"userRoleAssignments[0]: user {bob} already holds Viewer in workspace 'vision'",
        ),
        (
            {"userRoleAssignments": [good, good]},
            409,
            f"userRoleAssignments[1]: user {bob} already holds Editor in workspace 'vision'",
        ),
        (
            {
                "userRoleAssignments": [
                    {**good, "roleAssignment": {**good["roleAssignment"], "scopeCluster": True}}
                ]
            },
            400,
            "userRoleAssignments[0].roleAssignment: scopeCluster and scopeWorkspaceId name two "
            "scopes; give one",
        ),
    ]
    for body, status, message in cases:
        reply = await admin.post("/api/v1/roles/add-assignments", json=body)
        assert refusal(reply, status) == message, body
    for body, status, message in [
        (
            assignment("Editor", user=bob, ws=ws),
            404,
            f"userRoleAssignments[0]: user {bob} does not hold Editor in workspace 'vision'",
        ),
        (
            assignment("ClusterAdmin", user=bob),
            404,
            f"userRoleAssignments[0]: user {bob} does not hold ClusterAdmin across the cluster",
        ),
        (
            assignment("ClusterAdmin", user=await user_id(admin)),
            400,
            "userRoleAssignments[0]: an admin cannot remove their own ClusterAdmin; ask another "
            "admin",
        ),
    ]:
        reply = await admin.post("/api/v1/roles/remove-assignments", json=body)
        assert refusal(reply, status) == message, body
    # Not theirs to give: across the cluster only ClusterAdmins, in a workspace its admins.
    assert refusal(
        await api.post("/api/v1/roles/add-assignments", json=assignment("Editor", user=bob)),
        403,
    ) == (
        "userRoleAssignments[0]: assigning roles across the cluster is for ClusterAdmins; "
        "user determined is not one"
    )
    # In a workspace determined does not see, as if it did not exist; as its Viewer, refused.
    give = assignment("Editor", user=bob, ws=ws)
    assert refusal(await api.post("/api/v1/roles/add-assignments", json=give), 404) == (
        f"userRoleAssignments[0].roleAssignment.scopeWorkspaceId: workspace {ws} not found"
    )
    await give_viewer(admin, api, ws)
    before = await assignments_now(admin)
    assert "needs PERMISSION_TYPE_ASSIGN_ROLES there" in refusal(
        await api.post("/api/v1/roles/add-assignments", json=give), 403
    )
    assert await assignments_now(admin) == before


async def test_cluster_admin_is_the_admin_flag_and_a_removal_takes_it_back(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    bob = await create_user(admin, "bob")
    admin_id = await user_id(admin)
    await ok(
        await admin.post("/api/v1/roles/add-assignments", json=assignment("ClusterAdmin", user=bob))
    )
    assert (await ok(await admin.get(f"/api/v1/users/{bob}")))["user"]["admin"] is True
    async with sign_in(app, "bob", PASSWORD) as as_bob:
        # Now bob may do what admins do, and the last admin cannot remove their own role.
        assert (await as_bob.post("/api/v1/groups", json={"name": "bobs"})).status_code == 200
        await ok(
            await as_bob.post(
                "/api/v1/roles/remove-assignments", json=assignment("ClusterAdmin", user=admin_id)
            )
        )
        refused = await as_bob.post(
            "/api/v1/roles/remove-assignments", json=assignment("ClusterAdmin", user=bob)
        )
        assert "cannot remove their own ClusterAdmin" in refusal(refused, 400)
        await ok(
            await as_bob.post(
                "/api/v1/roles/add-assignments", json=assignment("ClusterAdmin", user=admin_id)
            )
        )
    await ok(
        await admin.post(
            "/api/v1/roles/remove-assignments", json=assignment("ClusterAdmin", user=bob)
        )
    )
    assert (await ok(await admin.get(f"/api/v1/users/{bob}")))["user"]["admin"] is False


async def test_a_role_through_a_group_or_across_the_cluster_applies(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    alice_id = await create_user(admin, "alice")
    bob = await create_user(admin, "bob")
    carol = await create_user(admin, "carol")
    group = await ok(await admin.post("/api/v1/groups", json={"name": "team", "addUsers": [bob]}))
    async with (
        sign_in(app, "alice", PASSWORD) as alice,
        sign_in(app, "bob", PASSWORD) as as_bob,
        sign_in(app, "carol", PASSWORD) as as_carol,
    ):
        scene = Scene(alice, alice_id, as_bob, bob)
        await scene.build("groups")
        ws = scene.workspaces["vision"]
        assert (await kill(scene)).status_code == 404  # not seen without a role
        # Editor given to bob's group in vision: bob may now kill there, not in nlp.
        body = assignment("Editor", group=group["group"]["groupId"], ws=ws)
        await ok(await admin.post("/api/v1/roles/add-assignments", json=body))
        assert (await kill(scene)).status_code == 200
        assert (await kill_elsewhere(scene)).status_code == 404
        # Removing bob from the group takes it away.
        update = {"groupId": group["group"]["groupId"], "removeUsers": [bob]}
        await ok(await admin.put(f"/api/v1/groups/{group['group']['groupId']}", json=update))
        assert (await kill(scene)).status_code == 404
        # Editor across the cluster: carol may kill in every workspace.
        carols = Scene(alice, alice_id, as_carol, carol)
        carols.workspaces, carols.projects = scene.workspaces, scene.projects
        await ok(
            await admin.post("/api/v1/roles/add-assignments", json=assignment("Editor", user=carol))
        )
        assert (await kill(carols)).status_code == 200
        assert (await kill_elsewhere(carols)).status_code == 200


async def test_moving_someone_elses_model_takes_the_workspace_admin(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    alice_id = await create_user(admin, "alice")
    bob = await create_user(admin, "bob")
    async with sign_in(app, "alice", PASSWORD) as alice, sign_in(app, "bob", PASSWORD) as as_bob:
        scene = Scene(alice, alice_id, as_bob, bob)
        await scene.build("models")
        vision = scene.workspaces["vision"]
        await ok(await alice.post("/api/v1/models", json={"name": "hers", "workspaceId": vision}))
        mine = await ok(await as_bob.post("/api/v1/workspaces", json={"name": "bobs"}))
        move = {"destinationWorkspaceId": mine["workspace"]["id"]}
        await ok(
            await admin.post(
                "/api/v1/roles/add-assignments", json=assignment("Editor", user=bob, ws=vision)
            )
        )
        # An Editor may change it, not take it out of its workspace (into one of his own,
        # where he could delete it).
        assert (
            await as_bob.patch("/api/v1/models/hers", json={"description": "x"})
        ).status_code == 200
        refused = refusal(await as_bob.post("/api/v1/models/hers/move", json=move), 403)
        assert "PERMISSION_TYPE_DELETE_OTHER_USER_MODEL_REGISTRY" in refused
        patch = {"workspaceId": mine["workspace"]["id"]}
        assert refusal(await as_bob.patch("/api/v1/models/hers", json=patch), 403)
        model = await ok(await alice.get("/api/v1/models/hers"))
        assert model["model"]["workspaceId"] == vision
        await ok(
            await admin.post(
                "/api/v1/roles/add-assignments",
                json=assignment("WorkspaceAdmin", user=bob, ws=vision),
            )
        )
        await ok(await as_bob.post("/api/v1/models/hers/move", json=move))


async def test_describing_a_role_one_holds_and_a_refused_removal(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    bob = await create_user(admin, "bob")
    await create_user(admin, "carol")
    ws = (await ok(await admin.post("/api/v1/workspaces", json={"name": "vision"})))["workspace"][
        "id"
    ]
    editor = assignment("Editor", user=bob, ws=ws)
    await ok(await admin.post("/api/v1/roles/add-assignments", json=editor))
    async with sign_in(app, "bob", PASSWORD) as as_bob:
        # A role bob holds: described with his own assignment; one he does not: refused.
        described = await ok(
            await as_bob.post("/api/v1/roles/search/by-ids", json={"roleIds": [5]})
        )
        assert [a["userId"] for a in described["roles"][0]["userRoleAssignments"]] == [bob]
        assert refusal(await as_bob.post("/api/v1/roles/search/by-ids", json={"roleIds": [2]}), 403)
    before = await assignments_now(admin)
    twice = {"userRoleAssignments": editor["userRoleAssignments"] * 2}
    message = refusal(await admin.post("/api/v1/roles/remove-assignments", json=twice), 404)
    assert (
        message == f"userRoleAssignments[1]: user {bob} does not hold Editor in workspace 'vision'"
    )
    assert await assignments_now(admin) == before


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_two_admins_removing_each_other_at_once_leave_one(
    app: FastAPI, admin: httpx.AsyncClient, backend: str
) -> None:
    """On PostgreSQL, where two requests' transactions overlap (SQLite runs one writer at a
    time): the second waits for the first's lock, then finds itself no longer an admin."""
    ann, ben = await create_user(admin, "ann"), await create_user(admin, "ben")
    for who in (ann, ben):
        body = assignment("ClusterAdmin", user=who)
        await ok(await admin.post("/api/v1/roles/add-assignments", json=body))
    admin_id = await user_id(admin)
    async with sign_in(app, "ann", PASSWORD) as as_ann, sign_in(app, "ben", PASSWORD) as as_ben:
        body = assignment("ClusterAdmin", user=admin_id)
        await ok(await as_ann.post("/api/v1/roles/remove-assignments", json=body))
        replies = await asyncio.gather(
            as_ann.post(
                "/api/v1/roles/remove-assignments", json=assignment("ClusterAdmin", user=ben)
            ),
            as_ben.post(
                "/api/v1/roles/remove-assignments", json=assignment("ClusterAdmin", user=ann)
            ),
        )
        assert sorted(r.status_code for r in replies) == [200, 403], [r.text for r in replies]
        # Refused whether it waited on the lock or started after the first had committed.
        refused = next(r for r in replies if r.status_code == 403).json()["message"]
        assert "is no longer a ClusterAdmin" in refused or "is not one" in refused, refused
        flags = []
        for who in (ann, ben):
            flags.append((await ok(await as_ann.get(f"/api/v1/users/{who}")))["user"]["admin"])
        assert sorted(flags) == [False, True]


async def test_the_database_keeps_each_assignment_once(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    """What two requests giving one assignment at the same moment would store (both past
    the service's check before either commits): the second row is refused by the
    database's unique indexes, one per kind of holder and scope. A refused insert surfaces
    as the API's 409."""
    bob = await create_user(admin, "bob")
    group = (await ok(await admin.post("/api/v1/groups", json={"name": "team"})))["group"]
    ws = (await ok(await admin.post("/api/v1/workspaces", json={"name": "vision"})))["workspace"]
    for held in (
        {"user_id": bob, "workspace_id": None},
        {"user_id": bob, "workspace_id": ws["id"]},
        {"group_id": group["groupId"], "workspace_id": None},
        {"group_id": group["groupId"], "workspace_id": ws["id"]},
    ):
        async with session_scope(app.state.session_factory) as session:
            session.add(RoleAssignmentModel(role_id=5, **held))
        with pytest.raises(IntegrityError):
            async with session_scope(app.state.session_factory) as session:
                session.add(RoleAssignmentModel(role_id=5, **held))
        # The same holder with another role, or in another scope, is another assignment.
        async with session_scope(app.state.session_factory) as session:
            session.add(RoleAssignmentModel(role_id=4, **held))
