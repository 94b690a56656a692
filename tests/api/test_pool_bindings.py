"""Resource pools bound to workspaces and a workspace's default pools (issue 29), on
Determined's routes: a bound pool takes work only from its workspaces, an unbound one from
all; a workspace's default compute pool takes its submits that name none; every bad input
is refused naming the field, with nothing changed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from master.settings import ResourcePoolSettings
from tests.api.test_access import alice, give_viewer, refusal  # noqa: F401 - alice is a fixture
from tests.api.test_workspaces import default_project, new_project, new_workspace, workspaces_of
from tests.factories import create_experiment

SINGLE = """\
name: pooled
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""
BINDINGS = "/api/v1/resource-pools/{}/workspace-bindings"


@pytest_asyncio.fixture
async def pools(app: FastAPI) -> AsyncIterator[None]:
    """The shared app with three pools: "default" (the master's default), "gpu", "cpu"."""
    settings = app.state.settings
    app.state.settings = settings.model_copy(
        update={
            "resource_pools": [ResourcePoolSettings(pool_name=n) for n in ("default", "gpu", "cpu")]
        }
    )
    try:
        yield
    finally:
        app.state.settings = settings


async def bound_to(api: httpx.AsyncClient, pool: str) -> list[int]:
    reply = await api.get(BINDINGS.format(pool))
    assert reply.status_code == 200, reply.text
    ids: list[int] = reply.json()["workspaceIds"]
    return ids


async def available(api: httpx.AsyncClient, workspace_id: int) -> list[str]:
    reply = await api.get(f"/api/v1/workspaces/{workspace_id}/available-resource-pools")
    assert reply.status_code == 200, reply.text
    names: list[str] = reply.json()["resourcePools"]
    return names


async def bind(admin: httpx.AsyncClient, pool: str, *names: str) -> None:
    body = {"resourcePoolName": pool, "workspaceNames": list(names)}
    reply = await admin.post(BINDINGS.format(pool), json=body)
    assert reply.status_code == 200, reply.text


async def submit(api: httpx.AsyncClient, project_id: int, pool: str | None) -> httpx.Response:
    config = SINGLE + (f"resources: {{resource_pool: {pool}}}\n" if pool else "")
    return await create_experiment(api, config, projectId=project_id)


async def experiment_count(api: httpx.AsyncClient) -> int:
    total: int = (await api.get("/api/v1/experiments")).json()["pagination"]["total"]
    return total


async def command(
    api: httpx.AsyncClient, workspace_id: int, slots: int, pool: str | None = None
) -> httpx.Response:
    resources: dict[str, Any] = {"slots": slots}
    if pool is not None:
        resources["resource_pool"] = pool
    config = {"entrypoint": ["echo", "hi"], "resources": resources}
    return await api.post("/api/v1/commands", json={"config": config, "workspaceId": workspace_id})


# -- the routes -------------------------------------------------------------------------


