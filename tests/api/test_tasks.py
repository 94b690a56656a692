"""Commands, notebooks, shells and TensorBoards through the master, on SQLite and Postgres:
the REST API, the scheduler, the agent hub's launch and release, kills, idle ends, the
proxy's refusals. Agents are the hub's own connections (as in test_agent_link); processes
and the proxy's forwarding are tested end to end in tests/e2e/test_interactive_tasks.py."""

from __future__ import annotations

import base64
import io
import tarfile
from datetime import timedelta
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from fastapi import FastAPI
from sqlalchemy import func, select

from master.db.models import AllocationSlotModel, TaskModel, utcnow
from master.db.session import session_scope
from master.services import interactive, scheduler
from master.services.agent_enrolment import peer_host
from master.services.agent_link import AgentHub, Connection
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_agent_link import connect, hub_of, of_kind, sent


async def schedule(app: FastAPI) -> scheduler.PassStats:
    async with session_scope(app.state.session_factory) as session:
        return await scheduler.run_pass(session, app.state.settings)


async def create(api: httpx.AsyncClient, kind: str = "commands", **body: Any) -> dict[str, Any]:
    reply = await api.post(f"/api/v1/{kind}", json=body)
    assert reply.status_code == 200, reply.text
    key = kind.removesuffix("s")
    task: dict[str, Any] = reply.json()[key]
    return task


async def get(api: httpx.AsyncClient, task_id: str, kind: str = "commands") -> dict[str, Any]:
    reply = await api.get(f"/api/v1/{kind}/{task_id}")
    assert reply.status_code == 200, reply.text
    task: dict[str, Any] = reply.json()[kind.removesuffix("s")]
    return task


async def task_count(app: FastAPI) -> int:
    async with session_scope(app.state.session_factory) as session:
        return int(await session.scalar(select(func.count()).select_from(TaskModel)) or 0)


async def started(
    app: FastAPI, api: httpx.AsyncClient, kind: str = "commands", **body: Any
) -> tuple[AgentHub, Connection, dict[str, Any], pb.StartAllocation]:
    """One agent, one task placed, prepared and started on it."""
    hub = hub_of(app)
    agent = await connect(hub, "agent-a")
    agent.peer_host = "198.18.0.97"
    task = await create(api, kind, **body)
    assert (await schedule(app)).placed == 1
    await hub.tick()
    (prepare,) = of_kind(sent(agent), "prepare")
    assert prepare.allocation_id == f"{task['id']}.1"
    await hub.on_message(
        agent,
        pb.AgentMessage(
            prepared=pb.AllocationPrepared(allocation_id=prepare.allocation_id, master_port=41234)
        ),
    )
    (start,) = of_kind(sent(agent), "start")
    await hub.on_message(
        agent, pb.AgentMessage(started=pb.AllocationStarted(allocation_id=start.allocation_id))
    )
    return hub, agent, task, start


def exit_with(allocation_id: str, code: int) -> pb.AgentMessage:
    kind = pb.EXIT_KIND_COMPLETED if code == 0 else pb.EXIT_KIND_FAILED
    return pb.AgentMessage(
        exited=pb.AllocationExited(
            allocation_id=allocation_id,
            kind=kind,  # type: ignore[arg-type]
            exits=[pb.RankExit(rank=0, exit_code=code)],
            message="" if code == 0 else f"rank 0 exited with code {code}",
        )
    )


# -- creating, listing, refusing -------------------------------------------------------------


