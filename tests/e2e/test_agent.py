"""Real det-master and det-agent processes over loopback: registration, refusal, launch,
gang failure, agent loss, master restart, metrics. Agents offer artificial CPU slots."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.cluster import AgentProcess
from tests.e2e.agents import (
    create_experiment,
    pid_alive,
    trial_logs,
    wait_trial_state,
    write_experiment,
)
from tests.e2e.conftest import BACKENDS, MasterProcess, running_master

pytestmark = pytest.mark.e2e


@pytest.fixture(params=BACKENDS)
def cluster_master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    with running_master(request, tmp_path_factory, "agents") as proc:
        yield proc


@pytest.fixture
def sqlite_master(tmp_path: Path) -> Iterator[MasterProcess]:
    proc = MasterProcess(tmp_path / "data", label="agents-sqlite")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.stop()


def start_agent(
    master: MasterProcess, agents: list[AgentProcess], tmp_path: Path, agent_id: str, **kw: object
) -> AgentProcess:
    agent = AgentProcess(master, agent_id, tmp_path / agent_id, **kw)  # type: ignore[arg-type]
    agents.append(agent.start())
    return agent


ENV_SCRIPT = """
import json, os, urllib.request
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "DET_TRIAL_ID",
        "DET_EXPERIMENT_ID", "DET_SLOT_IDS", "DET_AGENT_ID", "CUDA_VISIBLE_DEVICES",
        "DET_GLOBAL_BATCH_SIZE", "DET_PER_SLOT_BATCH_SIZE", "DET_TRIAL_SEED", "MY_VAR"]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}, sort_keys=True))
print("JOIN_TOKEN_LEAKED" if any("JOIN" in k for k in os.environ) else "no join token")
request = urllib.request.Request(os.environ["DET_MASTER"] + "/api/v1/me",
    headers={"Authorization": "Bearer " + os.environ["DET_SESSION_TOKEN"]})
print("ME " + json.loads(urllib.request.urlopen(request).read())["user"]["username"])
print("TOKEN " + os.environ["DET_SESSION_TOKEN"])  # only so the test can try it afterwards
"""


def rank_envs(logs: str) -> list[dict[str, str]]:
    import json

    found = [json.loads(m) for m in re.findall(r"^ENV (\{.*\})$", logs, re.M)]
    return sorted(found, key=lambda e: int(e["RANK"]))


def test_agent_registers_runs_a_gang_and_reports_metrics(
    cluster_master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    master = cluster_master
    agent = start_agent(master, agents, tmp_path, "alpha", slots=2)
    registered = agent.wait_connected()
    assert [s["device"]["type"] for s in registered["slots"].values()] == ["TYPE_CPU"] * 2

    config, model = write_experiment(
        tmp_path,
        ENV_SCRIPT,
        slots=2,
        extra={
            "hyperparameters": {"global_batch_size": 64},
            "environment": {"environment_variables": ["MY_VAR=hello", "RANK=99"]},
        },
    )
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    logs = trial_logs(master, trial["id"])
    assert trial["state"] == "COMPLETED", logs
    envs = rank_envs(logs)
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert [e["DET_SLOT_IDS"] for e in envs] == ["[0]", "[1]"]
    for env in envs:
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
        assert env["DET_TRIAL_ID"] == str(trial["id"])
        assert env["DET_EXPERIMENT_ID"] == str(experiment_id)
        assert env["DET_AGENT_ID"] == "alpha"
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # CPU slots hide every GPU
        assert env["DET_GLOBAL_BATCH_SIZE"] == "64" and env["DET_PER_SLOT_BATCH_SIZE"] == "32"
        assert env["DET_TRIAL_SEED"] == str(trial["seed"])
        assert env["MY_VAR"] == "hello"
    assert logs.count("ME determined") == 2  # DET_SESSION_TOKEN works against the API
    # ... while the trial runs, and no longer once it has ended.
    token = re.findall(r"^TOKEN (\S+)$", logs, re.M)[0]
    me = httpx.get(
        f"{master.url}/api/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    assert me.status_code == 401
    assert "JOIN_TOKEN_LEAKED" not in logs

    samples = master.wait_for(
        "agent metrics to be stored",
        lambda: master.api("GET", "/api/v1/agents/alpha/metrics")["samples"][1:],
    )
    assert samples[-1]["memory_free"] > 0
    assert 0 <= samples[-1]["cpu_util_simple"] <= 100


def test_agent_without_the_join_token_is_refused(
    sqlite_master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    master = sqlite_master
    intruder = start_agent(master, agents, tmp_path, "intruder", join_token="not-the-token")
    assert intruder.proc is not None
    assert intruder.proc.wait(timeout=30) == 3
    assert "refused" in intruder.output() and "join token" in intruder.output()
    assert master.http("GET", "/api/v1/agents/intruder").status_code == 404

    tokenless = start_agent(master, agents, tmp_path, "tokenless", join_token="")
    assert tokenless.proc is not None
    assert tokenless.proc.wait(timeout=30) == 2
    assert "no join token" in tokenless.output()


FAIL_SCRIPT = """
import os, sys, time
print("PID", os.environ["RANK"], os.getpid(), flush=True)
if os.environ["RANK"] == "3":
    time.sleep(1)
    sys.exit(1)
