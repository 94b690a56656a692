"""Determined's scripts on the master's side, on SQLite and Postgres: the launch layout
decided at submit and shown by the API, a per_agent gang driven through the agent hub with
the protocol's own messages (ports, one process per agent, bootstrap files, environment
defaults), and how its allocations end (an unrunnable interpreter, exits after a
preemption request, an early exit) as `det experiment describe` and `det task list` show it.

The pure parts (the rule, the files' exact keys) are in tests/unit/test_launch_layout.py;
the real `determined` package runs them in tests/e2e/test_determined_workloads.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.db.session import session_scope
from master.services import agent_link, scheduler
from master.services.agent_link import AgentHub, Connection
from master.services.trial_reports import EARLY_EXIT_REASONS
from master.settings import TaskContainerDefaults
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_agent_link import (
    exited,
    hub_of,
    long_poll,
    of_kind,
    open_as_agent,
    sent,
    stops,
    trial_of,
)
from tests.factories import create_experiment, v1_file

DET_SCRIPT = b"import determined as det\n\nwith det.core.init() as core_context:\n    pass\n"
RESOLUTE_SCRIPT = b"import resolute\n\nprint('train')\n"
HOST_PATH = "/mnt/det-checkpoints"
EXPERIMENT_PATH = "/opt/exp-venv/bin:/usr/bin:/bin"

GANG_CONFIG = f"""
name: det-gang
entrypoint: python3 train.py
resources: {{slots_per_trial: 4}}
max_restarts: 3
checkpoint_storage: {{type: shared_fs, host_path: {HOST_PATH}}}
environment:
  environment_variables:
    - PATH={EXPERIMENT_PATH}
    - FROM_EXPERIMENT=1
searcher: {{name: single, metric: loss, max_length: 1}}
"""
# What resolute's own tests name: the layout only shows in the launch.
PER_SLOT_GANG_CONFIG = GANG_CONFIG.replace("name: det-gang", "name: resolute-gang")

# The agents' eth0 addresses (test_agent_link.connect's rule: 198.18.0.<ord(last char)>).
ADDRESS = {"agent-a": "198.18.0.97", "agent-b": "198.18.0.98"}
RESERVED_FOR_THE_LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# -- helpers -------------------------------------------------------------------------------


async def connect(hub: AgentHub, agent_id: str, slots: int = 2) -> Connection:
    """An agent with `slots` CPU slots, on loopback and its own eth0 address."""
    hello = pb.Hello(
        agent_id=agent_id,
        resource_pool="default",
        join_token=hub.join_token,
        instance_id=agent_id,
        devices=[pb.Device(slot_id=i, type="cpu", index=-1) for i in range(slots)],
        interfaces=[
            pb.NetworkInterface(name="lo", ipv4=["127.0.0.1"]),
            pb.NetworkInterface(name="eth0", ipv4=[ADDRESS[agent_id]]),
        ],
    )
    return await open_as_agent(hub, hello)


def model_definition(script: bytes, path: str = "train.py") -> list[dict[str, Any]]:
    return [v1_file(path, script)]


async def submit(
    api: httpx.AsyncClient, config: str, script: bytes = DET_SCRIPT, path: str = "train.py"
) -> dict[str, Any]:
    """Create an activated experiment; returns GET /api/v1/experiments/{id}'s experiment."""
    reply = await create_experiment(api, config, modelDefinition=model_definition(script, path))
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    described = await api.get(f"/api/v1/experiments/{experiment_id}")
    assert described.status_code == 200, described.text
    experiment: dict[str, Any] = described.json()["experiment"]
    return experiment


async def schedule(app: FastAPI) -> None:
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 1


def prepared(allocation_id: str, master_port: int, extra_ports: list[int]) -> pb.AgentMessage:
    return pb.AgentMessage(
        prepared=pb.AllocationPrepared(
            allocation_id=allocation_id, master_port=master_port, extra_ports=extra_ports
        )
    )


def started(allocation_id: str) -> pb.AgentMessage:
    return pb.AgentMessage(started=pb.AllocationStarted(allocation_id=allocation_id))


