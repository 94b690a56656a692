"""Quotas on a real master with real agents: Kueue's basic scenario in slots. Two agents of
4 slots; workspace A's nominal quota is 6, B's is 2. A runs 8 trials (borrowing 2); when B
submits 2, A's two most recently started trials checkpoint and requeue, B runs 2, A runs 6;
once B is done, A's preempted trials resume from their checkpoints. Then, on the same
shape: `resources.weight` 1 and 3 share a contended workspace 2:6, a 4-slot gang is
admitted only whole, on one agent, when its quota and the free slots allow, and
`resources.max_slots` 4 keeps an 8-trial search to 4 slots at every moment of its history."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from harness.cluster import AgentProcess
from tests.e2e.agents import (
    create_experiment,
    scheduling_passes,
    trial_logs,
    wait_scheduling_pass,
    write_experiment,
)
from tests.e2e.conftest import BACKENDS, MasterProcess, running_master, unique

pytestmark = pytest.mark.e2e

VISION, NLP = unique("vision"), unique("nlp")
POOLS = [
    {
        "pool_name": "default",
        "quotas": [
            {"workspace": VISION, "nominal_slots": 6},
            {"workspace": NLP, "nominal_slots": 2},
        ],
    }
]

# Trains until asked to stop: on preemption it checkpoints and exits, and a later run
# resumes from that checkpoint; when the test creates its stop file it ends normally.
SCRIPT = """
import json, os, sys, time
import resolute

stop_file = os.environ["QUOTA_TEST_STOP_FILE"]
with resolute.init() as ctx:
    step = 0
    if ctx.latest_checkpoint:
        with ctx.checkpoint.restore_path(ctx.latest_checkpoint) as path:
            step = json.loads((path / "state.json").read_text())["step"]
        print(f"RESUMED {ctx.latest_checkpoint} step={step}", flush=True)
    while not os.path.exists(stop_file):
        time.sleep(0.2)
        step += 1
        if step % 5 == 0:
            ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": 1.0})
        if ctx.preempt.should_preempt():
            with ctx.checkpoint.store_path(step) as (path, uuid):
                (path / "state.json").write_text(json.dumps({"step": step}))
            print(f"PREEMPTED at step={step} checkpoint={uuid}", flush=True)
            sys.exit(0)
    print("STOPPED", flush=True)
