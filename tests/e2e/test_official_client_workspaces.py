"""Determined's official `det` 0.38.1 and its bindings, unchanged, on workspaces and
projects against a real master: `det workspace`, `det project`, `det e create --project_id`
and `det e move`; pinning and moving a project, which the client has bindings for but no
verb, through those bindings; templates in workspaces (`det template create --workspace-name`,
the list's Workspace column, and the bindings' workspaceIds filter and PUT)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import wait_until
from tests.conftest import require
from tests.e2e.concurrently import concurrently
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

pytestmark = [pytest.mark.e2e, pytest.mark.official_client]

SINGLE = """\
name: {name}
entrypoint: python3 train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 10}}}}
"""

# Determined's bindings as its SDK calls them: pin, unpin, then move a project.
BINDINGS_SCRIPT = """
import json, sys
from determined.common.api import authentication, bindings

master, workspace_id, project_id, destination_id = sys.argv[1], *map(int, sys.argv[2:5])
sess = authentication.login(master, "determined", "")
bindings.post_PinWorkspace(sess, id=workspace_id)
pinned = bindings.get_GetWorkspace(sess, id=workspace_id).workspace.pinned
listed = [w.id for w in bindings.get_GetWorkspaces(sess, pinned=True).workspaces]
bindings.post_UnpinWorkspace(sess, id=workspace_id)
unpinned = bindings.get_GetWorkspace(sess, id=workspace_id).workspace.pinned
bindings.post_MoveProject(
    sess,
    projectId=project_id,
    body=bindings.v1MoveProjectRequest(
        destinationWorkspaceId=destination_id, projectId=project_id
    ),
)
moved_to = bindings.get_GetProject(sess, id=project_id).project.workspaceId
print("RESULT " + json.dumps([pinned, listed, unpinned, moved_to]))
"""

# What Determined's SDK and web UI call on templates that its 0.38.1 CLI has no verb for:
# the list filtered by workspace, and PUT moving a template to another workspace.
TEMPLATE_SCRIPT = """
import json, sys
from determined.common.api import authentication, bindings

master, name, workspace_id, destination_id = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:5])
sess = authentication.login(master, "determined", "")
listed = [t.name for t in bindings.get_GetTemplates(sess, workspaceIds=[workspace_id]).templates]
tpl = bindings.v1Template(name=name, config={"description": "moved"}, workspaceId=destination_id)
moved = bindings.put_PutTemplate(sess, template_name=name, body=tpl).template.workspaceId
after = [t.name for t in bindings.get_GetTemplates(sess, workspaceIds=[workspace_id]).templates]
print("RESULT " + json.dumps([listed, moved, after]))
"""


@pytest.fixture(scope="module", params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    """A master of this file's own, with no agent, so that its experiments stay active (the
    shared e2e master's agents would run them). On Postgres only, as the other e2e files:
    what deletion and unique names rest on in each database is tested through the API on
    both (tests/api/test_workspaces.py); what this file adds is the official client's wire.
    """
    with running_master(request, tmp_path_factory, "workspaces") as proc:
        yield proc


@pytest.fixture(autouse=True)
def _official_client_installed() -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )


def table(text: str) -> list[list[str]]:
    """A tabulate table's rows (header first), cells stripped, rules dropped."""
    return [
        [cell.strip() for cell in line.split("|")]
        for line in lines(text)
        if "|" in line and not set(line) <= set("-+| ")
    ]


def workspace_named(master: MasterProcess, name: str) -> dict[str, Any]:
    [found] = master.api("GET", "/api/v1/workspaces", params={"nameCaseSensitive": name})[
        "workspaces"
    ]
    return dict(found)