async def placed_gang(
    app: FastAPI, api: httpx.AsyncClient, config: str = GANG_CONFIG, script: bytes = DET_SCRIPT
) -> tuple[AgentHub, Connection, Connection, int, pb.PrepareAllocation]:
    """Two two-slot agents and a four-slot trial placed on both; the hub has asked the chief
    (agent-a, first by id) to reserve its ports. Returns the hub, both connections, the
    experiment id and the PrepareAllocation the chief got."""
    hub = hub_of(app)
    a, b = await connect(hub, "agent-a"), await connect(hub, "agent-b")
    experiment = await submit(api, config, script)
    await schedule(app)
    await hub.tick()
    (prepare,) = of_kind(sent(a), "prepare")
    assert not of_kind(sent(b), "prepare")  # only the chief reserves ports
    return hub, a, b, experiment["id"], prepare


async def started_gang(
    app: FastAPI, api: httpx.AsyncClient, config: str = GANG_CONFIG
) -> tuple[AgentHub, Connection, Connection, int, str, pb.StartAllocation]:
    """A per_agent gang whose processes both started. Returns the hub, both connections,
    the experiment and allocation ids, and the chief's StartAllocation."""
    hub, a, b, experiment_id, prepare = await placed_gang(app, api, config)
    allocation_id = prepare.allocation_id
    await hub.on_message(a, prepared(allocation_id, 29500, [29501, 29502]))
    (start_a,), (start_b,) = of_kind(sent(a), "start"), of_kind(sent(b), "start")
    assert start_a.layout == start_b.layout == pb.LAUNCH_LAYOUT_PER_AGENT
    for connection in (a, b):
        await hub.on_message(connection, started(allocation_id))
    assert (await trial_of(api, experiment_id))["state"] == "STATE_RUNNING"
    return hub, a, b, experiment_id, allocation_id, start_a


def rank_headers(start: pb.StartAllocation) -> dict[str, str]:
    """What Determined's harness sends: the allocation's session token from cluster.json."""
    token = json.loads(start.info_files["cluster.json"])["session_token"]
    assert token and token == start.env["DET_SESSION_TOKEN"]
    return {"Authorization": f"Bearer {token}"}


async def tasks(api: httpx.AsyncClient, **params: Any) -> dict[str, dict[str, Any]]:
    reply = await api.get("/api/v1/tasks", params=params)
    assert reply.status_code == 200, reply.text
    listed: dict[str, dict[str, Any]] = reply.json()["allocationIdToSummary"]
    return listed


# -- the layout, decided at submit -----------------------------------------------------------


@pytest.mark.parametrize(
    ("entrypoint", "path", "script", "layout", "reason"),
    [
        ("python3 train.py", "train.py", DET_SCRIPT, "per_agent", "train.py imports determined"),
        (
            "python3 -m determined.launch.torch_distributed python3 train.py",
            "train.py",
            RESOLUTE_SCRIPT,
            "per_agent",
            "the entrypoint runs Determined's launcher determined.launch.torch_distributed",
        ),
        (
            "python3 -m pkg.train --epochs 2",
            "pkg/train.py",
            b"from determined import core\n",
            "per_agent",
            "pkg/train.py imports determined",
        ),
        ("python3 train.py", "train.py", RESOLUTE_SCRIPT, "per_slot", "train.py does not import"),
        ("python3 train.py", "other.py", DET_SCRIPT, "per_slot", "train.py is not in the model"),
    ],
)
async def test_the_layout_is_decided_at_submit_and_shown_with_its_reason(
    api: httpx.AsyncClient, entrypoint: str, path: str, script: bytes, layout: str, reason: str
) -> None:
    config = f"""
name: layout
entrypoint: {entrypoint}
searcher: {{name: single, metric: loss, max_length: 1}}
"""
    experiment = await submit(api, config, script, path)
    assert experiment["launchLayout"] == layout
    assert experiment["launchReason"].startswith(reason), experiment["launchReason"]
    # The summary says in words how many processes run; the stored config holds the
    # decision, never `auto`, so it cannot change under a running experiment.
    expected = "once per agent" if layout == "per_agent" else "once per slot"
    assert expected in experiment["launchLayoutSummary"]
    assert experiment["config"]["launch_layout"] == layout
    listed = (await api.get("/api/v1/experiments")).json()["experiments"]
    assert [(e["id"], e["launchLayout"]) for e in listed] == [(experiment["id"], layout)]


