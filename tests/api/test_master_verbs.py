"""`det master config` and `det master logs` through Determined's routes (issue 32), on both
databases: admins only, secrets hidden, the master's own recent lines. (Following the
log with Determined's client against a real master: tests/e2e/test_official_client.py.)"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.api.test_access import refusal


def entries(reply: httpx.Response) -> list[dict[str, Any]]:
    assert reply.status_code == 200, reply.text
    return [json.loads(line)["result"]["logEntry"] for line in reply.text.splitlines() if line]


async def test_the_config_is_for_admins_with_its_secrets_hidden(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    assert "reading the master's config is for admins" in refusal(
        await api.get("/api/v1/master/config"), 403
    )
    reply = await admin.get("/api/v1/master/config")
    assert reply.status_code == 200, reply.text
    config = reply.json()["config"]
    assert config["security"]["initial_user_password"] in ("", "********")
    assert "scheduler_interval_s" in config and "agent_link" in config
    # The suite's databases have no password; what a URL with one shows is unit-tested.
    assert urlsplit(config["db"]["url"]).password in (None, "********")


async def test_the_logs_are_the_masters_own_lines(
    api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    assert "reading the master's logs is for admins" in refusal(
        await api.get("/api/v1/master/logs"), 403
    )
    marks = [f"master-logs-test line {n}" for n in range(3)]
    for mark in marks:
        logging.getLogger("master.test").warning(mark)
    everything = entries(await admin.get("/api/v1/master/logs"))
    ids = [e["id"] for e in everything]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    ours = [e for e in everything if "master-logs-test" in e["message"]]
    assert [e["message"] for e in ours[-3:]] == [f"master.test: {m}" for m in marks]
    assert {e["level"] for e in ours} == {"LOG_LEVEL_WARNING"}
    assert all(e["timestamp"].endswith("Z") for e in ours)
    tail = entries(await admin.get("/api/v1/master/logs", params={"offset": -2}))
    assert [e["message"] for e in tail] == [f"master.test: {m}" for m in marks[1:]]
    limited = entries(await admin.get("/api/v1/master/logs", params={"offset": -3, "limit": 1}))
    assert [e["message"] for e in limited] == [f"master.test: {marks[0]}"]
    bad = await admin.get("/api/v1/master/logs", params={"limit": -1})
    assert bad.status_code == 400 and "limit" in bad.text
