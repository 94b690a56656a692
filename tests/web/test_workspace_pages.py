"""The workspaces and projects pages, in process on both databases: the workspaces, a
workspace's projects with their counts, a project's experiments (the experiments list
filtered to it), and an experiment's page linking back to its project and workspace; a
workspace's quotas with the slots it holds and borrows, and a trial waiting on its quota;
a workspace's members and the roles given them there."""

from __future__ import annotations

import re
from typing import Any

import httpx
from fastapi import FastAPI

from tests.api.test_scheduling import register, schedule
from tests.api.test_trial_reports import ok
from tests.factories import EXPERIMENT_YAML, v1_file
from tests.web.test_pages import bearer


async def experiment_in(web: httpx.AsyncClient, project_id: int, name: str) -> int:
    config = EXPERIMENT_YAML.replace("name: mnist-random", f"name: {name}")
    body = {"config": config, "modelDefinition": [v1_file("train.py")], "projectId": project_id}
    reply: dict[str, Any] = await ok(web.post("/api/v1/experiments", json=body))
    return int(reply["experiment"]["id"])


def rows_of(html: str, attribute: str) -> list[str]:
    return re.findall(rf'data-{attribute}="([^"]*)"', html)


async def test_workspaces_their_projects_and_a_projects_experiments(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    bucket = {"type": "s3", "bucket": "vision-ckpt", "access_key": "AK", "secret_key": "hush"}
    body = {"name": "vision", "checkpointStorageConfig": bucket}
    vision = (await ok(web.post("/api/v1/workspaces", json=body)))["workspace"]
    old = (await ok(web.post("/api/v1/workspaces", json={"name": "old-team"})))["workspace"]
    await ok(web.post(f"/api/v1/workspaces/{old['id']}/archive"))
    made = []
    for name, description in (("detection", "boxes"), ("segmentation", "")):
        body = {"name": name, "workspaceId": vision["id"], "description": description}
        made.append(
            (await ok(web.post(f"/api/v1/workspaces/{vision['id']}/projects", json=body)))[
                "project"
            ]
        )
    detection, segmentation = made
    first = await experiment_in(web, detection["id"], "yolo-small")
    second = await experiment_in(web, detection["id"], "yolo-large")
    other = await experiment_in(web, segmentation["id"], "unet")

    listed = await web.get("/ui/workspaces")
    assert listed.status_code == 200, listed.text
    assert "vision" in rows_of(listed.text, "workspace")
    assert "Uncategorized" in rows_of(listed.text, "workspace")
    assert "old-team" not in rows_of(listed.text, "workspace")  # archived: only when asked
    assert "old-team" in rows_of((await web.get("/ui/workspaces?archived=true")).text, "workspace")
    row = re.search(r'<tr data-workspace="vision">(.*?)</tr>', listed.text, re.S)
    assert row is not None
    assert [c.strip() for c in re.findall(r"<td>([^<]*)</td>", row.group(1))][:2] == ["2", "3"]

    workspace = await web.get(f"/ui/workspaces/{vision['id']}")
    assert workspace.status_code == 200, workspace.text
    assert rows_of(workspace.text, "project") == ["detection", "segmentation"]
    assert f'href="/ui/experiments?project={detection["id"]}"' in workspace.text
    assert "boxes" in workspace.text
    defaults = re.search(r'id="workspace-defaults">(.*?)</dl>', workspace.text, re.S)
    assert defaults is not None
    assert "vision-ckpt" in defaults.group(1) and "hush" not in workspace.text
    assert defaults.group(1).count("the master") == 2  # no default pools of its own

    in_project = await web.get(f"/ui/experiments?project={detection['id']}")
    assert in_project.status_code == 200, in_project.text
    assert 'id="project-heading">Experiments in detection<' in in_project.text
    shown = set(re.findall(r'href="/ui/experiments/(\d+)"', in_project.text))
    assert {str(first), str(second)} <= shown and str(other) not in shown
    # The filter form keeps the project, so filtering further stays inside it.
    assert f'name="project" value="{detection["id"]}"' in in_project.text

    page = await web.get(f"/ui/experiments/{other}")
    assert page.status_code == 200, page.text
    assert f'href="/ui/workspaces/{vision["id"]}" id="experiment-workspace">vision<' in page.text
    assert (
        f'href="/ui/experiments?project={segmentation["id"]}" id="experiment-project">'
        "segmentation<" in page.text
    )


async def test_unknown_workspaces_and_projects_are_404_pages_and_bad_ids_400(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    missing = await web.get("/ui/workspaces/987654")
    assert missing.status_code == 404 and "workspace 987654 not found" in missing.text
    no_project = await web.get("/ui/experiments?project=987654")
    assert no_project.status_code == 404 and "project 987654 not found" in no_project.text
    for bad in ("/ui/experiments?project=-1", "/ui/experiments?project=x", "/ui/workspaces/x"):
        reply = await web.get(bad)
        assert reply.status_code == 400, reply.text
        assert "<nav>" in reply.text  # the site's error page, with its navigation


def cells(html: str, table: str, attribute: str, key: str) -> list[str]:
    """The text of each cell of the row whose data-`attribute` is `key` in table `table`."""
    body = re.search(rf'<table class="list" id="{table}">(.*?)</table>', html, re.S)
    assert body is not None, html
    row = re.search(rf'<tr data-{attribute}="{re.escape(key)}">(.*?)</tr>', body.group(1), re.S)
    assert row is not None, body.group(1)
    found = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    return [re.sub(r"<[^>]+>", "", c).strip() for c in found]


async def quota_shown(web: httpx.AsyncClient, workspace: dict[str, Any]) -> tuple[str, list[str]]:
    """The workspace's cell in the list's Quota column, and its quota row in pool default
    on its own page."""
    listed = (await web.get("/ui/workspaces")).text
    page = (await web.get(f"/ui/workspaces/{workspace['id']}")).text
    return (
        cells(listed, "workspaces", "workspace", workspace["name"])[3],
        cells(page, "quotas", "pool", "default"),
    )


async def test_a_workspaces_quota_held_and_borrowed_slots_and_why_a_trial_waits(
    app: FastAPI, web: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    await bearer(web)
    await register(app, "cpu-1", 4)
    vision = (await ok(web.post("/api/v1/workspaces", json={"name": "vision"})))["workspace"]
    body = {"name": "detection", "workspaceId": vision["id"]}
    project = (await ok(web.post(f"/api/v1/workspaces/{vision['id']}/projects", json=body)))[
        "project"
    ]
    quota = f"/api/v1/workspaces/{vision['id']}/quotas/default"
    await ok(admin.put(quota, json={"nominalSlots": 2, "borrowingLimit": 0}))
    # Three one-slot trials; the quota admits two, and 2 slots stay idle, lent to no one.
    config = EXPERIMENT_YAML.replace("name: mnist-random", "name: yolo")
    body = {"config": config, "modelDefinition": [v1_file("train.py")], "projectId": project["id"]}
    body["activate"] = True
    experiment = (await ok(web.post("/api/v1/experiments", json=body)))["experiment"]["id"]
    await schedule(app)

    assert await quota_shown(web, vision) == (
        "2 slots in default, holds 2",
        ["default", "2", "0", "no limit", "2", "0", "api"],
    )
    listed = (await web.get("/ui/workspaces")).text
    assert cells(listed, "workspaces", "workspace", "Uncategorized")[3] == "—"

    # The waiting trial's reason on its experiment's page: the code, then the words.
    shown = (await web.get(f"/ui/experiments/{experiment}")).text
    assert (
        "<code>QUOTA_BORROWING_LIMIT</code> workspace vision holds 2 of its 2-slot quota " in shown
    )
    assert "lent to no one because its borrowing limit is 0" in shown

    # Borrowing allowed: the third runs on a slot above the quota, borrowed.
    await ok(admin.put(quota, json={"nominalSlots": 2, "borrowingLimit": None, "lendingLimit": 1}))
    await schedule(app)
    assert await quota_shown(web, vision) == (
        "2 slots in default, holds 3 (1 borrowed)",
        ["default", "2", "no limit", "1", "3", "1", "api"],
    )

    # Without a quota: a row that says so, and all it holds is borrowed.
    await ok(admin.delete(quota))
    summary, row = await quota_shown(web, vision)
    assert summary == "no quota in default, holds 3"
    assert row[0] == "default" and row[1].startswith("no quota") and row[2:] == ["3", "3", "—"]
    # A workspace with neither: the page says how an admin sets one.
    nlp = (await ok(web.post("/api/v1/workspaces", json={"name": "nlp"})))["workspace"]
    empty = (await web.get(f"/ui/workspaces/{nlp['id']}")).text
    assert "No quotas, and no slots held" in empty
    assert "det workspace quota set nlp --pool POOL --nominal N" in empty


async def test_a_workspaces_members_and_their_roles(web: httpx.AsyncClient) -> None:
    signed_in = await ok(web.post("/api/v1/auth/login", json={"username": "admin"}))
    as_admin = {"Authorization": f"Bearer {signed_in['token']}"}
    await bearer(web)  # determined, who creates the workspace and so may give roles in it
    ws = (await ok(web.post("/api/v1/workspaces", json={"name": "vision"})))["workspace"]["id"]
    body = {"user": {"username": "bob"}, "password": ""}
    bob = (await ok(web.post("/api/v1/users", json=body, headers=as_admin)))["user"]["id"]
    group = await ok(web.post("/api/v1/groups", json={"name": "team"}, headers=as_admin))
    page = await web.get(f"/ui/workspaces/{ws}")
    assert rows_of(page.text, "member") == ["determined"]
    assert "No roles given here" in page.text
    assignments = {
        "userRoleAssignments": [
            {"userId": bob, "roleAssignment": {"role": {"roleId": 5}, "scopeWorkspaceId": ws}}
        ],
        "groupRoleAssignments": [
            {
                "groupId": group["group"]["groupId"],
                "roleAssignment": {"role": {"roleId": 4}, "scopeWorkspaceId": ws},
            }
        ],
    }
    await ok(web.post("/api/v1/roles/add-assignments", json=assignments))
    page = await web.get(f"/ui/workspaces/{ws}")
    assert page.status_code == 200, page.text
    cells = re.findall(
        r'<tr data-member="[^"]*"><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>', page.text
    )
    assert cells == [
        ("determined", "user", "owner (created it)"),
        ("bob", "user", "Editor"),
        ("team", "group", "Viewer"),
    ]