time.sleep(120)
"""


def test_a_failing_rank_stops_the_gang_on_every_agent_and_the_trial_restarts(
    sqlite_master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    master = sqlite_master
    for name in ("left", "right"):
        start_agent(master, agents, tmp_path, name, slots=2).wait_connected()
    config, model = write_experiment(tmp_path, FAIL_SCRIPT, slots=4, max_restarts=1)
    started = time.monotonic()
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"ERROR", "COMPLETED"}, timeout=240)
    elapsed = time.monotonic() - started
    logs = trial_logs(master, trial["id"])
    assert trial["state"] == "ERROR", logs
    assert trial["restarts"] == 2, trial  # the first failure restarted it; the second ended it
    # Every other rank was stopped long before its 120 s sleep ended: had the first run's
    # ranks slept on, it alone would have taken 120 s. (Both runs take seconds idle; the
    # bound leaves a loaded machine room for two launches of four ranks.)
    assert elapsed < 100, f"both runs took {elapsed:.1f}s\n{logs}"
    pids = [int(p) for p in re.findall(r"^PID \d+ (\d+)$", logs, re.M)]
    assert len(pids) == 8, logs  # 4 ranks, 2 runs
    assert not [p for p in pids if pid_alive(p)]
    assert "rank 3 exited with code 1" in logs
    for name in ("left", "right"):
        assert f"[agent {name}] stopping" in logs or f"[agent {name}] rank 3 exited" in logs


LONG_FIRST_RUN = """
import os, time
print("PID", os.environ["DET_AGENT_ID"], os.getpid(), flush=True)
if os.environ["DET_TRIAL_RUN_ID"] == "1":
    time.sleep(300)
"""


def run_on_one_of_two(
    master: MasterProcess, agents: list[AgentProcess], tmp_path: Path, names: tuple[str, str]
) -> tuple[dict[str, AgentProcess], int, dict[str, Any], re.Match[str]]:
    """Two one-slot agents and a one-slot trial whose first run sleeps: returns the agents
    by id, the experiment id, the trial, and the rank's "PID <agent> <pid>" line."""
    by_id = {}
    for name in names:
        by_id[name] = start_agent(master, agents, tmp_path, name, slots=1)
        by_id[name].wait_connected()
    config, model = write_experiment(tmp_path, LONG_FIRST_RUN, slots=1)
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"RUNNING"})
    line: re.Match[str] = master.wait_for(
        "the rank to print its pid",
        lambda: re.search(r"^PID (\w+) (\d+)$", trial_logs(master, trial["id"]), re.M),
    )
    return by_id, experiment_id, trial, line


def test_a_killed_agent_has_its_trial_requeued_elsewhere(
    sqlite_master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    master = sqlite_master
    by_id, experiment_id, trial, line = run_on_one_of_two(
        master, agents, tmp_path, ("first", "second")
    )
    victim, rank_pid = line.group(1), int(line.group(2))
    survivor = "second" if victim == "first" else "first"

    by_id[victim].kill()
    killed_at = time.monotonic()
    # The rank sleeps 300 s: gone within this, it died with its agent (pdeathsig).
    master.wait_for("the rank to die with its agent", lambda: not pid_alive(rank_pid), timeout=30)

    def rerun_started() -> bool:
        logs = trial_logs(master, trial["id"])
        return f"PID {survivor} " in logs

    master.wait_for("the trial to run on the other agent", rerun_started, timeout=120)
    requeued_after = time.monotonic() - killed_at
    print(f"kill -9 to the rank running on the other agent: {requeued_after:.1f}s")
    # Requeued because the agent was lost (its 10 s window), not for any other reason ...
    released = rf"allocation {trial['id']}\.\d+ released: agent_lost agent {victim} lost \(no"
    assert re.search(released, master.log.read_text(errors="replace")), master.output()
    # ... and as soon as that window ran out: 10 s, then a pass and a launch, which take a
    # second or two idle and several seconds more on a loaded machine.
    assert requeued_after < 10 + 15, f"requeued and restarted after {requeued_after:.1f}s"
    done = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    assert done["state"] == "COMPLETED"
    assert done["restarts"] == 0  # an agent loss is not the trial's fault
    agent = master.api("GET", f"/api/v1/agents/{victim}")["agent"]
    assert agent["connected"] is False


# Runs until the test lets it finish (the file `go` appears): still running once the master
# is back, however long its restart took.
RESTART_SCRIPT = """
import os, pathlib, time
print("PID", os.getpid(), flush=True)
go = pathlib.Path(%(go)r)
deadline = time.monotonic() + 300
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
print("finished" if go.exists() else "never told to finish", flush=True)
"""


def test_ranks_survive_a_master_restart(
    sqlite_master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    """With the default lost_after_s: however long the restart takes, the agent port refuses
    connections meanwhile, and a refusal keeps the ranks' lease (agent/link.py)."""
    master = sqlite_master
    agent = start_agent(master, agents, tmp_path, "steady", slots=1)
    agent.wait_connected()
    go = tmp_path / "go"
    config, model = write_experiment(tmp_path, RESTART_SCRIPT % {"go": str(go)}, slots=1)
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"RUNNING"})
    line = master.wait_for(
        "the rank to start",
        lambda: re.search(r"^PID (\d+)$", trial_logs(master, trial["id"]), re.M),
    )
    rank_pid = int(line.group(1))

    master.stop()
    time.sleep(1)  # the master stays down a moment: the fault under test
    master.start()

    assert pid_alive(rank_pid), "the rank did not live through the master's restart"
    agent.wait_connected()
    go.write_text("go\n")
    done = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    logs = trial_logs(master, trial["id"])
    assert done["state"] == "COMPLETED", logs
    assert done["restarts"] == 0
    assert logs.count("PID ") == 1  # the same process ran to the end
    assert "finished" in logs


