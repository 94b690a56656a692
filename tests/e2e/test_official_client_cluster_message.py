"""Issue 32's master and retention verbs through Determined's official client and ours,
against the shared real master: the cluster message (set, get, clear; shown at our `det
user login`), `det e set log-retention`, the preview `det e set gc-policy` shows without
--yes, and `det model move`."""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

import pytest
import yaml

from tests.conftest import require
from tests.e2e.conftest import MasterProcess, describe_run, lines, official_client_path, ok, unique

pytestmark = [pytest.mark.e2e, pytest.mark.official_client]

ADMIN = ("-u", "admin")
SINGLE_YAML = """\
name: retention
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
checkpoint_storage: {type: shared_fs, host_path: /tmp, save_trial_latest: 5}
"""


@pytest.fixture(autouse=True)
def _official_client_installed() -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )


def test_cluster_message_with_both_clients(master: MasterProcess) -> None:
    refused = master.official("master", "cluster-message", "set", "-m", "mine")
    assert refused.returncode != 0 and "is for admins" in refused.stderr, describe_run(refused)
    # `-u admin` asks for the (empty) password on stdin.
    ok(
        master.official(
            *ADMIN,
            "master",
            "cluster-message",
            "set",
            "-m",
            "Upgrade at noon",
            "-d",
            "2h",
            input="\n",
        )
    )
    got = yaml.safe_load(
        ok(master.official(*ADMIN, "master", "cluster-message", "get", input="\n")).stdout
    )
    assert got["clusterMessage"]["message"] == "Upgrade at noon", got
    assert got["clusterMessage"]["endTime"], got
    # Everyone sees it, and our `det user login` prints it.
    shown = master.api("GET", "/api/v1/master")["clusterMessage"]
    assert shown["message"] == "Upgrade at noon"
    login = ok(master.det("user", "login", "determined", input="\n"))
    assert "Cluster message: Upgrade at noon" in lines(login.stdout), describe_run(login)
    ok(master.official(*ADMIN, "master", "cluster-message", "clear", input="\n"))
    assert master.api("GET", "/api/v1/master")["clusterMessage"] is None

    # Ours, as admin (DET_USER/DET_PASS: no stored login needed).
    as_admin = {"DET_USER": "admin", "DET_PASS": ""}
    bad = master.det(
        "master",
        "cluster-message",
        "set",
        "-m",
        "x",
        "-e",
        "2099-01-01T00:00:00Z",
        "-d",
        "1h",
        env=as_admin,
    )
    assert bad.returncode != 0 and "give one or the other" in bad.stderr, describe_run(bad)
    set_ = master.det("master", "cluster-message", "set", "-m", "Be nice", env=as_admin)
    assert lines(ok(set_).stdout) == ["Cluster message set"]
    got_json = json.loads(
        ok(master.det("master", "cluster-message", "get", "--json", env=as_admin)).stdout
    )
    assert got_json["message"] == "Be nice" and got_json["endTime"] is None
    ok(master.det("master", "cluster-message", "clear", env=as_admin))
    cleared = ok(master.det("master", "cluster-message", "get", env=as_admin))
    assert lines(cleared.stdout) == ["No cluster message is set"]


def _experiment_with_checkpoints(master: MasterProcess) -> tuple[str, list[str]]:
    """An ended experiment whose trial reported three checkpoints, two with validations."""
    created = master.api("POST", "/api/v1/experiments", json={"config": SINGLE_YAML})
    experiment_id = created["experiment"]["id"]
    tasks = master.api("GET", "/api/v1/tasks")["allocationIdToSummary"]
    (task,) = [t for t in tasks.values() if t["experimentId"] == experiment_id]
    uuids = []
    for steps, loss in ((1, 0.5), (2, 0.1), (3, None)):
        if loss is not None:
            body: dict[str, Any] = {
                "group": "validation",
                "metrics": {
                    "trialId": task["trialId"],
                    "trialRunId": int(task["allocationId"].split(".")[1]),
                    "stepsCompleted": steps,
                    "metrics": {"avgMetrics": {"loss": loss}, "batchMetrics": None},
                },
            }
            master.api("POST", f"/api/v1/trials/{task['trialId']}/metrics", json=body)
        uuid = str(uuidlib.uuid4())
        checkpoint = {
            "uuid": uuid,
            "state": "STATE_COMPLETED",
            "metadata": {"steps_completed": steps},
            "resources": {"model.pt": "2048"},
            "training": {"trialId": task["trialId"]},
            "taskId": task["taskId"],
            "allocationId": task["allocationId"],
        }
        master.api("POST", "/api/v1/checkpoints", json=checkpoint)
        uuids.append(uuid)
    master.api("POST", f"/api/v1/experiments/{experiment_id}/kill")
    return str(experiment_id), uuids


