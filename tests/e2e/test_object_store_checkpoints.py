"""Checkpoints in object stores, end to end: a det-master, a det-agent, trial scripts that
use the `resolute` library, and real S3 (moto), GCS (gcp-storage-emulator) and Azure
(Azurite) servers on loopback. What lands in a bucket is read from the store itself."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import AgentProcess
from tests.conftest import store_server
from tests.e2e.agents import (
    create_experiment,
    trial_logs,
    trial_of,
    wait_trial_state,
    write_experiment,
)
from tests.e2e.conftest import BACKENDS, MasterProcess, ok, running_master
from tests.object_stores import StoreServer, free_port, start_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=BACKENDS)
def master(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    store_servers: dict[str, StoreServer | str],
) -> Iterator[MasterProcess]:
    # The master deletes and serves checkpoints itself, so it must find the GCS server the
    # way google-cloud-storage does.
    if "gcs" not in store_servers:
        store_servers["gcs"] = start_server("gcs", tmp_path_factory.mktemp("gcs-server"))
    gcs = store_servers["gcs"]
    env = {"STORAGE_EMULATOR_HOST": gcs.url} if isinstance(gcs, StoreServer) else {}
    with running_master(request, tmp_path_factory, "stores", env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
def agent(
    master: MasterProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    work = tmp_path_factory.mktemp("store-agent")
    proc = AgentProcess(master, "store-agent", work / "agent", slots=1).start()
    proc.wait_connected()
    yield proc
    proc.stop()


# Checkpoints at step 2; a first run then waits to be killed, a resumed run reads the
# checkpoint back and finishes.
RESUMING_SCRIPT = """
import json, os, stat, sys, time
import resolute

with resolute.init() as ctx:
    config = os.environ["DET_EXPERIMENT_CONFIG"]
    print("CONFIG " + config)
    credentials = os.environ.get("AWS_SHARED_CREDENTIALS_FILE")
    if credentials:
        print("CREDENTIALS_MODE " + oct(stat.S_IMODE(os.stat(credentials).st_mode)))
    latest = ctx.latest_checkpoint
    if latest is None:
        with ctx.checkpoint.store_path(2) as (path, uuid):
            (path / "state.json").write_text(json.dumps({"step": 2}))
            (path / "weights").mkdir()
            (path / "weights" / "w.bin").write_bytes(os.urandom(3 * 1024 * 1024))
        print(f"CHECKPOINT {uuid} PID {os.getpid()}", flush=True)
        time.sleep(600)
    with ctx.checkpoint.restore_path(latest) as path:
        state = json.loads((path / "state.json").read_text())
        size = (path / "weights" / "w.bin").stat().st_size
    print(f"RESUMED {latest} step={state['step']} bytes={size}", flush=True)
    ctx.train.report_validation_metrics(steps_completed=4, metrics={"loss": 0.5})
