"""Templates in workspaces (issue 29 item 1), on Determined's wire: workspaceId on every
read, set by POST and moved by PUT, filtered by workspaceIds; a bad workspace refused
naming the field with nothing changed; a template used from any workspace."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.api.test_access import alice, give_viewer, refusal  # noqa: F401 - alice is a fixture
from tests.api.test_workspaces import (
    SINGLE,
    deleter_pass,
    experiment_in,
    new_project,
    new_workspace,
    workspaces_of,
)
from tests.factories import TEMPLATE_CONFIG, create_experiment, row_counts


async def post_template(
    api: httpx.AsyncClient, name: str, workspace_id: Any, config: dict[str, Any] | None = None
) -> httpx.Response:
    body = {"name": name, "config": config or TEMPLATE_CONFIG, "workspaceId": workspace_id}
    return await api.post(f"/api/v1/templates/{name}", json=body)


async def listed(api: httpx.AsyncClient, **params: Any) -> list[tuple[str, int]]:
    reply = await api.get("/api/v1/templates", params=params)
    assert reply.status_code == 200, reply.text
    return [(t["name"], t["workspaceId"]) for t in reply.json()["templates"]]


async def uncategorized_id(api: httpx.AsyncClient) -> int:
    [ws] = await workspaces_of(api, name="Uncategorized")
    found: int = ws["id"]
    return found


async def test_templates_belong_to_workspaces_and_list_by_them(api: httpx.AsyncClient) -> None:
    vision = (await new_workspace(api, "vision"))["id"]
    audio = (await new_workspace(api, "audio"))["id"]
    default = await uncategorized_id(api)
    reply = await post_template(api, "a-vision", vision)
    assert reply.status_code == 200, reply.text
    assert reply.json()["template"]["workspaceId"] == vision
    # workspaceId 0, as `det tpl set` sends it, and no workspaceId: the built-in workspace.
    assert (await post_template(api, "b-default", 0)).json()["template"]["workspaceId"] == default
    reply = await api.post("/api/v1/templates/c-none", json={"config": {"description": "x"}})
    assert reply.json()["template"]["workspaceId"] == default
    got = await api.get("/api/v1/templates/a-vision")
    assert got.json()["template"]["workspaceId"] == vision

    assert await listed(api, workspaceIds=vision) == [("a-vision", vision)]
    assert await listed(api, workspaceIds=[default]) == [
        ("b-default", default),
        ("c-none", default),
    ]
    assert [n for n, _ in await listed(api, workspaceIds=[vision, default])] == [
        "a-vision",
        "b-default",
        "c-none",
    ]
    assert await listed(api, workspaceIds=audio) == []
    assert await listed(api, workspaceIds=424242) == []
    assert [n for n, _ in await listed(api, orderBy="ORDER_BY_DESC", sortBy="SORT_BY_NAME")] == [
        "c-none",
        "b-default",
        "a-vision",
    ]
    reply = await api.get("/api/v1/templates", params={"workspaceIds": default, "limit": 1})
    assert reply.json()["pagination"]["total"] == 2
    assert [t["name"] for t in reply.json()["templates"]] == ["b-default"]


async def test_put_moves_a_template_and_zero_leaves_it(api: httpx.AsyncClient) -> None:
    vision = (await new_workspace(api, "vision"))["id"]
    default = await uncategorized_id(api)
    assert (await post_template(api, "shared", 0)).status_code == 200
    body = {"name": "shared", "config": {"description": "moved"}, "workspaceId": vision}
    reply = await api.put("/api/v1/templates/shared", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["template"]["workspaceId"] == vision
    assert await listed(api, workspaceIds=vision) == [("shared", vision)]
    # 0 replaces the config and leaves the template where it is, as Determined does.
    body = {"name": "shared", "config": {"description": "again"}, "workspaceId": 0}
    reply = await api.put("/api/v1/templates/shared", json=body)
    assert reply.json()["template"]["workspaceId"] == vision
    reply = await api.patch("/api/v1/templates/shared", json={"description": "patched"})
    assert reply.json()["template"]["workspaceId"] == vision
    # A PUT that creates puts the new template where it says.
    body = {"name": "fresh", "config": {"description": "new"}, "workspaceId": 0}
    assert (await api.put("/api/v1/templates/fresh", json=body)).json()["template"][
        "workspaceId"
    ] == default


async def test_only_the_owner_moves_a_template(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    vision = (await new_workspace(api, "vision"))["id"]
    assert (await post_template(api, "mine", 0)).status_code == 200
    body = {"name": "mine", "config": TEMPLATE_CONFIG, "workspaceId": vision}
    # alice holds no role in determined's vision: for her it does not exist.
    hidden = f"workspaceId: workspace {vision} not found"
    assert refusal(await alice.put("/api/v1/templates/mine", json=body), 404) == hidden
    assert refusal(await post_template(alice, "hers", vision), 404) == hidden
    # As its Viewer she sees it: moving determined's template there is his to do.
    await give_viewer(admin, alice, vision)
    refusal(await alice.put("/api/v1/templates/mine", json=body), 403)
    assert await listed(api, workspaceIds=vision) == []
    # A template of her own there takes CREATE_TEMPLATES (an Editor's), not a Viewer's.
    refused = refusal(await post_template(alice, "hers", vision), 403)
    assert "may not put templates in workspace 'vision'" in refused
    assert "PERMISSION_TYPE_CREATE_TEMPLATES" in refused
    assert await listed(api, workspaceIds=vision) == []


async def test_an_owner_replaces_a_template_where_it_is_without_the_right_to_add_one(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    """alice put her template in vision as its Editor, then kept only Viewer there: she may
    still replace it where it is (as PATCH lets her), not add another there."""
    vision = (await new_workspace(api, "vision"))["id"]
    me = (await alice.get("/api/v1/me")).json()["user"]["id"]
    scope = {"role": {"roleId": 5}, "scopeWorkspaceId": vision}  # Editor
    body = {"userRoleAssignments": [{"userId": me, "roleAssignment": scope}]}
    assert (await admin.post("/api/v1/roles/add-assignments", json=body)).status_code == 200
    assert (await post_template(alice, "hers", vision)).status_code == 200
    assert (await admin.post("/api/v1/roles/remove-assignments", json=body)).status_code == 200
    await give_viewer(admin, alice, vision)
    replaced = {"name": "hers", "config": {"description": "again"}, "workspaceId": vision}
    reply = await alice.put("/api/v1/templates/hers", json=replaced)
    assert reply.status_code == 200, reply.text
    assert reply.json()["template"]["config"] == {"description": "again"}
    refusal(await post_template(alice, "another", vision), 403)


BAD_IDS = [
    pytest.param(424242, 404, "workspaceId: workspace 424242 not found", id="unknown"),
    pytest.param(-1, 400, "workspaceId", id="negative"),
    pytest.param(2**63, 400, "workspaceId", id="past-int64"),
    pytest.param("vision", 400, "workspaceId", id="a-name"),
]


@pytest.mark.parametrize(("workspace_id", "status", "message"), BAD_IDS)
async def test_a_bad_workspace_id_is_refused_and_nothing_changes(
    api: httpx.AsyncClient, workspace_id: Any, status: int, message: str
) -> None:
    assert message in refusal(await post_template(api, "new", workspace_id), status)
    assert await row_counts(api) == (0, 0)
    assert (await post_template(api, "kept", 0)).status_code == 200
    body = {"name": "kept", "config": {"description": "changed"}, "workspaceId": workspace_id}
    assert message in refusal(await api.put("/api/v1/templates/kept", json=body), status)
    kept = (await api.get("/api/v1/templates/kept")).json()["template"]
    assert (kept["config"], kept["workspaceId"]) == (TEMPLATE_CONFIG, await uncategorized_id(api))
    reply = await api.get("/api/v1/templates", params={"workspaceIds": workspace_id})
    if status == 400:
        assert "workspaceIds" in refusal(reply, 400)


async def test_bad_list_parameters_are_refused(api: httpx.AsyncClient) -> None:
    reply = await api.get("/api/v1/templates", params={"orderBy": "ORDER_BY_NAME"})
    assert "orderBy: 'ORDER_BY_NAME' is not one of" in refusal(reply, 400)
    reply = await api.get("/api/v1/templates", params={"sortBy": "SORT_BY_ID"})
    assert "sortBy: 'SORT_BY_ID' is not one of" in refusal(reply, 400)


async def test_an_archived_workspace_takes_no_templates(api: httpx.AsyncClient) -> None:
    ws = (await new_workspace(api, "frozen"))["id"]
    assert (await post_template(api, "kept", 0)).status_code == 200
    assert (await api.post(f"/api/v1/workspaces/{ws}/archive")).status_code == 200
    message = f"workspaceId: workspace 'frozen' ({ws}) is archived"
    assert message in refusal(await post_template(api, "late", ws), 400)
    body = {"name": "kept", "config": TEMPLATE_CONFIG, "workspaceId": ws}
    assert message in refusal(await api.put("/api/v1/templates/kept", json=body), 400)
    assert await listed(api, workspaceIds=ws) == []
    assert await row_counts(api) == (0, 1)


async def test_a_deleted_workspace_takes_its_templates(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    ws = await new_workspace(api, "finished")
    project = await new_project(api, ws["id"], "done")
    assert (await post_template(api, "goes", ws["id"])).status_code == 200
    assert (await post_template(api, "stays", 0)).status_code == 200
    experiment_id = await experiment_in(api, projectId=project["id"])
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/kill")).status_code == 200
    reply = await api.delete(f"/api/v1/workspaces/{ws['id']}")
    assert reply.json() == {"completed": False}
    # While its experiments' checkpoints go, it takes no new template, nor a new role.
    reply = await post_template(api, "late", ws["id"])
    assert f"workspaceId: workspace 'finished' ({ws['id']}) is being deleted" in refusal(reply, 400)
    me = (await api.get("/api/v1/me")).json()["user"]["id"]
    scope = {"role": {"roleId": 4}, "scopeWorkspaceId": ws["id"]}
    body = {"userRoleAssignments": [{"userId": me, "roleAssignment": scope}]}
    reply = await api.post("/api/v1/roles/add-assignments", json=body)
    assert refusal(reply, 400) == (
        f"userRoleAssignments[0].roleAssignment.scopeWorkspaceId: workspace 'finished' "
        f"({ws['id']}) is being deleted"
    )
    await deleter_pass(app)
    assert [n for n, _ in await listed(api)] == ["stays"]
    assert refusal(await api.get("/api/v1/templates/goes"), 404)


async def test_a_template_serves_experiments_in_any_workspace(api: httpx.AsyncClient) -> None:
    """Determined checks only that the submitter may see the template, never that it
    shares the experiment's workspace; so do we."""
    vision = await new_workspace(api, "vision")
    audio = await new_workspace(api, "audio")
    project = await new_project(api, audio["id"], "speech")
    assert (await post_template(api, "vision-tpl", vision["id"])).status_code == 200
    reply = await create_experiment(api, SINGLE, template="vision-tpl", projectId=project["id"])
    assert reply.status_code == 200, reply.text
    assert (
        reply.json()["config"]["resources"]["priority"] == TEMPLATE_CONFIG["resources"]["priority"]
    )
    assert reply.json()["experiment"]["projectId"] == project["id"]


@pytest.mark.parametrize("name", ["bad\x00name", "bad\ud800name"], ids=["nul", "lone-surrogate"])
async def test_names_with_nul_or_lone_surrogates_are_refused(
    api: httpx.AsyncClient, name: str
) -> None:
    ws = (await new_workspace(api, "vision"))["id"]
    body = json.dumps({"name": name, "config": {"description": "x"}, "workspaceId": ws})
    reply = await api.post("/api/v1/templates/ok", content=body)
    assert "name" in refusal(reply, 400)
    reply = await api.post("/api/v1/templates/bad%00name", content=body)
    assert "name" in refusal(reply, 400)
    assert await row_counts(api) == (0, 0)