@pytest.mark.usefixtures("pools")
async def test_bindings_are_added_listed_replaced_and_removed(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    a = await new_workspace(api, "team-a")
    b = await new_workspace(api, "team-b")
    everything = ["default", "gpu", "cpu"]
    assert await bound_to(api, "gpu") == []
    assert await available(api, a["id"]) == everything

    # By name and by id in one request, as Determined's API takes them.
    body = {"workspaceNames": ["team-a"], "workspaceIds": [b["id"]]}
    assert (await admin.post(BINDINGS.format("gpu"), json=body)).status_code == 200
    assert await bound_to(api, "gpu") == [a["id"], b["id"]]
    # Binding again is no change.
    await bind(admin, "gpu", "team-a")
    reply = await api.get(BINDINGS.format("gpu"), params={"offset": 1, "limit": 1})
    assert reply.json()["workspaceIds"] == [b["id"]]
    assert reply.json()["pagination"]["total"] == 2
    assert await available(api, a["id"]) == everything
    [uncategorized] = await workspaces_of(api, name="Uncategorized")
    assert await available(api, uncategorized["id"]) == ["default", "cpu"]

    reply = await admin.put(BINDINGS.format("gpu"), json={"workspaceNames": ["team-b"]})
    assert reply.status_code == 200, reply.text
    assert await bound_to(api, "gpu") == [b["id"]]
    assert await available(api, a["id"]) == ["default", "cpu"]

    reply = await admin.request("DELETE", BINDINGS.format("gpu"), json={"workspaceIds": [b["id"]]})
    assert reply.status_code == 200, reply.text
    assert await bound_to(api, "gpu") == []
    assert await available(api, a["id"]) == everything

    # Replacing with none leaves the pool shared by all.
    await bind(admin, "cpu", "team-a", "team-b")
    assert (await admin.put(BINDINGS.format("cpu"), json={"workspaceIds": []})).status_code == 200
    assert await bound_to(api, "cpu") == []


@pytest.mark.usefixtures("pools")
async def test_a_deleted_workspace_takes_its_bindings_along(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    a = await new_workspace(api, "team-a")
    b = await new_workspace(api, "team-b")
    await bind(admin, "gpu", "team-a", "team-b")
    assert (await api.delete(f"/api/v1/workspaces/{a['id']}")).status_code == 200
    assert await bound_to(api, "gpu") == [b["id"]]


def _post(pool: str, body: dict[str, Any]) -> tuple[str, str, str]:
    return ("POST", BINDINGS.format(pool), json.dumps(body))


@pytest.mark.usefixtures("pools")
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "problem"),
    [
        (
            *_post("nowhere", {"workspaceNames": ["team-a"]}),
            404,
            "resourcePoolName: pool 'nowhere' does not exist; pools: default, gpu, cpu",
        ),
        (
            *_post("default", {"workspaceNames": ["team-a"]}),
            400,
            "pool 'default' is the master's default pool",
        ),
        (
            *_post("gpu", {"workspaceNames": ["team-a", "team-z"]}),
            400,
            "workspaceNames: workspace 'team-z' does not exist",
        ),
        (
            *_post("gpu", {"workspaceIds": list(range(1, 1002))}),
            400,
            "workspaceIds, workspaceNames: 1001 workspaces in one request; at most 1000",
        ),
        (
            *_post("gpu", {"workspaceIds": [424242]}),
            400,
            "workspaceIds: workspace 424242 does not exist",
        ),
        (*_post("gpu", {}), 400, "name at least one workspace"),
        (
            *_post("gpu", {"resourcePoolName": "cpu", "workspaceNames": ["team-a"]}),
            400,
            "resourcePoolName: the body names pool 'cpu', the path pool 'gpu'",
        ),
        (*_post("gpu", {"workspaceNames": ["\ud800"]}), 400, "workspaceNames: '\\ud800'"),
        (*_post("gpu", {"workspaceNames": [7]}), 400, "workspaceNames: 7 is not"),
        (*_post("gpu", {"workspaceIds": [-1]}), 400, "workspaceIds"),
        (*_post("gpu", {"colour": "red"}), 400, "colour"),
        (
            "PUT",
            BINDINGS.format("nowhere"),
            json.dumps({"workspaceNames": ["team-a"]}),
            404,
            "pool 'nowhere' does not exist",
        ),
        (
            "PUT",
            BINDINGS.format("gpu"),
            json.dumps({"workspaceNames": ["team-z"]}),
            400,
            "workspace 'team-z' does not exist",
        ),
        (
            "DELETE",
            BINDINGS.format("cpu"),
            json.dumps({"workspaceNames": ["team-a"]}),
            400,
            "workspaceNames: workspace 'team-a' ({a}) is not bound to pool 'cpu'",
        ),
        (
            "DELETE",
            BINDINGS.format("nowhere"),
            json.dumps({"workspaceNames": ["team-a"]}),
            404,
            "pool 'nowhere' does not exist",
        ),
        ("GET", BINDINGS.format("nowhere"), "", 404, "pool 'nowhere' does not exist"),
        ("GET", BINDINGS.format("%00"), "", 400, "resourcePoolName: the pool name holds a NUL"),
        (
            "DELETE",
            BINDINGS.format("%00"),
            json.dumps({"workspaceNames": ["team-a"]}),
            400,
            "the pool name holds a NUL",
        ),
        ("GET", BINDINGS.format("%ED%A0%80"), "", 404, "does not exist"),
        ("GET", "/api/v1/workspaces/424242/available-resource-pools", "", 404, "424242"),
    ],
)
async def test_bad_bindings_are_refused_and_change_nothing(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    method: str,
    path: str,
    body: str,
    status: int,
    problem: str,
) -> None:
    a = await new_workspace(api, "team-a")
    await bind(admin, "gpu", "team-a")
    reply = await admin.request(method, path, content=body or None)
    assert problem.replace("{a}", str(a["id"])) in refusal(reply, status)
    assert await bound_to(api, "gpu") == [a["id"]]
    assert await bound_to(api, "cpu") == []


