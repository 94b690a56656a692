"""The model registry through Determined's official `det model ...` 0.38.1 and its Python SDK,
unchanged, against a real master on Postgres; then our own `det model`.

The checkpoints are reported to the master the way a trial's harness reports them (as
tests/api/test_trial_reports.py does), for an experiment whose trial never runs."""

from __future__ import annotations

import json
import subprocess
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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

pytestmark = [pytest.mark.e2e, pytest.mark.official_client]

CONFIG = """
name: registry
entrypoint: python3 train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 100}}}}
checkpoint_storage: {{type: shared_fs, host_path: {storage}}}
"""

# Runs in the official client's venv; prints one RESULT line of JSON for the test to read.
SDK_SCRIPT = """
import json, sys, warnings

from determined.experimental import client

master, name, first, second = sys.argv[1:]
warnings.simplefilter("ignore", FutureWarning)  # get_versions() and friends: deprecated

client.login(master=master, user="determined", password="")
model = client.create_model(name, description="from the SDK", metadata={"team": "vision"})
by_name = client.get_model(name)
by_id = client.get_model(model.model_id)
by_old_call = client.get_model_by_id(model.model_id)
v1 = model.register_version(first)
v2 = by_name.register_version(second)
v1.set_name("baseline")
v1.set_notes("the first one")
by_name.add_metadata({"stage": "prod"})
by_name.set_labels(["cnn", "mnist"])
by_name.reload()
versions = by_name.get_versions()
latest = by_name.get_version()
first_again = by_name.get_version(1)
listed = [m.name for m in client.get_models(name=name)]
by_name.archive()
archived = client.get_model(name).archived
by_name.unarchive()
v2.delete()
after_delete = [v.model_version for v in by_name.list_versions()]
print("RESULT " + json.dumps({
    "id": model.model_id,
    "ids": [by_name.model_id, by_id.model_id, by_old_call.model_id],
    "description": by_id.description,
    "metadata": by_name.metadata,
    "labels": by_name.labels,
    "username": by_name.username,
    "versions": [
        [v.model_version, v.checkpoint.uuid, v.checkpoint.training.trial_id, v.name]
        for v in versions
    ],
    "latest": [latest.model_version, latest.checkpoint.uuid],
    "first": [first_again.name, first_again.notes, first_again.checkpoint.metadata],
    "validation": first_again.checkpoint.training.validation_metrics,
    "listed": listed,
    "archived": archived,
    "after_delete": after_delete,
}))
"""


@pytest.fixture(autouse=True)
def _official_client_installed() -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )


