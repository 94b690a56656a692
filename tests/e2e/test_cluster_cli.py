"""`det task|agent|slot|job|resource-pool` against a real master whose agents are simulated.

Two simulated 4-slot agents register through the agent service (tests/simulated.py), three
one-trial experiments ask for 2, 6 and 8 slots per trial, and the master's own scheduler loop
places them: the 2-slot trial shares an agent, 6 can never be placed (not a multiple of 4) and 8
waits for both agents to be idle. Our CLI and Determined's official 0.38.1 client then show it.

The module runs its own master per backend rather than the shared `master` fixture: agents
registered there would take the queued trials other modules leave behind (and those modules
assume no agent ever runs their trials), so neither side could predict a placement.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cli.cluster import AGENT_HEADERS, JOB_HEADERS, SLOT_HEADERS, TASK_HEADERS
from harness.cluster import wait_until
from tests.conftest import require
from tests.e2e.conftest import (
    BACKENDS,
    MasterProcess,
    describe_run,
    lines,
    official_client_path,
    ok,
    running_master,
    unique,
)
from tests.factories import EXPERIMENT_YAML
from tests.simulated import register_simulated_agents_sync, release_sync

pytestmark = pytest.mark.e2e

T = TypeVar("T")
SLOTS_PER_AGENT = 4
# For the scheduler's next passes to show a change (0.5 s apart idle): generous, since a
# loaded machine at half speed is slower at everything and a deadline costs nothing when
# all goes well.
WAIT_S = 60.0


# -- helpers ---------------------------------------------------------------------------------


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = WAIT_S) -> T:
    """The harness's wait (the scheduler runs every 0.5 s), at this file's deadline."""
    return wait_until(what, probe, timeout, interval=0.1)


def parse_json(result: subprocess.CompletedProcess[str]) -> Any:
    ok(result)
    assert "Traceback" not in result.stderr, describe_run(result)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"stdout is not pure JSON ({exc})\n{describe_run(result)}") from None


def rich_table(text: str, headers: list[str]) -> list[dict[str, str]]:
    """Rows of one of our tables (cells never wrap; a continuation line would be joined to its
    row's cells by spaces).

    Headers are bottom-aligned, so the header line holding the first header has the last word
    of every header; a column starts where text follows at least two spaces (the padding). A
    row starts on a line with text in the first column (ids never wrap). A blank line ends
    the table (what follows, such as `det job list`'s quotas, is not a row).
    """
    all_lines = text.splitlines()
    header_at = next(i for i, line in enumerate(all_lines) if line.lstrip().startswith(headers[0]))
    header = all_lines[header_at]
    starts = [len(header) - len(header.lstrip())]
    starts += [m.end() for m in re.finditer(r"\S {2,}(?=\S)", header)]
    assert len(starts) == len(headers), f"cannot find the columns {headers} in:\n{text}"
    spans = list(zip(starts, [*starts[1:], None], strict=True))
    rows: list[list[list[str]]] = []
    for line in all_lines[header_at + 1 :]:
        if not line.strip():
            break
        cells = [line[a:b].strip() for a, b in spans]
        if cells[0]:
            rows.append([[cell] for cell in cells])
        elif rows:
            for parts, cell in zip(rows[-1], cells, strict=True):
                if cell:
                    parts.append(cell)
    return [
        {name: " ".join(parts) for name, parts in zip(headers, row, strict=True)} for row in rows
    ]


def presto_table(text: str, first: str) -> list[dict[str, str]]:
    """Rows of the official client's `tabulate` (presto) tables."""
    rows = [[c.strip() for c in line.split("|")] for line in lines(text) if "|" in line]
    header_at = next(i for i, row in enumerate(rows) if row and row[0] == first)
    headers = rows[header_at]
    return [dict(zip(headers, row, strict=True)) for row in rows[header_at + 1 :]]


def config(slots: int, name: str) -> str:
    """One trial asking for `slots`; a batch size every slot count here divides."""
    text = EXPERIMENT_YAML.replace("max_trials: 3", "max_trials: 1").replace(
        "global_batch_size: 64", "global_batch_size: 48"
    )
    assert "max_trials: 1" in text and "global_batch_size: 48" in text
    return text.replace("name: mnist-random", f"name: {name}") + (
        f"resources:\n  slots_per_trial: {slots}\n"
    )


@dataclass
class Cluster:
    master: MasterProcess
    agents: tuple[str, str]
    experiments: dict[int, int] = field(default_factory=dict)  # slots per trial -> experiment id
    submits: dict[int, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def register(self, agents: list[tuple[str, int]]) -> None:
        register_simulated_agents_sync(self.master.db_url, agents, data_dir=self.master.data_dir)

    def release(self, allocation_id: str, outcome: str = "completed") -> None:
        release_sync(
            self.master.db_url,
            allocation_id,
            outcome,
            "simulated exit",
            data_dir=self.master.data_dir,
        )

    def tasks(self) -> dict[str, dict[str, Any]]:
        summaries: dict[str, dict[str, Any]] = self.master.api("GET", "/api/v1/tasks")[
            "allocationIdToSummary"
        ]
        return summaries

    def task_of(self, slots: int) -> dict[str, Any] | None:
        """The live allocation of the experiment asking for `slots`, if any."""
        experiment_id = self.experiments[slots]
        found = [t for t in self.tasks().values() if t["experimentId"] == experiment_id]
        assert len(found) <= 1, found
        return found[0] if found else None

    def must(self, slots: int) -> dict[str, Any]:
        task = self.task_of(slots)
        assert task is not None, f"no live allocation for the {slots}-slot experiment"
        return task

    def placed(self, slots: int) -> dict[str, Any] | None:
        task = self.task_of(slots)
        return task if task is not None and task["resources"] else None

    def pending_with(self, slots: int, code: str) -> dict[str, Any] | None:
        task = self.task_of(slots)
        if task is None or task["resources"] is not None:
            return None
        reason = task["pendingReason"] or {}
        return task if reason.get("code") == code else None


def agents_of(task: dict[str, Any]) -> list[str]:
    return sorted(agent for r in task["resources"] or [] for agent in r["agentDevices"])


# -- the cluster -----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A master of its own, two idle 4-slot agents, and 2-, 6- and 8-slot trials submitted."""
    with running_master(request, tmp_path_factory, "cluster") as master:
        yield from _cluster_on(master)


def _cluster_on(master: MasterProcess) -> Iterator[Cluster]:
    try:
        agents = (unique("sim-a"), unique("sim-b"))
        assert agents[0] < agents[1]
        state = Cluster(master, agents)
        state.register([(a, SLOTS_PER_AGENT) for a in agents])
        wait_for(
            "both agents listed",
            lambda: len(master.api("GET", "/api/v1/agents")["agents"]) == 2 or None,
        )
        files = Path(master.scratch)
        for slots in (2, 6, 8):
            path = files / f"slots-{slots}.yaml"
            path.write_text(config(slots, f"cluster-{slots}"), encoding="utf-8")
            result = ok(master.det("experiment", "create", str(path)))
            state.submits[slots] = result
            state.experiments[slots] = int(lines(result.stdout)[-1].split()[-1])
            if slots == 2:  # placed before the gang arrives, so the gang must wait
                wait_for("the 2-slot trial placed", lambda: state.placed(2))
        wait_for("6 slots: NEVER_FITS", lambda: state.pending_with(6, "NEVER_FITS"))
        wait_for("8 slots: waiting", lambda: state.pending_with(8, "WAITING_FOR_IDLE_AGENTS"))
        yield state
    except BaseException:
        print(master.output())
        raise
        shutil.rmtree(master.scratch, ignore_errors=True)


# -- our CLI ---------------------------------------------------------------------------------


def test_submit_warns_only_when_the_trial_can_never_fit(cluster: Cluster) -> None:
    for slots in (2, 8):  # 8 = two whole idle 4-slot agents: possible, so no warning
        assert cluster.submits[slots].stderr == "", describe_run(cluster.submits[slots])
    impossible = cluster.submits[6]
    warning = " ".join(lines(impossible.stderr))
    assert warning.startswith("warning:"), describe_run(impossible)
    assert "slots_per_trial=6" in warning and "multiple of 4" in warning, describe_run(impossible)
    assert lines(impossible.stdout) == [f"Created experiment {cluster.experiments[6]}"]


def test_placement_reasons_drain_priority_and_release(cluster: Cluster) -> None:
    master = cluster.master
    agent_a, agent_b = cluster.agents

    # 1. The 2-slot trial shares an agent: best fit, lowest id on a tie.
    two = cluster.placed(2)
    if two is None:
        pytest.skip("the cluster moved on (this test needs the state the fixture leaves)")
    tasks = parse_json(master.det("task", "list", "--json"))
    assert set(tasks) == {cluster.must(n)["allocationId"] for n in (2, 6, 8)}
    mine = tasks[two["allocationId"]]
    assert agents_of(mine) == [agent_a] and mine["pendingReason"] is None, mine
    assert mine["state"] == "STATE_ASSIGNED", mine
    held = [
        s
        for s in parse_json(master.det("slot", "list", "--json"))
        if s["allocationId"] == two["allocationId"]
    ]
    assert len(held) == 2 and {s["agentId"] for s in held} == {agent_a}, held
    assert all(s["taskName"] == two["name"] for s in held), held

    # 2. 6 slots can never be placed; 8 waits for two idle agents. JSON, table and CSV say why.
    six = tasks[cluster.must(6)["allocationId"]]
    eight = tasks[cluster.must(8)["allocationId"]]
    assert six["resources"] is None and six["pendingReason"]["code"] == "NEVER_FITS", six
    assert "multiple of 4" in six["pendingReason"]["message"], six
    assert eight["pendingReason"]["code"] == "WAITING_FOR_IDLE_AGENTS", eight
    assert "1 is idle" in eight["pendingReason"]["message"], eight

    table = ok(master.det("task", "list"))
    rows = {r["Allocation ID"]: r for r in rich_table(table.stdout, TASK_HEADERS)}
    assert rows[two["allocationId"]]["Agent"] == agent_a, table.stdout
    assert rows[two["allocationId"]]["Reason"] == "", table.stdout
    for task in (six, eight):
        row = rows[task["allocationId"]]
        assert row["Agent"] == "unassigned" and row["State"] == "PENDING", table.stdout
        assert row["Reason"] == task["pendingReason"]["message"], table.stdout  # wrapped, whole

    as_csv = list(csv.DictReader(io.StringIO(ok(master.det("task", "list", "--csv")).stdout)))
    by_allocation = {r["Allocation ID"]: r for r in as_csv}
    assert by_allocation[six["allocationId"]]["Reason"] == six["pendingReason"]["message"]
    assert by_allocation[two["allocationId"]]["Agent"] == agent_a

    # 3. Draining the agent that runs the 2-slot trial: it stays, nothing new goes there,
    #    and the gang's reason follows (only one usable agent is left).
    # Taking agents in and out of service is for admins (issue 15).
    refused = master.det("agent", "disable", agent_a, "--drain")
    assert lines(refused.stderr) == [
        "Error: disabling an agent is for admins; user determined is not one"
    ], describe_run(refused)
    drained = ok(master.det("-u", "admin", "agent", "disable", agent_a, "--drain"))
    assert lines(drained.stdout) == [
        f"Disabled agent {agent_a} (draining: 1 task still running there)"
    ], describe_run(drained)
    listed = {a["id"]: a for a in parse_json(master.det("agent", "list", "--json"))}
    assert (listed[agent_a]["enabled"], listed[agent_a]["draining"]) == (False, True)
    assert (listed[agent_b]["enabled"], listed[agent_b]["draining"]) == (True, False)

    def gang_reason_changed() -> dict[str, Any] | None:
        task = cluster.task_of(8)
        assert task is not None and task["pendingReason"] is not None, task
        return None if task["pendingReason"]["code"] == "WAITING_FOR_IDLE_AGENTS" else task

    gang = wait_for("the gang's reason to follow the drain", gang_reason_changed)
    assert "usable" in gang["pendingReason"]["message"], gang
    assert agents_of(cluster.placed(2) or {}) == [agent_a]
    table = ok(master.det("agent", "list"))
    rows = {r["Agent ID"]: r for r in rich_table(table.stdout, AGENT_HEADERS)}
    assert rows[agent_a]["Draining"] == "True", table.stdout

    enabled = ok(master.det("-u", "admin", "agent", "enable", agent_a))
    assert lines(enabled.stdout) == [f"Enabled agent {agent_a}"], describe_run(enabled)
    listed = {a["id"]: a for a in parse_json(master.det("agent", "list", "--json"))}
    assert (listed[agent_a]["enabled"], listed[agent_a]["draining"]) == (True, False)
    wait_for("the gang waiting again", lambda: cluster.pending_with(8, "WAITING_FOR_IDLE_AGENTS"))

    # 4. A job's priority changes while it is queued.
    jobs = parse_json(master.det("job", "list", "--json"))
    job = next(j for j in jobs if j["entityId"] == str(cluster.experiments[8]))
    assert job["priority"] == 42 and job["summary"]["state"] == "STATE_QUEUED", job
    updated = ok(master.det("job", "update", job["jobId"], "--priority", "10"))
    assert lines(updated.stdout) == [f"Updated job {job['jobId']}: priority 10"]
    jobs = parse_json(master.det("job", "list", "--json"))
    assert jobs[0]["jobId"] == job["jobId"] and jobs[0]["priority"] == 10, jobs
    assert [j["summary"]["jobsAhead"] for j in jobs] == list(range(len(jobs)))
    assert cluster.must(8)["priority"] == 10
    table = ok(master.det("job", "list"))
    first = rich_table(table.stdout, JOB_HEADERS)[0]
    assert (first["ID"], first["Priority"], first["State"]) == (job["jobId"], "10", "QUEUED")
    refused = master.det("job", "update", job["jobId"], "--priority", "100")
    assert refused.returncode == 1 and refused.stdout == "", describe_run(refused)
    assert lines(refused.stderr) == ["Error: priority: 100 is not between 1 and 99"]
    # Its weight, and a pool that does not exist (nothing changes).
    updated = ok(master.det("job", "update", job["jobId"], "--weight", "2"))
    assert lines(updated.stdout) == [f"Updated job {job['jobId']}: weight 2"]
    refused = master.det("job", "update", job["jobId"], "--resource-pool", "nowhere")
    assert refused.returncode == 1, describe_run(refused)
    assert lines(refused.stderr)[0].startswith(
        "Error: updates[0].resourcePool: pool 'nowhere' does not exist; pools: default"
    ), describe_run(refused)
    assert (cluster.must(8)["priority"], cluster.must(8)["resourcePool"]) == (10, "default")
    stored = master.api("GET", f"/api/v1/experiments/{cluster.experiments[8]}")["experiment"]
    assert stored["config"]["resources"]["weight"] == 2, stored["config"]["resources"]

    # 5. The 2-slot trial exits: both agents are idle and the gang takes them whole.
    cluster.release(two["allocationId"])
    gang = wait_for("the gang placed", lambda: cluster.placed(8))
    assert agents_of(gang) == [agent_a, agent_b], gang
    slots = parse_json(master.det("slot", "list", "--json"))
    assert len(slots) == 2 * SLOTS_PER_AGENT
    assert {s["allocationId"] for s in slots} == {gang["allocationId"]}, slots
    tasks = parse_json(master.det("task", "list", "--json"))
    assert two["allocationId"] not in tasks
    assert tasks[six["allocationId"]]["pendingReason"]["code"] == "NEVER_FITS"
    table = ok(master.det("task", "list"))
    row = next(
        r
        for r in rich_table(table.stdout, TASK_HEADERS)
        if r["Allocation ID"] == gang["allocationId"]
    )
    assert row["Agent"] == f"{agent_a}, {agent_b}", table.stdout


def test_errors_are_one_line_on_stderr(cluster: Cluster) -> None:
    master = cluster.master
    for args, message in (
        (
            ("-u", "admin", "agent", "disable", "no-such-agent", "--drain"),
            "Error: agent no-such-agent not found",
        ),
        (("job", "update", "no-such-job", "--priority", "3"), "Error: job no-such-job not found"),
        (("task", "list", "--json", "--csv"), "Error: --json and --csv cannot be used together"),
    ):
        result = master.det(*args)
        assert result.returncode == 1, describe_run(result)
        assert result.stdout == "" and lines(result.stderr) == [message], describe_run(result)


def test_aliases_csv_and_resource_pools(cluster: Cluster) -> None:
    master = cluster.master
    # `det a ls` is `det agent list`, a bare noun lists, and --csv has the table's columns.
    agents = list(csv.DictReader(io.StringIO(ok(master.det("a", "ls", "--csv")).stdout)))
    assert sorted(a["Agent ID"] for a in agents) == sorted(cluster.agents), agents
    assert list(agents[0]) == AGENT_HEADERS
    assert {a["Slots"] for a in agents} == {str(SLOTS_PER_AGENT)}
    assert {(a["Version"], a["Connected"], a["Addresses"]) for a in agents} == {
        ("sim", "True", "127.0.0.1")
    }
    bare = ok(master.det("slot"))
    rows = rich_table(bare.stdout, SLOT_HEADERS)
    assert len(rows) == 2 * SLOTS_PER_AGENT, describe_run(bare)
    assert {(r["Type"], r["Device"]) for r in rows} == {("cpu", "simulated")}

    pools = parse_json(master.det("rp", "list", "--json"))
    assert [p["name"] for p in pools] == ["default"], pools
    assert pools[0]["numAgents"] == 2 and pools[0]["slotsAvailable"] == 2 * SLOTS_PER_AGENT


# -- Determined's official client ------------------------------------------------------------


@pytest.mark.official_client
def test_official_client_lists_tasks_agents_and_slots(cluster: Cluster) -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )
    master = cluster.master
    tasks = cluster.tasks()
    placed = {a: t for a, t in tasks.items() if t["resources"]}
    pending = {a: t for a, t in tasks.items() if not t["resources"]}
    assert placed and pending, tasks  # whether or not the scenario above has run

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        result = ok(master.official(*args))
        assert "Traceback" not in result.stderr + result.stdout, describe_run(result)
        return result

    listed = run("task", "list")
    rows = {r["Allocation ID"]: r for r in presto_table(listed.stdout, "Task ID")}
    assert set(rows) == set(tasks), describe_run(listed)
    for allocation_id, task in placed.items():
        agents = agents_of(task)
        shown = rows[allocation_id]["Agent"]
        assert shown == (agents[0] if len(agents) == 1 else str(agents)), describe_run(listed)
    for allocation_id in pending:
        assert rows[allocation_id]["Agent"] == "unassigned", describe_run(listed)
        assert rows[allocation_id]["Task ID"] == tasks[allocation_id]["taskId"]

    as_json = json.loads(run("task", "list", "--json").stdout)
    assert set(as_json) == set(tasks)
    for allocation_id, task in as_json.items():
        assert task["allocationId"] == allocation_id
        assert (task["resources"] is None) == (allocation_id in pending), task

    listed = run("agent", "list")
    rows = {r["Agent ID"]: r for r in presto_table(listed.stdout, "Agent ID")}
    assert set(rows) == set(cluster.agents), describe_run(listed)
    assert {r["Slots"] for r in rows.values()} == {str(SLOTS_PER_AGENT)}
    agents = json.loads(run("agent", "list", "--json").stdout)
    assert sorted(a["id"] for a in agents) == sorted(cluster.agents), agents
    assert {a["num_slots"] for a in agents} == {SLOTS_PER_AGENT}, agents

    holders = {
        (agent, str(slot.get("id"))): allocation_id
        for allocation_id, task in placed.items()
        for r in task["resources"]
        for agent, devices in r["agentDevices"].items()
        for slot in devices["devices"]
    }
    listed = run("slot", "list")
    slot_rows = presto_table(listed.stdout, "Agent ID")
    assert len(slot_rows) == 2 * SLOTS_PER_AGENT, describe_run(listed)
    for row in slot_rows:
        expected = holders.get((row["Agent ID"], row["Slot ID"]), "FREE")
        assert row["Allocation ID"] == expected, describe_run(listed)
    slots = json.loads(run("slot", "list", "--json").stdout)
    assert len(slots) == 2 * SLOTS_PER_AGENT
    for slot in slots:
        expected = holders.get((slot["agent_id"], slot["slot_id"]), "FREE")
        assert slot["allocation_id"] == expected, slot
        if expected != "FREE":
            assert slot["task_name"] == tasks[expected]["name"], slot

    # Determined's `det job update` sends UpdateJobQueue; a pool that does not exist is
    # refused with the reason, and the weight is the experiment's resources.weight.
    path = f"/api/v1/experiments/{cluster.experiments[8]}"
    job_id = master.api("GET", path)["experiment"]["jobId"]
    run("job", "update", job_id, "--weight", "3")
    resources = master.api("GET", path)["experiment"]["config"]["resources"]
    assert resources["weight"] == 3, resources
    refused = master.official("job", "update", job_id, "--resource-pool", "nowhere")
    assert refused.returncode != 0, describe_run(refused)
    assert "pool 'nowhere' does not exist" in refused.stderr, describe_run(refused)
