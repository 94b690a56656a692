"""The ASHA searchers through the master: trials created as the search goes, stops that
reach running trials through their preemption signal, and the fixes of Determined's bugs.

The agent is the hub's in-process connection (as in test_agent_link); the reports are
the HTTP calls Determined's harness and resolute's library make.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from master.db.session import session_scope
from master.services import scheduler
from master.services.agent_link import AgentHub, Connection
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_agent_link import exited, hub_of, of_kind, open_as_agent, sent, stops

CONFIG = """
name: asha
entrypoint: python3 train.py
hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}
reproducibility: {experiment_seed: 7}
searcher:
  name: async_halving
  metric: loss
  num_rungs: 2
  divisor: 2
  max_time: 4
  time_metric: batches
  max_trials: 3
  max_concurrent_trials: 2
"""


async def connect_agent(hub: AgentHub, slots: int = 4) -> Connection:
    hello = pb.Hello(
        agent_id="agent-a",
        resource_pool="default",
        join_token=hub.join_token,
        instance_id="agent-a",
        devices=[pb.Device(slot_id=i, type="cpu", index=-1) for i in range(slots)],
        interfaces=[pb.NetworkInterface(name="lo", ipv4=["127.0.0.1"])],
    )
    return await open_as_agent(hub, hello)


async def start_queued(app: FastAPI, hub: AgentHub, agent: Connection) -> list[str]:
    """One scheduling pass, and every allocation it placed prepared and started."""
    async with session_scope(app.state.session_factory) as session:
        await scheduler.run_pass(session, app.state.settings)
    await hub.tick()
    for i, prepare in enumerate(of_kind(sent(agent), "prepare")):
        prepared = pb.AllocationPrepared(allocation_id=prepare.allocation_id, master_port=29500 + i)
        await hub.on_message(agent, pb.AgentMessage(prepared=prepared))
    started = []
    for start in of_kind(sent(agent), "start"):
        started_msg = pb.AllocationStarted(allocation_id=start.allocation_id)
        await hub.on_message(agent, pb.AgentMessage(started=started_msg))
        started.append(start.allocation_id)
    return started


async def submit(api: httpx.AsyncClient, config: str = CONFIG) -> int:
    reply = await api.post("/api/v1/experiments", json={"config": config, "activate": True})
    assert reply.status_code == 200, reply.text
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


async def trials_of(api: httpx.AsyncClient, experiment_id: int) -> list[dict[str, Any]]:
    reply = await api.get(f"/api/v1/experiments/{experiment_id}/trials")
    assert reply.status_code == 200, reply.text
    trials: list[dict[str, Any]] = reply.json()["trials"]
    return trials


async def experiment_of(api: httpx.AsyncClient, experiment_id: int) -> dict[str, Any]:
    experiment: dict[str, Any] = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()[
        "experiment"
    ]
    return experiment


async def validate(api: httpx.AsyncClient, trial: dict[str, Any], values: dict[str, Any]) -> None:
    run_id = await current_run(api, trial["id"])
    body = {
        "group": "validation",
        "metrics": {
            "trialId": trial["id"],
            "trialRunId": run_id,
            "stepsCompleted": int(values.get("batches", 0)),
            "metrics": {"avgMetrics": values, "batchMetrics": None},
            "reportTime": None,
        },
    }
    reply = await api.post(f"/api/v1/trials/{trial['id']}/metrics", json=body)
    assert reply.status_code == 200, reply.text


async def current_run(api: httpx.AsyncClient, trial_id: int) -> int:
    tasks = (await api.get("/api/v1/tasks")).json()["allocationIdToSummary"]
    runs = [int(a.split(".")[1]) for a, t in tasks.items() if t.get("trialId") == trial_id]
    return max(runs)


async def preempt_signal(api: httpx.AsyncClient, allocation_id: str) -> dict[str, Any]:
    """What the trial's preemption watcher (should_preempt) is told."""
    reply = await api.get(
        f"/api/v1/allocations/{allocation_id}/signals/preemption", params={"timeout_seconds": 0}
    )
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


def allocation_of(trial: dict[str, Any], started: list[str]) -> str:
    (allocation,) = [a for a in started if a.startswith(f"{trial['id']}.")]
    return allocation