@pytest.fixture(scope="module", params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    """A master with no agent, so that the experiments' trials never run (their checkpoints
    are reported by hand). On Postgres only, as the other e2e files: the registry's rules in
    each database are tested through the API on both (tests/api/test_model_registry.py)."""
    with running_master(request, tmp_path_factory, "registry") as proc:
        yield proc


def checkpoints(master: MasterProcess, storage: Path, losses: list[float]) -> tuple[int, list[str]]:
    """An experiment whose trial reported a validation and a checkpoint at each step
    1..len(losses), as Determined's harness reports them; (experiment id, uuids)."""
    created = master.api(
        "POST",
        "/api/v1/experiments",
        json={"config": CONFIG.format(storage=storage), "activate": True},
    )
    experiment_id = created["experiment"]["id"]
    tasks = master.api("GET", "/api/v1/tasks")["allocationIdToSummary"].values()
    (task,) = [t for t in tasks if t["experimentId"] == experiment_id]
    uuids = []
    for steps, loss in enumerate(losses, start=1):
        master.api(
            "POST",
            f"/api/v1/trials/{task['trialId']}/metrics",
            json={
                "group": "validation",
                "metrics": {
                    "trialId": task["trialId"],
                    "trialRunId": int(task["allocationId"].split(".")[1]),
                    "stepsCompleted": steps,
                    "metrics": {"avgMetrics": {"loss": loss}, "batchMetrics": None},
                    "reportTime": None,
                },
            },
        )
        uuid = str(uuidlib.uuid4())
        (storage / uuid).mkdir(parents=True)
        (storage / uuid / "model.pt").write_bytes(b"w" * 64)
        master.api(
            "POST",
            "/api/v1/checkpoints",
            json={
                "uuid": uuid,
                "state": "STATE_COMPLETED",
                "metadata": {"steps_completed": steps},
                "resources": {"model.pt": "64"},
                "training": {"trialId": task["trialId"]},
                "taskId": task["taskId"],
                "allocationId": task["allocationId"],
                "reportTime": None,
                "storageId": None,
            },
        )
        uuids.append(uuid)
    return experiment_id, uuids


def run_sdk_script(master: MasterProcess, home: Path, script: str, *args: str) -> dict[str, Any]:
    """Run `script` in the official client's venv against `master`; its RESULT line."""
    path = official_client_path()
    assert path is not None
    result = subprocess.run(
        [str(path.parent / "python"), "-c", script, master.url, *args],
        capture_output=True,
        text=True,
        cwd=master.scratch,
        timeout=120,
        env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / "xdg"), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, describe_run(result)
    (line,) = [x for x in lines(result.stdout) if x.startswith("RESULT ")]
    found: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return found


def checkpoint_state(master: MasterProcess, uuid: str) -> str:
    state: str = master.api("GET", f"/api/v1/checkpoints/{uuid}")["checkpoint"]["storageState"]
    return state


def failed(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, describe_run(result)
    return result.stdout + result.stderr


def test_official_det_model_verbs(master: MasterProcess, tmp_path: Path) -> None:
    _, (first, second) = checkpoints(master, tmp_path / "store", [0.5, 0.25])
    name = unique("det-model")

    created = ok(master.official("model", "create", name, "--description", "digits", "--json"))
    model = json.loads(created.stdout)
    assert model["name"] == name and model["description"] == "digits", describe_run(created)
    table = ok(master.official("model", "create", unique("det-model-table")))
    assert "Creation Time" in table.stdout and "Metadata" in table.stdout, describe_run(table)

    listed = json.loads(ok(master.official("model", "list", "--json")).stdout)
    assert name in [m["name"] for m in listed]
    human = ok(master.official("model", "list", "--sort-by", "name", "--order-by", "desc"))
    assert name in human.stdout and "Workspace ID" in human.stdout, describe_run(human)

    registered = ok(master.official("model", "register-version", name, first))
    assert "Version #" in registered.stdout and first in registered.stdout, describe_run(registered)
    as_json = json.loads(
        ok(master.official("model", "register-version", name, second, "--json")).stdout
    )
    assert as_json["modelVersion"]["version"] == 2
    assert as_json["modelVersion"]["checkpoint"]["uuid"] == second

    described = ok(master.official("model", "describe", name))
    # The latest version, with its trial, step and validation metrics.
    assert second in described.stdout and "0.25" in described.stdout, describe_run(described)
    one = ok(master.official("model", "describe", name, "--version", "1"))
    assert first in one.stdout and second not in one.stdout, describe_run(one)
    assert (
        json.loads(ok(master.official("model", "describe", name, "--json")).stdout)["id"]
        == model["id"]
    )

    versions = json.loads(ok(master.official("model", "list-versions", name, "--json")).stdout)
    assert [v["checkpoint"]["uuid"] for v in versions["modelVersions"]] == [first, second]
    table = ok(master.official("model", "list-versions", name))
    assert first in table.stdout and second in table.stdout, describe_run(table)

    # Refusals reach the user as the master's message.
    clash = failed(master.official("model", "create", name))
    assert f"a model named '{name}' already exists" in clash
    missing = failed(master.official("model", "describe", unique("nope")))
    assert "no model named" in missing
    bogus = str(uuidlib.uuid4())
    assert f"no checkpoint {bogus}" in failed(
        master.official("model", "register-version", name, bogus)
    )

    ok(master.official("model", "delete", name))
    assert master.http("GET", f"/api/v1/models/{name}").status_code == 404


def test_official_sdk_model_registry(master: MasterProcess, tmp_path: Path) -> None:
    _, (first, second) = checkpoints(master, tmp_path / "store", [0.5, 0.25])
    name = unique("sdk-model")
    found = run_sdk_script(master, tmp_path, SDK_SCRIPT, name, first, second)
    assert found["ids"] == [found["id"]] * 3
    assert found["description"] == "from the SDK" and found["username"] == "determined"
    assert found["metadata"] == {"team": "vision", "stage": "prod"}
    assert found["labels"] == ["cnn", "mnist"]
    trial_ids = {v[2] for v in found["versions"]}
    assert len(trial_ids) == 1 and None not in trial_ids
    assert [v[:2] for v in found["versions"]] == [[2, second], [1, first]]  # newest first
    assert found["versions"][1][3] == "baseline"
    assert found["latest"] == [2, second]
    assert found["first"] == ["baseline", "the first one", {"steps_completed": 1}]
    assert found["validation"]["avgMetrics"] == {"loss": 0.5}
    assert found["listed"] == [name] and found["archived"] is True
    assert found["after_delete"] == [1]


# Runs in the official client's venv: what a batch-inference trial's Core API calls
# (core_context.experimental.report_task_using_model_version, given the trial's session),
# then the SDK reading the version's and the checkpoint's metrics back.
INFERENCE_SCRIPT = """
import json, sys

from determined.common.api import bindings
from determined.core._experimental import ExperimentalCoreContext
from determined.experimental import client

master, name, inference_trial, run_id = sys.argv[1:]
client.login(master=master, user="determined", password="")
session = client._determined._session
version = client.get_model(name).get_version(1)
ExperimentalCoreContext(session, int(inference_trial)).report_task_using_model_version(version)
bindings.post_ReportTrialMetrics(session, metrics_trialId=int(inference_trial), body=(
    bindings.v1ReportTrialMetricsRequest(group="inference", metrics=bindings.v1TrialMetrics(
        trialId=int(inference_trial), trialRunId=int(run_id), stepsCompleted=8,
        metrics=bindings.v1Metrics(avgMetrics={"accuracy": 0.9})))))
by_version = [(m.trial_id, m.steps_completed, m.metrics) for m in version.iter_metrics("inference")]
by_checkpoint = [(m.trial_id, m.group) for m in version.checkpoint.get_metrics()]
print("RESULT " + json.dumps({"by_version": by_version, "by_checkpoint": by_checkpoint}))
"""


def test_an_inference_trials_metrics_through_the_sdk(master: MasterProcess, tmp_path: Path) -> None:
    _, (trained,) = checkpoints(master, tmp_path / "store", [0.5])
    name = unique("served")
    master.api("POST", "/api/v1/models", json={"name": name})
    master.api(
        "POST",
        f"/api/v1/models/{name}/versions",
        json={"checkpointUuid": trained, "modelName": name},
    )
    inference = master.api(
        "POST",
        "/api/v1/experiments",
        json={"config": CONFIG.format(storage=tmp_path / "other"), "activate": True},
    )["experiment"]["id"]
    tasks = master.api("GET", "/api/v1/tasks")["allocationIdToSummary"].values()
    (task,) = [t for t in tasks if t["experimentId"] == inference]
    args = [name, str(task["trialId"]), task["allocationId"].split(".")[1]]
    found = run_sdk_script(master, tmp_path, INFERENCE_SCRIPT, *args)
    assert found["by_version"] == [[task["trialId"], 8, {"accuracy": 0.9}]]
    assert found["by_checkpoint"] == [[task["trialId"], "inference"]]


def test_a_registered_checkpoint_outlives_retention_and_deletes(
    master: MasterProcess, tmp_path: Path
) -> None:
    # Retention keeps the best (step 2) and the latest (step 4); step 1 is registered.
    storage = tmp_path / "store"
    experiment_id, uuids = checkpoints(master, storage, [0.5, 0.1, 0.9, 0.7])
    name = unique("kept")
    ok(master.official("model", "create", name))
    ok(master.official("model", "register-version", name, uuids[0]))

    refused = failed(master.official("checkpoint", "delete", uuids[0], "--yes"))
    assert f"version 1 of model '{name}'" in refused and "delete those model versions" in refused
    master.api("POST", f"/api/v1/experiments/{experiment_id}/kill")
    assert checkpoint_state(master, uuids[2]) in ("DELETING", "DELETED")
    assert checkpoint_state(master, uuids[0]) == "ACTIVE"
    refused = failed(master.official("e", "delete", str(experiment_id), "--yes"))
    assert f"version 1 of model '{name}'" in refused
    assert (storage / uuids[0] / "model.pt").is_file()

    master.api("DELETE", f"/api/v1/models/{name}/versions/1")
    ok(master.official("checkpoint", "delete", uuids[0], "--yes"))
    assert checkpoint_state(master, uuids[0]) in ("DELETING", "DELETED")


def test_our_det_model_verbs(master: MasterProcess, tmp_path: Path) -> None:
    _, (first, second) = checkpoints(master, tmp_path / "store", [0.5, 0.25])
    name = unique("our-model")

    created = json.loads(
        ok(
            master.det(
                "model",
                "create",
                name,
                "--description",
                "d",
                "--label",
                "a",
                "--metadata",
                '{"team": "vision"}',
                "--json",
            )
        ).stdout
    )
    assert created["name"] == name and created["labels"] == ["a"]
    assert created["metadata"] == {"team": "vision"}
    table = ok(master.det("model", "list"))
    assert name in table.stdout and "Versions" in table.stdout, describe_run(table)
    assert name in [m["name"] for m in json.loads(ok(master.det("model", "list", "--json")).stdout)]

    v1 = json.loads(
        ok(master.det("model", "register-version", name, first, "--name", "v-one", "--json")).stdout
    )
    assert v1["version"] == 1 and v1["checkpoint"]["uuid"] == first and v1["name"] == "v-one"
    row = ok(master.det("model", "register-version", name, second))
    assert second in row.stdout, describe_run(row)

    versions = json.loads(ok(master.det("model", "list-versions", name, "--json")).stdout)
    assert [(v["version"], v["checkpoint"]["uuid"]) for v in versions] == [(1, first), (2, second)]
    described = ok(master.det("model", "describe", name))
    assert first in described.stdout and second in described.stdout, describe_run(described)
    assert "team" in described.stdout
    as_json = json.loads(ok(master.det("model", "describe", name, "--json")).stdout)
    assert as_json["model"]["numVersions"] == 2 and len(as_json["modelVersions"]) == 2

    ok(master.det("model", "archive", name))
    hidden = json.loads(ok(master.det("model", "list", "--json")).stdout)
    assert name not in [m["name"] for m in hidden]
    refused = failed(master.det("model", "register-version", name, first))
    assert "is archived" in refused
    ok(master.det("model", "unarchive", name))

    bad = failed(master.det("model", "create", unique("bad"), "--metadata", "[1, 2]"))
    assert "--metadata: must be a JSON object" in bad
    assert f"a model named '{name}' already exists" in failed(master.det("model", "create", name))
    assert "no model named" in failed(master.det("model", "describe", unique("nope")))

    ok(master.det("model", "delete", name, "--version", "2"))
    versions = json.loads(ok(master.det("model", "list-versions", name, "--json")).stdout)
    assert [v["version"] for v in versions] == [1]
    deleted = ok(master.det("model", "delete", name))
    assert lines(deleted.stdout) == [f"Deleted model {name}"], describe_run(deleted)
    assert master.http("GET", f"/api/v1/models/{name}").status_code == 404