@pytest.mark.parametrize(
    ("explicit", "script"), [("per_slot", DET_SCRIPT), ("per_agent", RESOLUTE_SCRIPT)]
)
async def test_an_explicit_launch_layout_wins_over_the_script(
    api: httpx.AsyncClient, explicit: str, script: bytes
) -> None:
    config = f"""
name: explicit
entrypoint: python3 train.py
launch_layout: {explicit}
searcher: {{name: single, metric: loss, max_length: 1}}
"""
    experiment = await submit(api, config, script)
    assert experiment["launchLayout"] == explicit
    assert experiment["launchReason"] == "launch_layout is set in the experiment config"


# -- a per_agent gang through the hub ----------------------------------------------------------


async def test_a_per_agent_gang_gets_one_process_per_agent_with_determineds_bootstrap(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, prepare = await placed_gang(app, api)
    assert prepare.extra_ports == 2  # Determined's ZMQ broadcast needs two more ports
    allocation_id = prepare.allocation_id
    await hub.on_message(a, prepared(allocation_id, 29500, [29501, 29502]))
    (start_a,), (start_b,) = of_kind(sent(a), "start"), of_kind(sent(b), "start")
    trial = await trial_of(api, experiment_id)

    for container_rank, (agent_id, start) in enumerate(
        (("agent-a", start_a), ("agent-b", start_b))
    ):
        assert start.allocation_id == allocation_id
        assert start.layout == pb.LAUNCH_LAYOUT_PER_AGENT
        # One process per agent, holding every slot the allocation has there.
        assert [(r.rank, list(r.slot_ids)) for r in start.ranks] == [(container_rank, [0, 1])]
        assert list(start.argv) == ["python3", "train.py"]
        assert start.model_definition  # the agent unpacks it into /run/determined/train/model
        assert start.shared_fs_host_path == HOST_PATH  # mounted at /determined_shared_fs
        assert set(start.info_files) == {"cluster.json", "trial.json", "rendezvous.json"}
        rendezvous = json.loads(start.info_files["rendezvous.json"])
        assert rendezvous == {
            "container_addrs": [ADDRESS["agent-a"], ADDRESS["agent-b"]],  # the chief first
            "container_rank": container_rank,
            "container_slot_counts": [2, 2],
        }
        cluster = json.loads(start.info_files["cluster.json"])
        assert (cluster["agent_id"], cluster["slot_ids"]) == (agent_id, [0, 1])
        assert cluster["allocation_id"] == allocation_id
        trial_info = json.loads(start.info_files["trial.json"])
        assert (trial_info["trial_id"], trial_info["experiment_id"]) == (trial["id"], experiment_id)
        assert trial_info["inter_node_network_interface"] == "eth0"
        env = start.env
        assert env["C10D_PORT"] == "29500"
        assert env["INTER_TRAIN_PROCESS_COMM_PORT_1"] == "29501"
        assert env["INTER_TRAIN_PROCESS_COMM_PORT_2"] == "29502"
        assert env["DET_CHIEF_IP"] == ADDRESS["agent-a"]
        assert env["DET_ALLOCATION_ID"] == allocation_id
        # Determined's launcher gives each rank these; set here they would be wrong.
        assert not set(RESERVED_FOR_THE_LAUNCHER) & env.keys(), sorted(env)
        assert env["PATH"] == EXPERIMENT_PATH and env["FROM_EXPERIMENT"] == "1"

    for connection in (a, b):
        await hub.on_message(connection, started(allocation_id))
    assert (await trial_of(api, experiment_id))["state"] == "STATE_RUNNING"
    listed = await tasks(api)
    assert listed[allocation_id]["state"] == "STATE_RUNNING"
    assert listed[allocation_id]["exitReason"] == ""


async def test_a_per_slot_gang_of_the_same_shape_keeps_resolutes_launch(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, prepare = await placed_gang(
        app, api, PER_SLOT_GANG_CONFIG, RESOLUTE_SCRIPT
    )
    experiment = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
    assert experiment["launchLayout"] == "per_slot"
    assert prepare.extra_ports == 0
    await hub.on_message(a, prepared(prepare.allocation_id, 29500, []))
    (start_a,), (start_b,) = of_kind(sent(a), "start"), of_kind(sent(b), "start")
    assert [r.rank for r in start_a.ranks] == [0, 1] and [r.rank for r in start_b.ranks] == [2, 3]
    for start in (start_a, start_b):
        assert start.layout == pb.LAUNCH_LAYOUT_PER_SLOT
        assert not start.info_files
        assert start.env["WORLD_SIZE"] == "4" and start.env["MASTER_PORT"] == "29500"
        assert "C10D_PORT" not in start.env


@pytest.mark.parametrize(
    "why", ["an answer without the two ports", "no answer in time", "a master restart"]
)
async def test_a_prepare_that_brings_no_ports_is_asked_again(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    # An agent that predates extra_ports answers with the rendezvous port alone; a lost
    # message is never answered; a master restarted meanwhile has forgotten it asked.
    # None may start the gang without its ports, and none may leave the trial waiting
    # forever: the chief is asked again (what `_start` and _PHASE_OF_STATE intend).
    hub, a, b, _, prepare = await placed_gang(app, api)
    allocation_id = prepare.allocation_id
    if why == "an answer without the two ports":
        await hub.on_message(a, prepared(allocation_id, 29500, []))
        assert not of_kind(sent(a), "start") and not of_kind(sent(b), "start")
    elif why == "no answer in time":
        monkeypatch.setattr(agent_link, "PREPARE_TIMEOUT_S", 0.0)
        await hub.tick()  # the chief's time to answer ran out
        monkeypatch.setattr(agent_link, "PREPARE_TIMEOUT_S", 30.0)
    else:
        hub = hub_of(app)  # the master's memory is gone; both agents reconnect
        a, b = await connect(hub, "agent-a"), await connect(hub, "agent-b")
    for _ in range(3):
        await hub.tick()
    assert (await tasks(api))[allocation_id]["state"] == "STATE_PULLING"
    (again,) = of_kind(sent(a), "prepare")
    assert (again.allocation_id, again.extra_ports) == (allocation_id, 2)
    await hub.on_message(a, prepared(allocation_id, 29510, [29511, 29512]))
    (start_a,), (start_b,) = of_kind(sent(a), "start"), of_kind(sent(b), "start")
    assert start_a.env["C10D_PORT"] == start_b.env["C10D_PORT"] == "29510"
    assert start_b.env["INTER_TRAIN_PROCESS_COMM_PORT_2"] == "29512"


@pytest.mark.parametrize("where", ["master", "pool"])
async def test_task_container_defaults_lie_beneath_the_experiments_variables(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    settings = app.state.settings
    master_defaults = TaskContainerDefaults(
        environment_variables=["PATH=/master/bin:/usr/bin", "FROM_MASTER=1"]
    )
    monkeypatch.setattr(settings, "task_container_defaults", master_defaults)
    if where == "pool":
        # The pool's own defaults replace the master's, and pick the agents' device type.
        pool_defaults = TaskContainerDefaults(
            environment_variables={
                "cpu": ["PATH=/pool/bin:/usr/bin", "FROM_POOL=cpu", "DET_VENV=/pool"],
                "cuda": ["FROM_POOL=cuda"],
            }
        )
        pool = settings.pool("default")
        monkeypatch.setattr(pool, "task_container_defaults", pool_defaults)
    hub, a, b, _, allocation_id, start = await started_gang(app, api)
    env = start.env
    assert env["PATH"] == EXPERIMENT_PATH  # the experiment's own wins
    assert env["FROM_EXPERIMENT"] == "1"
    if where == "master":
        assert env["FROM_MASTER"] == "1"
        assert "FROM_POOL" not in env
    else:
        assert (env["FROM_POOL"], env["DET_VENV"]) == ("cpu", "/pool")
        assert "FROM_MASTER" not in env  # replaced, not merged

    for connection in (a, b):
        await hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_COMPLETED))

    # Without PATH in the experiment, the defaults choose the interpreter.
    no_path = GANG_CONFIG.replace(f"    - PATH={EXPERIMENT_PATH}\n", "")
    assert no_path != GANG_CONFIG
    _, _, _, _, _, start = await started_gang(app, api, no_path)
    assert start.env["PATH"] == (
        "/master/bin:/usr/bin" if where == "master" else "/pool/bin:/usr/bin"
    )


@pytest.mark.parametrize("where", ["master", "pool"])
async def test_the_network_interface_in_task_container_defaults_is_obeyed(
    app: FastAPI, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # A pool's task_container_defaults replaces the master's for its trials (settings.py):
    # its dtrain_network_interface too, not only its environment_variables.
    defaults = TaskContainerDefaults(dtrain_network_interface="ib9")
    settings = app.state.settings
    if where == "master":
        monkeypatch.setattr(settings, "task_container_defaults", defaults)
    else:
        monkeypatch.setattr(settings.pool("default"), "task_container_defaults", defaults)
    hub = hub_of(app)
    a, b = await connect(hub, "agent-a"), await connect(hub, "agent-b")
    await submit(api, GANG_CONFIG)
    await schedule(app)
    await hub.tick()
    assert not of_kind(sent(a), "prepare") and not of_kind(sent(b), "prepare")
    (task,) = (await tasks(api)).values()
    assert task["pendingReason"]["code"] == "NO_COMMON_INTERFACE"
    assert "ib9" in task["pendingReason"]["message"]


# -- how a per_agent allocation ends -------------------------------------------------------


async def test_an_unrunnable_interpreter_ends_the_trial_in_error_at_once(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id, _ = await started_gang(app, api)
    message = "/usr/bin/python3 lacks determined (pip install determined==0.38.1)"
    await hub.on_message(b, exited(allocation_id, pb.EXIT_KIND_UNRUNNABLE, message))
    (stop_a,), stop_b = stops(a, b)
    assert stop_a.allocation_id == allocation_id and stop_b == []  # b's process never ran
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_STOPPED, "SIGTERM"))
    assert of_kind(sent(a), "exit_ack") and of_kind(sent(b), "exit_ack")

    trial = await trial_of(api, experiment_id)
    # max_restarts is 3: no restart can give the interpreter a package, so none is tried.
    assert (trial["state"], trial["restarts"]) == ("STATE_ERROR", 0)
    assert trial["endReason"] == message
    experiment = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
    assert experiment["state"] == "STATE_ERROR"
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 0
    await hub.tick()
    assert stops(a, b) == [[], []] and not of_kind(sent(a), "prepare")

    # `det task list` shows why, for an hour; Determined's own client asks without the
    # parameter and sees only what waits or runs, as before.
    assert allocation_id not in await tasks(api)
    recent = await tasks(api, failedWithinSeconds=3600)
    assert recent[allocation_id]["exitReason"] == f"unrunnable: {message}"
    assert recent[allocation_id]["state"] == "STATE_TERMINATED"
    assert recent[allocation_id]["trialId"] == trial["id"]


async def test_only_trials_that_ended_in_error_stay_in_the_task_list(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id, _ = await started_gang(app, api)
    for connection in (a, b):
        await hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_COMPLETED))
    assert (await trial_of(api, experiment_id))["state"] == "STATE_COMPLETED"
    assert allocation_id not in await tasks(api, failedWithinSeconds=3600)


async def test_the_task_list_refuses_a_bad_window(api: httpx.AsyncClient) -> None:
    for value in ("-1", "soon"):
        reply = await api.get("/api/v1/tasks", params={"failedWithinSeconds": value})
        assert reply.status_code == 400, (value, reply.status_code, reply.text)


async def test_an_exit_0_after_a_preemption_it_never_acknowledged_is_completed(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    # Determined's rule: the harness heard the signal (its long-poll was answered) but the
    # code never called should_preempt() and finished its work. With the acknowledgement
    # the same exits pause the trial instead: see test_agent_link's
    # test_ranks_that_exit_0_when_asked_to_stop_have_not_completed.
    hub, a, b, experiment_id, allocation_id, _ = await started_gang(app, api)
    watcher = await long_poll(app, api, allocation_id)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    await hub.tick()
    assert (await watcher).json() == {"preempt": True}
    assert stops(a, b) == [[], []]  # listening: it gets its time to stop on its own
    for connection in (a, b):
        await hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_COMPLETED))
    trial = await trial_of(api, experiment_id)
    assert (trial["state"], trial["restarts"]) == ("STATE_COMPLETED", 0)
    assert of_kind(sent(a), "exit_ack") and of_kind(sent(b), "exit_ack")


