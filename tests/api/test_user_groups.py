"""User groups (issue 29 item 2) on Determined's routes: create with members, search by name
and by member with pages, describe with members, rename, add and remove members, delete;
admins change them, everyone reads them; every bad input refused with nothing changed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import delete

from master.db.models import UserModel
from master.db.session import session_scope
from tests.api.test_access import alice, create_user, refusal  # noqa: F401 - alice is a fixture


async def user_id(api: httpx.AsyncClient, username: str) -> int:
    reply = await api.get(f"/api/v1/users/{username}/by-username")
    assert reply.status_code == 200, reply.text
    found: int = reply.json()["user"]["id"]
    return found


async def new_group(admin: httpx.AsyncClient, name: str, *members: int) -> dict[str, Any]:
    reply = await admin.post("/api/v1/groups", json={"name": name, "addUsers": list(members)})
    assert reply.status_code == 200, reply.text
    group: dict[str, Any] = reply.json()["group"]
    return group


async def search(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    reply = await api.post("/api/v1/groups/search", json={"limit": 0, **body})
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json()
    return found


async def listed(api: httpx.AsyncClient, **body: Any) -> list[tuple[str, int]]:
    """(name, numMembers) of each group found."""
    return [(g["group"]["name"], g["numMembers"]) for g in (await search(api, **body))["groups"]]


async def describe(api: httpx.AsyncClient, group_id: int) -> tuple[str, list[str]]:
    reply = await api.get(f"/api/v1/groups/{group_id}")
    assert reply.status_code == 200, reply.text
    group = reply.json()["group"]
    assert group["groupId"] == group_id
    return group["name"], [u["username"] for u in group["users"]]


async def everything(api: httpx.AsyncClient) -> list[tuple[str, list[str]]]:
    """Every group with its members: what a refused request must leave as it was."""
    found = (await search(api))["groups"]
    return [await describe(api, g["group"]["groupId"]) for g in found]


async def test_admins_manage_groups_that_everyone_can_read(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    alice_id, determined_id = await user_id(api, "alice"), await user_id(api, "determined")
    bob_id = await create_user(admin, "bob")

    created = await new_group(admin, "vision", alice_id, determined_id, alice_id)
    assert created["name"] == "vision" and isinstance(created["groupId"], int)
    assert [(u["id"], u["username"]) for u in created["users"]] == [
        (determined_id, "determined"),
        (alice_id, "alice"),
    ]
    # Each member is a whole v1User, as the official client's describe renders it.
    assert {"id", "username", "displayName", "admin", "active"} <= set(created["users"][0])
    empty = await new_group(admin, "empty")
    assert empty["users"] == []
    third = await new_group(admin, "nlp", bob_id)

    # Anyone signed in lists and describes.
    assert await listed(alice) == [("vision", 2), ("empty", 0), ("nlp", 1)]
    assert await describe(alice, created["groupId"]) == ("vision", ["determined", "alice"])
    assert await listed(api, name="nlp") == [("nlp", 1)]
    assert await listed(api, name="nl") == []  # a name is matched whole
    assert await listed(api, userId=alice_id) == [("vision", 2)]
    assert await listed(api, userId=bob_id, name="vision") == []
    page = await search(api, limit=1, offset=1)
    assert [g["group"]["name"] for g in page["groups"]] == ["empty"]
    assert page["pagination"]["total"] == 3 and page["pagination"]["endIndex"] == 2
    assert (await search(api, offset=5))["groups"] == []

    # Rename, add and remove in one update; the reply is the group as it now is.
    reply = await admin.put(
        f"/api/v1/groups/{created['groupId']}",
        json={
            "groupId": created["groupId"],
            "name": "vision-team",
            "addUsers": [bob_id],
            "removeUsers": [determined_id],
        },
    )
    assert reply.status_code == 200, reply.text
    assert [u["username"] for u in reply.json()["group"]["users"]] == ["alice", "bob"]
    assert await describe(api, created["groupId"]) == ("vision-team", ["alice", "bob"])
    assert await listed(api, userId=bob_id) == [("vision-team", 2), ("nlp", 1)]
    # Keeping its own name is no clash.
    same = await admin.put(f"/api/v1/groups/{third['groupId']}", json={"name": "nlp"})
    assert same.status_code == 200, same.text

    deleted = await admin.delete(f"/api/v1/groups/{created['groupId']}")
    assert deleted.status_code == 200 and deleted.json() == {}, deleted.text
    assert "not found" in refusal(await api.get(f"/api/v1/groups/{created['groupId']}"), 404)
    assert await listed(api) == [("empty", 0), ("nlp", 1)]
    assert await listed(api, userId=alice_id) == []
    # The name is free again.
    assert (await new_group(admin, "vision-team"))["users"] == []


async def test_users_who_are_not_admins_may_not_change_groups(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    alice_id = await user_id(api, "alice")
    group = await new_group(admin, "ops", alice_id)
    path = f"/api/v1/groups/{group['groupId']}"
    for reply in (
        await alice.post("/api/v1/groups", json={"name": "mine"}),
        await alice.put(path, json={"removeUsers": [alice_id]}),
        await api.put(path, json={"name": "renamed"}),
        await alice.delete(path),
    ):
        assert "is for admins; user" in refusal(reply, 403)
    assert await everything(api) == [("ops", ["alice"])]


def _raw(name: str) -> bytes:
    # httpx's json= refuses lone surrogates; JSON itself spells them as \\udXXX escapes.
    return json.dumps({"name": name}).encode()


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ({"name": ""}, "name", "the name is empty"),
        ({"name": "   "}, "name", "the name is empty"),
        ({"name": "x" * 256}, "name", "256 characters long; at most 255"),
        ({"name": " padded"}, "name", "starts or ends with spaces"),
        ({"name": "bell\x07"}, "name", "control character (U+0007)"),
        ({"name": "nul\x00"}, "name", "control character (U+0000)"),
        (_raw("lone\ud800"), "name", "control character (U+D800)"),
        ({}, "name", "must be a string"),
        ({"name": 5}, "name", "must be a string"),
        ({"name": "ok", "addUsers": [999999]}, "addUsers", "no user has id 999999"),
        ({"name": "ok", "addUsers": [-1]}, "addUsers.0", "greater than or equal to 0"),
        ({"name": "ok", "addUsers": "alice"}, "addUsers", "valid list"),
        ({"name": "ok", "addUsers": list(range(1, 1002))}, "addUsers", "at most 1000"),
        ({"name": "ok", "colour": "red"}, "colour", "Extra inputs are not permitted"),
    ],
)
async def test_bad_groups_are_refused_naming_the_field(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    body: dict[str, Any] | bytes,
    field: str,
    problem: str,
) -> None:
    await new_group(admin, "kept", await user_id(api, "determined"))
    before = await everything(api)
    if isinstance(body, bytes):
        headers = {"content-type": "application/json"}
        reply = await admin.post("/api/v1/groups", content=body, headers=headers)
    else:
        reply = await admin.post("/api/v1/groups", json=body)
    message = refusal(reply, 400)
    # Schema checks say where in the body ("body addUsers.0: ..."), the service's the field.
    assert message.removeprefix("body ").startswith(f"{field}:") and problem in message, message
    assert await everything(api) == before


async def test_clashes_and_unknown_members_are_refused_changing_nothing(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    alice_id, determined_id = await user_id(api, "alice"), await user_id(api, "determined")
    first = await new_group(admin, "first", alice_id)
    await new_group(admin, "second")
    path = f"/api/v1/groups/{first['groupId']}"
    before = await everything(api)

    clash = refusal(await admin.post("/api/v1/groups", json={"name": "second"}), 409)
    assert clash.startswith("name: a user group named 'second' already exists"), clash
    renamed = refusal(await admin.put(path, json={"name": "second", "addUsers": [1]}), 409)
    assert "'second' already exists" in renamed
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"addUsers": [alice_id]},
            f"addUsers: already in user group 'first': 'alice' ({alice_id})",
        ),
        (
            {"removeUsers": [determined_id]},
            f"removeUsers: not in user group 'first': 'determined' ({determined_id})",
        ),
        ({"addUsers": [determined_id, 999999]}, "addUsers: no user has id 999999"),
        ({"removeUsers": [alice_id, 999998]}, "removeUsers: no user has id 999998"),
        (
            {"addUsers": [determined_id], "removeUsers": [determined_id]},
            f"addUsers, removeUsers: user ids {determined_id} are in both",
        ),
        ({"name": "", "addUsers": [determined_id]}, "name: the name is empty"),
        ({"groupId": first["groupId"] + 1}, "groupId: "),
    ]
    for body, message in cases:
        got = refusal(await admin.put(path, json=body), 400)
        assert got.startswith(message), (body, got)
    surrogate = await admin.put(
        path, content=_raw("bad\udfff"), headers={"content-type": "application/json"}
    )
    assert refusal(surrogate, 400).startswith("name: the name holds a control character")
    assert await everything(api) == before

    for method in ("GET", "PUT", "DELETE"):
        reply = await admin.request(method, "/api/v1/groups/999999", json={"name": "x"})
        assert refusal(reply, 404) == "user group 999999 not found", method
    reply = await admin.get(f"/api/v1/groups/{2**40}")
    assert reply.status_code == 400, reply.text
    # A lone surrogate in a search is no group's name, not a server error.
    found = await admin.post(
        "/api/v1/groups/search",
        content=json.dumps({"limit": 1, "name": "x\ud800"}).encode(),
        headers={"content-type": "application/json"},
    )
    assert found.status_code == 200 and found.json()["groups"] == [], found.text
    bad_page = await admin.post("/api/v1/groups/search", json={"limit": -1})
    assert refusal(bad_page, 400).startswith("body limit:")
    too_many = await admin.post("/api/v1/groups/search", json={"limit": 10_001})
    assert refusal(too_many, 400) == "limit: 10001 is more than 10000"
    assert await everything(api) == before


async def test_a_deleted_user_leaves_every_group(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    carol_id = await create_user(admin, "carol")
    determined_id = await user_id(api, "determined")
    one = await new_group(admin, "one", carol_id, determined_id)
    await new_group(admin, "two", carol_id)
    # No route deletes users (Determined deactivates them); an operator's SQL may.
    async with session_scope(app.state.session_factory) as session:
        await session.execute(delete(UserModel).where(UserModel.id == carol_id))
    assert await describe(api, one["groupId"]) == ("one", ["determined"])
    assert await listed(api) == [("one", 1), ("two", 0)]
    assert await listed(api, userId=carol_id) == []