def failed(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode != 0, describe_run(result)
    assert "Traceback" not in result.stderr, describe_run(result)
    assert message in result.stderr, describe_run(result)


def test_workspace_verbs(master: MasterProcess, tmp_path: Path) -> None:
    name = unique("ws")
    created = ok(master.official("workspace", "create", name, "--json"))
    workspace = json.loads(created.stdout)
    assert workspace["name"] == name and workspace["numProjects"] == 0

    # Reads (and, further on, refusals) that need not wait for one another run side by side.
    listed, as_json_run, ascending, descending, described_run, shown = concurrently(
        lambda: master.official("workspace", "list"),
        lambda: master.official("workspace", "list", "--json"),
        lambda: master.official("workspace", "list", "--sort-by", "name", "--order-by", "asc"),
        lambda: master.official("workspace", "list", "--sort-by", "name", "--order-by", "desc"),
        lambda: master.official("workspace", "describe", name, "--json"),
        lambda: master.official("workspace", "describe", name),
    )
    ok(listed)
    rows = table(listed.stdout)
    assert rows[0][:3] == ["ID", "Name", "# Projects"], describe_run(listed)
    assert [str(workspace["id"]), name, "0"] in [row[:3] for row in rows], describe_run(listed)
    as_json = json.loads(ok(as_json_run).stdout)
    assert name in [w["name"] for w in as_json]
    # The database's collation orders names; descending is ascending reversed.
    orders = [
        [row[1] for row in table(ok(listing).stdout)[1:]] for listing in (ascending, descending)
    ]
    assert name in orders[0] and orders[1] == orders[0][::-1], orders

    described = json.loads(ok(described_run).stdout)
    assert (described["id"], described["archived"]) == (workspace["id"], False)
    ok(shown)
    assert name in shown.stdout and "Checkpoint Storage Config" in shown.stdout

    renamed = unique("ws-renamed")
    edited = ok(master.official("workspace", "edit", name, "--name", renamed, "--json"))
    assert json.loads(edited.stdout)["name"] == renamed

    archived = ok(master.official("workspace", "archive", renamed))
    assert lines(archived.stdout) == [f"Successfully archived workspace {renamed}."]
    assert workspace_named(master, renamed)["archived"] is True
    failed(
        master.official("project", "create", renamed, "late"),
        f"workspace '{renamed}' ({workspace['id']}) is archived",
    )
    unarchived = ok(master.official("workspace", "unarchive", renamed))
    assert lines(unarchived.stdout) == [f"Successfully un-archived workspace {renamed}."]
    assert workspace_named(master, renamed)["archived"] is False

    # Pinning has bindings but no verb in this client.
    destination = unique("ws-dest")
    made, project = concurrently(
        lambda: master.official("workspace", "create", destination),
        lambda: master.official("project", "create", renamed, "moving", "--json"),
    )
    ok(made)
    ok(project)
    project_id = json.loads(project.stdout)["id"]
    result = run_bindings(
        master, tmp_path, workspace["id"], project_id, workspace_named(master, destination)["id"]
    )
    pinned, pinned_list, unpinned, moved_to = result
    assert (pinned, unpinned) == (True, False)
    assert pinned_list == [workspace["id"]]
    assert moved_to == workspace_named(master, destination)["id"]

    deleted = ok(master.official("workspace", "delete", renamed, "--yes"))
    assert lines(deleted.stdout) == [f"Successfully deleted workspace {renamed}."]
    gone, taken, edit_built_in, delete_built_in = concurrently(
        lambda: master.official("workspace", "describe", renamed),
        lambda: master.official("workspace", "create", destination),
        lambda: master.official("workspace", "edit", "Uncategorized", "--name", "x"),
        lambda: master.official("workspace", "delete", "Uncategorized", "--yes"),
    )
    failed(gone, f"workspace '{renamed}' not found")

    failed(taken, f"a workspace named '{destination}' already exists")
    failed(edit_built_in, "is built in")
    failed(delete_built_in, "is built in")


def run_bindings(
    master: MasterProcess,
    tmp_path: Path,
    workspace_id: int,
    project_id: int,
    destination: int,
    script: str = BINDINGS_SCRIPT,
    name: str | None = None,
) -> list[Any]:
    client_path = official_client_path()
    assert client_path is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), PYTHONUNBUFFERED="1")
    if name is None:
        args = [master.url, str(workspace_id), str(project_id), str(destination)]
    else:  # TEMPLATE_SCRIPT: a template name where a project id would be
        args = [master.url, name, str(workspace_id), str(destination)]
    result = subprocess.run(
        [str(client_path.parent / "python"), "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, describe_run(result)
    [line] = [line for line in lines(result.stdout) if line.startswith("RESULT ")]
    found: list[Any] = json.loads(line.removeprefix("RESULT "))
    return found


def test_project_verbs_and_experiments_in_projects(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    ws = unique("team")
    ok(master.official("workspace", "create", ws))
    created = ok(
        master.official("project", "create", ws, "detection", "--description", "boxes", "--json")
    )
    project = json.loads(created.stdout)
    assert (project["name"], project["description"]) == ("detection", "boxes")

    # Calls that need not wait for one another (reads, refusals, changes to what the others
    # do not look at) run side by side.
    listed, again, sdk_listed = concurrently(
        lambda: master.official("project", "list", ws),
        lambda: master.official("project", "create", ws, "detection"),
        # The SDK's Workspace.list_projects, paginated.
        lambda: master.official("workspace", "list-projects", ws, "--json"),
    )
    ok(listed)
    rows = table(listed.stdout)
    assert rows[0] == ["ID", "Key", "Name", "Description", "# Experiments", "# Active Experiments"]
    assert rows[1][2:] == ["detection", "boxes", "0", "0"], describe_run(listed)
    failed(again, f"workspace '{ws}' already has a project named 'detection'")
    listed = ok(sdk_listed)
    [sdk_project] = json.loads(listed.stdout)
    assert (sdk_project["id"], sdk_project["workspaceId"]) == (
        project["id"],
        project["workspaceId"],
    )

    # `det e create --project_id`, then the config's workspace/project keys.
    config = tmp_path / "config.yaml"
    config.write_text(SINGLE.format(name="by-id"), encoding="utf-8")
    named = tmp_path / "named.yaml"
    named.write_text(
        SINGLE.format(name="by-name") + f"workspace: {ws}\nproject: detection\n", encoding="utf-8"
    )
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(
        SINGLE.format(name="lost") + f"workspace: {ws}\nproject: nowhere\n", encoding="utf-8"
    )
    # by_id before by_name (the listings below are in that order); the refusals beside them.
    submitted, no_project, no_name = concurrently(
        lambda: master.official(
            "e", "create", "--project_id", str(project["id"]), str(config), str(files["model_dir"])
        ),
        lambda: master.official(
            "e", "create", "--project_id", "987654", str(config), str(files["model_dir"])
        ),
        lambda: master.official("e", "create", str(unknown), str(files["model_dir"])),
    )
    ok(submitted)
    [line] = [x for x in lines(submitted.stdout) if x.startswith("Created experiment ")]
    by_id = int(line.removeprefix("Created experiment "))
    failed(no_project, "projectId: project 987654 does not exist")
    failed(no_name, f"project 'nowhere' does not exist in workspace '{ws}'")
    submitted, shelf_run = concurrently(
        lambda: master.official("e", "create", str(named), str(files["model_dir"])),
        lambda: master.official("project", "create", ws, "archive", "--json"),
    )
    ok(submitted)
    [line] = [x for x in lines(submitted.stdout) if x.startswith("Created experiment ")]
    by_name = int(line.removeprefix("Created experiment "))
    shelf = json.loads(ok(shelf_run).stdout)

    listed, described_run, shown, kept = concurrently(
        lambda: master.official("project", "list-experiments", ws, "detection"),
        lambda: master.official("project", "describe", ws, "detection", "--json"),
        lambda: master.official("project", "describe", ws, "detection"),
        lambda: master.official("project", "delete", ws, "detection", "--yes"),
    )
    ok(listed)
    ids = [row[0] for row in table(listed.stdout)[1:]]
    assert ids == [str(by_id), str(by_name)], describe_run(listed)
    described = json.loads(ok(described_run).stdout)
    assert (described["numExperiments"], described["numActiveExperiments"]) == (2, 2)
    ok(shown)
    assert "Associated Experiments" in shown.stdout, describe_run(shown)
    assert str(by_id) in shown.stdout and "by-name" in shown.stdout, describe_run(shown)

    # The project cannot go while its experiments are active; `det e move` takes them out.
    failed(kept, f"holds active experiments ({by_id}, {by_name})")
    moves = concurrently(
        *(
            (lambda i=experiment_id: master.official("e", "move", str(i), ws, "archive"))
            for experiment_id in (by_id, by_name)
        )
    )
    for experiment_id, moved in zip((by_id, by_name), moves, strict=True):
        ok(moved)
        assert lines(moved.stdout) == [f'Moved experiment {experiment_id} to project "archive"']
    listed, everywhere = concurrently(
        lambda: master.official("project", "list-experiments", ws, "archive", "--json"),
        lambda: master.official("e", "list", "--show_project"),
    )
    assert [e["id"] for e in json.loads(ok(listed).stdout)] == [by_id, by_name]
    listed = ok(everywhere)
    rows = table(listed.stdout)
    assert rows[0][:3] == ["Workspace", "Project", "ID"], describe_run(listed)
    assert [ws, "archive", str(by_id)] in [row[:3] for row in rows], describe_run(listed)

    archived = ok(master.official("project", "archive", ws, "archive"))
    assert lines(archived.stdout) == ["Successfully archived project archive."]
    for experiment_id in (by_id, by_name):  # still running in an archived project
        stored = master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
        assert stored["state"] == "STATE_ACTIVE"
    failed(
        master.official(
            "e", "create", "--project_id", str(shelf["id"]), str(config), str(files["model_dir"])
        ),
        "projectId: project 'archive'",
    )
    unarchived, edited = concurrently(
        lambda: master.official("project", "unarchive", ws, "archive"),
        lambda: master.official(
            "project", "edit", ws, "detection", "--new_name", "boxes", "--json"
        ),
    )
    ok(unarchived)
    assert json.loads(ok(edited).stdout)["name"] == "boxes"
    # Ended experiments go with their project (below): killed beside the empty one's delete.
    deleted, *killed = concurrently(
        lambda: master.official("project", "delete", ws, "boxes", "--yes"),
        *(
            (lambda i=experiment_id: master.official("e", "kill", str(i)))
            for experiment_id in (by_id, by_name)
        ),
    )
    assert lines(ok(deleted).stdout) == ["Successfully deleted project boxes."]
    for kill in killed:
        ok(kill)
    listed = ok(master.official("project", "list", ws, "--json"))
    assert [p["name"] for p in json.loads(listed.stdout)] == ["archive"]

    # The client waits while the master deletes them (checkpoints first), polling the
    # project until it is gone.

    def ended() -> bool:
        return all(
            master.api("GET", f"/api/v1/experiments/{i}")["experiment"]["state"] == "STATE_CANCELED"
            for i in (by_id, by_name)
        )

    wait_until("the killed experiments to end", ended, timeout=60)
    deleted = ok(master.official("project", "delete", ws, "archive", "--yes", timeout=120))
    said = lines(deleted.stdout)
    assert said[0] == "Started deletion of project archive...", describe_run(deleted)
    assert said[-1] == "Project deleted successfully.", describe_run(deleted)
    for experiment_id in (by_id, by_name):
        assert master.http("GET", f"/api/v1/experiments/{experiment_id}").status_code == 404
    deleted = ok(master.official("workspace", "delete", ws, "--yes"))
    assert lines(deleted.stdout) == [f"Successfully deleted workspace {ws}."]


def test_a_workspaces_checkpoint_storage_with_both_clients(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    """Determined's `det workspace create --checkpoint-storage-config` gives a team its
    bucket: shown with its secret masked, and the storage of the team's experiments that
    name none; ours edits it from a file and clears it."""
    ws = unique("bucketed")
    storage = {
        "type": "s3",
        "bucket": "team-bucket",
        "access_key": "AK",
        "secret_key": "team-secret",
    }
    created = ok(
        master.official(
            "workspace", "create", ws, "--checkpoint-storage-config", json.dumps(storage), "--json"
        )
    )
    shown = json.loads(created.stdout)["checkpointStorageConfig"]
    assert (shown["bucket"], shown["secret_key"]) == ("team-bucket", "********")
    assert "team-secret" not in created.stdout
    described, project = concurrently(
        lambda: master.official("workspace", "describe", ws),
        lambda: master.official("project", "create", ws, "p"),
    )
    ok(described)
    assert "team-bucket" in described.stdout and "team-secret" not in described.stdout
    ok(project)

    config = tmp_path / "config.yaml"
    config.write_text(SINGLE.format(name="in-bucket") + f"workspace: {ws}\nproject: p\n")
    submitted = ok(master.official("e", "create", str(config), str(files["model_dir"])))
    [line] = [x for x in lines(submitted.stdout) if x.startswith("Created experiment ")]
    experiment = master.api("GET", f"/api/v1/experiments/{line.split()[-1]}")["experiment"]
    assert experiment["config"]["checkpoint_storage"]["bucket"] == "team-bucket"

    # Ours: edited from a file, the masked secret sent back keeps the stored one; then cleared.
    edited = tmp_path / "storage.yaml"
    edited.write_text(yaml.safe_dump({**shown, "bucket": "team-bucket-2"}))
    reply = ok(
        master.det(
            "workspace", "edit", ws, "--checkpoint-storage-config-file", str(edited), "--json"
        )
    )
    assert json.loads(reply.stdout)["checkpointStorageConfig"]["bucket"] == "team-bucket-2"
    cleared = ok(master.det("workspace", "edit", ws, "--checkpoint-storage-config", "{}", "--json"))
    assert json.loads(cleared.stdout)["checkpointStorageConfig"] is None


def test_templates_in_workspaces(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    ws, other = unique("tpl-ws"), unique("tpl-other")
    ws_id = master.api("POST", "/api/v1/workspaces", json={"name": ws})["workspace"]["id"]
    other_id = master.api("POST", "/api/v1/workspaces", json={"name": other})["workspace"]["id"]
    name = unique("tpl")
    created = ok(
        master.official("template", "create", name, str(files["template"]), "--workspace-name", ws)
    )
    assert lines(created.stdout) == [f"Created template {name}"], describe_run(created)
    stored = master.api("GET", f"/api/v1/templates/{name}")["template"]
    assert stored["workspaceId"] == ws_id

    listed = ok(master.official("template", "list"))
    rows = table(listed.stdout)
    assert rows[0] == ["Name", "Workspace"], describe_run(listed)
    assert [name, ws] in rows, describe_run(listed)

    found = run_bindings(master, tmp_path, ws_id, 0, other_id, TEMPLATE_SCRIPT, name)
    assert found == [[name], other_id, []]
