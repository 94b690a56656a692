"""Two teams on one cluster, as users would work (issue 29): a real master and agent, our
`det` signed in as each person. alice is an Editor in `vision`, bob in `nlp`, carol the
WorkspaceAdmin of `vision`. Each submits, lists, reads logs, opens a notebook and kills;
neither team sees nor touches the other's work; carol manages alice's; an admin sees all."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import AgentProcess
from tests.conftest import require
from tests.e2e.agents import write_experiment
from tests.e2e.conftest import MasterProcess, describe_run, ok
from tests.e2e.test_interactive_tasks import jupyter_installed
from tests.e2e.test_user_groups_cli import AS_ADMIN, new_users, refused

pytestmark = [pytest.mark.e2e]

PASSWORD = "Correct-Horse-9"  # what new_users gives
SCRIPT = "print('hello from {team}', flush=True)\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    work = tmp_path_factory.mktemp("two-teams")
    master = MasterProcess(work / "data", label="teams")
    master.start()
    agent = AgentProcess(master, "teams-agent", work / "agent", slots=2).start()
    try:
        agent.wait_connected()
        yield master
    finally:
        agent.stop()
        master.stop()


def as_user(name: str) -> dict[str, str]:
    return {"DET_USER": name, "DET_PASS": PASSWORD}


def det_as(
    master: MasterProcess, who: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return master.det(*args, env=who, timeout=180)


def listed(master: MasterProcess, who: dict[str, str], *args: str) -> Any:
    return json.loads(ok(det_as(master, who, *args, "--json")).stdout)


def submit(master: MasterProcess, who: dict[str, str], team: str, work: Path) -> int:
    config, model = write_experiment(
        work / team,
        SCRIPT.format(team=team),
        name=f"{team}-run",
        extra={"workspace": team, "project": "research"},
    )
    result = ok(det_as(master, who, "experiment", "create", str(config), str(model)))
    return int(result.stdout.split("Created experiment")[1].split()[0])


def completed_trial(master: MasterProcess, experiment: int) -> int:
    """Its one trial's id once it completed, looked up as admin (determined, whom the
    harness looks with, sees neither team's work)."""
    headers = {"Authorization": f"Bearer {master.login('admin')}"}

    def done() -> int | None:
        path = f"/api/v1/experiments/{experiment}/trials"
        [trial] = master.api("GET", path, headers=headers)["trials"]
        return int(trial["id"]) if trial["state"] == "STATE_COMPLETED" else None

    found: int = master.wait_for(f"experiment {experiment}'s trial to complete", done, 180)
    return found


def test_two_teams_work_side_by_side_without_seeing_each_other(
    cluster: MasterProcess, tmp_path: Path
) -> None:
    require(jupyter_installed(), "jupyterlab is not installed (make install puts it in .venv)")
    master = cluster
    alice_name, bob_name, carol_name = new_users(master, "alice", "bob", "carol")
    alice, bob, carol = as_user(alice_name), as_user(bob_name), as_user(carol_name)
    # The admin sets the teams up with our det, as an admin would.
    for team in ("vision", "nlp"):
        ok(det_as(master, AS_ADMIN, "workspace", "create", team))
        ok(det_as(master, AS_ADMIN, "project", "create", team, "research"))
    for user, role, team in (
        (alice_name, "Editor", "vision"),
        (bob_name, "Editor", "nlp"),
        (carol_name, "WorkspaceAdmin", "vision"),
    ):
        ok(det_as(master, AS_ADMIN, "rbac", "assign-role", role, "-w", team, "-u", user))

    # Each submits into their team's workspace and reads their own trial's logs.
    theirs = {"vision": submit(master, alice, "vision", tmp_path)}
    theirs["nlp"] = submit(master, bob, "nlp", tmp_path)
    trials = {team: completed_trial(master, experiment) for team, experiment in theirs.items()}
    assert (
        "hello from vision"
        in ok(det_as(master, alice, "trial", "logs", str(trials["vision"]))).stdout
    )
    assert "hello from nlp" in ok(det_as(master, bob, "trial", "logs", str(trials["nlp"]))).stdout

    # Neither sees the other's: not in the lists, and "not found" when named.
    def experiments(who: dict[str, str]) -> set[int]:
        return {e["id"] for e in listed(master, who, "experiment", "list", "--all")}

    assert experiments(alice) == {theirs["vision"]}
    assert experiments(bob) == {theirs["nlp"]}
    assert experiments(carol) == {theirs["vision"]}
    assert experiments(AS_ADMIN) >= set(theirs.values())
    nlp_trial, nlp_experiment = str(trials["nlp"]), str(theirs["nlp"])
    refused(det_as(master, alice, "trial", "logs", nlp_trial), f"trial {nlp_trial} not found")
    refused(
        det_as(master, alice, "experiment", "kill", nlp_experiment),
        f"experiment {nlp_experiment} not found",
    )
    workspaces = {w["name"] for w in listed(master, alice, "workspace", "list")}
    assert workspaces == {"Uncategorized", "vision"}

    # alice opens a notebook in vision: bob does not see it and cannot kill it; carol,
    # vision's WorkspaceAdmin, may.
    started = det_as(master, alice, "notebook", "start", "-w", "vision", "--no-browser", "-d")
    notebook = ok(started).stdout.strip().splitlines()[-1]
    assert notebook in {t["id"] for t in listed(master, alice, "notebook", "list")}
    assert notebook not in {t["id"] for t in listed(master, bob, "notebook", "list", "--all")}
    assert notebook in {t["id"] for t in listed(master, AS_ADMIN, "notebook", "list", "--all")}
    refused(det_as(master, bob, "notebook", "kill", notebook), f"task {notebook} not found")
    reply = master.http("GET", f"/proxy/{notebook}/")  # determined: no role in vision
    assert reply.status_code == 404, reply.text
    ok(det_as(master, carol, "notebook", "kill", notebook))
    killed = listed(master, alice, "notebook", "list")
    assert [t["state"] for t in killed if t["id"] == notebook] in (
        ["STATE_TERMINATING"],
        ["STATE_TERMINATED"],
    ), describe_run(started)
    # carol manages alice's experiment too, and still cannot reach nlp's.
    ok(det_as(master, carol, "experiment", "archive", str(theirs["vision"])))
    refused(
        det_as(master, carol, "experiment", "archive", nlp_experiment),
        f"experiment {nlp_experiment} not found",
    )