"""


@pytest.fixture(params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    env = {"DET_MASTER_RESOURCE_POOLS": json.dumps(POOLS)}
    with running_master(request, tmp_path_factory, "quotas", env) as proc:
        yield proc


@pytest.fixture
def agents(master: MasterProcess, tmp_path: Path) -> Iterator[list[AgentProcess]]:
    procs = [
        AgentProcess(master, f"quota-{i}", tmp_path / f"quota-{i}", slots=4).start()
        for i in range(2)
    ]
    for proc in procs:
        proc.wait_connected()
    yield procs
    for proc in procs:
        proc.stop()


def project_in_new_workspace(master: MasterProcess, name: str) -> int:
    ws = master.api("POST", "/api/v1/workspaces", json={"name": name})["workspace"]["id"]
    project = master.api("POST", f"/api/v1/workspaces/{ws}/projects", json={"name": "p"})
    project_id: int = project["project"]["id"]
    return project_id


def submit(
    master: MasterProcess,
    tmp_path: Path,
    workspace: str,
    trials: int,
    stop: Path,
    *,
    name: str = "search",
    project: str = "p",
    slots: int = 1,
    resources: dict[str, Any] | None = None,
) -> int:
    config, model = write_experiment(
        tmp_path / f"{workspace}-{name}",
        SCRIPT,
        slots=slots,
        name=f"{workspace}-{name}",
        extra={
            "resources": resources or {},
            "workspace": workspace,
            "project": project,
            "searcher": {
                "name": "grid",
                "metric": "loss",
                "max_length": 1,
            },
            "hyperparameters": {"i": {"type": "categorical", "vals": list(range(trials))}},
            "environment": {"environment_variables": [f"QUOTA_TEST_STOP_FILE={stop}"]},
            "checkpoint_storage": {
                "type": "directory",
                "container_path": str(tmp_path / "checkpoints"),
            },
            "max_restarts": 0,
        },
    )
    return create_experiment(master, config, model)


def trials(master: MasterProcess, experiment_id: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = master.api(
        "GET", f"/api/v1/experiments/{experiment_id}/trials?limit=100"
    )["trials"]
    for trial in found:
        trial["state"] = trial["state"].removeprefix("STATE_")
    return found


def running(master: MasterProcess, experiment_id: int) -> int:
    return sum(t["state"] == "RUNNING" for t in trials(master, experiment_id))


def test_a_workspace_reclaims_its_quota_from_a_borrower(
    master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    project_in_new_workspace(master, VISION)
    project_in_new_workspace(master, NLP)
    stop_a, stop_b = tmp_path / "stop-a", tmp_path / "stop-b"
    a = submit(master, tmp_path, VISION, 10, stop_a)
    master.wait_for("A to run 8 trials, 2 of them borrowed", lambda: running(master, a) == 8, 180)
    assert sum(t["state"] == "QUEUED" for t in trials(master, a)) == 2

    def training() -> bool:
        runs = [t for t in trials(master, a) if t["state"] == "RUNNING"]
        return all(
            master.api("GET", f"/api/v1/trials/{t['id']}/metrics?group=training")["metrics"]
            for t in runs
        )

    # Trial code that polls the preemption signal checkpoints when preempted; before its
    # first poll it is stopped at once (nothing to save yet). Wait until all 8 train.
    master.wait_for("A's trials to train", training, 120)

    b = submit(master, tmp_path, NLP, 2, stop_b)
    master.wait_for(
        "B to run 2 and A 6",
        lambda: running(master, b) == 2 and running(master, a) == 6,
        180,
    )

    def preempted_trials() -> list[dict[str, Any]]:
        return [t for t in trials(master, a) if "PREEMPTED at step" in trial_logs(master, t["id"])]

    # Their log lines arrive in the agents' next log batches.
    master.wait_for("A's 2 checkpoints", lambda: len(preempted_trials()) == 2, 60)
    preempted = preempted_trials()
    assert running(master, a) == 6 and running(master, b) == 2
    for trial in preempted:
        assert trial["restarts"] == 0  # a preemption is not a failure
        assert trial["latestCheckpointUuid"]

    # B's trials end; then A's: its queued trials run (borrowing again) and end at once,
    # the preempted ones after resuming from their checkpoints.
    stop_b.touch()
    stop_a.touch()
    master.wait_for(
        "every trial to complete",
        lambda: {t["state"] for t in trials(master, a) + trials(master, b)} == {"COMPLETED"},
        180,
    )
    for trial in preempted:
        logs = trial_logs(master, trial["id"])
        found = re.findall(r"PREEMPTED at step=(\d+) checkpoint=(\S+)", logs)
        resumed = re.findall(r"RESUMED (\S+) step=(\d+)", logs)
        assert resumed == [(found[0][1], found[0][0])], logs


def test_a_borrowing_limit_of_zero_leaves_slots_idle_and_says_why(
    master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    project_in_new_workspace(master, VISION)
    project_in_new_workspace(master, NLP)
    vision = next(
        w["id"]
        for w in master.api("GET", "/api/v1/workspaces")["workspaces"]
        if w["name"] == VISION
    )
    # Admins change the config's quota through the API; it applies at the next pass.
    admin = {"Authorization": f"Bearer {master.login('admin')}"}
    master.api(
        "PUT",
        f"/api/v1/workspaces/{vision}/quotas/default",
        json={"nominalSlots": 6, "borrowingLimit": 0},
        headers=admin,
    )
    stop = tmp_path / "stop"
    # 8 trials for 8 free slots: 6 within the quota, 2 that only borrowing could place.
    a = submit(master, tmp_path, VISION, 8, stop)
    master.wait_for("A to run 6 trials", lambda: running(master, a) == 6, 180)

    def reasons() -> list[dict[str, Any]]:
        summaries = master.api("GET", "/api/v1/tasks")["allocationIdToSummary"]
        return [
            t["pendingReason"]
            for t in summaries.values()
            if t["experimentId"] == a and not t["resources"]
        ]

    master.wait_for("the waiting trials' reasons", lambda: len(reasons()) == 2, 60)
    for reason in reasons():
        assert reason["code"] == "QUOTA_BORROWING_LIMIT", reason
        assert reason["message"] == (
            f"workspace {VISION} holds 6 of its 6-slot quota in pool default; 2 idle slots "
            "are lent to no one because its borrowing limit is 0"
        )
    # A later pass (at the latest the periodic full one) still gives A nothing more.
    passes = scheduling_passes(master)
    master.wait_for("another pass", lambda: scheduling_passes(master) > passes, 60)
    assert running(master, a) == 6
    stop.touch()
    master.wait_for(
        "every trial to complete",
        lambda: {t["state"] for t in trials(master, a)} == {"COMPLETED"},
        180,
    )


def placements(master: MasterProcess, experiment_id: int) -> list[dict[str, int]]:
    """Each placed allocation of the experiment: slots by agent."""
    summaries = master.api("GET", "/api/v1/tasks")["allocationIdToSummary"]
    found = []
    for summary in summaries.values():
        if summary["experimentId"] != experiment_id or not summary["resources"]:
            continue
        by_agent: dict[str, int] = {}
        for resource in summary["resources"]:
            for agent, devices in resource["agentDevices"].items():
                by_agent[agent] = by_agent.get(agent, 0) + len(devices["devices"])
        found.append(by_agent)
    return found


def completed(master: MasterProcess, *experiment_ids: int) -> bool:
    states = {t["state"] for e in experiment_ids for t in trials(master, e)}
    return states == {"COMPLETED"}


def test_weights_share_a_workspace_and_a_gang_is_admitted_only_whole(
    master: MasterProcess, tmp_path: Path
) -> None:
    project_in_new_workspace(master, VISION)
    project_in_new_workspace(master, NLP)
    # Two experiments of one user in one workspace, weights 1 and 3, submitted before any
    # agent: the first passes with slots share the 8 slots 1:3, 2 and 6. Each asks for one
    # trial more than its share (3 and 7), so that the split is the weights' doing, not
    # what either could use.
    stop_weights, stop_b, stop_gangs = tmp_path / "stop-w", tmp_path / "stop-b", tmp_path / "stop-g"
    light = submit(master, tmp_path, VISION, 3, stop_weights, name="light", resources={"weight": 1})
    heavy = submit(master, tmp_path, VISION, 7, stop_weights, name="heavy", resources={"weight": 3})
    agents = [
        AgentProcess(master, f"quota-{i}", tmp_path / f"quota-{i}", slots=4).start()
        for i in range(2)
    ]
    try:
        for agent in agents:
            agent.wait_connected()
        master.wait_for(
            "the two experiments to hold all 8 slots",
            lambda: running(master, light) + running(master, heavy) == 8,
            180,
        )
        assert (running(master, light), running(master, heavy)) == (2, 6)
        stop_weights.touch()
        master.wait_for("both to complete", lambda: completed(master, light, heavy), 180)

        # B holds 1 slot on one agent; A's 4-slot gangs: the first fits on the other agent
        # within A's nominal 6; the second would borrow 2 and needs 4 free on one agent,
        # which only 3 are: it waits, holding nothing.
        b = submit(master, tmp_path, NLP, 1, stop_b)
        master.wait_for("B's trial to run", lambda: running(master, b) == 1, 120)
        gangs = submit(master, tmp_path, VISION, 2, stop_gangs, name="gangs", slots=4)
        master.wait_for("A's first gang to run", lambda: running(master, gangs) == 1, 120)
        wait_scheduling_pass(master)
        assert running(master, gangs) == 1
        [placed] = placements(master, gangs)
        assert list(placed.values()) == [4], placed  # whole, on one agent
        waiting = [t for t in trials(master, gangs) if t["state"] == "QUEUED"]
        assert len(waiting) == 1

        # B's trial ends: 4 slots are free on one agent, 2 of them B's idle quota, which
        # it lends; A borrows them and its second gang runs whole there.
        stop_b.touch()
        master.wait_for("A's second gang to run", lambda: running(master, gangs) == 2, 120)
        assert sorted(list(p.values()) for p in placements(master, gangs)) == [[4], [4]]
        assert {agent for p in placements(master, gangs) for agent in p} == {
            "quota-0",
            "quota-1",
        }
        stop_gangs.touch()
        master.wait_for("every trial to complete", lambda: completed(master, gangs, b), 180)
    finally:
        for agent in agents:
            agent.stop()


def slot_history(master: MasterProcess, experiment_id: int) -> list[tuple[datetime, datetime, int]]:
    """Each allocation the experiment held, from the master's database: assigned, ended,
    slots."""

    async def read() -> list[tuple[datetime, datetime, int]]:
        conn = await asyncpg.connect(master.db_url, timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT assigned_at, ended_at, slots_needed FROM allocations "
                "WHERE experiment_id = $1 AND assigned_at IS NOT NULL",
                experiment_id,
            )
        finally:
            await conn.close()
        return [(r["assigned_at"], r["ended_at"], r["slots_needed"]) for r in rows]

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, read()).result()


def test_max_slots_keeps_a_search_to_its_cap_at_every_moment(
    master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    # 8 one-slot trials that end at once (their stop file exists) on 8 free slots: without
    # the cap all would run together; with it, 4 at most, the other 4 placed as those end.
    stop = tmp_path / "stop"
    stop.touch()
    search = submit(
        master,
        tmp_path,
        "Uncategorized",
        8,
        stop,
        project="Uncategorized",
        resources={"max_slots": 4},
    )
    master.wait_for("the search to complete", lambda: completed(master, search), 240)
    history = slot_history(master, search)
    assert len(history) == 8
    # Slots held just after each allocation starts, counting every one not yet ended.
    for assigned, _, _ in history:
        held = sum(n for start, end, n in history if start <= assigned and end > assigned)
        assert held <= 4, (assigned, history)
    # It did use its cap: 4 at once at some moment (8 slots were free).
    assert (
        max(
            sum(n for start, end, n in history if start <= assigned and end > assigned)
            for assigned, _, _ in history
        )
        == 4
    )
