"""Our `det workspace`, `det project`, `det e create --project_id`, `det e move` and
`det tpl ... --workspace` against a real master."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import wait_until
from tests.e2e.concurrently import concurrently
from tests.e2e.conftest import MasterProcess, describe_run, lines, ok, unique

pytestmark = pytest.mark.e2e

SINGLE = """\
name: {name}
entrypoint: python3 train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 10}}}}
"""


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    ok(result)
    return json.loads(result.stdout)


def refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 1, describe_run(result)
    assert "Traceback" not in result.stderr, describe_run(result)
    assert message in result.stderr, describe_run(result)
    assert result.stdout == "", describe_run(result)


def test_workspace_and_project_verbs(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    # Commands that need not wait for one another run side by side (concurrently): those
    # that read, refuse, or change what the others do not look at.
    ws, other = unique("ours"), unique("other")
    created_run, created_other = concurrently(
        lambda: master.det("workspace", "create", ws, "--json"),
        lambda: master.det("workspace", "create", other),
    )
    created = as_json(created_run)
    assert (created["name"], created["username"]) == (ws, "determined")
    ok(created_other)
    again, empty, listed_run, table = concurrently(
        lambda: master.det("workspace", "create", ws),
        lambda: master.det("workspace", "create", " "),
        lambda: master.det("workspace", "list", "--json"),
        lambda: master.det("workspace", "list"),
    )
    refused(again, f"a workspace named '{ws}' already exists")
    refused(empty, "name: the name is empty")

    listed = as_json(listed_run)
    assert {ws, other, "Uncategorized"} <= {w["name"] for w in listed}
    ok(table)
    assert ws in table.stdout and "# Projects" in table.stdout

    renamed = unique("renamed")
    assert as_json(master.det("workspace", "rename", ws, renamed, "--json"))["name"] == renamed
    ws = renamed
    for verb, said in [
        ("pin", "Pinned"),
        ("unpin", "Unpinned"),
        ("archive", "Archived"),
        ("unarchive", "Unarchived"),
    ]:
        done = ok(master.det("workspace", verb, ws))
        assert lines(done.stdout) == [f"{said} workspace {ws}"], describe_run(done)
    ok(master.det("workspace", "pin", ws))
    config = tmp_path / "config.yaml"
    config.write_text(SINGLE.format(name="ours"), encoding="utf-8")
    described_ws, built_in, missing, project_run, landing = concurrently(
        lambda: master.det("workspace", "describe", ws, "--json"),
        lambda: master.det("workspace", "archive", "Uncategorized"),
        lambda: master.det("workspace", "describe", "missing-ws"),
        lambda: master.det("project", "create", ws, "vision", "--description", "eyes", "--json"),
        lambda: master.det("project", "create", other, "landing"),
    )
    assert as_json(described_ws)["pinned"] is True
    refused(built_in, "is built in")
    refused(missing, "workspace 'missing-ws' not found")

    project = as_json(project_run)
    assert (project["name"], project["description"]) == ("vision", "eyes")
    ok(landing)
    again, projects, created_exp, nowhere = concurrently(
        lambda: master.det("project", "create", ws, "vision"),
        lambda: master.det("project", "list", ws, "--json"),
        lambda: master.det(
            "e", "create", "--project_id", str(project["id"]), str(config), str(files["model_dir"])
        ),
        lambda: master.det("e", "create", "--project_id", "987654", str(config)),
    )
    refused(again, "already has a project named 'vision'")
    assert [p["name"] for p in as_json(projects)] == ["vision"]
    ok(created_exp)
    experiment_id = int(lines(created_exp.stdout)[-1].removeprefix("Created experiment "))
    refused(nowhere, "projectId: project 987654 does not exist")
    described_run, table, project_kept, workspace_kept = concurrently(
        lambda: master.det("project", "describe", ws, "vision", "--json"),
        lambda: master.det("project", "list-experiments", ws, "vision"),
        lambda: master.det("project", "delete", ws, "vision", "--yes"),
        lambda: master.det("workspace", "delete", ws, "--yes"),
    )
    described = as_json(described_run)
    assert (described["numExperiments"], described["numActiveExperiments"]) == (1, 1)
    ok(table)
    assert str(experiment_id) in table.stdout

    refused(project_kept, "holds active experiments")
    refused(workspace_kept, "holds active experiments")
    moved = ok(master.det("e", "move", str(experiment_id), other, "landing"))
    assert lines(moved.stdout) == [f'Moved experiment {experiment_id} to project "landing"']
    experiments_run, archived = concurrently(
        lambda: master.det("project", "list-experiments", other, "landing", "--json"),
        lambda: master.det("project", "archive", ws, "vision"),
    )
    assert [e["id"] for e in as_json(experiments_run)] == [experiment_id]

    ok(archived)
    assert as_json(master.det("project", "describe", ws, "vision", "--json"))["archived"] is True
    ok(master.det("project", "unarchive", ws, "vision"))
    moved = ok(master.det("project", "move", ws, "vision", other))
    assert lines(moved.stdout) == [f"Moved project vision to workspace {other}"]
    left, deleted = concurrently(
        lambda: master.det("project", "list", ws, "--json"),
        lambda: master.det("project", "delete", other, "vision", "--yes"),
    )
    assert as_json(left) == []
    assert lines(ok(deleted).stdout) == ["Deleted project vision"]
    # (`other` holds the experiment, not `ws`: the kill does not wait for this delete.)
    deleted, killed = concurrently(
        lambda: master.det("workspace", "delete", ws, "--yes"),
        lambda: master.det("e", "kill", str(experiment_id)),
    )
    assert lines(ok(deleted).stdout) == [f"Deleted workspace {ws}"]
    ok(killed)
    refused(master.det("workspace", "describe", ws), f"workspace '{ws}' not found")

    # An ended experiment goes with its workspace; the command waits for it.
    wait_until(
        "the killed experiment to end",
        lambda: (
            master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]["state"]
            == "STATE_CANCELED"
        ),
        timeout=60,
    )
    deleted = ok(master.det("workspace", "delete", other, "--yes", timeout=120))
    assert lines(deleted.stdout) == [
        f"Deleting workspace {other}: its experiments' checkpoints go first",
        f"Deleted workspace {other}",
    ]
    assert master.http("GET", f"/api/v1/experiments/{experiment_id}").status_code == 404


def test_templates_in_workspaces(master: MasterProcess, files: dict[str, Path]) -> None:
    ws, other = unique("tpl-ws"), unique("tpl-other")
    ws_id = master.api("POST", "/api/v1/workspaces", json={"name": ws})["workspace"]["id"]
    other_id = master.api("POST", "/api/v1/workspaces", json={"name": other})["workspace"]["id"]
    name, template = unique("tpl"), str(files["template"])
    created = as_json(master.det("tpl", "create", name, template, "--workspace", ws, "--json"))
    assert (created["name"], created["workspaceId"]) == (name, ws_id)

    listed, missing = concurrently(
        lambda: master.det("tpl", "list", "-w", ws, "--csv"),
        lambda: master.det("tpl", "create", unique("tpl"), template, "-w", ws + "-nope"),
    )
    ok(listed)
    assert listed.stdout.splitlines() == ["Name,Workspace", f"{name},{ws}"], describe_run(listed)

    moved = as_json(master.det("tpl", "set", name, template, "-w", other, "--json"))
    assert moved["workspaceId"] == other_id
    refused(missing, "not found")
