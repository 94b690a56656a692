"""Our `det workspace`, `det project`, `det e create --project_id`, `det e move` and
`det tpl ... --workspace` against a real master."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import wait_until
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
    ws, other = unique("ours"), unique("other")
    created = as_json(master.det("workspace", "create", ws, "--json"))
    assert (created["name"], created["username"]) == (ws, "determined")
    ok(master.det("workspace", "create", other))
    refused(master.det("workspace", "create", ws), f"a workspace named '{ws}' already exists")
    refused(master.det("workspace", "create", " "), "name: the name is empty")

    listed = as_json(master.det("workspace", "list", "--json"))
    assert {ws, other, "Uncategorized"} <= {w["name"] for w in listed}
    table = ok(master.det("workspace", "list"))
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
    assert as_json(master.det("workspace", "describe", ws, "--json"))["pinned"] is True
    refused(master.det("workspace", "archive", "Uncategorized"), "is built in")
    refused(master.det("workspace", "describe", "missing-ws"), "workspace 'missing-ws' not found")

    project = as_json(
        master.det("project", "create", ws, "vision", "--description", "eyes", "--json")
    )
    assert (project["name"], project["description"]) == ("vision", "eyes")
    refused(master.det("project", "create", ws, "vision"), "already has a project named 'vision'")
    assert [p["name"] for p in as_json(master.det("project", "list", ws, "--json"))] == ["vision"]

    config = tmp_path / "config.yaml"
    config.write_text(SINGLE.format(name="ours"), encoding="utf-8")
    created_exp = ok(
        master.det(
            "e", "create", "--project_id", str(project["id"]), str(config), str(files["model_dir"])
        )
    )
    experiment_id = int(lines(created_exp.stdout)[-1].removeprefix("Created experiment "))
    refused(
        master.det("e", "create", "--project_id", "987654", str(config)),
        "projectId: project 987654 does not exist",
    )
    described = as_json(master.det("project", "describe", ws, "vision", "--json"))
    assert (described["numExperiments"], described["numActiveExperiments"]) == (1, 1)
    table = ok(master.det("project", "list-experiments", ws, "vision"))
    assert str(experiment_id) in table.stdout

    refused(master.det("project", "delete", ws, "vision", "--yes"), "holds active experiments")
    refused(master.det("workspace", "delete", ws, "--yes"), "holds active experiments")
    ok(master.det("project", "create", other, "landing"))
    moved = ok(master.det("e", "move", str(experiment_id), other, "landing"))
    assert lines(moved.stdout) == [f'Moved experiment {experiment_id} to project "landing"']
    experiments = as_json(master.det("project", "list-experiments", other, "landing", "--json"))
    assert [e["id"] for e in experiments] == [experiment_id]

    ok(master.det("project", "archive", ws, "vision"))
    assert as_json(master.det("project", "describe", ws, "vision", "--json"))["archived"] is True
    ok(master.det("project", "unarchive", ws, "vision"))
    moved = ok(master.det("project", "move", ws, "vision", other))
    assert lines(moved.stdout) == [f"Moved project vision to workspace {other}"]
    assert as_json(master.det("project", "list", ws, "--json")) == []
    deleted = ok(master.det("project", "delete", other, "vision", "--yes"))
    assert lines(deleted.stdout) == ["Deleted project vision"]
    deleted = ok(master.det("workspace", "delete", ws, "--yes"))
    assert lines(deleted.stdout) == [f"Deleted workspace {ws}"]
    refused(master.det("workspace", "describe", ws), f"workspace '{ws}' not found")

    # An ended experiment goes with its workspace; the command waits for it.
    ok(master.det("e", "kill", str(experiment_id)))
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

    listed = ok(master.det("tpl", "list", "-w", ws, "--csv"))
    assert listed.stdout.splitlines() == ["Name,Workspace", f"{name},{ws}"], describe_run(listed)

    moved = as_json(master.det("tpl", "set", name, template, "-w", other, "--json"))
    assert moved["workspaceId"] == other_id
    refused(master.det("tpl", "create", unique("tpl"), template, "-w", ws + "-nope"), "not found")