async def test_an_acknowledged_preemption_then_exit_0_pauses_the_per_agent_trial(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    # The acknowledgement comes with the allocation's own token (cluster.json's), as the
    # harness sends it; the run is then stopped for preemption, not finished.
    hub, a, b, experiment_id, allocation_id, start = await started_gang(app, api)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    ack = f"/api/v1/allocations/{allocation_id}/signals/ack_preemption"
    reply = await api.post(ack, content=b"", headers=rank_headers(start))
    assert reply.status_code == 200, reply.text
    for connection in (a, b):
        await hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_COMPLETED))
    trial = await trial_of(api, experiment_id)
    assert (trial["state"], trial["restarts"]) == ("STATE_PAUSED", 0)


async def test_an_early_exit_ends_the_trial_completed_even_when_preempted_and_acked(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    # det.InvalidHP: the harness reports the early exit from every rank, and the ranks
    # exit 0. The trial is done, whatever the preemption said: never paused or rerun.
    hub, a, b, experiment_id, allocation_id, start = await started_gang(app, api)
    trial = await trial_of(api, experiment_id)
    headers = rank_headers(start)
    assert (await api.post(f"/api/v1/experiments/{experiment_id}/pause")).status_code == 200
    ack = f"/api/v1/allocations/{allocation_id}/signals/ack_preemption"
    assert (await api.post(ack, content=b"", headers=headers)).status_code == 200
    for _ in (a, b):  # every rank reports it; the same reason again is a 200
        reply = await api.post(
            f"/api/v1/trials/{trial['id']}/early_exit",
            json={"reason": "EXITED_REASON_INVALID_HP"},
            headers=headers,
        )
        assert reply.status_code == 200, reply.text
    for connection in (a, b):
        await hub.on_message(connection, exited(allocation_id, pb.EXIT_KIND_COMPLETED))
    trial = await trial_of(api, experiment_id)
    assert (trial["state"], trial["restarts"]) == ("STATE_COMPLETED", 0)
    assert trial["endReason"] == EARLY_EXIT_REASONS["EXITED_REASON_INVALID_HP"]
    async with session_scope(app.state.session_factory) as session:
        assert (await scheduler.run_pass(session, app.state.settings)).placed == 0


async def test_an_early_exit_does_not_excuse_a_failed_rank(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub, a, b, experiment_id, allocation_id, start = await started_gang(app, api)
    trial = await trial_of(api, experiment_id)
    reply = await api.post(
        f"/api/v1/trials/{trial['id']}/early_exit",
        json={"reason": "EXITED_REASON_INVALID_HP"},
        headers=rank_headers(start),
    )
    assert reply.status_code == 200, reply.text
    await hub.on_message(b, exited(allocation_id, pb.EXIT_KIND_FAILED, "rank 3 exited with 1"))
    await hub.on_message(a, exited(allocation_id, pb.EXIT_KIND_STOPPED, "SIGTERM"))
    trial = await trial_of(api, experiment_id)
    assert (trial["state"], trial["restarts"]) == ("STATE_QUEUED", 1)