"""


def storage_extra(server: StoreServer, bucket: str, prefix: str = "") -> dict[str, Any]:
    extra: dict[str, Any] = {"checkpoint_storage": server.storage_config(bucket, prefix)}
    if server.kind == "gcs":
        extra["environment"] = {"environment_variables": [f"STORAGE_EMULATOR_HOST={server.url}"]}
    return extra


def wait_for_log(master: MasterProcess, trial_id: int, pattern: str) -> re.Match[str]:
    def found() -> re.Match[str] | None:
        return re.search(pattern, trial_logs(master, trial_id))

    match: re.Match[str] = master.wait_for(f"{pattern!r} in trial {trial_id}'s logs", found, 180)
    return match


def test_a_trial_checkpoints_into_the_store_and_resumes_from_it_after_a_kill(
    master: MasterProcess, agent: AgentProcess, object_store: StoreServer, tmp_path: Path
) -> None:
    bucket = object_store.new_bucket()
    prefix = "" if object_store.kind == "azure" else "team/runs"
    extra = storage_extra(object_store, bucket, prefix)
    config, model = write_experiment(tmp_path, RESUMING_SCRIPT, max_restarts=1, extra=extra)
    experiment_id = create_experiment(master, config, model)
    trial_id = wait_trial_state(master, experiment_id, {"RUNNING"})["id"]
    first = wait_for_log(master, trial_id, r"CHECKPOINT (\S+) PID (\d+)")
    uuid, pid = first.group(1), int(first.group(2))

    # In the bucket itself, under Determined's layout: <prefix>/<uuid>/<path>.
    base = f"{prefix}/{uuid}" if prefix else uuid
    assert object_store.keys(bucket) == {
        f"{base}/state.json": len(json.dumps({"step": 2})),
        f"{base}/weights/w.bin": 3 * 1024 * 1024,
    }
    reply = master.api("GET", f"/api/v1/checkpoints/{uuid}")["checkpoint"]
    scheme = {"s3": "s3", "gcs": "gs", "azure": "azure"}[object_store.kind]
    assert reply["storagePath"] == f"{scheme}://{bucket}/{base}"
    assert reply["resources"] == {
        "state.json": str(len(json.dumps({"step": 2}))),
        "weights/w.bin": str(3 * 1024 * 1024),
    }

    os.kill(pid, signal.SIGKILL)  # the rank dies; its restart resumes from the store
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    logs = trial_logs(master, trial_id)
    assert trial["state"] == "COMPLETED", logs
    assert trial["restarts"] == 1
    assert f"RESUMED {uuid} step=2 bytes={3 * 1024 * 1024}" in logs

    # The S3 keys never reached the rank: the config it saw has none, and boto3 found
    # them in a file only the agent's user can read.
    seen = json.loads(re.findall(r"CONFIG (.+)", logs)[-1])["checkpoint_storage"]
    if object_store.kind == "s3":
        assert "access_key" not in seen and "secret_key" not in seen
        assert "CREDENTIALS_MODE 0o600" in logs
        for key in ("access_key", "secret_key"):
            assert extra["checkpoint_storage"][key] not in logs
    # Nor does the API show a secret of any store.
    shown = master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
    for key in ("access_key", "secret_key", "connection_string"):
        if key in extra["checkpoint_storage"]:
            assert shown["config"]["checkpoint_storage"][key] == "********"
            assert extra["checkpoint_storage"][key] not in shown["originalConfig"]


def test_a_bad_bucket_fails_the_trial_before_its_ranks_start(
    master: MasterProcess, agent: AgentProcess, object_store: StoreServer, tmp_path: Path
) -> None:
    storage = object_store.storage_config("no-such-bucket-here")
    extra = storage_extra(object_store, "no-such-bucket-here")
    config, model = write_experiment(tmp_path, "print('RANK STARTED')", max_restarts=0, extra=extra)
    started = time.monotonic()
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"}, timeout=120)
    took = time.monotonic() - started
    logs = trial_logs(master, trial["id"])
    assert trial["state"] == "ERROR", logs
    assert "RANK STARTED" not in logs
    described = trial_of(master, experiment_id)["endReason"]
    # One line, naming the store and in its own words.
    assert "\n" not in described and "is not usable" in described, described
    words = {"s3": "NoSuchBucket", "gcs": "no-such-bucket-here", "azure": "does not exist"}
    assert words[object_store.kind] in described, described
    assert storage.get("secret_key", "not-a-secret") not in logs
    assert took < 30, f"the trial took {took:.1f} s to fail"


def test_an_endpoint_nobody_listens_on_fails_the_trial_in_seconds(
    master: MasterProcess, agent: AgentProcess, tmp_path: Path
) -> None:
    storage = {
        "type": "s3",
        "bucket": "anything",
        "endpoint_url": f"http://127.0.0.1:{free_port()}",
        "access_key": "AKIA-NOT-REAL",
        "secret_key": "not-real-either",
    }
    config, model = write_experiment(
        tmp_path, "print('RANK STARTED')", extra={"checkpoint_storage": storage}
    )
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    assert trial["state"] == "ERROR"
    reason = trial_of(master, experiment_id)["endReason"]
    assert "Could not connect to the endpoint URL" in reason, reason
    assert "not-real-either" not in trial_logs(master, trial["id"])


# Five checkpoints with validation losses 0.5, 0.1, 0.9, 0.3, 0.7 at steps 1..5.
RETENTION_SCRIPT = """
import resolute

LOSSES = [0.5, 0.1, 0.9, 0.3, 0.7]
with resolute.init() as ctx:
    for step, loss in enumerate(LOSSES, start=1):
        ctx.train.report_validation_metrics(steps_completed=step, metrics={"loss": loss})
        with ctx.checkpoint.store_path(step) as (path, uuid):
            (path / "weights.bin").write_bytes(bytes([step]) * (1000 * step))
            (path / "sub").mkdir()
            (path / "sub" / "step.txt").write_text(str(step))
        print(f"CHECKPOINT {step} {uuid}", flush=True)