async def test_a_search_stops_trials_replaces_them_and_completes(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    agent = await connect_agent(hub)
    experiment_id = await submit(api)
    first, second = await trials_of(api, experiment_id)  # max_concurrent_trials: 2
    assert first["searcher"]["bracket"] == 0 and first["searcher"]["rung"] == -1
    started = await start_queued(app, hub, agent)
    assert len(started) == 2

    await validate(api, first, {"loss": 1.0, "batches": 2})
    await validate(api, second, {"loss": 2.0, "batches": 2})
    first, second = await trials_of(api, experiment_id)
    assert first["state"] == "STATE_RUNNING" and first["searcher"]["rung"] == 0
    assert second["state"] == "STATE_STOPPING_COMPLETED"
    assert second["searcher"]["stoppedAtRung"] == 0
    assert second["searcher"]["reachedTop"] is False
    assert second["searcher"]["summary"].endswith("; stopped at rung 0")
    assert second["endReason"] == (
        "stopped by the searcher at rung 0 (2 batches): place 2 of 2, not in the top 1/2"
    )

    # The stop reaches the trial as its preemption signal.
    assert await preempt_signal(api, allocation_of(second, started)) == {"preempt": True}
    assert await preempt_signal(api, allocation_of(first, started)) == {"preempt": False}
    # Its slot is still taken until it exits: max_concurrent_trials is a real cap.
    assert len(await trials_of(api, experiment_id)) == 2
    # It keeps reporting (Determined 0.38 entered it in the rung again each time): ignored.
    await validate(api, second, {"loss": 0.1, "batches": 4})
    assert [r["rung"] for r in (await trials_of(api, experiment_id))[1]["searcher"]["rungs"]] == [0]

    await hub.on_message(agent, exited(allocation_of(second, started), pb.EXIT_KIND_COMPLETED))
    trials = await trials_of(api, experiment_id)
    assert [(t["state"], t["restarts"]) for t in trials[:2]] == [
        ("STATE_RUNNING", 0),
        ("STATE_COMPLETED", 0),
    ]
    assert len(trials) == 3 and trials[2]["state"] == "STATE_QUEUED"  # its replacement

    await validate(api, first, {"loss": 0.9, "batches": 4})  # the top rung
    first = (await trials_of(api, experiment_id))[0]
    assert first["state"] == "STATE_STOPPING_COMPLETED"
    assert first["endReason"] == "reached the top rung 1 (4 batches): trained the full max_time"
    # The rung it ended at is no stop: the summary and the flag say what the reason says.
    assert first["searcher"]["reachedTop"] is True
    assert first["searcher"]["summary"].endswith("; trained the full max_time")
    await hub.on_message(agent, exited(allocation_of(first, started), pb.EXIT_KIND_COMPLETED))
    assert len(await trials_of(api, experiment_id)) == 3  # max_trials reached

    started = await start_queued(app, hub, agent)
    third = (await trials_of(api, experiment_id))[2]
    # A diverged trial is the worst of its rung; the experiment goes on.
    await validate(api, third, {"loss": "NaN", "batches": 2})
    third = (await trials_of(api, experiment_id))[2]
    assert third["state"] == "STATE_STOPPING_COMPLETED"
    assert "validation metric 'loss' was 'NaN', not a number" in third["endReason"]
    assert (await experiment_of(api, experiment_id))["state"] == "STATE_ACTIVE"
    await hub.on_message(agent, exited(allocation_of(third, started), pb.EXIT_KIND_COMPLETED))
    experiment = await experiment_of(api, experiment_id)
    assert (experiment["state"], experiment["progress"]) == ("STATE_COMPLETED", 1.0)


async def test_a_trial_that_ignores_the_stop_is_stopped_after_its_preemption_timeout(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    agent = await connect_agent(hub)
    experiment_id = await submit(api, CONFIG + "preemption_timeout: 1\n")
    started = await start_queued(app, hub, agent)
    first, second = await trials_of(api, experiment_id)
    await validate(api, first, {"loss": 1.0, "batches": 2})
    await validate(api, second, {"loss": 2.0, "batches": 2})
    assert await preempt_signal(api, allocation_of(second, started)) == {"preempt": True}
    await hub.tick()
    assert stops(agent) == [[]]  # it listens: it gets the experiment's preemption_timeout
    await asyncio.sleep(1.1)
    await hub.tick()
    (stop,) = stops(agent)[0]
    assert stop.allocation_id == allocation_of(second, started)
    await hub.on_message(agent, exited(stop.allocation_id, pb.EXIT_KIND_STOPPED, "SIGTERM"))
    second = (await trials_of(api, experiment_id))[1]
    # Stopped by the searcher: completed, not errored, no restart counted.
    assert (second["state"], second["restarts"]) == ("STATE_COMPLETED", 0)


async def test_errored_and_invalid_trials_are_replaced(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    agent = await connect_agent(hub)
    experiment_id = await submit(api, CONFIG.replace("entrypoint:", "max_restarts: 0\nentrypoint:"))
    started = await start_queued(app, hub, agent)
    first, second = await trials_of(api, experiment_id)
    # The first reports invalid hyperparameters (det.InvalidHP) and exits 0.
    reply = await api.post(
        f"/api/v1/trials/{first['id']}/early_exit", json={"reason": "EXITED_REASON_INVALID_HP"}
    )
    assert reply.status_code == 200, reply.text
    await hub.on_message(agent, exited(allocation_of(first, started), pb.EXIT_KIND_COMPLETED))
    # The second fails (no restarts left).
    await hub.on_message(agent, exited(allocation_of(second, started), pb.EXIT_KIND_FAILED, "boom"))
    trials = await trials_of(api, experiment_id)
    assert [t["state"] for t in trials[:2]] == ["STATE_COMPLETED", "STATE_ERROR"]
    # Both replaced: the invalid one does not count toward max_trials, the errored one does.
    assert [t["state"] for t in trials[2:]] == ["STATE_QUEUED", "STATE_QUEUED"]
    # The errored trial is the worst entry of the rung it was heading for.
    assert trials[1]["searcher"]["rungs"] == [{"rung": 0, "units": 2, "time": 0.0, "metric": None}]


async def test_reports_after_invalid_hyperparameters_or_past_any_float_stop_nothing_wrongly(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    hub = hub_of(app)
    agent = await connect_agent(hub)
    experiment_id = await submit(api)
    await start_queued(app, hub, agent)
    first, second = await trials_of(api, experiment_id)
    reply = await api.post(
        f"/api/v1/trials/{first['id']}/early_exit", json={"reason": "EXITED_REASON_INVALID_HP"}
    )
    assert reply.status_code == 200, reply.text
    await validate(api, second, {"loss": 1.0, "batches": 2})
    # A validation after det.InvalidHP (it would place last) neither stops the trial nor
    # replaces the reason it gave.
    await validate(api, first, {"loss": 5.0, "batches": 2})
    first = (await trials_of(api, experiment_id))[0]
    assert first["state"] == "STATE_RUNNING" and first["searcher"]["rungs"] == []
    assert first["endReason"] == "the trial reported invalid hyperparameters (det.InvalidHP)"
    # A metric past the largest float is the worst value, not a 500.
    await validate(api, second, {"loss": 10**400, "batches": 4})
    second = (await trials_of(api, experiment_id))[1]
    assert second["state"] == "STATE_STOPPING_COMPLETED"
    assert "not a finite number" in second["endReason"]
    assert second["searcher"]["rungs"][-1] == {"rung": 1, "units": 4, "time": 4.0, "metric": None}


async def test_trials_are_drawn_as_determined_draws_them(api: httpx.AsyncClient) -> None:
    config = CONFIG.replace("hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}", "")
    config = config.replace("experiment_seed: 7", "experiment_seed: 0")
    experiment_id = await submit(api, config)
    trials = await trials_of(api, experiment_id)
    assert (trials[0]["requestId"], trials[0]["seed"]) == (
        "ac0a7f8c-2faa-4497-b5a6-16b7c0cc21d8",
        441365315,
    )


async def test_preview_search_matches_determined_simulate(api: httpx.AsyncClient) -> None:
    config = {
        "searcher": {
            "name": "adaptive_asha",
            "metric": "loss",
            "max_rungs": 10,
            "divisor": 3,
            "max_time": 900,
            "time_metric": "batches",
            "max_trials": 10,
            "max_concurrent_trials": 5,
        }
    }
    reply = await api.post("/api/v1/preview-hp-search", json={"config": config})
    assert reply.status_code == 200, reply.text
    summary = reply.json()["summary"]
    assert [(t["count"], t["unit"]["value"], t["unit"]["name"]) for t in summary["trials"]] == [
        (5, 100, "batches"),
        (3, 300, "batches"),
        (2, 900, "batches"),
    ]
    assert summary["config"]["mode"] == "standard"  # the defaults are shown

    random = {"searcher": {"name": "random", "metric": "loss", "max_trials": 7}}
    reply = await api.post("/api/v1/preview-hp-search", json={"config": random})
    assert reply.json()["summary"]["trials"] == [{"count": 7, "unit": {"maxLength": True}}]


@pytest.mark.parametrize(
    ("searcher", "path"),
    [
        ("{name: adaptive_asha, metric: loss, max_trials: 4}", "searcher.max_time"),
        ("{name: adaptive_asha, metric: loss, max_trials: 4, max_time: 8}", "searcher.time_metric"),
        (
            "{name: adaptive_asha, metric: loss, max_trials: 4, max_time: 0, time_metric: b}",
            "searcher.max_time",
        ),
        (
            "{name: adaptive_asha, metric: loss, max_trials: 4, max_time: 8, time_metric: b, "
            "bracket_rungs: [2, 0]}",
            "searcher.bracket_rungs.1",
        ),
        (
            "{name: async_halving, metric: loss, max_trials: 4, max_time: 8, time_metric: b}",
            "searcher.num_rungs",
        ),
        ("{name: adaptive_asha, metric: loss, max_time: 8, time_metric: b}", "searcher.max_trials"),
        (
            "{name: adaptive_asha, metric: loss, max_trials: 2, max_length: {epochs: 2}}",
            "searcher.max_length",
        ),
    ],
)
async def test_bad_asha_configs_are_refused_naming_the_field(
    api: httpx.AsyncClient, searcher: str, path: str
) -> None:
    config = f"entrypoint: python3 train.py\nsearcher: {searcher}\n"
    for route, body in (
        ("/api/v1/experiments", {"config": config}),
        ("/api/v1/preview-hp-search", {"config": config}),
    ):
        reply = await api.post(route, json=body)
        assert reply.status_code == 400, reply.text
        assert path in reply.text
    assert (await api.get("/api/v1/experiments")).json()["experiments"] == []