def test_gc_policy_preview_and_log_retention_with_both_clients(master: MasterProcess) -> None:
    experiment_id, uuids = _experiment_with_checkpoints(master)
    policy = ("--save-experiment-best", "0", "--save-trial-best", "1", "--save-trial-latest", "0")
    # Without --yes the official client shows what would go, then asks; "n" changes nothing.
    preview = ok(
        master.official("experiment", "set", "gc-policy", experiment_id, *policy, input="n\n")
    )
    assert uuids[0] in preview.stdout and uuids[1] not in preview.stdout, describe_run(preview)
    assert "will delete 1 checkpoints with validations and 1 checkpoints without" in (
        preview.stdout
    ), describe_run(preview)
    assert "Aborting" in preview.stdout
    ours = json.loads(
        ok(master.det("experiment", "set", "gc-policy", experiment_id, *policy, "--json")).stdout
    )
    assert sorted(c["UUID"] for c in ours) == sorted([uuids[0], uuids[2]])
    listed = master.api("GET", f"/api/v1/experiments/{experiment_id}/checkpoints")
    assert {c["state"] for c in listed["checkpoints"]} == {"STATE_COMPLETED"}

    path = f"/api/v1/experiments/{experiment_id}"
    said = ok(master.official("experiment", "set", "log-retention", experiment_id, "--days", "5"))
    no_days = master.api("GET", path)["experiment"]["config"]["retention_policy"]
    assert no_days == {"log_retention_days": 5}, describe_run(said)
    ok(master.official("experiment", "set", "log-retention", experiment_id, "--forever"))
    config = master.api("GET", path)["experiment"]["config"]
    assert config["retention_policy"]["log_retention_days"] == -1
    both = master.det(
        "experiment", "set", "log-retention", experiment_id, "--days", "3", "--forever"
    )
    assert both.returncode != 0 and "--days, --forever" in both.stderr, describe_run(both)
    negative = master.det("experiment", "set", "log-retention", experiment_id, "--days", "-4")
    assert negative.returncode != 0 and "--days: -4" in negative.stderr, describe_run(negative)
    kept = ok(master.det("experiment", "set", "log-retention", experiment_id, "--days", "30"))
    assert lines(kept.stdout) == [
        f"Logs of experiment {experiment_id} are kept 30 days after each trial ends"
    ]
    config = master.api("GET", path)["experiment"]["config"]
    assert config["retention_policy"]["log_retention_days"] == 30
    # The leader runs the pass that acts on it (what it deletes: tests/api).
    assert "log-retention started (every 3600.00s)" in master.output(tail=10**8)


def test_model_move_with_both_clients(master: MasterProcess) -> None:
    model = unique("moving")
    workspaces = [unique("ws"), unique("ws")]
    for name in workspaces:
        master.api("POST", "/api/v1/workspaces", json={"name": name})
    master.api("POST", "/api/v1/models", json={"name": model})
    ok(master.official("model", "move", model, "-w", workspaces[0]))
    ids = {w["name"]: w["id"] for w in master.api("GET", "/api/v1/workspaces")["workspaces"]}
    assert (
        master.api("GET", f"/api/v1/models/{model}")["model"]["workspaceId"] == ids[workspaces[0]]
    )
    moved = json.loads(ok(master.det("model", "move", model, "-w", workspaces[1], "--json")).stdout)
    assert moved["workspaceId"] == ids[workspaces[1]]
    missing = master.det("model", "move", model, "-w", unique("nowhere"))
    assert missing.returncode != 0 and "not found" in missing.stderr, describe_run(missing)
