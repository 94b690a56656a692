"""Workspaces and projects (issue 29, first slice), on Determined's routes: create, list,
describe, edit, archive, pin, move and delete; experiments placed by projectId or by the
config's workspace/project; every bad input refused with nothing changed."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.services import workspaces as workspace_service
from master.services.checkpoint_gc import CheckpointDeleter
from tests.api.test_access import alice, give_viewer, refusal  # noqa: F401 - alice is a fixture
from tests.factories import create_experiment

SINGLE = """\
name: placed
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


async def new_workspace(api: httpx.AsyncClient, name: str) -> dict[str, Any]:
    reply = await api.post("/api/v1/workspaces", json={"name": name})
    assert reply.status_code == 200, reply.text
    workspace: dict[str, Any] = reply.json()["workspace"]
    return workspace


async def new_project(
    api: httpx.AsyncClient, workspace_id: int, name: str, **fields: Any
) -> dict[str, Any]:
    reply = await api.post(
        f"/api/v1/workspaces/{workspace_id}/projects",
        json={"name": name, "workspaceId": workspace_id, **fields},
    )
    assert reply.status_code == 200, reply.text
    project: dict[str, Any] = reply.json()["project"]
    return project


async def workspaces_of(api: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    reply = await api.get("/api/v1/workspaces", params=params)
    assert reply.status_code == 200, reply.text
    found: list[dict[str, Any]] = reply.json()["workspaces"]
    return found


async def projects_of(api: httpx.AsyncClient, workspace_id: int) -> list[dict[str, Any]]:
    reply = await api.get(f"/api/v1/workspaces/{workspace_id}/projects")
    assert reply.status_code == 200, reply.text
    found: list[dict[str, Any]] = reply.json()["projects"]
    return found


async def experiment_in(api: httpx.AsyncClient, config: str = SINGLE, **fields: Any) -> int:
    reply = await create_experiment(api, config, **fields)
    assert reply.status_code == 200, reply.text
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


async def experiment_count(api: httpx.AsyncClient) -> int:
    total: int = (await api.get("/api/v1/experiments")).json()["pagination"]["total"]
    return total


async def default_project(api: httpx.AsyncClient) -> dict[str, Any]:
    [uncategorized] = await workspaces_of(api, name="Uncategorized")
    [project] = await projects_of(api, uncategorized["id"])
    return project


# -- workspaces -------------------------------------------------------------------------


async def test_a_workspace_from_creation_to_deletion(api: httpx.AsyncClient) -> None:
    created = await new_workspace(api, "vision")
    assert created["name"] == "vision"
    assert created["username"] == "determined"
    assert (created["archived"], created["pinned"], created["immutable"]) == (False, False, False)
    assert (created["numProjects"], created["numExperiments"]) == (0, 0)
    assert created["state"] == "WORKSPACE_STATE_UNSPECIFIED"
    ws_id = created["id"]

    names = [w["name"] for w in await workspaces_of(api)]
    assert names == ["Uncategorized", "vision"]
    # How the official client finds a workspace by name.
    assert [w["id"] for w in await workspaces_of(api, nameCaseSensitive="vision")] == [ws_id]
    assert await workspaces_of(api, nameCaseSensitive="Vision") == []

    reply = await api.patch(f"/api/v1/workspaces/{ws_id}", json={"name": "vision-2"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["workspace"]["name"] == "vision-2"

    assert (await api.post(f"/api/v1/workspaces/{ws_id}/archive")).status_code == 200
    assert [w["name"] for w in await workspaces_of(api, archived="true")] == ["vision-2"]
    assert (await api.post(f"/api/v1/workspaces/{ws_id}/unarchive")).status_code == 200
    assert (await api.get(f"/api/v1/workspaces/{ws_id}")).json()["workspace"]["archived"] is False

    assert (await api.post(f"/api/v1/workspaces/{ws_id}/pin")).status_code == 200
    pinned = (await api.get(f"/api/v1/workspaces/{ws_id}")).json()["workspace"]
    assert pinned["pinned"] is True and pinned["pinnedAt"]
    assert [w["id"] for w in await workspaces_of(api, pinned="true")] == [ws_id]
    assert (await api.post(f"/api/v1/workspaces/{ws_id}/unpin")).status_code == 200
    assert await workspaces_of(api, pinned="true") == []

    reply = await api.delete(f"/api/v1/workspaces/{ws_id}")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"completed": True}
    assert "workspace" in refusal(await api.get(f"/api/v1/workspaces/{ws_id}"), 404)


async def test_pins_are_each_users_own(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    ws = await new_workspace(api, "shared")
    await give_viewer(admin, alice, ws["id"])
    assert (await alice.post(f"/api/v1/workspaces/{ws['id']}/pin")).status_code == 200
    assert (await alice.get(f"/api/v1/workspaces/{ws['id']}")).json()["workspace"]["pinned"]
    assert not (await api.get(f"/api/v1/workspaces/{ws['id']}")).json()["workspace"]["pinned"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "name: the name is empty"),
        ("   ", "name: the name is empty"),
        ("x" * 256, "name: the name is 256 characters long; at most 255"),
        (" padded", "name: the name ' padded' starts or ends with spaces"),
        ("tab\there", "name: the name holds a control character (U+0009)"),
        (12, "name: must be a string"),
        (None, "name: must be a string"),
    ],
)
async def test_bad_workspace_names_are_refused(
    api: httpx.AsyncClient, name: object, message: str
) -> None:
    before = await workspaces_of(api)
    assert message in refusal(await api.post("/api/v1/workspaces", json={"name": name}), 400)
    ws = await new_workspace(api, "kept")
    reply = await api.patch(f"/api/v1/workspaces/{ws['id']}", json={"name": name})
    if name is None:  # PATCH without a name changes nothing and is no error
        assert reply.status_code == 200
    else:
        assert message in refusal(reply, 400)
    assert [w["name"] for w in await workspaces_of(api)] == [w["name"] for w in before] + ["kept"]


async def test_clashing_workspace_names_and_unknown_ids(api: httpx.AsyncClient) -> None:
    first = await new_workspace(api, "nlp")
    other = await new_workspace(api, "speech")
    message = refusal(await api.post("/api/v1/workspaces", json={"name": "nlp"}), 409)
    assert f"name: a workspace named 'nlp' already exists ({first['id']})" in message
    message = refusal(
        await api.patch(f"/api/v1/workspaces/{other['id']}", json={"name": "nlp"}), 409
    )
    assert "'nlp' already exists" in message
    assert [w["name"] for w in await workspaces_of(api)] == ["Uncategorized", "nlp", "speech"]
    for method, path in [
        ("GET", "/api/v1/workspaces/99999"),
        ("PATCH", "/api/v1/workspaces/99999"),
        ("POST", "/api/v1/workspaces/99999/archive"),
        ("POST", "/api/v1/workspaces/99999/unarchive"),
        ("POST", "/api/v1/workspaces/99999/pin"),
        ("POST", "/api/v1/workspaces/99999/unpin"),
        ("DELETE", "/api/v1/workspaces/99999"),
        ("GET", "/api/v1/workspaces/99999/projects"),
        ("POST", "/api/v1/workspaces/99999/projects"),
    ]:
        body = {"name": "x"} if method in ("PATCH", "POST") else None
        reply = await api.request(method, path, json=body)
        assert "workspace 99999 not found" in refusal(reply, 404), path


async def test_settings_resolute_does_not_apply_are_refused(api: httpx.AsyncClient) -> None:
    reply = await api.post(
        "/api/v1/workspaces",
        json={"name": "agents", "agentUserGroup": {"agentUid": 1000}},
    )
    assert "agentUserGroup: agent users per workspace" in refusal(reply, 400)
    assert await workspaces_of(api, name="agents") == []


async def test_the_built_in_workspace_and_project_cannot_change(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    [ws] = await workspaces_of(api, name="Uncategorized")
    project = await default_project(api)
    assert ws["immutable"] and project["immutable"]
    for client in (api, admin):
        for reply in [
            await client.patch(f"/api/v1/workspaces/{ws['id']}", json={"name": "Mine"}),
            await client.post(f"/api/v1/workspaces/{ws['id']}/archive"),
            await client.delete(f"/api/v1/workspaces/{ws['id']}"),
        ]:
            assert "workspace 'Uncategorized'" in refusal(reply, 400)
            assert "is built in" in reply.json()["message"]
        for reply in [
            await client.patch(f"/api/v1/projects/{project['id']}", json={"name": "Mine"}),
            await client.post(f"/api/v1/projects/{project['id']}/archive"),
            await client.post(
                f"/api/v1/projects/{project['id']}/move",
                json={"destinationWorkspaceId": ws["id"], "projectId": project["id"]},
            ),
            await client.delete(f"/api/v1/projects/{project['id']}"),
        ]:
            assert "project 'Uncategorized'" in refusal(reply, 400)
    assert (await workspaces_of(api, name="Uncategorized"))[0]["archived"] is False
    assert (await default_project(api))["name"] == "Uncategorized"
    # Pinning is the user's own business, and allowed.
    assert (await api.post(f"/api/v1/workspaces/{ws['id']}/pin")).status_code == 200


async def test_only_the_owner_or_an_admin_changes_a_workspace(
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
    admin: httpx.AsyncClient,
) -> None:
    ws = await new_workspace(api, "owned")
    project = await new_project(api, ws["id"], "theirs")
    # Without a role alice does not see them (tests/api/test_reading.py); as a Viewer she
    # does, and is told whose they are.
    assert refusal(await alice.delete(f"/api/v1/workspaces/{ws['id']}"), 404) == (
        f"workspace {ws['id']} not found"
    )
    await give_viewer(admin, alice, ws["id"])
    for reply in [
        await alice.patch(f"/api/v1/workspaces/{ws['id']}", json={"name": "taken"}),
        await alice.post(f"/api/v1/workspaces/{ws['id']}/archive"),
        await alice.delete(f"/api/v1/workspaces/{ws['id']}"),
    ]:
        assert "workspace 'owned' belongs to determined" in refusal(reply, 403)
    for reply in [
        await alice.patch(f"/api/v1/projects/{project['id']}", json={"name": "taken"}),
        await alice.post(f"/api/v1/projects/{project['id']}/archive"),
        await alice.delete(f"/api/v1/projects/{project['id']}"),
    ]:
        assert "project 'theirs' belongs to determined" in refusal(reply, 403)
    # Anyone signed in may create; what they create is theirs.
    mine = await new_workspace(alice, "alices")
    assert mine["username"] == "alice"
    assert (await alice.delete(f"/api/v1/workspaces/{mine['id']}")).status_code == 200
    reply = await admin.patch(f"/api/v1/workspaces/{ws['id']}", json={"name": "renamed"})
    assert reply.status_code == 200, reply.text
    assert (await admin.delete(f"/api/v1/projects/{project['id']}")).status_code == 200


async def deleter_pass(app: FastAPI) -> None:
    """One pass of the master's checkpoint deleter, as app.py builds it."""
    await CheckpointDeleter(
        app.state.session_factory,
        after_pass=workspace_service.finish_deletions,
        pending=workspace_service.deletions_pending,
    ).run_once()


async def test_active_experiments_stop_a_deletion_ended_ones_go_with_it(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    ws = await new_workspace(api, "busy")
    project = await new_project(api, ws["id"], "training")
    kept = await new_project(api, ws["id"], "kept")
    experiment_id = await experiment_in(api, projectId=project["id"])
    message = refusal(await api.delete(f"/api/v1/workspaces/{ws['id']}"), 409)
    assert f"workspace 'busy' holds active experiments ({experiment_id})" in message
    message = refusal(await api.delete(f"/api/v1/projects/{project['id']}"), 409)
    assert f"project 'training' holds active experiments ({experiment_id})" in message
    assert [p["name"] for p in await projects_of(api, ws["id"])] == ["training", "kept"]
    for described in [
        (await api.get(f"/api/v1/projects/{project['id']}")).json()["project"],
        (await api.get(f"/api/v1/workspaces/{ws['id']}")).json()["workspace"],
    ]:
        assert described["state"] == "WORKSPACE_STATE_UNSPECIFIED"

    # Ended, it goes with its project: its checkpoints first, then it, then the project.
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/kill")).status_code == 200
    reply = await api.delete(f"/api/v1/projects/{project['id']}")
    assert reply.status_code == 200 and reply.json() == {"completed": False}
    deleting = (await api.get(f"/api/v1/projects/{project['id']}")).json()["project"]
    assert deleting["state"] == "WORKSPACE_STATE_DELETING"
    reply = await create_experiment(api, SINGLE, projectId=project["id"])
    assert "projectId: project 'training'" in refusal(reply, 400)
    assert "is being deleted" in reply.json()["message"]
    reply = await api.patch(f"/api/v1/projects/{project['id']}", json={"name": "again"})
    assert "is being deleted" in refusal(reply, 409)
    await deleter_pass(app)
    assert "experiment" in refusal(await api.get(f"/api/v1/experiments/{experiment_id}"), 404)
    assert "project" in refusal(await api.get(f"/api/v1/projects/{project['id']}"), 404)
    assert [p["name"] for p in await projects_of(api, ws["id"])] == ["kept"]

    # A workspace whose projects hold no experiments goes at once.
    reply = await api.delete(f"/api/v1/workspaces/{ws['id']}")
    assert reply.status_code == 200 and reply.json() == {"completed": True}
    assert "project" in refusal(await api.get(f"/api/v1/projects/{kept['id']}"), 404)
    assert "workspace" in refusal(await api.get(f"/api/v1/workspaces/{ws['id']}"), 404)


async def test_a_workspace_with_ended_experiments_goes_after_them(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    ws = await new_workspace(api, "finished")
    project = await new_project(api, ws["id"], "done")
    experiment_id = await experiment_in(api, projectId=project["id"])
    moved_out = await experiment_in(api, projectId=project["id"])
    default = await default_project(api)
    reply = await api.post(
        f"/api/v1/experiments/{moved_out}/move",
        json={"destinationProjectId": default["id"], "experimentId": moved_out},
    )
    assert reply.status_code == 200, reply.text
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/kill")).status_code == 200
    reply = await api.delete(f"/api/v1/workspaces/{ws['id']}")
    assert reply.status_code == 200 and reply.json() == {"completed": False}
    described = (await api.get(f"/api/v1/workspaces/{ws['id']}")).json()["workspace"]
    assert described["state"] == "WORKSPACE_STATE_DELETING"
    reply = await api.post(f"/api/v1/workspaces/{ws['id']}/projects", json={"name": "late"})
    assert "is being deleted" in refusal(reply, 409)
    await deleter_pass(app)
    assert "workspace" in refusal(await api.get(f"/api/v1/workspaces/{ws['id']}"), 404)
    assert "project" in refusal(await api.get(f"/api/v1/projects/{project['id']}"), 404)
    assert "experiment" in refusal(await api.get(f"/api/v1/experiments/{experiment_id}"), 404)
    # The one moved out stays, in its new project.
    reply = await api.get(f"/api/v1/experiments/{moved_out}")
    assert reply.json()["experiment"]["projectId"] == default["id"]


# -- projects ---------------------------------------------------------------------------


async def test_a_project_from_creation_to_deletion(api: httpx.AsyncClient) -> None:
    ws = await new_workspace(api, "research")
    other = await new_workspace(api, "production")
    project = await new_project(api, ws["id"], "Object Detection", description="boxes")
    assert project["workspaceId"] == ws["id"]
    assert project["workspaceName"] == "research"
    assert project["key"] == "OBJEC"
    assert project["description"] == "boxes"
    assert (project["numExperiments"], project["numActiveExperiments"]) == (0, 0)
    assert project["notes"] == [] and project["username"] == "determined"
    assert (await api.get(f"/api/v1/workspaces/{ws['id']}")).json()["workspace"]["numProjects"] == 1
    # Workspace 0 lists every workspace's projects.
    names = [p["name"] for p in (await api.get("/api/v1/workspaces/0/projects")).json()["projects"]]
    assert names == ["Uncategorized", "Object Detection"]

    reply = await api.patch(
        f"/api/v1/projects/{project['id']}", json={"name": "detection", "description": "v2"}
    )
    assert reply.status_code == 200, reply.text
    assert (reply.json()["project"]["name"], reply.json()["project"]["description"]) == (
        "detection",
        "v2",
    )
    assert (await api.post(f"/api/v1/projects/{project['id']}/archive")).status_code == 200
    assert (await api.get(f"/api/v1/projects/{project['id']}")).json()["project"]["archived"]
    assert (await api.post(f"/api/v1/projects/{project['id']}/unarchive")).status_code == 200

    reply = await api.post(
        f"/api/v1/projects/{project['id']}/move",
        json={"destinationWorkspaceId": other["id"], "projectId": project["id"]},
    )
    assert reply.status_code == 200, reply.text
    assert [p["name"] for p in await projects_of(api, other["id"])] == ["detection"]
    assert await projects_of(api, ws["id"]) == []

    reply = await api.delete(f"/api/v1/projects/{project['id']}")
    assert reply.status_code == 200 and reply.json() == {"completed": True}
    assert await projects_of(api, other["id"]) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": ""}, "name: the name is empty"),
        ({"name": "y" * 300}, "name: the name is 300 characters long; at most 255"),
        ({"name": "ok", "key": "TOOLONG"}, "key: 'TOOLONG' is not a project key"),
        ({"name": "ok", "key": "a-b"}, "key: 'a-b' is not a project key"),
        ({"name": "ok", "description": "d" * 10_001}, "description: 10001 characters long"),
        ({"name": "ok", "workspaceId": 424242}, "workspaceId: the body names workspace 424242"),
    ],
)
async def test_bad_project_input_is_refused(
    api: httpx.AsyncClient, body: dict[str, Any], message: str
) -> None:
    ws = await new_workspace(api, "team")
    reply = await api.post(f"/api/v1/workspaces/{ws['id']}/projects", json=body)
    assert message in refusal(reply, 400)
    assert await projects_of(api, ws["id"]) == []
    kept = await new_project(api, ws["id"], "kept", description="same")
    patch = {k: v for k, v in body.items() if k != "workspaceId"}
    if patch != {"name": "ok"}:
        reply = await api.patch(f"/api/v1/projects/{kept['id']}", json=patch)
        assert message.split(":")[0] in refusal(reply, 400)
    [after] = await projects_of(api, ws["id"])
    assert (after["name"], after["description"], after["key"]) == ("kept", "same", kept["key"])


async def test_project_names_are_unique_within_their_workspace(api: httpx.AsyncClient) -> None:
    a = await new_workspace(api, "a")
    b = await new_workspace(api, "b")
    first = await new_project(api, a["id"], "same")
    message = refusal(
        await api.post(f"/api/v1/workspaces/{a['id']}/projects", json={"name": "same"}), 409
    )
    assert f"workspace 'a' already has a project named 'same' ({first['id']})" in message
    elsewhere = await new_project(api, b["id"], "same")  # another workspace: fine
    assert elsewhere["key"] != first["key"]
    # Moving it beside its namesake, or renaming into one, is refused too.
    reply = await api.post(
        f"/api/v1/projects/{elsewhere['id']}/move",
        json={"destinationWorkspaceId": a["id"], "projectId": elsewhere["id"]},
    )
    assert "destinationWorkspaceId: workspace 'a' already has a project" in refusal(reply, 409)
    other = await new_project(api, a["id"], "other")
    reply = await api.patch(f"/api/v1/projects/{other['id']}", json={"name": "same"})
    assert "name: workspace 'a' already has a project named 'same'" in refusal(reply, 409)
    reply = await api.post(
        f"/api/v1/workspaces/{a['id']}/projects", json={"name": "keyed", "key": first["key"]}
    )
    assert f"key: project {first['id']} already has the key" in refusal(reply, 409)
    assert [p["name"] for p in await projects_of(api, a["id"])] == ["same", "other"]
    assert [p["name"] for p in await projects_of(api, b["id"])] == ["same"]


async def test_unknown_projects_and_destinations(api: httpx.AsyncClient) -> None:
    ws = await new_workspace(api, "w")
    project = await new_project(api, ws["id"], "p")
    for method, path in [
        ("GET", "/api/v1/projects/99999"),
        ("PATCH", "/api/v1/projects/99999"),
        ("POST", "/api/v1/projects/99999/archive"),
        ("POST", "/api/v1/projects/99999/unarchive"),
        ("DELETE", "/api/v1/projects/99999"),
    ]:
        reply = await api.request(method, path, json={"name": "x"} if method == "PATCH" else None)
        assert "project 99999 not found" in refusal(reply, 404), path
    reply = await api.post(
        f"/api/v1/projects/{project['id']}/move",
        json={"destinationWorkspaceId": 99999, "projectId": project["id"]},
    )
    assert "destinationWorkspaceId: workspace 99999 does not exist" in refusal(reply, 400)
    reply = await api.post(f"/api/v1/projects/{project['id']}/move", json={})
    assert "destinationWorkspaceId: required" in refusal(reply, 400)
    assert (await api.get(f"/api/v1/projects/{project['id']}")).json()["project"][
        "workspaceId"
    ] == ws["id"]
    # An archived workspace takes no new projects.
    assert (await api.post(f"/api/v1/workspaces/{ws['id']}/archive")).status_code == 200
    reply = await api.post(f"/api/v1/workspaces/{ws['id']}/projects", json={"name": "late"})
    assert "workspaceId: workspace 'w'" in refusal(reply, 400)
    assert "is archived" in reply.json()["message"]


# -- experiments in projects ------------------------------------------------------------


async def test_experiments_are_placed_by_project_id_or_by_config_names(
    api: httpx.AsyncClient,
) -> None:
    ws = await new_workspace(api, "vision")
    project = await new_project(api, ws["id"], "detection")
    by_id = await experiment_in(api, projectId=project["id"])
    by_names = await experiment_in(api, SINGLE + "workspace: vision\nproject: detection\n")
    both = await experiment_in(
        api, SINGLE + "workspace: vision\nproject: detection\n", projectId=project["id"]
    )
    nowhere = await experiment_in(api)
    default = await default_project(api)
    for experiment_id, project_id, names in [
        (by_id, project["id"], ("vision", "detection")),
        (by_names, project["id"], ("vision", "detection")),
        (both, project["id"], ("vision", "detection")),
        (nowhere, default["id"], ("Uncategorized", "Uncategorized")),
    ]:
        experiment = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
        assert experiment["projectId"] == project_id
        assert (experiment["workspaceName"], experiment["projectName"]) == names
    reply = await create_experiment(api, SINGLE, projectId=project["id"])
    created = reply.json()["experiment"]
    assert (created["workspaceId"], created["workspaceName"]) == (ws["id"], "vision")
    assert (created["projectName"], created["projectOwnerId"]) == ("detection", project["userId"])
    # Out again, so that the project holds the three placed above.
    reply = await api.post(
        f"/api/v1/experiments/{created['id']}/move", json={"destinationProjectId": default["id"]}
    )
    assert reply.status_code == 200, reply.text
    # What `det project list-experiments` asks for.
    reply = await api.get(
        "/api/v1/experiments",
        params={"projectId": project["id"], "users": "determined", "archived": "false"},
    )
    assert [e["id"] for e in reply.json()["experiments"]] == [by_id, by_names, both]
    assert reply.json()["pagination"]["total"] == 3
    described = (await api.get(f"/api/v1/projects/{project['id']}")).json()["project"]
    assert (described["numExperiments"], described["numActiveExperiments"]) == (3, 3)
    assert described["lastExperimentStartedAt"]
    workspace = (await api.get(f"/api/v1/workspaces/{ws['id']}")).json()["workspace"]
    assert workspace["numExperiments"] == 3


@pytest.mark.parametrize(
    ("config", "fields", "message"),
    [
        ("workspace: nope\nproject: detection\n", {}, "workspace: workspace 'nope' does not exist"),
        (
            "workspace: vision\nproject: nope\n",
            {},
            "project: project 'nope' does not exist in workspace 'vision'",
        ),
        ("", {"projectId": 99999}, "projectId: project 99999 does not exist"),
        (
            "workspace: Uncategorized\nproject: Uncategorized\n",
            {"projectId": "DETECTION"},
            "projectId: project",
        ),
        ("", {"projectId": 99999, "validateOnly": True}, "projectId: project 99999"),
    ],
)
async def test_unknown_projects_are_refused_at_submit(
    api: httpx.AsyncClient, config: str, fields: dict[str, Any], message: str
) -> None:
    ws = await new_workspace(api, "vision")
    project = await new_project(api, ws["id"], "detection")
    if fields.get("projectId") == "DETECTION":
        fields = {"projectId": project["id"]}
    before = await experiment_count(api)
    reply = await create_experiment(api, SINGLE + config, **fields)
    assert message in refusal(reply, 400)
    assert await experiment_count(api) == before


async def test_archived_projects_take_no_new_experiments_but_theirs_run_on(
    api: httpx.AsyncClient,
) -> None:
    ws = await new_workspace(api, "w")
    project = await new_project(api, ws["id"], "p")
    running = await experiment_in(api, projectId=project["id"])
    assert (await api.post(f"/api/v1/projects/{project['id']}/archive")).status_code == 200
    reply = await create_experiment(api, SINGLE, projectId=project["id"])
    assert "projectId: project 'p'" in refusal(reply, 400)
    assert "is archived" in reply.json()["message"]
    experiment = (await api.get(f"/api/v1/experiments/{running}")).json()["experiment"]
    assert experiment["state"] == "STATE_ACTIVE"
    moved = await experiment_in(api)
    reply = await api.post(
        f"/api/v1/experiments/{moved}/move",
        json={"destinationProjectId": project["id"], "experimentId": moved},
    )
    assert "destinationProjectId: project 'p'" in refusal(reply, 400)


async def test_moving_experiments(
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    ws = await new_workspace(api, "w")
    project = await new_project(api, ws["id"], "p")
    experiment_id = await experiment_in(api)
    url = f"/api/v1/experiments/{experiment_id}/move"
    reply = await api.post(url, json={"destinationProjectId": 99999, "experimentId": experiment_id})
    assert "destinationProjectId: project 99999 does not exist" in refusal(reply, 400)
    other = experiment_id + 1000
    reply = await api.post(url, json={"destinationProjectId": project["id"], "experimentId": other})
    assert f"experimentId: the body names experiment {other}" in refusal(reply, 400)
    reply = await alice.post(
        url, json={"destinationProjectId": project["id"], "experimentId": experiment_id}
    )
    assert "only its owner or an admin may move it" in refusal(reply, 403)
    reply = await api.post(
        "/api/v1/experiments/99999/move",
        json={"destinationProjectId": project["id"], "experimentId": 99999},
    )
    assert "experiment 99999 not found" in refusal(reply, 404)
    default = await default_project(api)
    assert (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"][
        "projectId"
    ] == default["id"]
    reply = await api.post(
        url, json={"destinationProjectId": project["id"], "experimentId": experiment_id}
    )
    assert reply.status_code == 200, reply.text
    listed = await api.get("/api/v1/experiments", params={"projectId": project["id"]})
    assert [e["id"] for e in listed.json()["experiments"]] == [experiment_id]
    reply = await api.get("/api/v1/experiments", params={"projectId": 99999})
    assert "project 99999 not found" in refusal(reply, 404)


async def test_racing_creates_of_one_name_make_one_workspace_and_one_project(
    api: httpx.AsyncClient,
) -> None:
    replies = await asyncio.gather(
        *(api.post("/api/v1/workspaces", json={"name": "raced"}) for _ in range(6))
    )
    assert sorted(r.status_code for r in replies) == [200] + [409] * 5, [r.text for r in replies]
    [ws] = await workspaces_of(api, name="raced")
    replies = await asyncio.gather(
        *(
            api.post(f"/api/v1/workspaces/{ws['id']}/projects", json={"name": "raced"})
            for _ in range(6)
        )
    )
    assert sorted(r.status_code for r in replies) == [200] + [409] * 5, [r.text for r in replies]
    assert [p["name"] for p in await projects_of(api, ws["id"])] == ["raced"]


async def test_racing_projects_with_one_key_stem_all_get_keys(api: httpx.AsyncClient) -> None:
    ws = await new_workspace(api, "keys")
    replies = await asyncio.gather(
        *(
            api.post(f"/api/v1/workspaces/{ws['id']}/projects", json={"name": f"alpha {i}"})
            for i in range(6)
        )
    )
    assert [r.status_code for r in replies] == [200] * 6, [r.text for r in replies]
    keys = [p["key"] for p in await projects_of(api, ws["id"])]
    assert "ALPHA" in keys and len(set(keys)) == 6, keys
    assert all(re.fullmatch(r"ALPHA[0-9]*", key) for key in keys), keys
