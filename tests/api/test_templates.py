"""Template CRUD as Determined's client drives it; every bad input refused, nothing stored."""

from __future__ import annotations

import httpx
import pytest

from tests.factories import TEMPLATE_CONFIG, create_template, row_counts


async def test_create_get_list_delete(api: httpx.AsyncClient) -> None:
    created = await create_template(api, "cpu-defaults")
    assert created.status_code == 200, created.text
    template = created.json()["template"]
    workspaces = (await api.get("/api/v1/workspaces")).json()["workspaces"]
    default_ws = next(w for w in workspaces if w["name"] == "Uncategorized")
    # workspaceId 0 means the default workspace, as Determined's `tpl set` sends it.
    assert template == {
        "name": "cpu-defaults",
        "config": TEMPLATE_CONFIG,
        "workspaceId": default_ws["id"],
    }

    got = await api.get("/api/v1/templates/cpu-defaults")
    assert got.status_code == 200
    assert got.json()["template"] == template

    listed = (await api.get("/api/v1/templates")).json()
    assert listed["templates"] == [template]
    assert listed["pagination"]["total"] == 1

    deleted = await api.delete("/api/v1/templates/cpu-defaults")
    assert deleted.status_code == 200
    missing = await api.get("/api/v1/templates/cpu-defaults")
    assert missing.status_code == 404
    assert missing.json()["code"] == 5
    assert missing.json()["message"] == "template cpu-defaults not found"


async def test_workspace_has_every_key_the_client_reads(api: httpx.AsyncClient) -> None:
    workspace = (await api.get("/api/v1/workspaces")).json()["workspaces"][0]
    required = {"id", "name", "archived", "errorMessage", "immutable", "numExperiments"}
    required |= {"numProjects", "pinned", "state", "userId", "username"}
    assert required <= workspace.keys()


async def test_patch_replaces_the_config(api: httpx.AsyncClient) -> None:
    await create_template(api, "t1")
    reply = await api.patch("/api/v1/templates/t1", json={"max_restarts": 2})
    assert reply.status_code == 200, reply.text
    assert reply.json()["template"]["config"] == {"max_restarts": 2}
    assert (await api.get("/api/v1/templates/t1")).json()["template"]["config"] == {
        "max_restarts": 2
    }


async def test_put_upserts(api: httpx.AsyncClient) -> None:
    first = await api.put(
        "/api/v1/templates/t2", json={"name": "t2", "config": {"max_restarts": 1}}
    )
    assert first.status_code == 200, first.text
    second = await api.put("/api/v1/templates/t2", json={"config": {"max_restarts": 3}})
    assert second.json()["template"]["config"] == {"max_restarts": 3}
    assert (await api.get("/api/v1/templates")).json()["pagination"]["total"] == 1


async def test_rename(api: httpx.AsyncClient) -> None:
    await create_template(api, "old")
    reply = await api.patch("/api/v1/template/rename", json={"oldName": "old", "newName": "new"})
    assert reply.status_code == 200, reply.text
    assert (await api.get("/api/v1/templates/new")).status_code == 200
    assert (await api.get("/api/v1/templates/old")).status_code == 404


async def test_list_paginates(api: httpx.AsyncClient) -> None:
    for name in ("a", "b", "c"):
        await create_template(api, name, {"max_restarts": 1})
    page = (await api.get("/api/v1/templates", params={"offset": 1, "limit": 1})).json()
    assert [t["name"] for t in page["templates"]] == ["b"]
    assert page["pagination"] | {} == page["pagination"]
    assert page["pagination"]["endIndex"] == 2
    assert page["pagination"]["total"] == 3


async def test_duplicate_create_is_refused(api: httpx.AsyncClient) -> None:
    await create_template(api, "dup", {"max_restarts": 1})
    again = await create_template(api, "dup", {"max_restarts": 9})
    assert again.status_code == 409
    assert again.json()["message"] == "template dup already exists"
    stored = (await api.get("/api/v1/templates/dup")).json()["template"]["config"]
    assert stored == {"max_restarts": 1}


BAD_TEMPLATES = [
    pytest.param(
        {"resources": {"slots_per_trial": -1}}, "resources.slots_per_trial", id="negative-slots"
    ),
    pytest.param({"resourcez": {}}, "resourcez", id="unknown-top-level-key"),
    pytest.param({"resources": {"slots": 2}}, "resources.slots", id="slots-not-slots-per-trial"),
    pytest.param(
        {"reproducibility": {"experiment_seed": 2**31}},
        "reproducibility.experiment_seed",
        id="seed-too-large",
    ),
    pytest.param({"max_restarts": "many"}, "max_restarts", id="wrong-type"),
    pytest.param({"template": "other"}, "template", id="template-names-a-template"),
]


@pytest.mark.parametrize("config,path", BAD_TEMPLATES)
async def test_bad_template_config_is_refused_and_nothing_stored(
    api: httpx.AsyncClient, config: dict[str, object], path: str
) -> None:
    reply = await create_template(api, "bad", config)
    assert reply.status_code == 400, reply.text
    body = reply.json()
    assert body["code"] == 3
    assert path in body["message"]
    assert any(d["path"] == path for d in body["details"])
    assert await row_counts(api) == (0, 0)


async def test_bad_patch_keeps_the_old_config(api: httpx.AsyncClient) -> None:
    await create_template(api, "keep", {"max_restarts": 1})
    reply = await api.patch("/api/v1/templates/keep", json={"max_restarts": -5})
    assert reply.status_code == 400
    assert "max_restarts" in reply.json()["message"]
    stored = (await api.get("/api/v1/templates/keep")).json()["template"]["config"]
    assert stored == {"max_restarts": 1}


async def test_patch_with_a_non_mapping_body(api: httpx.AsyncClient) -> None:
    await create_template(api, "keep", {"max_restarts": 1})
    reply = await api.patch("/api/v1/templates/keep", json=[1, 2])
    assert reply.status_code == 400
    assert "must be a mapping" in reply.json()["message"]


@pytest.mark.parametrize("name", ["", " lead", "a/b", "x" * 300])
async def test_bad_template_names(api: httpx.AsyncClient, name: str) -> None:
    reply = await api.put(f"/api/v1/templates/{name}", json={"config": {}})
    assert reply.status_code in (400, 404, 405)
    assert reply.json()["code"] in (3, 5, 12)
    assert await row_counts(api) == (0, 0)


async def test_body_name_must_match_path(api: httpx.AsyncClient) -> None:
    reply = await api.post("/api/v1/templates/a", json={"name": "b", "config": {}})
    assert reply.status_code == 400
    assert reply.json()["message"].startswith("name:")
    assert await row_counts(api) == (0, 0)


async def test_delete_unknown_is_404(api: httpx.AsyncClient) -> None:
    reply = await api.delete("/api/v1/templates/ghost")
    assert reply.status_code == 404
    assert reply.json()["message"] == "template ghost not found"