SLEEPER = """
import os, time
print("PID", os.getpid(), flush=True)
time.sleep(300)
"""


def test_pause_activate_and_kill_reach_the_running_ranks(
    sqlite_master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    master = sqlite_master
    start_agent(master, agents, tmp_path, "worker", slots=1).wait_connected()
    config, model = write_experiment(tmp_path, SLEEPER, slots=1)
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"RUNNING"})

    def pids() -> list[int]:
        return [int(p) for p in re.findall(r"^PID (\d+)$", trial_logs(master, trial["id"]), re.M)]

    first = master.wait_for("the first run to start", pids)[0]
    assert master.det("experiment", "pause", str(experiment_id)).returncode == 0
    paused = wait_trial_state(master, experiment_id, {"PAUSED"})
    assert paused["restarts"] == 0  # a pause is not a failure
    # SIGTERM, SIGKILL 10 s later at worst; the rank would sleep on for 300 s.
    master.wait_for("the paused rank to be stopped", lambda: not pid_alive(first), timeout=60)

    assert master.det("experiment", "activate", str(experiment_id)).returncode == 0
    wait_trial_state(master, experiment_id, {"RUNNING"})
    second = master.wait_for("the second run to start", lambda: pids()[1:])[0]
    assert second != first

    assert master.det("experiment", "kill", str(experiment_id)).returncode == 0
    killed = wait_trial_state(master, experiment_id, {"CANCELED", "ERROR", "COMPLETED"})
    assert killed["state"] == "CANCELED"
    master.wait_for("the killed rank to be stopped", lambda: not pid_alive(second), timeout=60)


def test_a_second_agent_with_the_same_id_is_refused(
    sqlite_master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    master = sqlite_master
    start_agent(master, agents, tmp_path, "twin", slots=1).wait_connected()
    impostor = AgentProcess(master, "twin", tmp_path / "twin-2", slots=1)
    agents.append(impostor.start())
    assert impostor.proc is not None
    assert impostor.proc.wait(timeout=30) == 3
    assert "already connected from another process" in impostor.output()
    assert master.api("GET", "/api/v1/agents/twin")["agent"]["connected"] is True


def test_a_stopping_agent_hands_its_trial_on_without_a_restart(
    sqlite_master: MasterProcess, agents: list[AgentProcess], tmp_path: Path
) -> None:
    master = sqlite_master
    by_id, experiment_id, trial, line = run_on_one_of_two(
        master, agents, tmp_path, ("leaving", "staying")
    )
    first_agent = line.group(1)
    other = "staying" if first_agent == "leaving" else "leaving"
    stopped_at = time.monotonic()
    by_id[first_agent].stop()  # SIGTERM: a clean shutdown
    master.wait_for(
        "the trial to move to the other agent",
        lambda: f"PID {other} " in trial_logs(master, trial["id"]),
        timeout=120,
    )
    moved_after = time.monotonic() - stopped_at
    print(f"SIGTERM to the agent -> the trial runs on the other one: {moved_after:.1f}s")
    # The agent reported how its ranks ended, so the trial moved on that report, not when the
    # 10 s lost-agent window ran out (which is what the master's log would say otherwise).
    log = master.log.read_text(errors="replace")
    released = rf"allocation {trial['id']}\.\d+ released: agent_lost ranks stopped by their agent"
    found = re.search(released, log)
    assert found, master.output()
    assert f"agent {first_agent} lost (no heartbeat" not in log, master.output()
    # Out of the scheduler's choice by that report's commit, so the trial was never placed
    # on it again in the moment before its stream closed.
    taken_out = log.find(f"master.services.agents: agent {first_agent} disconnected")
    assert 0 <= taken_out < found.start(), master.output()
    starts = re.findall(rf"allocation {trial['id']}\.\d+ starting .* on (\S+), rendezvous", log)
    assert starts.count(first_agent) == 1, starts
    done = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    assert (done["state"], done["restarts"]) == ("COMPLETED", 0)
