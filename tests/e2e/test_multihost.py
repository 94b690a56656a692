"""Two agents on two "hosts" (network namespaces) run one Gloo gang across them.

The master listens on every address; the namespaces reach it over a bridge in the root
namespace (their management link), and talk to each other over a direct veth pair (the
fast link). Interface names are chosen per test so that the master's rule for the dtrain
interface (master.core.interfaces) either picks the fast link by itself, is told to by
`environment.dtrain_network_interface`, or finds no name common to both hosts. The byte
counters of the links show which one the all-reduce really crossed.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import AgentProcess
from tests.e2e import netns
from tests.e2e.agents import (
    create_experiment,
    trial_logs,
    trial_of,
    wait_trial_state,
    write_experiment,
)
from tests.e2e.conftest import MasterProcess, ok

pytestmark = [pytest.mark.e2e, pytest.mark.netns]

AGENT_IDS = ("host-a", "host-b")  # host-a sorts first, so it is the chief (rank 0)
SLOTS_PER_AGENT = 1
ELEMENTS = 4 * 1024 * 1024  # float32: 16 MiB per tensor
TENSOR_BYTES = ELEMENTS * 4
ITERATIONS = 3

ALLREDUCE_SCRIPT = f"""
import datetime, json, os, sys
keys = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME", "DET_AGENT_ID", "DET_MASTER", "DET_INTER_NODE_NETWORK_INTERFACE"]
print("ENV " + json.dumps({{k: os.environ.get(k) for k in keys}}, sort_keys=True), flush=True)
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
rank, world = dist.get_rank(), dist.get_world_size()
for _ in range({ITERATIONS}):
    tensor = torch.full(({ELEMENTS},), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(tensor)
expected = world * (world + 1) / 2
right = bool(torch.all(tensor == expected))
print(f"ALLREDUCE rank={{rank}} world={{world}} first={{tensor[0].item()}} "
      f"expected={{expected}} right={{right}}", flush=True)
dist.destroy_process_group()
sys.exit(0 if right else 1)
"""

NEVER_RUNS_SCRIPT = """
print("RANK STARTED", flush=True)
"""


@pytest.fixture(autouse=True)
def prerequisites() -> None:
    netns.require_netns_and_torch()


@dataclass
class Cluster:
    master: MasterProcess
    net: netns.Topology
    agents: list[AgentProcess]

    def diagnostics(self) -> str:
        parts = [f"--- master log ---\n{self.master.output()}"]
        parts += [f"--- agent {a.id} log ---\n{a.output()}" for a in self.agents]
        return "\n".join(parts)

    def snapshot(self) -> dict[tuple[int, str], dict[str, int]]:
        """Byte counters of both links of both hosts."""
        return {
            (i, name): self.net.counters(i, name)
            for i, host in enumerate(self.net.hosts)
            for name in (host.mgmt, host.fast)
        }


@contextmanager
def two_host_cluster(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    *,
    mgmt_names: tuple[str, str],
    fast_names: tuple[str, str],
) -> Iterator[Cluster]:
    """Network, master and one agent per namespace; all of it removed afterwards, in
    reverse order (agents, master, network), whatever happened."""
    with ExitStack() as stack:
        net = stack.enter_context(
            netns.topology(
                netns.tag_for(request.node.nodeid), mgmt_names=mgmt_names, fast_names=fast_names
            )
        )
        master = MasterProcess(tmp_path / "data", label="multihost", host="0.0.0.0")
        master.extra_env["DET_MASTER_EXTERNAL_URL"] = f"http://{net.bridge_address}:{master.port}"
        stack.callback(shutil.rmtree, master.scratch, ignore_errors=True)
        stack.callback(master.stop)
        master.start()
        agents = []
        for agent_id, host in zip(AGENT_IDS, net.hosts, strict=True):
            agent = AgentProcess(
                master,
                agent_id,
                tmp_path / agent_id,
                slots=SLOTS_PER_AGENT,
                netns=host.netns,
                master_address=f"{net.bridge_address}:{master.agent_port}",
            )
            stack.callback(agent.stop)
            agents.append(agent.start())
        for agent in agents:
            agent.wait_connected()
        yield Cluster(master, net, agents)
    assert not net.leftovers(), net.leftovers()


def rank_lines(logs: str, marker: str) -> list[dict[str, Any]]:
    if marker == "ENV":
        found = [json.loads(m) for m in re.findall(r"^ENV (\{.*\})$", logs, re.M)]
        return sorted(found, key=lambda e: int(e["RANK"]))
    pattern = r"^ALLREDUCE rank=(\d+) world=(\d+) first=(\S+) expected=(\S+) right=(\w+)$"
    results = [
        {"rank": int(r), "world": int(w), "first": float(f), "expected": float(e), "right": v}
        for r, w, f, e, v in re.findall(pattern, logs, re.M)
    ]
    return sorted(results, key=lambda r: r["rank"])


def run_allreduce(
    cluster: Cluster, tmp_path: Path, extra: dict[str, Any] | None = None
) -> tuple[str, dict[tuple[int, str], dict[str, int]]]:
    """Run the all-reduce trial over both agents; its logs and the bytes each link moved."""
    world = SLOTS_PER_AGENT * len(AGENT_IDS)
    config, model = write_experiment(tmp_path, ALLREDUCE_SCRIPT, slots=world, extra=extra)
    before = cluster.snapshot()
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, {"COMPLETED", "ERROR"}, timeout=240)
    after = cluster.snapshot()
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", f"{logs}\n{cluster.diagnostics()}"

    results = rank_lines(logs, "ALLREDUCE")
    assert [r["rank"] for r in results] == list(range(world)), logs
    for result in results:
        assert result["world"] == world, result
        assert result["right"] == "True", result
        assert result["first"] == result["expected"] == world * (world + 1) / 2, result
    moved = {key: netns.difference(after[key], before[key]) for key in after}
    print_figures(moved)
    return logs, moved


def print_figures(moved: dict[tuple[int, str], dict[str, int]]) -> None:
    """Shown with `pytest -s` (and kept in the captured output of a failure)."""
    for (index, name), delta in sorted(moved.items()):
        print(
            f"{AGENT_IDS[index]} {name}: rx {delta['rx_bytes']:,} B, tx {delta['tx_bytes']:,} B "
            f"({delta['rx_packets']:,}/{delta['tx_packets']:,} packets)"
        )


def assert_traffic_crossed(
    net: netns.Topology, moved: dict[tuple[int, str], dict[str, int]], fast: str
) -> None:
    """`fast` carried the tensors both ways on both hosts; the management link far less.

    Any all-reduce algorithm must move at least 2 (n - 1) / n times the tensor in and out
    of each of n ranks: with one rank per host, the whole tensor each way per iteration.
    """
    least = ITERATIONS * TENSOR_BYTES * 2 * (len(AGENT_IDS) - 1) // len(AGENT_IDS)
    for index, host in enumerate(net.hosts):
        assert fast in (host.fast, host.mgmt)
        other = host.mgmt if fast == host.fast else host.fast
        on_fast, on_other = moved[(index, fast)], moved[(index, other)]
        for direction in ("rx_bytes", "tx_bytes"):
            assert on_fast[direction] >= least, (
                f"{AGENT_IDS[index]} {fast} {direction}: {on_fast[direction]:,} B, less than "
                f"{ITERATIONS} all-reduces of a {TENSOR_BYTES:,} B tensor; all links: {moved}"
            )
        fast_total = on_fast["rx_bytes"] + on_fast["tx_bytes"]
        other_total = on_other["rx_bytes"] + on_other["tx_bytes"]
        assert other_total < fast_total / 10, (
            f"{AGENT_IDS[index]}: {other} moved {other_total:,} B against {fast_total:,} B "
            f"on {fast}; all links: {moved}"
        )


def assert_rendezvous(
    logs: str, net: netns.Topology, interface: str, master_url: str
) -> list[dict[str, Any]]:
    envs = rank_lines(logs, "ENV")
    world = SLOTS_PER_AGENT * len(AGENT_IDS)
    assert [e["RANK"] for e in envs] == [str(r) for r in range(world)], logs
    chief = net.hosts[0]
    chief_address = chief.fast_address if interface == chief.fast else chief.mgmt_address
    for env in envs:
        assert env["WORLD_SIZE"] == str(world), env
        assert env["MASTER_ADDR"] == chief_address, env
        assert int(env["MASTER_PORT"]) > 0, env
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == interface, env
        assert env["DET_INTER_NODE_NETWORK_INTERFACE"] == interface, env
        assert env["DET_MASTER"] == master_url, env
    assert [e["DET_AGENT_ID"] for e in envs] == [
        agent for agent in AGENT_IDS for _ in range(SLOTS_PER_AGENT)
    ]
    return envs


def test_gloo_allreduce_crosses_the_configured_fast_link(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # eth0 is what the automatic rule would pick (eth* before anything but ib*); the
    # experiment names fast0 instead.
    with two_host_cluster(
        request, tmp_path, mgmt_names=("eth0", "eth0"), fast_names=("fast0", "fast0")
    ) as cluster:
        logs, moved = run_allreduce(
            cluster, tmp_path, extra={"environment": {"dtrain_network_interface": "fast0"}}
        )
        master_url = f"http://{cluster.net.bridge_address}:{cluster.master.port}"
        assert_rendezvous(logs, cluster.net, "fast0", master_url)
        assert cluster.net.hosts[0].fast_address == f"198.19.{netns.worker_subnet()}.2"
        assert_traffic_crossed(cluster.net, moved, "fast0")


def test_the_automatic_choice_picks_the_rule_s_interface(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Common to both hosts: mgmt0 and eth1 (lo never counts); eth* is preferred.
    with two_host_cluster(
        request, tmp_path, mgmt_names=("mgmt0", "mgmt0"), fast_names=("eth1", "eth1")
    ) as cluster:
        logs, moved = run_allreduce(cluster, tmp_path)
        master_url = f"http://{cluster.net.bridge_address}:{cluster.master.port}"
        assert_rendezvous(logs, cluster.net, "eth1", master_url)
        assert_traffic_crossed(cluster.net, moved, "eth1")


def test_no_common_interface_is_reported_as_the_reason(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with two_host_cluster(
        request, tmp_path, mgmt_names=("ma0", "mb0"), fast_names=("fa0", "fb0")
    ) as cluster:
        master = cluster.master
        world = SLOTS_PER_AGENT * len(AGENT_IDS)
        config, model = write_experiment(tmp_path, NEVER_RUNS_SCRIPT, slots=world)
        experiment_id = create_experiment(master, config, model)
        trial_id = master.wait_for(
            "the trial to be created", lambda: trial_of(master, experiment_id)
        )["id"]

        def blocked() -> dict[str, Any] | None:
            summaries = master.api("GET", "/api/v1/tasks")["allocationIdToSummary"]
            for summary in summaries.values():
                reason = summary.get("pendingReason") or {}
                if (
                    summary.get("trialId") == trial_id
                    and reason.get("code") == "NO_COMMON_INTERFACE"
                ):
                    return dict(summary)
            return None

        summary = master.wait_for(
            "the allocation to show NO_COMMON_INTERFACE in GET /api/v1/tasks", blocked, 120
        )
        message = summary["pendingReason"]["message"]
        assert "host-a" in message and "host-b" in message, summary
        assert "dtrain_network_interface" in message, summary
        # It holds both agents' slots but never started a rank.
        placed = {agent for r in summary["resources"] or [] for agent in r["agentDevices"]}
        assert placed == set(AGENT_IDS), summary
        trial = trial_of(master, experiment_id)
        assert trial["state"].removeprefix("STATE_") not in ("RUNNING", "COMPLETED"), trial
        assert "RANK STARTED" not in trial_logs(master, trial_id)

        ok(master.det("experiment", "kill", str(experiment_id)))
        # Nothing runs, so there is nothing to wait for (no rank to stop, no grace period):
        # the deadline only leaves a loaded machine room.
        done = wait_trial_state(
            master, experiment_id, {"CANCELED", "ERROR", "COMPLETED"}, timeout=60
        )
        assert done["state"] == "CANCELED", f"{done}\n{cluster.diagnostics()}"
        assert "RANK STARTED" not in trial_logs(master, trial_id)
        master.wait_for(
            "the allocation to leave GET /api/v1/tasks",
            lambda: all(
                s.get("trialId") != trial_id
                for s in master.api("GET", "/api/v1/tasks")["allocationIdToSummary"].values()
            ),
            60,
        )