@pytest.mark.usefixtures("pools")
async def test_only_admins_change_bindings(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    a = await new_workspace(api, "team-a")
    await bind(admin, "gpu", "team-a")
    body = {"workspaceNames": ["team-a"]}
    for method in ("POST", "PUT", "DELETE"):
        reply = await api.request(method, BINDINGS.format("cpu"), json=body)
        assert "for admins; user determined is not one" in refusal(reply, 403)
    reply = await api.request("DELETE", BINDINGS.format("gpu"), json=body)
    assert refusal(reply, 403)
    # Anyone may look.
    assert await bound_to(api, "gpu") == [a["id"]]
    assert await bound_to(api, "cpu") == []


# -- what bindings mean -----------------------------------------------------------------


@pytest.mark.usefixtures("pools")
async def test_a_bound_pool_takes_work_only_from_its_workspaces(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    a = await new_workspace(api, "team-a")
    b = await new_workspace(api, "team-b")
    in_a = (await new_project(api, a["id"], "p"))["id"]
    in_b = (await new_project(api, b["id"], "p"))["id"]
    await bind(admin, "gpu", "team-a")

    problem = refusal(await submit(api, in_b, "gpu"), 400)
    assert "resources.resource_pool: pool 'gpu' is bound to other workspaces" in problem
    assert f"workspace 'team-b' ({b['id']}) may not use it" in problem
    assert await experiment_count(api) == 0
    # The config's own workspace/project names place it the same way.
    placed_by_name = SINGLE + "workspace: team-b\nproject: p\nresources: {resource_pool: gpu}\n"
    assert "'team-b'" in refusal(await create_experiment(api, placed_by_name), 400)

    reply = await submit(api, in_a, "gpu")
    assert reply.status_code == 200, reply.text
    from_a = reply.json()["experiment"]
    assert from_a["resourcePool"] == "gpu"
    # Nor may it move into a workspace that may not use its pool.
    move_body = {"destinationProjectId": in_b, "experimentId": from_a["id"]}
    problem = refusal(
        await api.post(f"/api/v1/experiments/{from_a['id']}/move", json=move_body), 400
    )
    assert "destinationProjectId: pool 'gpu' is bound to other workspaces" in problem
    stored = (await api.get(f"/api/v1/experiments/{from_a['id']}")).json()["experiment"]
    assert stored["projectId"] == in_a
    # Nor may its whole project.
    problem = refusal(
        await api.post(f"/api/v1/projects/{in_a}/move", json={"destinationWorkspaceId": b["id"]}),
        400,
    )
    assert "destinationWorkspaceId: pool 'gpu' is bound to other workspaces" in problem
    project = (await api.get(f"/api/v1/projects/{in_a}")).json()["project"]
    assert project["workspaceId"] == a["id"]
    # An unbound pool is shared by all.
    reply = await submit(api, in_b, "cpu")
    assert reply.status_code == 200, reply.text
    from_b = reply.json()["experiment"]
    assert await experiment_count(api) == 2

    # Commands, notebooks, shells and TensorBoards likewise.
    problem = refusal(await command(api, b["id"], 1, "gpu"), 400)
    assert "pool 'gpu' is bound to other workspaces" in problem and "'team-b'" in problem
    reply = await command(api, a["id"], 1, "gpu")
    assert reply.status_code == 200, reply.text
    assert reply.json()["command"]["resourcePool"] == "gpu"

    # `det job update --resource-pool` into a pool its workspace may not use.
    move = {"jobId": from_b["jobId"], "resourcePool": "gpu"}
    problem = refusal(await api.post("/api/v1/job-queues", json={"updates": [move]}), 400)
    assert "updates[0].resourcePool: pool 'gpu' is bound to other workspaces" in problem
    stored = (await api.get(f"/api/v1/experiments/{from_b['id']}")).json()["experiment"]
    assert stored["resourcePool"] == "cpu"

    # Queued work keeps its place when the bindings change.
    await bind(admin, "cpu", "team-a")
    stored = (await api.get(f"/api/v1/experiments/{from_b['id']}")).json()["experiment"]
    assert (stored["resourcePool"], stored["state"]) == ("cpu", "STATE_ACTIVE")
    assert "pool 'cpu' is bound" in refusal(await submit(api, in_b, "cpu"), 400)
    # Continuing it, once ended, would enter the pool again: refused the same way.
    await api.post(f"/api/v1/experiments/{from_b['id']}/kill")
    problem = refusal(
        await api.post("/api/v1/experiments/continue", json={"id": from_b["id"]}), 400
    )
    assert "resources.resource_pool: pool 'cpu' is bound to other workspaces" in problem
    stored = (await api.get(f"/api/v1/experiments/{from_b['id']}")).json()["experiment"]
    assert stored["state"] == "STATE_CANCELED"


# -- default pools ----------------------------------------------------------------------


@pytest.mark.usefixtures("pools")
async def test_a_workspaces_default_compute_pool_takes_its_submits_that_name_none(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    reply = await api.post(
        "/api/v1/workspaces", json={"name": "team-a", "defaultComputePool": "cpu"}
    )
    assert reply.status_code == 200, reply.text
    a = reply.json()["workspace"]
    assert (a["defaultComputePool"], a["defaultAuxPool"]) == ("cpu", "")
    project = (await new_project(api, a["id"], "p"))["id"]

    reply = await submit(api, project, None)
    assert reply.status_code == 200, reply.text
    experiment = reply.json()["experiment"]
    assert experiment["resourcePool"] == "cpu"
    assert experiment["config"]["resources"]["resource_pool"] == "cpu"
    # The config's own pool wins over the workspace's.
    reply = await submit(api, project, "default")
    assert reply.json()["experiment"]["resourcePool"] == "default"
    # Elsewhere, the master's default.
    reply = await submit(api, (await default_project(api))["id"], None)
    assert reply.json()["experiment"]["resourcePool"] == "default"

    # Determined's client edits with the *ResourcePool keys; "" clears.
    patch = {"defaultComputeResourcePool": None, "defaultAuxResourcePool": "gpu", "name": None}
    reply = await api.patch(f"/api/v1/workspaces/{a['id']}", json=patch)
    assert reply.status_code == 200, reply.text
    assert (reply.json()["workspace"]["defaultComputePool"]) == "cpu"
    assert (reply.json()["workspace"]["defaultAuxPool"]) == "gpu"
    # The aux pool takes tasks that ask for no slots.
    reply = await command(api, a["id"], 0)
    assert reply.json()["command"]["resourcePool"] == "gpu"
    reply = await command(api, a["id"], 1)
    assert reply.json()["command"]["resourcePool"] == "cpu"
    patch = {"defaultComputeResourcePool": "", "defaultAuxResourcePool": ""}
    reply = await api.patch(f"/api/v1/workspaces/{a['id']}", json=patch)
    assert (reply.json()["workspace"]["defaultComputePool"]) == ""
    assert (await submit(api, project, None)).json()["experiment"]["resourcePool"] == "default"

    # A default bound away from the workspace later: its submits are refused, naming both.
    patch = {"defaultComputeResourcePool": "gpu"}
    assert (await api.patch(f"/api/v1/workspaces/{a['id']}", json=patch)).status_code == 200
    await new_workspace(api, "team-b")
    await bind(admin, "gpu", "team-b")
    problem = refusal(await submit(api, project, None), 400)
    assert "workspace 'team-a' defaultComputePool: pool 'gpu' is bound to other workspaces" in (
        problem
    )


@pytest.mark.usefixtures("pools")
@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"defaultComputePool": "nowhere"}, "defaultComputePool: pool 'nowhere' does not exist"),
        ({"defaultAuxPool": "gpu"}, "defaultAuxPool: pool 'gpu' is bound to other workspaces"),
        ({"defaultComputePool": 5}, "defaultComputePool: must be a string"),
        ({"defaultComputePool": "\ud800"}, "defaultComputePool: the pool name holds a NUL"),
    ],
)
async def test_a_bad_default_pool_is_refused_and_creates_nothing(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, body: dict[str, Any], problem: str
) -> None:
    await new_workspace(api, "team-b")
    await bind(admin, "gpu", "team-b")
    other = await new_workspace(api, "team-c")
    reply = await api.post("/api/v1/workspaces", content=json.dumps({"name": "team-a", **body}))
    assert problem in refusal(reply, 400)
    names = [w["name"] for w in (await api.get("/api/v1/workspaces")).json()["workspaces"]]
    assert names == ["Uncategorized", "team-b", "team-c"]
    # The same refusals in an edit, which changes nothing either.
    edit = {k.replace("Pool", "ResourcePool"): v for k, v in body.items()} | {"name": "renamed"}
    reply = await api.patch(f"/api/v1/workspaces/{other['id']}", content=json.dumps(edit))
    assert problem.replace("Pool:", "ResourcePool:") in refusal(reply, 400)
    after = (await api.get(f"/api/v1/workspaces/{other['id']}")).json()["workspace"]
    assert (after["name"], after["defaultComputePool"], after["defaultAuxPool"]) == (
        "team-c",
        "",
        "",
    )


@pytest.mark.usefixtures("pools")
async def test_only_owners_and_admins_set_default_pools(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    a = await new_workspace(api, "team-a")
    await give_viewer(admin, alice, a["id"])
    patch = {"defaultComputeResourcePool": "cpu"}
    reply = await alice.patch(f"/api/v1/workspaces/{a['id']}", json=patch)
    assert "only its owner or an admin" in refusal(reply, 403)
    # The built-in workspace has no owner: admins only.
    project = await default_project(api)
    uncategorized = project["workspaceId"]
    reply = await api.patch(f"/api/v1/workspaces/{uncategorized}", json=patch)
    assert "for admins" in refusal(reply, 403)
    reply = await admin.patch(f"/api/v1/workspaces/{uncategorized}", json=patch)
    assert reply.status_code == 200, reply.text
    assert reply.json()["workspace"]["defaultComputePool"] == "cpu"
    assert (await submit(api, project["id"], None)).json()["experiment"]["resourcePool"] == "cpu"
