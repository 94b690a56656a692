"""At most one live copy of a trial: faults on real processes in network namespaces.

A master in the root namespace and two one-slot agents, each in its own namespace (its
"host"), reached over a bridge. A trial's rank appends a line to a shared file every 50 ms:
CLOCK_MONOTONIC, its pid, its agent. Every namespace shares the kernel's monotonic clock,
so the old run's last line and the replacement's first line are read on one clock: the
overlap (old last - new first) must be below zero, whatever the fault. The first run ignores
SIGTERM, so only the fence's SIGKILL ends it: the slowest path.

Faults, each on the agent that runs the trial, healed after HOLD_S:
- the agent process frozen (SIGSTOP, then SIGCONT): its main loop cannot fence anything;
- its link down (both directions);
- a blackhole route from the master to it (it can send, hears nothing);
- a blackhole route from it to the master (it hears, cannot send).
And a link that flaps (down 2 s, up 2 s) must cost nothing: no fence, no requeue.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cluster import AgentProcess
from tests.e2e import netns
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment
from tests.e2e.conftest import MasterProcess

pytestmark = [pytest.mark.e2e, pytest.mark.netns]

AGENT_IDS = ("host-a", "host-b")
HOLD_S = 16.0  # longer than lost_after_s (10 s): the replacement starts while the fault lasts
LOST_AFTER_S = 10.0
TBF_16KBIT = ("rate", "16kbit", "burst", "1600", "latency", "400ms")

TICK_SCRIPT = """
import os, signal, time
TICKS = %(ticks)r
agent = os.environ.get("DET_AGENT_ID", "?")
rerun = os.path.exists(TICKS) and os.path.getsize(TICKS) > 0
if not rerun:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends the first run
end = time.monotonic() + (%(rerun_s)s if rerun else %(first_s)s)
fd = os.open(TICKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
while time.monotonic() < end:
    os.write(fd, f"{time.monotonic():.3f} {os.getpid()} {agent}\\n".encode())
    time.sleep(0.05)
print("DONE", os.getpid(), agent, flush=True)
"""


@dataclass
class Cluster:
    master: MasterProcess
    net: netns.Topology
    agents: dict[str, AgentProcess]

    def host_of(self, agent_id: str) -> netns.Host:
        return self.net.hosts[AGENT_IDS.index(agent_id)]

    def diagnostics(self) -> str:
        parts = [f"--- master log ---\n{self.master.output()}"]
        parts += [f"--- agent {a.id} log ---\n{a.output()}" for a in self.agents.values()]
        return "\n".join(parts)


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    netns.require_netns()
    work = tmp_path_factory.mktemp("fencing")
    with ExitStack() as stack:
        net = stack.enter_context(netns.topology(netns.tag_for(request.node.nodeid)))
        master = MasterProcess(work / "data", label="fencing", host="0.0.0.0")
        master.extra_env["DET_MASTER_EXTERNAL_URL"] = f"http://{net.bridge_address}:{master.port}"
        master.extra_env["DET_MASTER_AGENT_LINK__LOST_AFTER_S"] = str(LOST_AFTER_S)
        stack.callback(shutil.rmtree, master.scratch, ignore_errors=True)
        stack.callback(master.stop)
        master.start()
        agents = {}
        for agent_id, host in zip(AGENT_IDS, net.hosts, strict=True):
            agent = AgentProcess(
                master,
                agent_id,
                work / agent_id,
                slots=1,
                netns=host.netns,
                master_address=f"{net.bridge_address}:{master.agent_port}",
            )
            stack.callback(agent.stop)
            stack.callback(lambda a=agent: signal_agent(a, signal.SIGCONT))  # never left frozen
            agents[agent_id] = agent.start()
        for agent in agents.values():
            agent.wait_connected()
        yield Cluster(master, net, agents)


def signal_agent(agent: AgentProcess, sig: signal.Signals) -> None:
    """The agent process alone (`ip netns exec` execs it: its pid is the agent's)."""
    agent.send(sig)


def restart_agent(agent: AgentProcess) -> None:
    if agent.proc is not None:
        agent.proc.wait(timeout=20)  # reaped, then started afresh with the same id
    agent.start()


def read_ticks(path: Path) -> list[tuple[float, int, str]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 3:  # a line cut by a SIGKILL mid-write is skipped
            rows.append((float(parts[0]), int(parts[1]), parts[2]))
    return rows


def start_ticking(cluster: Cluster, directory: Path, first_s: float) -> tuple[int, Path, str]:
    ticks = directory / "ticks"
    script = TICK_SCRIPT % {"ticks": str(ticks), "first_s": first_s, "rerun_s": 3}
    config, model = write_experiment(directory, script, slots=1)
    experiment_id = create_experiment(cluster.master, config, model)
    rows = cluster.master.wait_for("the first rank to tick", lambda: read_ticks(ticks), 60)
    return experiment_id, ticks, rows[0][2]


def ip(*args: str) -> Callable[[], None]:
    return lambda: netns.ip(*args) and None


FAULTS: dict[str, Callable[[Cluster, str], tuple[Callable[[], None], Callable[[], None]]]] = {
    "agent_sigstop": lambda c, a: (
        lambda: signal_agent(c.agents[a], signal.SIGSTOP),
        lambda: signal_agent(c.agents[a], signal.SIGCONT),
    ),
    "agent_sigkill": lambda c, a: (
        lambda: signal_agent(c.agents[a], signal.SIGKILL),
        lambda: restart_agent(c.agents[a]),
    ),
    "link_down": lambda c, a: (
        ip("-n", c.host_of(a).netns, "link", "set", c.host_of(a).mgmt, "down"),
        ip("-n", c.host_of(a).netns, "link", "set", c.host_of(a).mgmt, "up"),
    ),
    "blackhole_master_to_agent": lambda c, a: (
        ip("route", "add", "blackhole", f"{c.host_of(a).mgmt_address}/32"),
        ip("route", "del", "blackhole", f"{c.host_of(a).mgmt_address}/32"),
    ),
    "blackhole_agent_to_master": lambda c, a: (
        ip("-n", c.host_of(a).netns, "route", "add", "blackhole", f"{c.net.bridge_address}/32"),
        ip("-n", c.host_of(a).netns, "route", "del", "blackhole", f"{c.net.bridge_address}/32"),
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_trial_never_runs_twice(cluster: Cluster, tmp_path: Path, fault: str) -> None:
    master = cluster.master
    experiment_id, ticks, victim = start_ticking(cluster, tmp_path, first_s=300)
    survivor = next(a for a in AGENT_IDS if a != victim)
    inject, heal = FAULTS[fault](cluster, victim)

    faulted_at = time.monotonic()
    inject()
    try:
        rows = master.wait_for(
            "the trial to run again on the other agent",
            lambda: [r for r in read_ticks(ticks) if r[2] == survivor],
            LOST_AFTER_S + 20,
            0.1,
        )
        requeued_s = rows[0][0] - faulted_at
        time.sleep(max(0.0, faulted_at + HOLD_S - time.monotonic()))
    finally:
        heal()
    healed_at = time.monotonic()

    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR", "CANCELED"}, timeout=60)
    logs = trial_logs(master, trial["id"])
    assert trial["state"] == "COMPLETED", f"{trial}\n{logs}\n{cluster.diagnostics()}"
    assert trial["restarts"] == 0, trial  # neither an agent's loss nor a fence is the trial's fault
    # The healed agent comes back and can take work again.
    back = cluster.agents[victim].wait_connected(timeout=LOST_AFTER_S + 20)
    rejoined_s = time.monotonic() - healed_at

    rows = read_ticks(ticks)
    old = [t for t, _, agent in rows if agent == victim]
    new = [t for t, _, agent in rows if agent == survivor]
    overlap = max(old) - min(new)
    figures = {
        "fault": fault,
        "old_run_last_line_after_fault_s": round(max(old) - faulted_at, 3),
        "new_run_first_line_after_fault_s": round(requeued_s, 3),
        "overlap_s": round(overlap, 3),
        "restarts": trial["restarts"],
        "victim_reconnected_after_heal_s": round(rejoined_s, 3),
    }
    print(json.dumps(figures))
    assert overlap < 0, f"{figures}\n{cluster.diagnostics()}"
    # The fence fires before the master may requeue, and the master does within its window.
    assert max(old) - faulted_at < LOST_AFTER_S, figures
    assert requeued_s < LOST_AFTER_S + 5, figures
    assert len({pid for _, pid, _ in rows}) == 2, "exactly two runs"
    assert back["connected"] is True


def test_a_flapping_link_costs_nothing(cluster: Cluster, tmp_path: Path) -> None:
    """Down 2 s, up 2 s, for 16 s: under the fence's 6 s, so nothing may be lost."""
    master = cluster.master
    logged_before = {a.id: a.log.stat().st_size for a in cluster.agents.values()}
    experiment_id, ticks, victim = start_ticking(cluster, tmp_path, first_s=24)
    host = cluster.host_of(victim)
    stop = threading.Event()

    def flap() -> None:
        while not stop.is_set():
            netns.ip("-n", host.netns, "link", "set", host.mgmt, "down")
            stop.wait(2.0)
            netns.ip("-n", host.netns, "link", "set", host.mgmt, "up")
            stop.wait(2.0)

    flapper = threading.Thread(target=flap, daemon=True)
    flapper.start()
    time.sleep(16)
    stop.set()
    flapper.join()
    netns.ip("-n", host.netns, "link", "set", host.mgmt, "up")

    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR", "CANCELED"}, timeout=60)
    rows = read_ticks(ticks)
    logs = trial_logs(master, trial["id"])
    explain = f"{trial}\n{logs}\n{cluster.diagnostics()}"
    assert trial["state"] == "COMPLETED" and trial["restarts"] == 0, explain
    assert {agent for _, _, agent in rows} == {victim}, f"the trial moved\n{explain}"
    assert len({pid for _, pid, _ in rows}) == 1, explain
    with cluster.agents[victim].log.open("rb") as log:
        log.seek(logged_before[victim])
        assert b"fence:" not in log.read(), cluster.agents[victim].output()
    agent = master.api("GET", f"/api/v1/agents/{victim}")["agent"]
    assert agent["connected"] is True


def test_the_fence_kills_a_frozen_agents_ranks_by_itself(tmp_path: Path) -> None:
    """The fence process alone: a lease that runs out kills the guarded group (SIGTERM,
    then SIGKILL for one that ignores it); one whose pid was reused is spared."""
    from agent.fence import FenceProcess

    fence = FenceProcess()
    ignoring = _sleeper(ignore_term=True)
    reused = _sleeper(ignore_term=False)
    try:
        fence.renew(time.monotonic() + 1.0, kill_after=0.5)
        fence.guard(ignoring.pid)
        # A wrong start time: the fence must take it for another process and spare it.
        fence._send(f"guard {reused.pid} 1\n")
        started = time.monotonic()
        assert ignoring.wait(timeout=5) == -signal.SIGKILL
        took = time.monotonic() - started
        assert 1.4 <= took < 2.5, took  # lease 1 s, then SIGTERM ignored, SIGKILL 0.5 s later
        assert reused.poll() is None
    finally:
        fence.close()
        for proc in (ignoring, reused):
            proc.kill()
            proc.wait()


def _sleeper(*, ignore_term: bool) -> subprocess.Popen[bytes]:
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "time.sleep(60)\n"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_a_master_down_longer_than_the_fence_costs_no_trial_a_restart(
    cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL the master and keep it down 9 s (past the 6 s fence): the agents' probes are
    refused (nothing listens), so the lease holds and the ranks run on."""
    master = cluster.master
    experiment_id, ticks, _ = start_ticking(cluster, tmp_path, first_s=20)
    master.kill()
    time.sleep(9)
    master.start()

    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR", "CANCELED"}, timeout=60)
    rows = read_ticks(ticks)
    logs = trial_logs(master, trial["id"])
    assert trial["state"] == "COMPLETED" and trial["restarts"] == 0, f"{trial}\n{logs}"
    assert len({pid for _, pid, _ in rows}) == 1, "the same rank ran to the end"
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(rows)]
    assert max(gaps) < 1.0, "the rank ticked all along"
    for agent in cluster.agents.values():
        agent.wait_connected()


def test_a_slow_link_leaves_the_agent_healthy_or_fenced_never_both(
    cluster: Cluster, tmp_path: Path
) -> None:
    """16 kbit/s on the agent's link (tbf; netem is missing here) for 15 s: whatever the
    master decides, the trial never runs in two places."""
    master = cluster.master
    experiment_id, ticks, victim = start_ticking(cluster, tmp_path, first_s=25)
    host = cluster.host_of(victim)
    tc = ["tc", "-n", host.netns, "qdisc"]
    subprocess.run(
        [*tc, "add", "dev", host.mgmt, "root", "tbf", *TBF_16KBIT],
        check=True,
    )
    try:
        time.sleep(15)
        scrape = master.http("GET", "/metrics").text  # a user's token opens the scrape
    finally:
        subprocess.run([*tc, "del", "dev", host.mgmt, "root"], check=True)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR", "CANCELED"}, timeout=90)
    rows = read_ticks(ticks)
    runs = {pid for _, pid, _ in rows}
    round_trip = re.search(
        rf'resolute_agent_heartbeat_round_trip_seconds{{agent="{victim}"}} (\S+)', scrape
    )
    figures = {
        "fault": "slow_link_16kbit",
        "runs": len(runs),
        "victim_last_round_trip_s": round(float(round_trip.group(1)), 3) if round_trip else None,
        "restarts": trial["restarts"],
    }
    if len(runs) > 1:
        old = [t for t, _, agent in rows if agent == victim]
        new = [t for t, _, agent in rows if agent != victim]
        figures["overlap_s"] = round(max(old) - min(new), 3)
    print(json.dumps(figures))
    assert trial["state"] == "COMPLETED" and trial["restarts"] == 0, figures
    assert len(runs) == 1 or figures["overlap_s"] < 0, figures
    cluster.agents[victim].wait_connected(timeout=LOST_AFTER_S + 20)
