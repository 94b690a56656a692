"""Workspaces' slot quotas (issue 30): set, shown and unset through our routes and
Determined's, from the master config and the API, on SQLite and Postgres; every bad input
refused naming its field, with nothing changed; a change bumps the scheduler's epoch."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event

from master.db.session import session_scope
from master.services import allocations as allocation_service
from master.services import quotas as quota_service
from master.settings import ResourcePoolSettings, WorkspaceQuotaSettings
from tests.api.test_access import give_viewer, refusal
from tests.api.test_no_server_errors import fuzz, scalars
from tests.api.test_pool_bindings import bind, command
from tests.api.test_scheduling import register, schedule, submit
from tests.api.test_workspaces import new_project, new_workspace, workspaces_of

QUOTAS = "/api/v1/workspaces/{}/quotas"
QUOTA = "/api/v1/workspaces/{}/quotas/{}"
SET_RESOURCE_QUOTA = "/api/v1/workspaces/{}/set-resource-quota"


@pytest_asyncio.fixture
async def pools(app: FastAPI, api: httpx.AsyncClient) -> AsyncIterator[None]:
    """The shared app with the pools "default" (the master's default), "gpu" with a config
    quota for workspace "vision" (nominal 2, borrowing 1), and "empty", which has no agents;
    and agents: 2 agents of 4 slots in "gpu", 8 in "default" (after `api` cleared the rows)."""
    settings = app.state.settings
    gpu_quota = WorkspaceQuotaSettings(workspace="vision", nominal_slots=2, borrowing_limit=1)
    app.state.settings = settings.model_copy(
        update={
            "resource_pools": [
                ResourcePoolSettings(pool_name="default"),
                ResourcePoolSettings(pool_name="gpu", quotas=[gpu_quota]),
                ResourcePoolSettings(pool_name="empty"),
            ]
        }
    )
    try:
        await register(app, "gpu-1", 4, pool="gpu")
        await register(app, "gpu-2", 4, pool="gpu")
        await register(app, "cpu-1", 8)
        yield
    finally:
        app.state.settings = settings


async def shown(api: httpx.AsyncClient, workspace_id: int) -> list[dict[str, Any]]:
    reply = await api.get(QUOTAS.format(workspace_id))
    assert reply.status_code == 200, reply.text
    found: list[dict[str, Any]] = reply.json()["quotas"]
    return found


async def everyone(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    reply = await api.get("/api/v1/quotas")
    assert reply.status_code == 200, reply.text
    found: list[dict[str, Any]] = reply.json()["quotas"]
    return found


async def put(
    admin: httpx.AsyncClient, workspace_id: int, pool: str, **body: Any
) -> httpx.Response:
    return await admin.put(QUOTA.format(workspace_id, pool), json=body)


async def epoch(app: FastAPI) -> int:
    async with session_scope(app.state.session_factory) as session:
        return await allocation_service.scheduler_epoch(session)


def quota(
    ws: dict[str, Any],
    pool: str,
    nominal: int,
    borrowing: int | None = None,
    lending: int | None = None,
    source: str = "api",
    held: int = 0,
) -> dict[str, Any]:
    return {
        "workspaceId": ws["id"],
        "workspaceName": ws["name"],
        "resourcePool": pool,
        "nominalSlots": nominal,
        "borrowingLimit": borrowing,
        "lendingLimit": lending,
        "source": source,
        "heldSlots": held,
        "borrowedSlots": max(0, held - nominal),
    }


# -- set, show, unset -------------------------------------------------------------------


@pytest.mark.usefixtures("pools")
async def test_set_show_and_unset(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    nlp = await new_workspace(api, "nlp")
    assert await shown(api, nlp["id"]) == []

    before = await epoch(app)
    reply = await put(admin, nlp["id"], "gpu", nominalSlots=3, borrowingLimit=2, lendingLimit=1)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"quota": quota(nlp, "gpu", 3, 2, 1)}
    # The scheduler's view loads afresh at its next pass.
    assert await epoch(app) > before
    assert await shown(api, nlp["id"]) == [quota(nlp, "gpu", 3, 2, 1)]

    # Again, with no limits: null (or absent) means none.
    reply = await put(admin, nlp["id"], "gpu", nominalSlots=4, borrowingLimit=None)
    assert reply.status_code == 200, reply.text
    reply = await put(admin, nlp["id"], "default", nominalSlots=0, lendingLimit=0)
    assert reply.status_code == 200, reply.text
    assert await shown(api, nlp["id"]) == [
        quota(nlp, "default", 0, None, 0),
        quota(nlp, "gpu", 4),
    ]

    before = await epoch(app)
    reply = await admin.delete(QUOTA.format(nlp["id"], "gpu"))
    assert reply.status_code == 200, reply.text
    assert await epoch(app) > before
    assert await shown(api, nlp["id"]) == [quota(nlp, "default", 0, None, 0)]
    # Unsetting again: nothing is there to unset.
    message = refusal(await admin.delete(QUOTA.format(nlp["id"], "gpu")), 404)
    assert message.startswith("pool: workspace 'nlp'") and "no quota set through the API" in message


@pytest.mark.usefixtures("pools")
async def test_config_quota_is_shown_and_overridden_by_the_apis(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    vision = await new_workspace(api, "vision")
    config_quota = quota(vision, "gpu", 2, 1, None, source="master config")
    assert await shown(api, vision["id"]) == [config_quota]
    assert await everyone(api) == [config_quota]

    reply = await put(admin, vision["id"], "gpu", nominalSlots=5)
    assert reply.status_code == 200, reply.text
    assert await shown(api, vision["id"]) == [quota(vision, "gpu", 5)]

    # The API's removed, the config's applies again; the config's cannot be unset.
    assert (await admin.delete(QUOTA.format(vision["id"], "gpu"))).status_code == 200
    assert await shown(api, vision["id"]) == [config_quota]
    message = refusal(await admin.delete(QUOTA.format(vision["id"], "gpu")), 404)
    assert "the master config's, changed only there" in message


async def test_effective_quotas_skip_unknown_workspaces_keep_unknown_pools(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    vision = await new_workspace(api, "vision")
    settings = app.state.settings.model_copy(
        update={
            "resource_pools": [
                ResourcePoolSettings(
                    pool_name="default",
                    quotas=[
                        WorkspaceQuotaSettings(workspace="vision", nominal_slots=1),
                        WorkspaceQuotaSettings(workspace="nobody-here", nominal_slots=1),
                    ],
                )
            ]
        }
    )
    quota_service._warned_unknown.discard(("nobody-here", "default"))
    async with session_scope(app.state.session_factory) as session:
        # A row for a pool gone from the config is still returned: the scheduler ignores it.
        session.add(
            quota_service.WorkspaceQuotaModel(
                workspace_id=vision["id"], resource_pool="gone", nominal_slots=7
            )
        )
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engine = app.state.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        with caplog.at_level(logging.WARNING, logger="master.services.quotas"):
            for _ in range(2):
                async with session_scope(app.state.session_factory) as session:
                    found = await quota_service.effective_quotas(session, settings)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    # What the scheduler pays at each load of its view: two selects.
    assert len(statements) == 4, statements
    assert [(q.workspace_name, q.pool, q.nominal_slots, q.source) for q in found] == [
        ("vision", "default", 1, "master config"),
        ("vision", "gone", 7, "api"),
    ]
    warned = [r for r in caplog.records if "nobody-here" in r.getMessage()]
    assert len(warned) == 1, caplog.text


@pytest.mark.usefixtures("pools")
async def test_a_deleted_workspaces_quotas_go_with_it(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    nlp = await new_workspace(api, "nlp")
    assert (await put(admin, nlp["id"], "gpu", nominalSlots=2, lendingLimit=0)).status_code == 200
    before = await epoch(app)
    reply = await api.delete(f"/api/v1/workspaces/{nlp['id']}")
    assert reply.status_code == 200, reply.text
    assert reply.json()["completed"] is True
    assert await everyone(api) == []
    # The scheduler's view drops them too: slots it kept for nlp are free again.
    assert await epoch(app) > before


# -- what is refused --------------------------------------------------------------------


@pytest.mark.usefixtures("pools")
async def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    nlp = await new_workspace(api, "nlp")
    assert (await put(admin, nlp["id"], "gpu", nominalSlots=2, lendingLimit=1)).status_code == 200
    kept = [quota(nlp, "gpu", 2, None, 1)]
    start = await epoch(app)

    async def refused(status: int, reply: httpx.Response, *expected: str) -> None:
        message = refusal(reply, status)
        for text in expected:
            assert text in message, message
        assert await shown(api, nlp["id"]) == kept
        assert await epoch(app) == start

    cases: list[tuple[dict[str, Any], tuple[str, ...]]] = [
        ({}, ("nominalSlots: required",)),
        ({"nominalSlots": -1}, ("nominalSlots: -1 is negative",)),
        ({"nominalSlots": 1.5}, ("nominalSlots: 1.5 is not a whole number",)),
        ({"nominalSlots": 2.0}, ("nominalSlots: 2.0 is not a whole number",)),
        ({"nominalSlots": "3"}, ("nominalSlots: '3' is not a whole number",)),
        ({"nominalSlots": True}, ("nominalSlots: True is not a whole number",)),
        ({"nominalSlots": [1]}, ("nominalSlots:",)),
        ({"nominalSlots": 1, "borrowingLimit": -2}, ("borrowingLimit: -2 is negative",)),
        ({"nominalSlots": 1, "borrowingLimit": False}, ("borrowingLimit: False",)),
        ({"nominalSlots": 1, "lendingLimit": "all"}, ("lendingLimit: 'all'",)),
        ({"nominalSlots": 1, "lendingLimit": 2}, ("lendingLimit: 2 is above nominalSlots 1",)),
        ({"nominalSlots": 2**40}, ("nominalSlots:", "above")),
        # The pool has 8 slots on 2 agents.
        ({"nominalSlots": 9}, ("nominalSlots: 9 is above the size of pool 'gpu': 8 enabled",)),
        ({"nominalSlots": 1, "borrowingLimit": 9}, ("borrowingLimit: 9 is above the size",)),
        ({"nominalSlots": 3, "extra": 1}, ("extra",)),
    ]
    for body, expected in cases:
        await refused(400, await put(admin, nlp["id"], "gpu", **body), *expected)

    # Pools: one that does not exist, one no name can be, one without agents.
    await refused(400, await put(admin, nlp["id"], "a%00b", nominalSlots=1), "pool: the pool name")
    await refused(400, await admin.delete(QUOTA.format(nlp["id"], "a%00b")), "pool: the pool name")
    await refused(404, await admin.delete(QUOTA.format(nlp["id"], "tpu")), "pool: pool 'tpu' does")
    await refused(
        400,
        await put(admin, nlp["id"], "tpu", nominalSlots=1),
        "pool: pool 'tpu' does not exist; pools: default, gpu, empty",
    )
    await refused(
        400,
        await put(admin, nlp["id"], "empty", nominalSlots=1),
        "nominalSlots: 1 slot in pool 'empty', which has no agents yet",
    )
    # 0 is fine there, and changes only that pool.
    assert (await put(admin, nlp["id"], "empty", nominalSlots=0)).status_code == 200
    assert (await admin.delete(QUOTA.format(nlp["id"], "empty"))).status_code == 200
    start = await epoch(app)

    # Workspaces: unknown, archived, being deleted.
    await refused(404, await put(admin, 999_999, "gpu", nominalSlots=1), "workspace 999999")
    await refused(404, await api.get(QUOTAS.format(999_999)), "workspace 999999")
    archived = await new_workspace(api, "old")
    assert (await api.post(f"/api/v1/workspaces/{archived['id']}/archive")).status_code == 200
    start = await epoch(app)  # a new workspace makes the scheduler read quotas again
    await refused(
        400, await put(admin, archived["id"], "gpu", nominalSlots=1), "workspaceId:", "archived"
    )
    # A pool bound to other workspaces only.
    await bind(admin, "gpu", "old")
    await refused(
        400, await put(admin, nlp["id"], "gpu", nominalSlots=1), "pool: pool 'gpu' is bound"
    )


@pytest.mark.usefixtures("pools")
async def test_only_admins_change_quotas_and_everyone_reads_them(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    nlp = await new_workspace(api, "nlp")
    message = refusal(await put(api, nlp["id"], "gpu", nominalSlots=1), 403)
    assert message == "setting workspace quotas is for admins; user determined is not one"
    body = {"id": nlp["id"], "clusterQuotaPairs": {"": 1}}
    message = refusal(await api.post(SET_RESOURCE_QUOTA.format(nlp["id"]), json=body), 403)
    assert "is for admins" in message
    assert await shown(api, nlp["id"]) == []
    assert (await put(admin, nlp["id"], "gpu", nominalSlots=1)).status_code == 200
    message = refusal(await api.delete(QUOTA.format(nlp["id"], "gpu")), 403)
    assert message == "unsetting workspace quotas is for admins; user determined is not one"
    assert await shown(api, nlp["id"]) == [quota(nlp, "gpu", 1)]
    assert await everyone(api) == [quota(nlp, "gpu", 1)]


# -- held slots -------------------------------------------------------------------------


@pytest.mark.usefixtures("pools")
async def test_held_and_borrowed_slots_count_experiments_and_tasks(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    nlp = await new_workspace(api, "nlp")
    project = await new_project(api, nlp["id"], "p")
    assert (await put(admin, nlp["id"], "gpu", nominalSlots=2)).status_code == 200
    config = (
        "name: held\nentrypoint: python3 train.py\n"
        "resources: {slots_per_trial: 3, resource_pool: gpu}\n"
        "searcher: {name: single, metric: loss, max_length: 10}\n"
    )
    reply = await api.post(
        "/api/v1/experiments", json={"config": config, "activate": True, "projectId": project["id"]}
    )
    assert reply.status_code == 200, reply.text
    assert (await command(api, nlp["id"], 1, "gpu")).status_code == 200
    # Another workspace's work counts for it, not for nlp.
    await submit(
        api, "name: other\nentrypoint: x\nsearcher: {name: single, metric: l, max_length: 1}\n"
    )
    await schedule(app)
    assert await shown(api, nlp["id"]) == [quota(nlp, "gpu", 2, held=4)]
    async with session_scope(app.state.session_factory) as session:
        held = await quota_service.held_slots_by_workspace(session)
    assert held[(nlp["id"], "gpu")] == 4
    assert sum(held.values()) == 5


# -- Determined's routes ----------------------------------------------------------------


@pytest.mark.usefixtures("pools")
async def test_determineds_set_resource_quota_sets_the_default_pools_nominal(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    nlp = await new_workspace(api, "nlp")
    path = SET_RESOURCE_QUOTA.format(nlp["id"])

    # No default compute pool of its own: the master's, "default".
    before = await epoch(app)
    reply = await admin.post(path, json={"id": nlp["id"], "clusterQuotaPairs": {"": 3}})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {}
    assert await epoch(app) > before
    assert await shown(api, nlp["id"]) == [quota(nlp, "default", 3)]

    # Its own default; the limits in force there are kept; the cluster may be named.
    reply = await admin.patch(f"/api/v1/workspaces/{nlp['id']}", json={"defaultComputePool": "gpu"})
    assert reply.status_code == 200, reply.text
    assert (
        await put(admin, nlp["id"], "gpu", nominalSlots=2, borrowingLimit=1, lendingLimit=1)
    ).status_code == 200
    cluster = app.state.settings.cluster_name
    reply = await admin.post(path, json={"id": nlp["id"], "clusterQuotaPairs": {cluster: 6}})
    assert reply.status_code == 200, reply.text
    expected = [quota(nlp, "default", 3), quota(nlp, "gpu", 6, 1, 1)]
    assert await shown(api, nlp["id"]) == expected
    reply = await api.get(f"/api/v1/workspaces/{nlp['id']}/get-k8s-resource-quotas")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"resourceQuotas": {"default": 3.0, "gpu": 6.0}}

    start = await epoch(app)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"id": nlp["id"]}, "clusterQuotaPairs: give one quota"),
        ({"id": nlp["id"], "clusterQuotaPairs": {}}, "clusterQuotaPairs: give one quota"),
        ({"id": nlp["id"], "clusterQuotaPairs": [3]}, "clusterQuotaPairs: give one quota"),
        (
            {"id": nlp["id"], "clusterQuotaPairs": {"": 1, cluster: 2}},
            "clusterQuotaPairs: 2 clusters",
        ),
        ({"id": nlp["id"], "clusterQuotaPairs": {"k8s-east": 1}}, "cluster 'k8s-east' is not this"),
        ({"id": nlp["id"], "clusterQuotaPairs": {"": -1}}, "clusterQuotaPairs: -1 is negative"),
        ({"id": nlp["id"], "clusterQuotaPairs": {"": "2"}}, "clusterQuotaPairs: '2' is not"),
        ({"id": nlp["id"], "clusterQuotaPairs": {"": 9}}, "clusterQuotaPairs: 9 is above the size"),
        ({"id": nlp["id"], "clusterQuotaPairs": {"": 0}}, "below the lending limit 1"),
        ({"id": nlp["id"] + 1, "clusterQuotaPairs": {"": 1}}, "id: the body names workspace"),
    ]
    for body, expected_text in bad:
        assert expected_text in refusal(await admin.post(path, json=body), 400)
        assert await shown(api, nlp["id"]) == expected
    assert await epoch(app) == start
    refusal(
        await admin.post(
            SET_RESOURCE_QUOTA.format(999_999), json={"id": 999_999, "clusterQuotaPairs": {"": 1}}
        ),
        404,
    )


@pytest.mark.usefixtures("pools")
async def test_determineds_workspace_create_with_a_resource_quota(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    body = {"name": "nlp", "defaultComputePool": "gpu", "clusterQuotaPairs": {"": 2}}
    # Not an admin: refused, and the workspace is not created either.
    assert "is for admins" in refusal(await api.post("/api/v1/workspaces", json=body), 403)
    bad = {**body, "clusterQuotaPairs": {"": 9}}
    message = refusal(await admin.post("/api/v1/workspaces", json=bad), 400)
    assert message.startswith("clusterQuotaPairs: 9 is above the size of pool 'gpu'"), message
    assert [w["name"] for w in (await api.get("/api/v1/workspaces")).json()["workspaces"]] == [
        "Uncategorized"
    ]
    reply = await admin.post("/api/v1/workspaces", json=body)
    assert reply.status_code == 200, reply.text
    nlp = reply.json()["workspace"]
    await give_viewer(admin, api, nlp["id"])
    assert await shown(api, nlp["id"]) == [quota(nlp, "gpu", 2)]


@fuzz
@given(
    nominal=scalars,
    borrowing=scalars,
    lending=scalars,
    pairs=st.one_of(scalars, st.dictionaries(st.text(max_size=4), scalars, max_size=2)),
)
async def test_random_quota_bodies_are_never_a_server_error(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    nominal: Any,
    borrowing: Any,
    lending: Any,
    pairs: Any,
) -> None:
    # The default pool has no agents here: a nominal above 0 is refused, 0 is set.
    [uncategorized] = await workspaces_of(api, name="Uncategorized")
    ws = uncategorized["id"]
    body = {"nominalSlots": nominal, "borrowingLimit": borrowing, "lendingLimit": lending}
    reply = await put(admin, ws, "default", **body)
    assert reply.status_code in (200, 400), reply.text
    reply = await admin.post(
        SET_RESOURCE_QUOTA.format(ws), json={"id": ws, "clusterQuotaPairs": pairs}
    )
    assert reply.status_code in (200, 400), reply.text