"""


def checkpoints_of(master: MasterProcess, experiment_id: int) -> dict[int, dict[str, Any]]:
    """The experiment's checkpoints by step."""
    found = master.api("GET", f"/api/v1/experiments/{experiment_id}/checkpoints")["checkpoints"]
    return {c["stepsCompleted"]: c for c in found}


def wait_states(
    master: MasterProcess, experiment_id: int, wanted: dict[int, str], timeout: float = 180
) -> dict[int, dict[str, Any]]:
    def reached() -> dict[int, dict[str, Any]] | None:
        found = checkpoints_of(master, experiment_id)
        states = {step: c["storageState"] for step, c in found.items()}
        return found if states == wanted else None

    result: dict[int, dict[str, Any]] = master.wait_for(
        f"checkpoint states {wanted}", reached, timeout
    )
    return result


def uuids_in_bucket(server: StoreServer, bucket: str, prefix: str) -> set[str]:
    keys = server.keys(bucket)
    start = len(prefix) + 1 if prefix else 0
    return {key[start:].split("/")[0] for key in keys}


def test_retention_download_and_experiment_delete_act_on_the_store_itself(
    master: MasterProcess, agent: AgentProcess, object_store: StoreServer, tmp_path: Path
) -> None:
    bucket = object_store.new_bucket()
    prefix = "" if object_store.kind == "azure" else "kept"
    extra = storage_extra(object_store, bucket, prefix)
    extra["checkpoint_storage"].update(save_trial_best=1, save_trial_latest=1)
    config, model = write_experiment(tmp_path, RETENTION_SCRIPT, extra=extra)
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    assert trial["state"] == "COMPLETED", trial_logs(master, trial["id"])

    # The best (step 2, loss 0.1) and the latest (step 5) stay; the others are deleted
    # from the store, which is what we list, not our database.
    found = wait_states(
        master,
        experiment_id,
        {1: "DELETED", 2: "ACTIVE", 3: "DELETED", 4: "DELETED", 5: "ACTIVE"},
    )
    assert uuids_in_bucket(object_store, bucket, prefix) == {found[2]["uuid"], found[5]["uuid"]}
    assert found[1]["state"] == "STATE_DELETED"  # Determined's name, for its client
    listed = ok(master.det("checkpoint", "list", str(experiment_id))).stdout
    assert listed.count("DELETED") == 3 and listed.count("ACTIVE") == 2, listed

    # Downloads stream the kept checkpoint through the master: ours with a progress bar,
    # Determined's official client (S3 and GCS try the store directly first: S3 has no
    # credentials here, so it falls back to the master; Azure needs --mode master).
    kept = found[2]["uuid"]
    ours = tmp_path / "ours"
    ok(master.det("checkpoint", "download", kept, "-o", str(ours)))
    assert (ours / "weights.bin").read_bytes() == bytes([2]) * 2000
    assert (ours / "sub" / "step.txt").read_text() == "2"
    official = tmp_path / "official"
    mode = ["--mode", "master"] if object_store.kind == "azure" else []
    ok(master.official("checkpoint", "download", kept, "-o", str(official), *mode))
    assert (official / "weights.bin").read_bytes() == bytes([2]) * 2000
    assert (official / "sub" / "step.txt").read_text() == "2"

    # Deleting the experiment deletes its checkpoints from the store, then the experiment.
    ok(master.det("experiment", "delete", str(experiment_id), "--yes"))
    master.wait_for(
        f"experiment {experiment_id} gone",
        lambda: master.http("GET", f"/api/v1/experiments/{experiment_id}").status_code == 404,
        180,
    )
    assert object_store.keys(bucket) == {}


