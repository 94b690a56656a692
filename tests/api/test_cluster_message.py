"""The cluster message (`det master cluster-message set|get|clear`, issue 32) on Determined's
routes, on both databases: admins set and clear it, everyone sees it in GET /api/v1/master
(and on every dashboard page) while it is active, and bad input changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.test_access import refusal
from tests.api.test_trial_reports import ok
from tests.factories import create_experiment

PATH = "/api/v1/master/cluster_message"


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parsed(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def shown(client: httpx.AsyncClient) -> dict[str, Any] | None:
    message: dict[str, Any] | None = (await ok(client.get("/api/v1/master")))["clusterMessage"]
    return message


async def scheduled(admin: httpx.AsyncClient) -> dict[str, Any] | None:
    message: dict[str, Any] | None = (await ok(admin.get(PATH)))["clusterMessage"]
    return message


async def test_admins_set_and_clear_it_and_everyone_sees_it_while_active(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    assert await shown(api) is None and await scheduled(admin) is None
    # What the official client sends: its default start is now, end and duration null.
    start = datetime.now(UTC) - timedelta(seconds=1)
    body = {"message": "Maintenance at 18:00 UTC", "startTime": rfc3339(start)}
    await ok(admin.put(PATH, json={**body, "endTime": None, "duration": None}))
    message = await shown(api)
    assert message is not None and message["message"] == "Maintenance at 18:00 UTC"
    assert message["endTime"] is None and message["startTime"].endswith("Z")
    assert await scheduled(admin) == message
    # A new one replaces it; --duration sets the end from the start.
    await ok(admin.put(PATH, json={"message": "Upgrade tonight", "duration": "2h"}))
    message = await shown(api)
    assert message is not None and message["message"] == "Upgrade tonight"
    assert parsed(message["endTime"]) - parsed(message["startTime"]) == timedelta(hours=2)
    await ok(admin.delete(PATH))
    assert await shown(api) is None and await scheduled(admin) is None
    await ok(admin.delete(PATH))  # clearing nothing is fine


async def test_a_message_that_starts_later_is_shown_to_admins_only_until_it_starts(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    start = datetime.now(UTC) + timedelta(hours=1)
    end = start + timedelta(days=2)
    body = {"message": "Cluster moves", "startTime": rfc3339(start), "endTime": rfc3339(end)}
    await ok(admin.put(PATH, json=body))
    assert await shown(api) is None
    message = await scheduled(admin)
    assert message is not None and message["message"] == "Cluster moves"
    assert parsed(message["startTime"]) == start
    assert parsed(message["endTime"]) == end


async def test_only_admins_read_set_or_clear_it(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    await ok(admin.put(PATH, json={"message": "kept"}))
    message = refusal(await api.put(PATH, json={"message": "mine"}), 403)
    assert message == "setting the cluster message is for admins; user determined is not one"
    assert "clearing the cluster message is for admins" in refusal(await api.delete(PATH), 403)
    assert "is for admins" in refusal(await api.get(PATH), 403)
    shown_now = await shown(api)
    assert shown_now is not None and shown_now["message"] == "kept"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"message": "x" * 251}, "message: at most 250 characters; this one has 251"),
        ({"message": "  "}, "message: must not be empty"),
        (
            {"message": "m", "endTime": "2099-01-01T00:00:00Z", "duration": "1h"},
            "endTime, duration: give one or the other, not both",
        ),
        (
            {
                "message": "m",
                "startTime": "2099-01-02T00:00:00Z",
                "endTime": "2099-01-01T00:00:00Z",
            },
            "endTime: must be after startTime",
        ),
        (
            {
                "message": "m",
                "startTime": "2000-01-01T00:00:00Z",
                "endTime": "2000-01-02T00:00:00Z",
            },
            "endTime: must be in the future",
        ),
        ({"message": "m", "startTime": "tomorrow"}, "startTime: 'tomorrow' is not an RFC 3339"),
        (
            {"message": "m", "startTime": "2099-01-01T00:00:00"},
            "startTime: '2099-01-01T00:00:00' has no time zone",
        ),
        ({"message": "m", "duration": "5x"}, "duration: '5x' is not a duration"),
        (
            {"message": "m", "startTime": "9999-12-31T00:00:00Z", "duration": "2d"},
            "duration: '2d' after startTime is past year 9999",
        ),
        ({"message": "m", "duration": "0h"}, "duration: '0h' must be longer than zero"),
        ({"message": "m", "duration": "999999w"}, "duration: '999999w' is longer than 100 years"),
        ({"message": "m", "colour": "red"}, "colour"),
        ({}, "message"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, body: dict[str, Any], problem: str
) -> None:
    await ok(admin.put(PATH, json={"message": "before"}))
    reply = await admin.put(PATH, json=body)
    assert reply.status_code in (400, 422), reply.text
    assert problem in reply.text
    message = await shown(api)
    assert message is not None and message["message"] == "before"


async def test_a_lone_surrogate_is_refused_and_changes_nothing(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    await ok(admin.put(PATH, json={"message": "before"}))
    reply = await admin.put(
        PATH,
        content=json.dumps({"message": "down at \udc00 noon"}),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 400, reply.text
    # Refused as the body is read (pydantic names the field), before the service's own check.
    assert reply.json()["message"].startswith("body message:"), reply.text
    message = await shown(api)
    assert message is not None and message["message"] == "before"


wire_keys = st.sampled_from(
    [
        "message",
        "startTime",
        "endTime",
        "duration",
        "numDays",
        "experimentId",
        "destinationWorkspaceId",
        "modelName",
        "save_trial_best",
        "save_trial_latest",
    ]
)
wire_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(["2099-01-01T00:00:00Z", "1h", "5d", "2000-01-01T00:00:00+02:00", "-1"]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.dictionaries(wire_keys, wire_values, max_size=4), pick=st.integers(0, 3))
async def test_random_input_to_these_routes_is_never_a_server_error(
    admin: httpx.AsyncClient, body: dict[str, Any], pick: int
) -> None:
    """The cluster message, log retention, gc preview and model move routes, with bodies
    and parameters a client might get wrong in any way: a 4xx, or a 200, never a 5xx."""
    # Something real to aim at (the database is reset per test, not per example).
    experiments = (await ok(admin.get("/api/v1/experiments")))["experiments"]
    if not experiments:
        experiments = [(await ok(create_experiment(admin)))["experiment"]]
    if (await admin.get("/api/v1/models/target")).status_code == 404:
        await ok(admin.post("/api/v1/models", json={"name": "target"}))
    experiment_id = experiments[0]["id"]
    params = {k: str(v) for k, v in body.items()}
    request = (
        lambda: admin.put(PATH, json=body),
        lambda: admin.put(f"/api/v1/experiments/{experiment_id}/retain_logs", json=body),
        lambda: admin.get(f"/experiments/{experiment_id}/preview_gc", params=params),
        lambda: admin.post("/api/v1/models/target/move", json=body),
    )[pick]()
    reply = await request
    assert reply.status_code < 500, (pick, body, reply.text)