async def test_a_command_waits_in_the_queue_with_its_reason_and_is_listed_as_a_task(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    task = await create(api, config={"entrypoint": ["echo", "hi"], "resources": {"slots": 2}})
    assert task["state"] == "STATE_QUEUED"
    assert task["description"] == "Command (echo hi)"
    assert task["username"] == "determined"
    await schedule(app)
    task = await get(api, task["id"])
    assert task["state"] == "STATE_QUEUED"
    assert "no agents" in task["pendingReason"].lower(), task["pendingReason"]
    listed = (await api.get("/api/v1/commands")).json()["commands"]
    assert [t["id"] for t in listed] == [task["id"]]
    summaries = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    (summary,) = summaries.values()
    assert summary["taskId"] == task["id"]
    assert summary["taskType"] == "TASK_TYPE_COMMAND"
    assert summary["slotsNeeded"] == 2
    assert summary["name"] == "Command (echo hi)"


_ECHO = {"config": {"entrypoint": "echo hi"}}
_OVER = "files: the files add up to 1.0 MiB, over the 1 MiB limit"


def _file(path: str, size: int = 3) -> dict[str, Any]:
    content = base64.b64encode(b"x" * size).decode()
    return {"path": path, "type": 48, "content": content, "mtime": "0", "mode": 0o644}


@pytest.mark.parametrize(
    ("kind", "body", "status", "words"),
    [
        ("commands", {"config": {"entrypoint": "x", "resourses": {}}}, 400, "resourses"),
        ("commands", {"config": {}}, 400, "entrypoint"),
        ("commands", {"config": {"entrypoint": "x", "resources": {"slots": -1}}}, 400, "slots"),
        ("notebooks", {"config": {"idle_timeout": "soon"}}, 400, "idle_timeout"),
        ("notebooks", {"config": {"idle_timeout": 0}}, 400, "idle_timeout"),
        ("notebooks", {"config": {"resources": {"resource_pool": "gpus"}}}, 400, "gpus"),
        ("notebooks", {"config": "entrypoint: [unclosed"}, 400, "config"),
        ("notebooks", {"templateName": "missing"}, 404, "missing"),
        ("tensorboards", {"experimentIds": []}, 400, "experimentIds"),
        ("tensorboards", {"experimentIds": [4242]}, 404, "4242"),
        ("tensorboards", {"experimentIds": [2**40]}, 400, "experimentIds"),
        ("tensorboards", {"trialIds": [4343]}, 404, "trialIds: trial 4343 not found"),
        ("tensorboards", {"trialIds": [-1]}, 400, "trialIds"),
        ("tensorboards", {"trialIds": list(range(101))}, 400, "at most 100"),
        ("shells", {"experimentIds": [1]}, 400, "experimentIds"),
        ("notebooks", {"trialIds": [1]}, 400, "trialIds: only a TensorBoard"),
        # The context directory (det cmd run -c DIR): checked as a model definition.
        ("commands", {**_ECHO, "files": [_file("../x.py")]}, 400, "files[0]: path '../x.py'"),
        ("commands", {**_ECHO, "files": [_file("/etc/x")]}, 400, "files[0]: path '/etc/x'"),
        ("commands", {**_ECHO, "files": [{"path": "a", "content": "!"}]}, 400, "files[0]"),
        ("shells", {"files": [_file("a.py"), _file("a.py")]}, 400, "files[1]: path 'a.py'"),
        # The suite's masters take 1 MiB.
        ("commands", {**_ECHO, "files": [_file("big", 2**20 + 1)]}, 413, _OVER),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    app: FastAPI,
    api: httpx.AsyncClient,
    kind: str,
    body: dict[str, Any],
    status: int,
    words: str,
) -> None:
    reply = await api.post(f"/api/v1/{kind}", json=body)
    assert reply.status_code == status, reply.text
    assert words in reply.json()["message"], reply.json()["message"]
    assert await task_count(app) == 0


async def test_unknown_ids_and_wrong_types_are_refused(api: httpx.AsyncClient) -> None:
    assert (await api.get("/api/v1/commands/no-such-task")).status_code == 404
    assert (await api.post("/api/v1/notebooks/no-such-task/kill")).status_code == 404
    assert (await api.get("/api/v1/tasks/no-such-task/logs")).status_code == 404
    command = await create(api, config={"entrypoint": "true"})
    reply = await api.get(f"/api/v1/notebooks/{command['id']}")
    assert reply.status_code == 400
    assert "is a command" in reply.json()["message"]


async def test_a_template_and_the_pool_default_fill_the_config(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    template = {"environment": {"environment_variables": ["A=1"]}}
    reply = await api.post("/api/v1/templates/tasks", json={"config": template})
    assert reply.status_code == 200, reply.text
    config = {"idle_timeout": "1h30m", "resources": {"slots": 0}}
    reply = await api.post("/api/v1/notebooks", json={"templateName": "tasks", "config": config})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["config"]["resources"]["slots"] == 0
    assert body["config"]["environment"]["environment_variables"] == ["A=1"]
    assert body["notebook"]["idleTimeoutSeconds"] == 5400
    assert body["notebook"]["serviceAddress"] == f"/proxy/{body['notebook']['id']}/"


# -- launch, exit, kill ------------------------------------------------------------------------


async def test_a_command_runs_once_on_its_agent_and_its_exit_code_is_kept(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, agent, task, start = await started(
        app,
        api,
        config={
            "entrypoint": "echo $GREETING; exit 3",
            "resources": {"slots": 1},
            "environment": {"environment_variables": ["GREETING=hello"]},
        },
    )
    assert list(start.argv) == ["sh", "-c", "echo $GREETING; exit 3"]
    assert [list(r.slot_ids) for r in start.ranks] == [[0]]
    env = dict(start.env)
    assert env["DET_TASK_TYPE"] == "COMMAND" and env["DET_TASK_ID"] == task["id"]
    assert env["GREETING"] == "hello" and env["DET_USER"] == "determined"
    assert env["DET_SESSION_TOKEN"] and env["RESOLUTE_TASK_SECRET"]
    # The task's token acts as its owner while it runs.
    as_task = {"Authorization": f"Bearer {env['DET_SESSION_TOKEN']}"}
    assert (await api.get("/api/v1/me", headers=as_task)).json()["user"]["username"] == (
        "determined"
    )
    assert (await get(api, task["id"]))["state"] == "STATE_RUNNING"

    await hub.on_message(agent, exit_with(start.allocation_id, 3))
    assert of_kind(sent(agent), "exit_ack")
    ended = await get(api, task["id"])
    assert ended["state"] == "STATE_TERMINATED"
    assert ended["exitCode"] == 3
    assert "exited with code 3" in ended["endReason"]
    async with session_scope(app.state.session_factory) as session:
        held = await session.scalar(select(func.count()).select_from(AllocationSlotModel))
    assert held == 0  # its slot is free
    assert (await api.get("/api/v1/me", headers=as_task)).status_code == 401
    # Never run again: the next pass places nothing.
    assert (await schedule(app)).placed == 0


async def test_a_commands_context_directory_goes_to_its_agent_with_the_start(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    """det cmd run -c DIR: the files, packed as a model definition, in StartAllocation,
    which the agent unpacks into the working directory; a command without one gets none."""
    files = [
        {"path": "data", "type": 53, "content": "", "mtime": "0", "mode": 0o755},
        _file("data/rows.csv"),
        {**_file("prep.py"), "content": base64.b64encode(b"print(1)\n").decode()},
    ]
    config = {"entrypoint": "python3 prep.py"}
    hub, agent, _, start = await started(app, api, config=config, files=files)
    with tarfile.open(fileobj=io.BytesIO(start.model_definition), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"data", "data/rows.csv", "prep.py"}
        assert members["data"].isdir()
        prep = tar.extractfile(members["prep.py"])
        assert prep is not None and prep.read() == b"print(1)\n"
    await hub.on_message(agent, exit_with(start.allocation_id, 0))

    plain = await create(api, config={"entrypoint": "true"})
    assert (await schedule(app)).placed == 1
    await hub.tick()
    (prepare,) = of_kind(sent(agent), "prepare")
    await hub.on_message(
        agent,
        pb.AgentMessage(
            prepared=pb.AllocationPrepared(allocation_id=prepare.allocation_id, master_port=1)
        ),
    )
    (start,) = of_kind(sent(agent), "start")
    assert start.allocation_id == f"{plain['id']}.1" and start.model_definition == b""


async def test_a_notebook_is_started_behind_the_proxy_with_its_secret(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    _, _, task, start = await started(app, api, "notebooks", config={"resources": {"slots": 0}})
    argv = list(start.argv)
    assert argv[1:3] == ["-m", "jupyterlab"]
    assert f"--ServerApp.base_url=/proxy/{task['id']}/" in argv
    assert "--ServerApp.port=41234" in argv
    env = dict(start.env)
    # The token only in the environment: argv is visible to every user of the agent.
    assert env["JUPYTER_TOKEN"] == env["RESOLUTE_TASK_SECRET"]
    assert not any(env["JUPYTER_TOKEN"] in a for a in argv)
    async with session_scope(app.state.session_factory) as session:
        target = await interactive.proxy_target(
            session,
            interactive.Actor(user_id=task["userId"], username="determined", admin=False),
            task["id"],
        )
    assert (target.address, target.port) == ("198.18.0.97", 41234)


async def test_killing_a_queued_task_ends_it_at_once_and_a_running_one_through_its_agent(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    queued = await create(api, "shells", config={"resources": {"slots": 4}})
    assert (await api.post(f"/api/v1/shells/{queued['id']}/kill")).status_code == 200
    ended = await get(api, queued["id"], "shells")
    assert ended["state"] == "STATE_TERMINATED"
    assert ended["endReason"] == "killed by determined"

    hub, agent, task, start = await started(app, api, "shells", config={"resources": {"slots": 1}})
    assert (await api.post(f"/api/v1/shells/{task['id']}/kill")).status_code == 200
    assert (await get(api, task["id"], "shells"))["state"] == "STATE_TERMINATING"
    await hub.tick()
    (stop,) = of_kind(sent(agent), "stop")
    assert stop.allocation_id == start.allocation_id
    await hub.on_message(
        agent,
        pb.AgentMessage(
            exited=pb.AllocationExited(
                allocation_id=start.allocation_id,
                kind=pb.EXIT_KIND_STOPPED,
                exits=[pb.RankExit(rank=0, exit_code=-15)],
            )
        ),
    )
    ended = await get(api, task["id"], "shells")
    assert ended["state"] == "STATE_TERMINATED"
    assert ended["endReason"] == "killed by determined"


async def test_another_users_task_cannot_be_killed_or_opened(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    _, _, task, _ = await started(app, admin, "notebooks", config={"resources": {"slots": 0}})
    reply = await api.post(f"/api/v1/notebooks/{task['id']}/kill")
    assert reply.status_code == 403
    assert "belongs to admin" in reply.json()["message"]
    reply = await api.get(f"/proxy/{task['id']}/lab")
    assert reply.status_code == 403
    assert "only its owner" in reply.json()["message"]
    assert (await get(api, task["id"], "notebooks"))["state"] == "STATE_RUNNING"


async def test_a_shell_carries_its_ssh_key_for_its_owner_only(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    """What Determined's det shell start runs ssh with (v1Shell.privateKey, agentUserGroup)."""
    shell = await create(api, "shells", config={"resources": {"slots": 0}})
    private = serialization.load_ssh_private_key(shell["privateKey"].encode(), password=None)
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert shell["publicKey"].startswith(public.decode() + " ")
    assert shell["agentUserGroup"] == {"user": "determined"}
    # The same key when read again (det shell open); its text differs (OpenSSH's check bytes).
    again = (await get(api, shell["id"], "shells"))["privateKey"]
    reloaded = serialization.load_ssh_private_key(again.encode(), password=None)
    assert (
        reloaded.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        == public
    )
    # Not to an admin, not in a list, and another shell has another key.
    seen_by_admin = (await admin.get(f"/api/v1/shells/{shell['id']}")).json()["shell"]
    assert "privateKey" not in seen_by_admin and seen_by_admin["publicKey"] == shell["publicKey"]
    listed = (await api.get("/api/v1/shells")).json()["shells"]
    assert [t for t in listed if "privateKey" in t] == []
    other = await create(api, "shells", config={"resources": {"slots": 0}})
    assert other["publicKey"] != shell["publicKey"]


async def test_the_proxy_sends_a_signed_out_browser_to_sign_in_and_refuses_what_does_not_serve(
    app: FastAPI, anon: httpx.AsyncClient, api: httpx.AsyncClient
) -> None:
    notebook = await create(api, "notebooks", config={"resources": {"slots": 0}})
    signed_out = await anon.get(f"/proxy/{notebook['id']}/lab", headers={"Authorization": ""})
    assert signed_out.status_code in (303, 401)
    # Not running yet (no agent): a clear 409, not a 502.
    reply = await api.get(f"/proxy/{notebook['id']}/lab")
    assert reply.status_code == 409
    assert "not running yet" in reply.json()["message"]
    command = await create(api, config={"entrypoint": "true"})
    assert (await api.get(f"/proxy/{command['id']}/")).status_code == 400
    assert (await api.get("/proxy/no-such-task/")).status_code == 404


async def test_a_browser_without_a_sign_in_is_sent_to_the_login_page(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    notebook = await create(api, "notebooks", config={"resources": {"slots": 0}})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as browser:
        reply = await browser.get(f"/proxy/{notebook['id']}/lab?reset")
    assert reply.status_code == 303
    assert reply.headers["location"] == f"/ui/login?next=/proxy/{notebook['id']}/lab%3Freset"


# -- idle timeout ------------------------------------------------------------------------------


async def test_an_idle_notebook_is_stopped_with_the_reason_and_activity_keeps_one_alive(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, agent, idle, idle_start = await started(
        app, api, "notebooks", config={"resources": {"slots": 0}, "idle_timeout": "10m"}
    )
    agent2 = await connect(hub, "agent-b")
    busy = await create(api, "notebooks", config={"resources": {"slots": 0}, "idle_timeout": "10m"})
    assert (await schedule(app)).placed == 1
    later = utcnow() + timedelta(minutes=11)
    async with session_scope(app.state.session_factory) as session:
        await interactive.record_activity(session, {busy["id"]: later - timedelta(minutes=1)})
    async with session_scope(app.state.session_factory) as session:
        ended = await interactive.end_idle_tasks(session, now=later)
    # `busy` was never started, and is not RUNNING: only the idle one is asked to stop.
    assert ended == [idle["id"]]
    await hub.tick()
    (stop,) = of_kind(sent(agent), "stop")
    assert stop.allocation_id == idle_start.allocation_id
    await hub.on_message(
        agent,
        pb.AgentMessage(
            exited=pb.AllocationExited(
                allocation_id=idle_start.allocation_id, kind=pb.EXIT_KIND_STOPPED
            )
        ),
    )
    ended_task = await get(api, idle["id"], "notebooks")
    assert ended_task["state"] == "STATE_TERMINATED"
    assert ended_task["endReason"].startswith("idle for 10 min (idle_timeout)")
    del agent2


async def test_commands_have_no_idle_timeout(app: FastAPI, api: httpx.AsyncClient) -> None:
    command = await create(api, config={"entrypoint": "sleep 1d", "idle_timeout": "1s"})
    assert command["idleTimeoutSeconds"] is None


def test_grpc_peer_names_give_the_agents_address() -> None:
    assert peer_host("ipv4:198.18.0.5:40112") == "198.18.0.5"
    assert peer_host("ipv6:[::1]:40112") == "::1"
    assert peer_host("unix:/run/x.sock") == ""


async def test_the_dashboards_tasks_page_lists_commands_and_links_running_notebooks(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    command = await create(api, config={"entrypoint": "sleep 1d", "resources": {"slots": 3}})
    _, _, notebook, _ = await started(app, api, "notebooks", config={"resources": {"slots": 0}})
    reply = await api.post(
        "/ui/login",
        data={"username": "determined", "password": "", "next": "/ui/tasks"},
        headers={"Origin": "http://master"},
    )
    assert reply.status_code == 303, reply.text
    page = (await api.get("/ui/tasks")).text
    assert "Command (sleep 1d)" in page and f"command {command['id']}" in page
    assert f'href="/proxy/{notebook["id"]}/"' in page
