"""Trial and task logs: stored from agent batches, streamed back as Determined's NDJSON."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.db.session import session_scope
from master.services.logs import READ_BATCH, LogLine, append_logs
from tests.factories import create_experiment

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
REQUIRED_TRIAL_KEYS = {"id", "trialId", "timestamp", "level", "message"}
REQUIRED_TASK_KEYS = {"id", "taskId", "timestamp", "level", "message", "log"}


@dataclass
class Trial:
    id: int
    task_id: str
    allocation_id: str
    experiment_id: int


async def start_experiment(api: httpx.AsyncClient) -> list[Trial]:
    """An experiment with three queued trials, each with its first (pending) allocation."""
    reply = await create_experiment(api)
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    tasks = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    trials = [
        Trial(t["trialId"], t["taskId"], t["allocationId"], experiment_id)
        for t in tasks.values()
        if t["experimentId"] == experiment_id
    ]
    assert len(trials) == 3
    return sorted(trials, key=lambda t: t.id)


def line(
    trial: Trial, message: str, rank: int | None = 0, stdtype: str = "stdout", second: int = 0
) -> LogLine:
    return LogLine(trial.allocation_id, rank, stdtype, T0 + timedelta(seconds=second), message)


async def append(app: FastAPI, agent_id: str, lines: list[LogLine]) -> int:
    async with session_scope(app.state.session_factory) as session:
        return await append_logs(session, agent_id, lines)


async def read(api: httpx.AsyncClient, path: str, **params: Any) -> list[dict[str, Any]]:
    reply = await api.get(path, params=params)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    raw = reply.text.split("\n")
    assert raw[-1] == "", "every line ends with a newline"
    assert all(raw[:-1]), "no blank keep-alive lines"
    results = []
    for text in raw[:-1]:
        item = json.loads(text)
        assert set(item) == {"result"}, item
        results.append(item["result"])
    return results


def messages(results: list[dict[str, Any]]) -> list[str]:
    return [r["message"] for r in results]


async def test_lines_come_back_in_order_with_rank_and_agent(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    trial, other, _ = await start_experiment(api)
    kept = await append(
        app,
        "agent-a",
        [line(trial, "rank 0 starts\n", 0), line(trial, "rank 1 starts\n", 1, second=1)],
    )
    assert kept == 2
    await append(app, "agent-b", [line(trial, "oops\n", 1, "stderr", second=2)])
    await append(app, "agent-a", [line(other, "another trial\n")])

    results = await read(api, f"/api/v1/trials/{trial.id}/logs")
    assert messages(results) == ["rank 0 starts\n", "rank 1 starts\n", "oops\n"]
    for result in results:
        assert result.keys() >= REQUIRED_TRIAL_KEYS
        assert isinstance(result["id"], str)
        assert result["trialId"] == trial.id
        assert result["level"] == "LOG_LEVEL_INFO"
        assert result["log"] == result["message"]
    assert [int(r["id"]) for r in results] == sorted(int(r["id"]) for r in results)
    assert [(r["rankId"], r["agentId"], r["stdtype"]) for r in results] == [
        (0, "agent-a", "stdout"),
        (1, "agent-a", "stdout"),
        (1, "agent-b", "stderr"),
    ]
    assert results[0]["timestamp"] == "2026-11-21T10:00:00Z"
    assert results[0]["source"] == "container"

    task_results = await read(api, f"/api/v1/tasks/{trial.task_id}/logs")
    assert messages(task_results) == messages(results)
    for result in task_results:
        assert result.keys() >= REQUIRED_TASK_KEYS
        assert result["taskId"] == trial.task_id
        assert result["allocationId"] == trial.allocation_id


async def test_tail_returns_the_last_lines_newest_first(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    trial = (await start_experiment(api))[0]
    await append(app, "agent-a", [line(trial, f"line {i}\n", second=i) for i in range(5)])
    path = f"/api/v1/trials/{trial.id}/logs"

    tail = await read(api, path, limit=2, orderBy="ORDER_BY_DESC")
    assert messages(tail) == ["line 4\n", "line 3\n"]
    head = await read(api, path, limit=2)
    assert messages(head) == ["line 0\n", "line 1\n"]
    for order in ("ORDER_BY_ASC", "ORDER_BY_UNSPECIFIED"):
        assert len(await read(api, path, orderBy=order)) == 5
    task_tail = await read(
        api, f"/api/v1/tasks/{trial.task_id}/logs", limit=3, orderBy="ORDER_BY_DESC"
    )
    assert messages(task_tail) == ["line 4\n", "line 3\n", "line 2\n"]


async def test_more_lines_than_one_read_batch(api: httpx.AsyncClient, app: FastAPI) -> None:
    trial = (await start_experiment(api))[0]
    count = READ_BATCH * 2 + 5
    await append(app, "agent-a", [line(trial, f"{i}\n") for i in range(count)])
    path = f"/api/v1/trials/{trial.id}/logs"

    assert messages(await read(api, path)) == [f"{i}\n" for i in range(count)]
    tail = await read(api, path, limit=READ_BATCH + 3, orderBy="ORDER_BY_DESC")
    assert messages(tail) == [f"{i}\n" for i in reversed(range(count - READ_BATCH - 3, count))]
    assert len(await read(api, path, limit=READ_BATCH + 1)) == READ_BATCH + 1


async def test_levels_are_parsed_and_filtered(api: httpx.AsyncClient, app: FastAPI) -> None:
    trial = (await start_experiment(api))[0]
    await append(
        app,
        "agent-a",
        [
            line(trial, "plain output\n"),
            line(trial, "WARNING:root:slow step\n"),
            line(trial, "ERROR:root:failed\n", stdtype="stderr"),
            line(trial, "[2026-11-21 10:00:00] CRITICAL down\n"),
            line(trial, "rank 1 exited with code 1\n", rank=1, stdtype="agent"),
        ],
    )
    path = f"/api/v1/trials/{trial.id}/logs"
    levels = [r["level"] for r in await read(api, path)]
    assert levels == [
        "LOG_LEVEL_INFO",
        "LOG_LEVEL_WARNING",
        "LOG_LEVEL_ERROR",
        "LOG_LEVEL_CRITICAL",
        "LOG_LEVEL_INFO",
    ]
    # What the official client sends for `--level ERROR`.
    errors = await read(api, path, levels=["LOG_LEVEL_ERROR", "LOG_LEVEL_CRITICAL"])
    assert messages(errors) == ["ERROR:root:failed\n", "[2026-11-21 10:00:00] CRITICAL down\n"]
    every = ["UNSPECIFIED", "TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    assert len(await read(api, path, levels=[f"LOG_LEVEL_{x}" for x in every])) == 5
    agent_lines = await read(api, path, sources=["agent"])
    assert [(r["stdtype"], r["source"]) for r in agent_lines] == [("agent", "agent")]


async def test_filters(api: httpx.AsyncClient, app: FastAPI) -> None:
    trial = (await start_experiment(api))[0]
    await append(
        app,
        "agent-a",
        [line(trial, "r0 a\n", 0, second=0), line(trial, "r1 a\n", 1, "stderr", second=1)],
    )
    await append(
        app,
        "agent-b",
        [line(trial, "r2 b 100%\n", 2, second=2), line(trial, "no rank\n", None, second=3)],
    )
    path = f"/api/v1/trials/{trial.id}/logs"

    assert messages(await read(api, path, rankIds=1)) == ["r1 a\n"]
    assert messages(await read(api, path, rankIds=[0, 2])) == ["r0 a\n", "r2 b 100%\n"]
    assert messages(await read(api, path, agentIds="agent-b")) == ["r2 b 100%\n", "no rank\n"]
    assert messages(await read(api, path, stdtypes="stderr")) == ["r1 a\n"]
    assert messages(await read(api, path, sources="container")) == [
        "r0 a\n",
        "r1 a\n",
        "r2 b 100%\n",
        "no rank\n",
    ]
    assert messages(await read(api, path, searchText="100%")) == ["r2 b 100%\n"]
    assert messages(await read(api, path, searchText="%")) == ["r2 b 100%\n"]
    assert await read(api, path, containerIds="abc") == []
    window = {"timestampAfter": "2026-11-21T10:00:00Z", "timestampBefore": "2026-11-21T10:00:03Z"}
    assert messages(await read(api, path, **window)) == ["r1 a\n", "r2 b 100%\n"]
    no_rank = [r for r in await read(api, path) if r["message"] == "no rank\n"]
    assert no_rank[0]["rankId"] is None
    task_path = f"/api/v1/tasks/{trial.task_id}/logs"
    assert len(await read(api, task_path, allocationIds=trial.allocation_id)) == 4
    assert await read(api, task_path, allocationIds="999.1") == []


async def test_lines_of_unknown_allocations_are_dropped(
    api: httpx.AsyncClient, app: FastAPI, caplog: pytest.LogCaptureFixture
) -> None:
    trial = (await start_experiment(api))[0]
    stray = LogLine("424242.1", 0, "stdout", T0, "lost\n")
    with caplog.at_level(logging.WARNING, logger="master.services.logs"):
        kept = await append(app, "agent-a", [line(trial, "kept\n"), stray, stray])
    assert kept == 1
    assert "dropped 2 log lines from agent agent-a: unknown allocations 424242.1" in caplog.text
    assert messages(await read(api, f"/api/v1/trials/{trial.id}/logs")) == ["kept\n"]
    assert await append(app, "agent-a", [stray]) == 0
    assert await append(app, "agent-a", []) == 0


async def test_odd_lines_are_stored_safely(api: httpx.AsyncClient, app: FastAPI) -> None:
    trial = (await start_experiment(api))[0]
    naive = LogLine(trial.allocation_id, 0, "weird-stdtype", datetime(2026, 1, 1), "a\x00b\n")
    huge = line(trial, "x" * 100_000 + "\n")
    assert await append(app, "agent-a", [naive, huge]) == 2
    first, second = await read(api, f"/api/v1/trials/{trial.id}/logs")
    assert first["stdtype"] == "stdout"
    assert first["timestamp"] == "2026-01-01T00:00:00Z"
    assert "\x00" not in first["message"]
    assert len(second["message"].encode()) <= 64 * 1024
    assert second["message"].endswith("\n")


async def test_unknown_trial_or_task_is_404(api: httpx.AsyncClient, app: FastAPI) -> None:
    trial = (await start_experiment(api))[0]
    reply = await api.get("/api/v1/trials/999999/logs")
    assert reply.status_code == 404
    assert reply.json()["code"] == 5
    assert reply.json()["message"] == "trial 999999 not found"
    experiment_id, request_id = trial.task_id.split(".", 1)
    for task_id in (
        "nope",
        f"{experiment_id}.nope",
        f"99999.{request_id}",
        f"99999999999999999999.{request_id}",
        ".x",
    ):
        reply = await api.get(f"/api/v1/tasks/{task_id}/logs")
        assert reply.status_code == 404, (task_id, reply.text)
        assert reply.json()["message"] == f"task {task_id} not found"


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"orderBy": "SIDEWAYS"}, "orderBy"),
        ({"limit": -1}, "limit"),
        ({"limit": 2**31}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"levels": "LOG_LEVEL_LOUD"}, "levels"),
        ({"rankIds": "zero"}, "rankIds"),
        ({"rankIds": -1}, "rankIds"),
        ({"rankIds": 2**40}, "rankIds"),
        ({"follow": "maybe"}, "follow"),
        ({"follow": "true", "orderBy": "ORDER_BY_DESC"}, "orderBy"),
        ({"timestampBefore": "yesterday"}, "timestampBefore"),
        ({"timestampAfter": "2026-13-01T00:00:00Z"}, "timestampAfter"),
        ({"enableRegex": "true", "searchText": "a.*"}, "enableRegex"),
        ({"agentIds": "a\x00b"}, "agentIds"),
        ({"searchText": "\x00"}, "searchText"),
    ],
)
async def test_bad_parameters_are_400_naming_them(
    api: httpx.AsyncClient, app: FastAPI, params: dict[str, Any], named: str
) -> None:
    trial = (await start_experiment(api))[0]
    for path in (f"/api/v1/trials/{trial.id}/logs", f"/api/v1/tasks/{trial.task_id}/logs"):
        reply = await api.get(path, params=params)
        assert reply.status_code == 400, (path, params, reply.text)
        assert reply.json()["code"] == 3
        assert named in reply.json()["message"], reply.text


async def test_bad_ids_in_the_path(api: httpx.AsyncClient) -> None:
    for path in ("/api/v1/trials/abc/logs", "/api/v1/trials/-1/logs", "/api/v1/trials/1e99/logs"):
        reply = await api.get(path)
        assert reply.status_code == 400, (path, reply.text)
    reply = await api.get("/api/v1/tasks/" + "x" * 65 + "/logs")
    assert reply.status_code == 400, reply.text
    reply = await api.get("/api/v1/tasks/a%00b/logs")
    assert reply.status_code in (400, 404), reply.text


async def test_logs_need_a_token(anon: httpx.AsyncClient) -> None:
    for path in ("/api/v1/trials/1/logs", "/api/v1/tasks/1.x/logs"):
        reply = await anon.get(path)
        assert reply.status_code == 401, reply.text
        assert reply.json()["code"] == 16


async def test_follow_ends_once_the_trial_is_terminal(api: httpx.AsyncClient, app: FastAPI) -> None:
    trial = (await start_experiment(api))[0]
    await append(app, "agent-a", [line(trial, "before\n")])
    follow = asyncio.create_task(read(api, f"/api/v1/trials/{trial.id}/logs", follow="true"))
    task_follow = asyncio.create_task(
        read(api, f"/api/v1/tasks/{trial.task_id}/logs", follow="true")
    )
    await asyncio.sleep(0.6)
    assert not follow.done() and not task_follow.done(), "follow returned while the trial runs"

    await append(app, "agent-a", [line(trial, "during\n", second=1)])
    await asyncio.sleep(0.4)
    await append(app, "agent-a", [line(trial, "last words\n", second=2)])
    reply = await api.post(f"/api/v1/experiments/{trial.experiment_id}/kill")
    assert reply.status_code == 200, reply.text
    state = (await api.get(f"/api/v1/trials/{trial.id}")).json()["trial"]["state"]
    assert state == "STATE_CANCELED"

    results = await asyncio.wait_for(follow, timeout=10)
    assert messages(results) == ["before\n", "during\n", "last words\n"]
    task_results = await asyncio.wait_for(task_follow, timeout=10)
    assert messages(task_results) == messages(results)

    # A terminal trial's follow returns what there is at once.
    again = await asyncio.wait_for(
        read(api, f"/api/v1/trials/{trial.id}/logs", follow="true", limit=2), timeout=5
    )
    assert messages(again) == ["before\n", "during\n"]


async def test_follow_stops_at_the_limit(api: httpx.AsyncClient, app: FastAPI) -> None:
    trial = (await start_experiment(api))[0]  # still queued: only the limit ends the stream
    await append(app, "agent-a", [line(trial, f"{i}\n") for i in range(3)])
    results = await asyncio.wait_for(
        read(api, f"/api/v1/trials/{trial.id}/logs", follow="true", limit=3), timeout=5
    )
    assert messages(results) == ["0\n", "1\n", "2\n"]
