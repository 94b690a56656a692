"""Webhooks (issue 32): Determined's routes, bad input refused naming the field with nothing
changed, and deliveries to a real HTTP receiver: signed, Slack's shape, a regex over task
logs, a trial's custom alert, and a receiver that errs, hangs or is down for a while."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any, Literal

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select, update

from harness.webhook_receiver import Delivery, Receiver
from master.db.models import WebhookEventModel, WebhookOutboxModel, utcnow
from master.db.session import session_scope
from master.services import access, webhooks
from master.settings import MasterSettings
from tests.api.test_access import alice, give_viewer, refusal  # noqa: F401 - alice is a fixture
from tests.api.test_logs import append, line, start_experiment
from tests.factories import create_experiment

SINGLE = """\
name: hooked
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def hook(
    url: str,
    *triggers: dict[str, Any],
    kind: str = "WEBHOOK_TYPE_DEFAULT",
    mode: str = "WEBHOOK_MODE_WORKSPACE",
    name: str = "team",
    workspace_id: int = 0,
) -> dict[str, Any]:
    """The body the SDK's bindings.post_PostWebhook sends (v1Webhook.to_json)."""
    return {
        "id": None,
        "mode": mode,
        "name": name,
        "triggers": list(triggers),
        "url": url,
        "webhookType": kind,
        "workspaceId": workspace_id,
    }


def on_state(state: str) -> dict[str, Any]:
    return {"triggerType": "TRIGGER_TYPE_EXPERIMENT_STATE_CHANGE", "condition": {"state": state}}


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    reply = await client.post("/api/v1/webhooks", json=body)
    assert reply.status_code == 200, reply.text
    webhook: dict[str, Any] = reply.json()["webhook"]
    return webhook