def test_a_delete_while_the_store_is_down_is_retried_until_it_is_back(
    master: MasterProcess,
    agent: AgentProcess,
    store_servers: dict[str, StoreServer | str],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    # Azurite keeps its blobs on disk, so it can be stopped and started again.
    server = store_server("azure", store_servers, tmp_path_factory)
    bucket = server.new_bucket()
    extra = storage_extra(server, bucket)
    extra["checkpoint_storage"].update(save_trial_best=5, save_trial_latest=5)  # keep all
    config, model = write_experiment(tmp_path, RETENTION_SCRIPT, extra=extra)
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    assert trial["state"] == "COMPLETED", trial_logs(master, trial["id"])
    found = checkpoints_of(master, experiment_id)
    doomed = found[3]["uuid"]

    server.stop()
    try:
        ok(master.det("checkpoint", "delete", doomed, "--yes"))

        def failed_once() -> dict[str, Any] | None:
            checkpoint = checkpoints_of(master, experiment_id)[3]
            return checkpoint if "attempt 1 failed" in checkpoint["stateReason"] else None

        failing = master.wait_for("a failed delete attempt", failed_once, 180)
        assert failing["storageState"] in ("DELETING", "PARTIALLY_DELETED")
        assert "retrying in" in failing["stateReason"]
        assert failing["stateReason"].startswith("deleted by determined | attempt 1 failed")
        described = ok(master.det("checkpoint", "describe", doomed)).stdout
        assert "attempt 1 failed" in described
    finally:
        server.start()
    wait_states(
        master,
        experiment_id,
        {1: "ACTIVE", 2: "ACTIVE", 3: "DELETED", 4: "ACTIVE", 5: "ACTIVE"},
    )
    assert doomed not in uuids_in_bucket(server, bucket, "")
    assert len(uuids_in_bucket(server, bucket, "")) == 4
    # Deleted at last, it says why it went, not how the retries went.
    assert checkpoints_of(master, experiment_id)[3]["stateReason"] == "deleted by determined"


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_synthetic"


def rank_pids(trial_id: int) -> list[int]:
    """The trial's rank processes on this machine, found by their DET_TRIAL_ID."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"DET_TRIAL_ID={trial_id}".encode() in environ and b"train.py" in cmdline:
            found.append(int(proc.name))
    return found


def test_the_ddp_example_checkpoints_to_s3_and_resumes_after_a_kill(
    master: MasterProcess,
    agent: AgentProcess,
    store_servers: dict[str, StoreServer | str],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    """The example's own checkpoints, retention and resume, on S3 alone: what differs from
    one store to another is resolute.storage, which the library test above runs on each
    store, while PyTorch's start costs seconds of CPU a run."""
    pytest.importorskip("torch")  # the example trains with PyTorch (the CPU build here)
    object_store = store_server("s3", store_servers, tmp_path_factory)
    bucket = object_store.new_bucket()
    prefix = "ddp"
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    config.update(storage_extra(object_store, bucket, prefix))
    config["name"] = f"ddp-{object_store.kind}"
    config["resources"] = {"slots_per_trial": 1}
    # 40 steps in about 8 s: after the checkpoint at step 10, the 6 s left are for seeing it
    # in the logs and killing the rank (0.1 s a step left 3 s, which a loaded machine can miss).
    config["hyperparameters"]["step_sleep_s"] = 0.2
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    experiment_id = create_experiment(master, path, EXAMPLE)
    trial_id = wait_trial_state(master, experiment_id, {"RUNNING"})["id"]
    first = wait_for_log(master, trial_id, r"CHECKPOINT uuid=(\S+) steps=10")
    pids = rank_pids(trial_id)
    assert pids, "the trial's rank is not running"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"})
    logs = trial_logs(master, trial_id)
    assert trial["state"] == "COMPLETED", logs[-3000:]
    assert trial["restarts"] == 1
    # The restart read a checkpoint back from the store, at 10 steps or later.
    resumed = re.findall(r"RESUMED uuid=(\S+) steps=(\d+)", logs)
    assert resumed and int(resumed[0][1]) >= 10, logs[-3000:]
    # Retention (save_trial_best 1, save_trial_latest 1) leaves at most two in the bucket,
    # and what is left is what the master lists as ACTIVE.
    found = master.wait_for(
        "retention to finish",
        lambda: (
            None
            if any(
                c["storageState"] in ("DELETING", "PARTIALLY_DELETED")
                for c in checkpoints_of(master, experiment_id).values()
            )
            else checkpoints_of(master, experiment_id)
        ),
        180,
    )
    active = {c["uuid"] for c in found.values() if c["storageState"] == "ACTIVE"}
    assert 1 <= len(active) <= 2
    assert uuids_in_bucket(object_store, bucket, prefix) == active
    assert first.group(1) in {c["uuid"] for c in found.values()}
