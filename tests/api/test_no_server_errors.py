"""Random bodies and configs never get a 5xx: every bad input is the client's 4xx."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import yaml
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.test_access import PASSWORD, create_user, sign_in
from tests.factories import row_counts

keys = st.sampled_from(
    [
        "name",
        "entrypoint",
        "resources",
        "slots_per_trial",
        "hyperparameters",
        "searcher",
        "type",
        "minval",
        "maxval",
        "vals",
        "count",
        "reproducibility",
        "experiment_seed",
        "bind_mounts",
        "container_path",
        "max_trials",
        "global_batch_size",
        "x",
    ]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
documents = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)
fuzz = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@fuzz
@given(config=documents)
async def test_random_experiment_configs(api: httpx.AsyncClient, config: Any) -> None:
    before = await row_counts(api)
    text = yaml.safe_dump(config)
    reply = await api.post("/api/v1/experiments", json={"config": text, "validateOnly": True})
    assert reply.status_code in (200, 400, 404, 409, 413), reply.text
    assert reply.json()["message" if reply.status_code != 200 else "config"] is not None
    assert await row_counts(api) == before


@fuzz
@given(config=documents)
async def test_random_template_bodies(api: httpx.AsyncClient, config: Any) -> None:
    reply = await api.put("/api/v1/templates/fuzz", json={"config": config})
    assert reply.status_code in (200, 400), reply.text
    if reply.status_code == 400:
        assert reply.json()["code"] == 3


@fuzz
@given(body=documents)
async def test_random_create_bodies(api: httpx.AsyncClient, body: Any) -> None:
    reply = await api.post("/api/v1/experiments", json=body)
    assert reply.status_code < 500, reply.text


@pytest.mark.parametrize(
    "path", ["/api/v1/agents/a%00b", "/api/v1/templates/a%00b", "/api/v1/checkpoints/a%00b"]
)
async def test_a_nul_character_is_a_400_on_both_databases(
    api: httpx.AsyncClient, path: str
) -> None:
    reply = await api.get(path)
    # SQLite stores NUL and simply finds nothing; Postgres cannot hold it: never a 500.
    assert reply.status_code in (400, 404), reply.text
    assert reply.json()["code"] in (3, 5)


async def test_an_integer_python_cannot_read_is_a_config_error(api: httpx.AsyncClient) -> None:
    huge = "9" * 5000  # Python refuses to convert integers over 4,300 digits
    for reply in (
        await api.post("/api/v1/experiments", json={"config": f"name: x\nmax_restarts: {huge}\n"}),
        await api.put("/api/v1/templates/huge", json={"name": "huge", "config": f"x: {huge}"}),
    ):
        assert reply.status_code == 400, reply.text
        assert reply.json()["code"] == 3


# -- every route, as a user, as a user with a role and as an admin (issues 15 and 29) --------

# Long polls and streams wait for events that never come here; they have their own tests.
_WAITING_ROUTES = {
    "/api/v1/allocations/{allocation_id}/signals/preemption",
    "/api/v1/trials/metrics/trial_metrics",
    "/api/v1/trials/{trial_id}/logs",
    "/api/v1/tasks/{task_id}/logs",
    "/checkpoints/{uuid}",
}
path_values = st.one_of(
    st.integers(-5, 2**40).map(str),
    st.text(min_size=1, max_size=12).filter(lambda t: "/" not in t and t not in (".", "..")),
)


def _routes() -> list[tuple[str, str]]:
    from master.app import create_app
    from master.settings import MasterSettings

    schema = create_app(MasterSettings(run_loops=False)).openapi()
    return sorted(
        (method.upper(), path)
        for path, operations in schema["paths"].items()
        if (path.startswith("/api/v1/") or path == "/metrics") and path not in _WAITING_ROUTES
        for method in operations
    )


ROUTES = _routes()


@pytest.fixture
async def editor(app: FastAPI, admin: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """A third user, holding a role (Editor in the built-in workspace)."""
    user_id = await create_user(admin, "fuzz-editor")
    workspaces = (await admin.get("/api/v1/workspaces?name=Uncategorized")).json()["workspaces"]
    role = {"role": {"roleId": 5}, "scopeWorkspaceId": workspaces[0]["id"]}
    body = {"userRoleAssignments": [{"userId": user_id, "roleAssignment": role}]}
    assert (await admin.post("/api/v1/roles/add-assignments", json=body)).status_code == 200
    async with sign_in(app, "fuzz-editor", PASSWORD) as client:
        yield client


@pytest.mark.parametrize("who", ["user", "editor", "admin"])
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
async def test_every_route_answers_random_input_without_a_server_error(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    editor: httpx.AsyncClient,
    who: str,
    data: st.DataObject,
) -> None:
    client = {"admin": admin, "editor": editor}.get(who, api)
    method, template = data.draw(st.sampled_from(ROUTES))
    path = template
    for name in [p.strip("{}") for p in template.split("/") if p.startswith("{")]:
        value = data.draw(path_values)
        path = path.replace("{" + name + "}", quote(value, safe=""))
    body = data.draw(documents)
    params = data.draw(st.dictionaries(keys, scalars.map(str), max_size=2))
    request = client.request(method, path, json=body, params=params)
    reply = await asyncio.wait_for(request, timeout=30)
    assert reply.status_code < 500, (method, path, body, reply.text)