async def listed(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    reply = await client.get("/api/v1/webhooks")
    assert reply.status_code == 200, reply.text
    found: list[dict[str, Any]] = reply.json()["webhooks"]
    return found


async def new_experiment(api: httpx.AsyncClient, config: str = SINGLE) -> int:
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


async def pause(api: httpx.AsyncClient, experiment_id: int) -> None:
    reply = await api.post(f"/api/v1/experiments/{experiment_id}/pause")
    assert reply.status_code == 200, reply.text


async def activate(api: httpx.AsyncClient, experiment_id: int) -> None:
    reply = await api.post(f"/api/v1/experiments/{experiment_id}/activate")
    assert reply.status_code == 200, reply.text


def shipper_for(app: FastAPI, **webhook_settings: Any) -> webhooks.WebhookShipper:
    settings: MasterSettings = app.state.settings
    tuned = settings.webhooks.model_copy(update=webhook_settings)
    return webhooks.WebhookShipper(
        app.state.session_factory, settings.model_copy(update={"webhooks": tuned})
    )


async def until(what: str, check: Callable[[], Awaitable[Any]], within_s: float = 15.0) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last saw {value!r}")
        await asyncio.sleep(0.05)


async def ship_until(
    shipper: webhooks.WebhookShipper, receiver: Receiver, count: int, within_s: float = 15.0
) -> list[Delivery]:
    """Run the shipper's passes (as the leader's loop does) until `count` have arrived."""

    async def arrived() -> list[Delivery] | None:
        await shipper.run_once()
        got = receiver.received()
        return got if len(got) >= count else None

    try:
        found: list[Delivery] = await until(f"{count} deliveries", arrived, within_s)
        return found
    finally:
        await shipper.stop()


async def queued(app: FastAPI) -> int:
    async with session_scope(app.state.session_factory) as session:
        return int(await session.scalar(select(func.count()).select_from(WebhookEventModel)) or 0)


# -- the routes -----------------------------------------------------------------------------


async def test_create_list_patch_delete_on_determineds_routes(
    admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    body = hook(
        receiver.url,
        on_state("COMPLETED"),
        on_state("ERROR"),
        {"triggerType": "TRIGGER_TYPE_TASK_LOG", "condition": {"regex": "CUDA out of memory"}},
        kind="WEBHOOK_TYPE_SLACK",
    )
    made = await create(admin, body)
    assert made["name"] == "team" and made["url"] == receiver.url
    assert made["webhookType"] == "WEBHOOK_TYPE_SLACK"
    assert made["mode"] == "WEBHOOK_MODE_WORKSPACE" and made["workspaceId"] == 0
    assert [(t["triggerType"], t["condition"]) for t in made["triggers"]] == [
        ("TRIGGER_TYPE_EXPERIMENT_STATE_CHANGE", {"state": "COMPLETED"}),
        ("TRIGGER_TYPE_EXPERIMENT_STATE_CHANGE", {"state": "ERROR"}),
        ("TRIGGER_TYPE_TASK_LOG", {"regex": "CUDA out of memory"}),
    ]
    assert all(t["webhookId"] == made["id"] for t in made["triggers"])
    # Admins see it; other users do not: a webhook's URL is often its credential.
    assert await listed(admin) == [made]
    assert await listed(api) == []

    new_url = receiver.url + "/v2"
    reply = await admin.patch(f"/api/v1/webhooks/{made['id']}", json={"url": new_url})
    assert reply.status_code == 200, reply.text
    assert [w["url"] for w in await listed(admin)] == [new_url]

    reply = await admin.delete(f"/api/v1/webhooks/{made['id']}")
    assert reply.status_code == 200, reply.text
    assert await listed(admin) == []
    assert "not found" in refusal(await admin.delete(f"/api/v1/webhooks/{made['id']}"), 404)
    assert "not found" in refusal(
        await admin.patch(f"/api/v1/webhooks/{made['id']}", json={"url": new_url}), 404
    )


async def test_test_route_sends_one_signed_delivery_or_says_why_not(
    app: FastAPI, admin: httpx.AsyncClient, receiver: Receiver
) -> None:
    made = await create(admin, hook(receiver.url, on_state("COMPLETED")))
    reply = await admin.post(f"/api/v1/webhooks/{made['id']}/test")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"completed": True}
    (delivery,) = receiver.received()
    assert delivery.json["event_data"] == {"data": "test"}
    assert delivery.signed_with(webhooks.signing_key(app.state.settings))
    receiver.status = 500
    message = refusal(await admin.post(f"/api/v1/webhooks/{made['id']}/test"), 400)
    assert "HTTP 500" in message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"url": "ftp://hooks.example/x"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": ""}, "url"),
        ({"name": ""}, "name"),
        ({"webhookType": "WEBHOOK_TYPE_TEAMS"}, "webhookType"),
        ({"mode": "WEBHOOK_MODE_SOMETIMES"}, "mode"),
        ({"triggers": []}, "triggers"),
        ({"triggers": [{"triggerType": "TRIGGER_TYPE_SUNRISE"}]}, "triggers[0].triggerType"),
        ({"triggers": [on_state("FINISHED")]}, "triggers[0].condition.state"),
        (
            {"triggers": [{"triggerType": "TRIGGER_TYPE_TASK_LOG", "condition": {"regex": "("}}]},
            "triggers[0].condition.regex",
        ),
        (
            {"triggers": [{"triggerType": "TRIGGER_TYPE_TASK_LOG", "condition": {}}]},
            "triggers[0].condition",
        ),
        (
            {"triggers": [{"triggerType": "TRIGGER_TYPE_CUSTOM", "condition": {}}]},
            "triggers[0].triggerType",
        ),
        ({"workspaceId": 999}, "workspaceId"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    admin: httpx.AsyncClient, change: dict[str, Any], field: str
) -> None:
    body = {**hook("http://127.0.0.1:9/hook", on_state("COMPLETED")), **change}
    reply = await admin.post("/api/v1/webhooks", json=body)
    assert reply.status_code in (400, 404), reply.text
    assert reply.json()["message"].startswith(f"{field}:"), reply.text
    assert await listed(admin) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "team \ud800"}, "name"),
        ({"url": "https://hooks.example/\udfff"}, "url"),
        (
            {
                "triggers": [
                    {"triggerType": "TRIGGER_TYPE_TASK_LOG", "condition": {"regex": "\ud83d"}}
                ]
            },
            "triggers[0].condition.regex",
        ),
    ],
)
async def test_a_lone_surrogate_is_refused_naming_the_field_and_changes_nothing(
    admin: httpx.AsyncClient, change: dict[str, Any], field: str
) -> None:
    """JSON may spell half a surrogate pair ("\\ud800"); no database stores it as text."""
    body = {**hook("http://127.0.0.1:9/hook", on_state("COMPLETED")), **change}
    reply = await admin.post(
        "/api/v1/webhooks",
        content=json.dumps(body),  # ensure_ascii: the surrogate travels as an escape
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["message"].startswith(f"{field}:"), reply.text
    assert "surrogate" in reply.json()["message"]
    assert await listed(admin) == []


async def test_a_bad_patch_url_changes_nothing(admin: httpx.AsyncClient) -> None:
    made = await create(admin, hook("https://hooks.example/x", on_state("COMPLETED")))
    message = refusal(
        await admin.patch(f"/api/v1/webhooks/{made['id']}", json={"url": "file:///etc/passwd"}),
        400,
    )
    assert message.startswith("url:")
    assert [w["url"] for w in await listed(admin)] == ["https://hooks.example/x"]


async def test_only_admins_make_global_webhooks_and_owners_their_workspaces(
    admin: httpx.AsyncClient,
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    body = hook("https://hooks.example/x", on_state("COMPLETED"))
    assert "for admins" in refusal(await api.post("/api/v1/webhooks", json=body), 403)
    reply = await alice.post("/api/v1/workspaces", json={"name": "alices"})
    assert reply.status_code == 200, reply.text
    workspace_id = reply.json()["workspace"]["id"]
    scoped = {**body, "workspaceId": workspace_id}
    # determined holds no role in alice's workspace: it is not there for him.
    message = refusal(await api.post("/api/v1/webhooks", json=scoped), 404)
    assert message == f"workspaceId: workspace {workspace_id} not found"
    made = await create(alice, scoped)
    assert made["workspaceId"] == workspace_id
    # Its owner and admins see it; another user does not, and may not delete it.
    assert [w["id"] for w in await listed(alice)] == [made["id"]]
    assert [w["id"] for w in await listed(admin)] == [made["id"]]
    assert await listed(api) == []
    hidden = refusal(await api.delete(f"/api/v1/webhooks/{made['id']}"), 404)
    assert hidden == f"webhook {made['id']} not found"
    # As a Viewer there he sees the workspace, not its webhooks' management.
    await give_viewer(admin, api, workspace_id)
    assert "owner" in refusal(await api.delete(f"/api/v1/webhooks/{made['id']}"), 403)
    reply = await admin.delete(f"/api/v1/webhooks/{made['id']}")
    assert reply.status_code == 200, reply.text


# -- deliveries -----------------------------------------------------------------------------


async def test_a_state_change_is_delivered_signed_with_its_event_id(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    await create(admin, hook(receiver.url, on_state("PAUSED")))
    experiment_id = await new_experiment(api)
    await pause(api, experiment_id)
    (delivery,) = await ship_until(shipper_for(app), receiver, 1)
    assert delivery.signed_with(webhooks.signing_key(app.state.settings))
    assert not delivery.signed_with(b"another key")
    assert abs(int(delivery.headers["X-Determined-AI-Signature-Timestamp"]) - time.time()) < 60
    body = delivery.json
    assert body["event_id"] == delivery.event_id
    assert body["event_type"] == "EXPERIMENT_STATE_CHANGE"
    assert body["condition"] == {"state": "PAUSED"}
    experiment = body["event_data"]["experiment"]
    assert (experiment["id"], experiment["state"], experiment["name"]) == (
        experiment_id,
        "PAUSED",
        "hooked",
    )
    assert experiment["workspace"] == "Uncategorized" and experiment["slots_per_trial"] == 1
    assert await queued(app) == 0


async def test_a_slack_webhook_gets_slacks_message_shape(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    await create(admin, hook(receiver.url, on_state("PAUSED"), kind="WEBHOOK_TYPE_SLACK"))
    experiment_id = await new_experiment(api)
    await pause(api, experiment_id)
    (delivery,) = await ship_until(shipper_for(app, base_url="https://det.example"), receiver, 1)
    body = delivery.json
    assert set(body) == {"blocks", "attachments"}
    (status,) = body["blocks"]
    assert status["type"] == "section"
    assert status["text"] == {
        "type": "plain_text",
        "text": "The status of your experiment is PAUSED",
    }
    (attachment,) = body["attachments"]
    assert attachment["color"].startswith("#")
    (section,) = attachment["blocks"]
    assert section["text"]["type"] == "mrkdwn"
    assert f"https://det.example/ui/experiments/{experiment_id}" in section["text"]["text"]
    assert f"hooked (#{experiment_id})" in section["text"]["text"]
    fields = [f["text"] for f in section["fields"]]
    assert "*Status*: PAUSED" in fields and "*Workspace*: Uncategorized" in fields
    assert delivery.signed_with(webhooks.signing_key(app.state.settings))


async def test_a_log_line_matching_the_regex_fires_once_per_task(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    regex = r"CUDA (out of|error) memory \d+"
    await create(
        admin,
        hook(receiver.url, {"triggerType": "TRIGGER_TYPE_TASK_LOG", "condition": {"regex": regex}}),
    )
    first, second, _ = await start_experiment(api)
    await append(app, "agent-a", [line(first, "epoch 1\n"), line(second, "all fine\n")])
    await append(
        app,
        "agent-a",
        [
            line(first, "RuntimeError: CUDA out of memory 42\n", second=1),
            line(first, "CUDA out of memory 43 again\n", second=2),
        ],
    )
    await append(app, "agent-a", [line(first, "CUDA error memory 7\n", second=3)])
    (delivery,) = await ship_until(shipper_for(app), receiver, 1)
    body = delivery.json
    assert body["event_type"] == "TASK_LOG"
    assert body["condition"] == {"regex": regex}
    assert body["event_data"]["task_log"] == {
        "task_id": first.task_id,
        "node_name": "agent-a",
        "triggering_log": "RuntimeError: CUDA out of memory 42",
    }
    # The second trial's task matches later: one more, for it.
    await append(app, "agent-b", [line(second, "CUDA out of memory 1\n", second=4)])
    deliveries = await ship_until(shipper_for(app), receiver, 2)
    assert [d.json["event_data"]["task_log"]["task_id"] for d in deliveries] == [
        first.task_id,
        second.task_id,
    ]
    assert len(receiver.received()) == 2


async def test_a_regex_that_would_backtrack_forever_costs_a_log_batch_nothing(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    """`(a+)+$` takes Python's re about 2^n steps on n a's and a b; the master matches
    TASK_LOG regexes with RE2 (Determined's Go regexp syntax), linear in the line, so a
    workspace owner's regex cannot stall the event loop that stores every log batch."""
    await create(
        admin,
        hook(
            receiver.url, {"triggerType": "TRIGGER_TYPE_TASK_LOG", "condition": {"regex": "(a+)+$"}}
        ),
    )
    (first, *_) = await start_experiment(api)
    started = time.monotonic()
    # 30 a's: minutes of backtracking per line in Python's re on this machine; RE2 takes
    # microseconds, so 30 s is room for the batch's writes on a loaded machine.
    await append(app, "agent-a", [line(first, "a" * 30 + "b\n"), line(first, "aaaa\n", second=1)])
    assert time.monotonic() - started < 30.0
    (delivery,) = await ship_until(shipper_for(app), receiver, 1)
    assert delivery.json["condition"]["regex"] == "(a+)+$"


async def test_a_regex_re2_cannot_take_is_refused_saying_why(admin: httpx.AsyncClient) -> None:
    trigger = {"triggerType": "TRIGGER_TYPE_TASK_LOG", "condition": {"regex": r"(err)\1"}}
    reply = await admin.post("/api/v1/webhooks", json=hook("http://127.0.0.1:9/hook", trigger))
    assert reply.status_code == 400, reply.text
    message = reply.json()["message"]
    assert message.startswith("triggers[0].condition.regex: '(err)\\\\1' is not an RE2 expression")
    assert "back-references" in message and "invalid escape sequence" in message
    assert await listed(admin) == []


async def test_a_trials_alert_reaches_the_specific_webhooks_its_config_names(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    custom = {"triggerType": "TRIGGER_TYPE_CUSTOM", "condition": {}}
    named = await create(
        admin, hook(receiver.url + "/named", custom, mode="WEBHOOK_MODE_SPECIFIC", name="ops")
    )
    await create(
        admin, hook(receiver.url + "/other", custom, mode="WEBHOOK_MODE_SPECIFIC", name="other")
    )
    config = SINGLE + "integrations: {webhooks: {webhook_name: [ops]}}\n"
    experiment_id = await new_experiment(api, config)
    tasks = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    (trial_id,) = [t["trialId"] for t in tasks.values() if t["experimentId"] == experiment_id]
    reply = await api.post(
        "/api/v1/webhooks/custom",
        json={
            "data": {
                "title": "loss diverged",
                "description": "at step 10",
                "level": "LOG_LEVEL_ERROR",
            },
            "experimentId": experiment_id,
            "trialId": trial_id,
        },
    )
    assert reply.status_code == 200, reply.text
    (delivery,) = await ship_until(shipper_for(app), receiver, 1)
    body = delivery.json
    assert body["event_type"] == "CUSTOM"
    assert body["event_data"]["custom_data"] == {
        "title": "loss diverged",
        "description": "at step 10",
        "level": "ERROR",
    }
    assert body["event_data"]["experiment"]["trial_id"] == trial_id
    assert named["id"] and len(receiver.received()) == 1
    # Still a line of the trial's logs, as before.
    logs = (await api.get(f"/api/v1/trials/{trial_id}/logs")).text
    assert "alert: loss diverged: at step 10" in logs


async def test_workspace_scope_and_exclusion_are_respected(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    reply = await admin.post("/api/v1/workspaces", json={"name": "elsewhere"})
    assert reply.status_code == 200, reply.text
    elsewhere = reply.json()["workspace"]["id"]
    await create(
        admin, hook(receiver.url + "/elsewhere", on_state("PAUSED"), workspace_id=elsewhere)
    )
    await create(admin, hook(receiver.url + "/everywhere", on_state("PAUSED")))
    here = await new_experiment(api)
    excluded = await new_experiment(api, SINGLE + "integrations: {webhooks: {exclude: true}}\n")
    await pause(api, here)
    await pause(api, excluded)
    shipper = shipper_for(app)
    (delivery,) = await ship_until(shipper, receiver, 1)
    await shipper.run_once()
    assert len(receiver.received()) == 1
    assert delivery.json["event_data"]["experiment"]["id"] == here
    assert await queued(app) == 0


async def test_errors_and_a_hanging_receiver_cost_only_retries(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    await create(admin, hook(receiver.url, on_state("PAUSED"), on_state("ACTIVE")))
    experiment_id = await new_experiment(api)
    shipper = shipper_for(app, timeout_s=0.5, retry_initial_s=0.1, retry_max_s=0.2)
    receiver.status = 500
    await pause(api, experiment_id)
    await shipper.run_once()
    await until("a first failed attempt", lambda: _true(receiver.failures >= 1))
    receiver.status, receiver.hang_s = 200, 3.0
    await activate(api, experiment_id)
    started = time.monotonic()
    await until("the hanging attempt", lambda: _ran(shipper, lambda: receiver.failures >= 2))
    # The pass gave up on the hanging receiver after its timeout, not the receiver's 3 s.
    assert time.monotonic() - started < 2.5
    receiver.hang_s = 0.0
    deliveries = await ship_until(shipper, receiver, 2)
    assert sorted(d.json["condition"]["state"] for d in deliveries) == ["ACTIVE", "PAUSED"]
    assert len({d.event_id for d in deliveries}) == 2
    assert await queued(app) == 0


async def _true(value: bool) -> bool:
    return value


async def _ran(shipper: webhooks.WebhookShipper, done: Callable[[], bool]) -> bool:
    await shipper.run_once()
    return done()


async def test_a_receiver_down_for_a_while_gets_every_event_once(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    """Down 20 s while 10 events happen (the backoff scaled down: 0.2 s doubling to 1 s,
    so the shipper tries it about twenty times); then up: every event arrives, none twice
    by id."""
    await create(admin, hook(receiver.url, on_state("PAUSED"), on_state("ACTIVE")))
    experiment_id = await new_experiment(api)
    receiver.down()
    shipper = shipper_for(app, retry_initial_s=0.2, retry_max_s=1.0, poll_interval_s=0.05)
    shipper.start()  # as the leader runs it: its own task, beside everything else
    try:
        down_since = time.monotonic()
        for _ in range(5):
            await pause(api, experiment_id)
            await activate(api, experiment_id)
        await until("10 queued deliveries", lambda: _at_least(app, 10))
        # The outage itself lasts 20 s: a span of the fault, not a wait for anything.
        await asyncio.sleep(max(0.0, 20.0 - (time.monotonic() - down_since)))
        assert receiver.received() == []
        receiver.up()

        async def all_ten() -> list[Delivery] | None:
            got = receiver.received()
            return got if len(got) >= 10 else None

        deliveries: list[Delivery] = await until("10 deliveries", all_ten, within_s=20)
        await until("an empty queue", lambda: _empty(app))
    finally:
        await shipper.stop()
    ids = [d.event_id for d in receiver.received()]
    assert len(ids) == 10 and len(set(ids)) == 10
    assert [d.json["condition"]["state"] for d in deliveries].count("PAUSED") == 5


async def _at_least(app: FastAPI, count: int) -> bool:
    return await queued(app) >= count


async def _empty(app: FastAPI) -> bool:
    return await queued(app) == 0


async def test_deleting_a_webhook_drops_its_queued_deliveries(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    made = await create(admin, hook(receiver.url, on_state("PAUSED")))
    receiver.down()
    await pause(api, await new_experiment(api))
    shipper = shipper_for(app, retry_initial_s=60)
    await shipper.run_once()
    assert await queued(app) == 1
    reply = await admin.delete(f"/api/v1/webhooks/{made['id']}")
    assert reply.status_code == 200, reply.text
    assert await queued(app) == 0
    await shipper.stop()


async def test_a_webhook_deleted_mid_delivery_makes_nobody_else_hear_twice(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    """A webhook deleted while its event is on the wire takes its queued rows with it; the
    retry its failed send then records updates nothing, and the delivered events of the
    same batch are still settled, not sent again on the next pass."""
    other = Receiver()
    try:
        gone = await create(admin, hook(receiver.url, on_state("PAUSED"), name="gone"))
        await create(admin, hook(other.url, on_state("PAUSED"), name="kept"))
        await pause(api, await new_experiment(api))
        shipper = shipper_for(app, timeout_s=10.0, retry_initial_s=60)
        receiver.status, receiver.hang_s = 500, 2.0  # the delete lands while it hangs
        sending = asyncio.create_task(shipper.run_once())
        await until("the doomed send on the wire", lambda: _true(receiver.failures >= 1))
        reply = await admin.delete(f"/api/v1/webhooks/{gone['id']}")
        assert reply.status_code == 200, reply.text
        await sending  # raised StaleDataError here, rolling the delivered event back
        assert len(other.received()) == 1
        assert await queued(app) == 0
        await shipper.run_once()
        assert len(other.received()) == 1
        await shipper.stop()
    finally:
        other.close()


async def outbox(app: FastAPI) -> int:
    async with session_scope(app.state.session_factory) as session:
        return int(await session.scalar(select(func.count()).select_from(WebhookOutboxModel)) or 0)


async def test_state_changes_nobody_listens_for_write_no_outbox_rows(
    app: FastAPI,
    admin: httpx.AsyncClient,
    api: httpx.AsyncClient,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every experiment's submit, pause and end are state changes: with no webhook for a
    state, none of them costs an outbox row or a shipper pass (issue 27's hot path); a
    webhook made a moment ago hears the very next change it names."""
    # Known triggers are trusted for 2 s; a loaded machine must not turn that into a flake.
    monkeypatch.setattr(webhooks, "_TRIGGERS_TTL_S", 600.0)
    shipper = shipper_for(app)
    await shipper.run_once()  # the leader's shipper keeps the triggers known
    before = await outbox(app)
    experiment_id = await new_experiment(api)
    await pause(api, experiment_id)
    await activate(api, experiment_id)
    assert await outbox(app) == before
    await create(admin, hook(receiver.url, on_state("PAUSED")))
    await pause(api, experiment_id)
    (delivery,) = await ship_until(shipper, receiver, 1)
    assert delivery.json["condition"]["state"] == "PAUSED"
    # The shipper's pass knew the triggers again: ACTIVE, which no webhook names, is skipped.
    await activate(api, experiment_id)
    assert await outbox(app) == before


async def test_events_aged_out_behind_a_failing_endpoint_are_dropped_with_a_warning(
    app: FastAPI,
    admin: httpx.AsyncClient,
    api: httpx.AsyncClient,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await create(admin, hook(receiver.url, on_state("PAUSED"), on_state("ACTIVE")))
    experiment_id = await new_experiment(api)
    receiver.status = 500
    for _ in range(2):
        await pause(api, experiment_id)
        await activate(api, experiment_id)
    shipper = shipper_for(app, max_age_s=60)
    async with session_scope(app.state.session_factory) as session:
        await webhooks.expand_outbox(session, "")
    assert await queued(app) == 4
    async with session_scope(app.state.session_factory) as session:
        # Made two minutes ago: older than max_age_s, without waiting for it to pass.
        await session.execute(
            update(WebhookEventModel).values(created_at=utcnow() - timedelta(minutes=2))
        )
    with caplog.at_level(logging.WARNING, logger="master.services.webhooks"):
        await shipper.deliver_due()
    await shipper.stop()
    assert await queued(app) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("dropped after 1 attempts: HTTP 500" in w for w in warnings), warnings
    assert any(
        w.startswith(f"3 webhook events to {receiver.url} dropped: still undelivered after")
        for w in warnings
    ), warnings


async def test_a_trigger_load_racing_a_webhooks_creation_does_not_hide_it(
    app: FastAPI, admin: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load of the triggers (the shipper's, a log batch's) that reads while a new
    webhook's transaction is still open must not be kept once it commits: else, for the
    cache's lifetime, the state it names would be skipped as if nobody listened."""
    monkeypatch.setattr(webhooks, "_TRIGGERS_TTL_S", 600.0)
    factory = app.state.session_factory
    async with session_scope(factory) as creating:
        await webhooks.create_webhook(
            creating,
            access.Actor(user_id=1, username="admin", admin=True),
            name="late",
            url="http://127.0.0.1:9/hook",
            webhook_type="WEBHOOK_TYPE_DEFAULT",
            mode="WEBHOOK_MODE_WORKSPACE",
            workspace_id=0,
            triggers=[on_state("COMPLETED")],
        )
        if app.state.settings.db.url.startswith("sqlite"):
            stale = None  # SQLite's one writer: the other session would wait for this one
        else:
            async with session_scope(factory) as racing:
                stale = await webhooks._triggers(racing)
            assert "COMPLETED" not in stale.states  # it read before the commit
    async with session_scope(factory) as after:
        assert webhooks._known_triggers(after) is None  # forgotten once it committed
        assert "COMPLETED" in (await webhooks._triggers(after)).states


class _WatchedIdle(asyncio.Event):
    """The scheduler's idle event, telling the test when the shipper waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = asyncio.Event()

    async def wait(self) -> Literal[True]:
        self.waited.set()
        return await super().wait()


async def test_deliveries_wait_while_a_scheduling_pass_runs(
    app: FastAPI, admin: httpx.AsyncClient, api: httpx.AsyncClient, receiver: Receiver
) -> None:
    """The shipper's requests share the event loop with the scheduler: none starts while a
    pass runs, and they go as soon as it ends."""
    await create(admin, hook(receiver.url, on_state("PAUSED")))
    await pause(api, await new_experiment(api))
    shipper = shipper_for(app)
    idle = _WatchedIdle()  # cleared: a pass is running
    shipper.scheduler_idle = idle
    try:
        sending = asyncio.create_task(shipper.run_once())
        await asyncio.wait_for(idle.waited.wait(), 15)
        assert receiver.received() == [] and not sending.done()
        idle.set()  # the pass ended
        await asyncio.wait_for(sending, 15)
        assert [d.json["condition"]["state"] for d in receiver.received()] == ["PAUSED"]
    finally:
        await shipper.stop()
