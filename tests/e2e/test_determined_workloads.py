"""Determined workloads run unmodified: the real `determined==0.38.1` package in the trials'
interpreter, a real master and two real agents in network namespaces (2 CPU slots each),
driven by Determined's official `det` client.

The scripts in determined_workloads/ are ours, written in the style of Determined's
tutorials; their configs are in Determined's format and submitted as they are. The trials'
interpreter (`.venv-trial`, built by `make test`, named by DET_TRIAL_VENV) is chosen the
way an admin would: the master's task_container_defaults.environment_variables sets PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import AgentProcess
from tests.conftest import require
from tests.e2e import netns
from tests.e2e.agents import trial_logs
from tests.e2e.conftest import MasterProcess, describe_run, ok, unique
from tests.object_stores import StoreServer, start_server

pytestmark = pytest.mark.e2e

WORKLOADS = Path(__file__).resolve().parent / "determined_workloads"
AGENT_IDS = ("host-a", "host-b")
TERMINAL = {"COMPLETED", "CANCELED", "ERROR"}
# "eventually": under a minute for the biggest in CI; under pytest-timeout's 300 s, so a
# miss fails with the master's and agents' logs rather than a stack.
TRIAL_TIMEOUT_S = 240.0
# checkpoints.py at 0.2 s a step, not 0.05: a pause sent once the first checkpoint (step 10)
# is seen must reach the trial before its step 50, and it goes through the official client,
# whose start alone takes seconds on a loaded machine. 40 steps at 0.05 s left 2 s for it.
PAUSABLE_ENTRYPOINT = "python3 checkpoints.py --sleep 0.2"


def trial_venv() -> Path:
    """The interpreter with determined 0.38.1, torch and tensorboard; skip (fail in CI)
    without it."""
    venv = Path(os.environ.get("DET_TRIAL_VENV") or "")
    python = venv / "bin" / "python3"
    require(
        bool(os.environ.get("DET_TRIAL_VENV")) and python.exists(),
        "no trial interpreter with determined: run `make trial-venv` and set DET_TRIAL_VENV",
    )
    return venv


class Cluster:
    def __init__(
        self, master: MasterProcess, agents: list[AgentProcess], work: Path, bridge: str
    ) -> None:
        self.master = master
        self.bridge = bridge  # the root namespace's address on the agents' network
        self.agents = agents
        self.work = work

    def create(self, name: str, *extra: str, model: Path = WORKLOADS) -> int:
        """`det experiment create` with Determined's official client, the config as it is."""
        result = ok(
            self.master.official(
                "experiment", "create", str(WORKLOADS / f"{name}.yaml"), str(model), *extra
            )
        )
        found = re.findall(r"Created experiment (\d+)", result.stdout)
        assert len(found) == 1, describe_run(result)
        return int(found[0])

    def trial(self, experiment_id: int) -> dict[str, Any]:
        trials = self.master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
        assert len(trials) == 1, trials
        trial: dict[str, Any] = trials[0]
        trial["state"] = trial["state"].removeprefix("STATE_")
        return trial

    def wait(
        self, experiment_id: int, states: set[str], timeout: float = TRIAL_TIMEOUT_S
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            trial = self.trial(experiment_id)
            if trial["state"] in TERMINAL and trial["state"] not in states:
                raise AssertionError(
                    f"trial {trial['id']} ended {trial['state']} ({trial.get('endReason')}):\n"
                    f"{trial_logs(self.master, trial['id'])[-4000:]}\n{self.diagnostics()}"
                )
            return trial if trial["state"] in states else None

        result: dict[str, Any] = self.master.wait_for(
            f"experiment {experiment_id} to reach {sorted(states)}", reached, timeout, 0.5
        )
        return result

    def pause_after_a_checkpoint(self, experiment_id: int, trial_id: int) -> None:
        """Once the trial has reported a checkpoint, pause the experiment (official det)."""
        self.master.wait_for(
            "a first checkpoint",
            lambda: self.master.api("GET", f"/api/v1/trials/{trial_id}/checkpoints")["checkpoints"],
            TRIAL_TIMEOUT_S,
            0.5,
        )
        ok(self.master.official("experiment", "pause", str(experiment_id)))

    def metrics(self, trial_id: int, group: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.master.api(
            "GET", f"/api/v1/trials/{trial_id}/metrics", params={"group": group}
        )["metrics"]
        return rows

    def logs(self, trial_id: int) -> list[dict[str, Any]]:
        reply = self.master.http("GET", f"/api/v1/trials/{trial_id}/logs")
        assert reply.status_code == 200, reply.text
        return [json.loads(line)["result"] for line in reply.text.splitlines() if line.strip()]

    def diagnostics(self) -> str:
        parts = [f"--- master log ---\n{self.master.output()}"]
        parts += [f"--- agent {a.id} log ---\n{a.output()}" for a in self.agents]
        return "\n".join(parts)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    netns.require_netns_and_torch()
    venv = trial_venv()
    work = tmp_path_factory.mktemp("determined")
    with ExitStack() as stack:
        net = stack.enter_context(
            netns.topology(
                netns.tag_for("determined-workloads"),
                mgmt_names=("mgmt0", "mgmt0"),
                fast_names=("eth1", "eth1"),
            )
        )
        master = MasterProcess(work / "data", label="determined", host="0.0.0.0")
        path = f"PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin"
        master.extra_env.update(
            DET_MASTER_EXTERNAL_URL=f"http://{net.bridge_address}:{master.port}",
            # How an admin picks the interpreter for every trial: no config changes.
            DET_MASTER_TASK_CONTAINER_DEFAULTS__ENVIRONMENT_VARIABLES=json.dumps([path]),
            DET_MASTER_AGENT_LINK__PREEMPTION_TIMEOUT_S="60",
        )
        stack.callback(shutil.rmtree, master.scratch, ignore_errors=True)
        stack.callback(master.stop)
        master.start()
        agents = []
        for index, agent_id in enumerate(AGENT_IDS):
            agent = AgentProcess(
                master,
                agent_id,
                work / agent_id,
                slots=2,
                netns=net.hosts[index].netns,
                master_address=f"{net.bridge_address}:{master.agent_port}",
            )
            stack.callback(agent.stop)
            agents.append(agent.start())
        for agent in agents:
            agent.wait_connected()
        yield Cluster(master, agents, work, net.bridge_address)


def test_core_api_metrics_run_unchanged_and_describe_says_how(cluster: Cluster) -> None:
    experiment_id = cluster.create("metrics")
    trial = cluster.wait(experiment_id, {"COMPLETED"})
    training = cluster.metrics(trial["id"], "training")
    assert [r["stepsCompleted"] for r in training] == list(range(1, 51))
    validation = cluster.metrics(trial["id"], "validation")
    assert [r["stepsCompleted"] for r in validation] == [10, 20, 30, 40, 50]
    assert trial["progress"] == pytest.approx(1.0)
    metadata = cluster.master.api("GET", f"/api/v1/runs/{trial['id']}/metadata")["metadata"]
    assert metadata == {"steps": 50, "final": {"x": training[-1]["metrics"]["x"]}}
    # The launch layout and why, in our describe; the official client's describe works too.
    described = ok(cluster.master.det("experiment", "describe", str(experiment_id))).stdout
    flat = " ".join(described.split())
    assert "per_agent: the entrypoint runs once per agent" in flat, described
    assert "metrics.py imports determined" in flat, described
    ok(cluster.master.official("experiment", "describe", str(experiment_id)))


def test_checkpoints_pause_and_activate_resume_from_the_latest_checkpoint(
    cluster: Cluster,
) -> None:
    experiment_id = cluster.create("checkpoints", "--config", f"entrypoint={PAUSABLE_ENTRYPOINT}")
    trial = cluster.wait(experiment_id, {"RUNNING"})
    cluster.pause_after_a_checkpoint(experiment_id, trial["id"])
    paused = cluster.wait(experiment_id, {"PAUSED"})
    assert paused["restarts"] == 0
    ok(cluster.master.official("experiment", "activate", str(experiment_id)))
    done = cluster.wait(experiment_id, {"COMPLETED"})
    assert done["restarts"] == 0

    text = trial_logs(cluster.master, trial["id"])
    steps = [int(s) for s in re.findall(r"^STEP (\d+) ", text, re.M)]
    assert "PREEMPTED" in text and "RESUMED" in text, text[-3000:]
    # Every step ran exactly once across the two runs, and the result is the
    # uninterrupted one.
    assert sorted(steps) == list(range(1, 51)), steps
    expected = 0.0
    for step in range(1, 51):
        expected += 1.0 / step
    final = re.findall(r"^DONE steps=50 x=(\S+)", text, re.M)
    assert final and float(final[0]) == expected, text[-2000:]
    training = cluster.metrics(trial["id"], "training")
    assert [r["stepsCompleted"] for r in training] == list(range(1, 51))
    assert training[-1]["metrics"]["x"] == expected


def test_continue_trains_a_completed_trial_on_from_its_latest_checkpoint(
    cluster: Cluster,
) -> None:
    """`det experiment continue` (official client) with a longer run: the same trial runs
    again from the checkpoint its first run ended with; no step runs twice."""
    experiment_id = cluster.create(
        "checkpoints", "--config", "entrypoint=python3 checkpoints.py --steps 20"
    )
    first = cluster.wait(experiment_id, {"COMPLETED"})
    continued = ok(
        cluster.master.official(
            "experiment",
            "continue",
            str(experiment_id),
            "--config",
            "entrypoint=python3 checkpoints.py --steps 30",
        )
    )
    assert f"Continued experiment {experiment_id}" in continued.stdout, describe_run(continued)
    done = cluster.wait(experiment_id, {"COMPLETED"})
    assert done["id"] == first["id"] and done["restarts"] == 0
    text = trial_logs(cluster.master, first["id"])
    assert re.search(r"^RESUMED \S+ steps=20 ", text, re.M), text[-3000:]
    steps = [int(s) for s in re.findall(r"^STEP (\d+) ", text, re.M)]
    assert sorted(steps) == list(range(1, 31)), steps
    expected = 0.0
    for step in range(1, 31):
        expected += 1.0 / step
    final = re.findall(r"^DONE steps=30 x=(\S+)", text, re.M)
    assert final and float(final[0]) == expected, text[-2000:]
    experiment = cluster.master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
    assert experiment["state"] == "STATE_COMPLETED"
    assert experiment["config"]["entrypoint"] == "python3 checkpoints.py --steps 30"


def test_batch_inference_serves_a_registered_version_and_its_metrics_are_found_from_it(
    cluster: Cluster,
) -> None:
    """Determined's batch inference, unchanged: a trained checkpoint is registered as a
    model version; an inference trial reads that version through the SDK with its own
    token, says it uses it (core_context.experimental) and reports "inference" metrics,
    which the version's metrics route then returns."""
    trained = cluster.create(
        "checkpoints", "--config", "entrypoint=python3 checkpoints.py --steps 10"
    )
    trial = cluster.wait(trained, {"COMPLETED"})
    # Its one checkpoint, at step 10.
    (latest,) = cluster.master.api("GET", f"/api/v1/trials/{trial['id']}/checkpoints")[
        "checkpoints"
    ]
    model = unique("served")
    cluster.master.api("POST", "/api/v1/models", json={"name": model})
    cluster.master.api(
        "POST",
        f"/api/v1/models/{model}/versions",
        json={"checkpointUuid": latest["uuid"], "modelName": model},
    )
    serving = cluster.create(
        "batch_inference", "--config", f"entrypoint=python3 batch_inference.py --model {model}"
    )
    inference = cluster.wait(serving, {"COMPLETED"})
    assert f"SERVED {model} version 1" in trial_logs(cluster.master, inference["id"])
    reports = cluster.master.api(
        "GET",
        f"/api/v1/models/{model}/versions/1/metrics",
        params={
            "trialSourceInfoType": "TRIAL_SOURCE_INFO_TYPE_INFERENCE",
            "metricGroup": "inference",
        },
    )["metrics"]
    assert [(r["trialId"], r["totalBatches"], r["metrics"]) for r in reports] == [
        (inference["id"], batch, {"avg_metrics": {"predictions": 64 * batch}})
        for batch in (1, 2, 3)
    ]


@pytest.mark.parametrize("name", ["torch_distributed", "distributed_launcher"])
def test_four_slots_across_two_agents(cluster: Cluster, name: str) -> None:
    experiment_id = cluster.create(name)
    trial = cluster.wait(experiment_id, {"COMPLETED"})
    logs = cluster.logs(trial["id"])
    # Each rank's lines carry its rank (the launchers' `[rank=N]` prefix is parsed out).
    ranks = {line["rankId"] for line in logs if line.get("rankId") is not None}
    assert ranks == {0, 1, 2, 3}, sorted(ranks, key=str)
    agents = {line["agentId"] for line in logs if line.get("rankId") is not None}
    assert agents == set(AGENT_IDS)
    assert not any(line["message"].startswith("[rank=") for line in logs)
    validation = cluster.metrics(trial["id"], "validation")
    assert validation, "the chief reported nothing"
    # The network-interface rule as for our own layout: the fast link both hosts share.
    log = cluster.master.log.read_text(encoding="utf-8", errors="replace")
    started = re.findall(rf"allocation {trial['id']}\.\d+ starting \(per_agent\): (.*)", log)
    assert started and started[-1].startswith("2 processes on host-a, host-b"), started
    assert started[-1].endswith("over eth1"), started


def test_a_rank_failing_on_one_agent_stops_the_gang_and_the_trial_restarts(
    cluster: Cluster,
) -> None:
    created = ok(
        cluster.master.det(
            "experiment",
            "create",
            str(WORKLOADS / "torch_distributed.yaml"),
            str(WORKLOADS),
            "--config",
            "entrypoint=python3 -m determined.launch.torch_distributed python3 "
            "torch_distributed.py --steps 20 --fail-first-run 3 5",
            "--config",
            "max_restarts=1",
        )
    )
    experiment_id = int(re.findall(r"Created experiment (\d+)", created.stdout)[0])
    trial = cluster.wait(experiment_id, {"COMPLETED"})
    assert trial["restarts"] == 1
    text = trial_logs(cluster.master, trial["id"])
    assert "FAILING rank=3 step=5" in text, text[-3000:]
    # Rank 3 runs on host-b (container rank 1); its launcher's failure stopped host-a's.
    assert "[agent host-b] the entrypoint (container rank 1) exited with code" in text, text
    assert "[agent host-a] stopping: stopping the gang" in text, text
    training = cluster.metrics(trial["id"], "training")
    assert [r["stepsCompleted"] for r in training] == list(range(1, 21))


def test_core_api_checkpoints_go_to_s3_through_determined_s_own_storage_code(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # An S3 server the agents reach from their network namespaces.
    server = start_server("s3", tmp_path_factory.mktemp("s3-det"), host=cluster.bridge)
    require(isinstance(server, StoreServer), str(server))
    assert isinstance(server, StoreServer)
    try:
        bucket = server.new_bucket()
        config = yaml.safe_load((WORKLOADS / "checkpoints.yaml").read_text())
        config["checkpoint_storage"] = server.storage_config(bucket, prefix="det-runs")
        config["entrypoint"] = PAUSABLE_ENTRYPOINT
        path = tmp_path_factory.mktemp("s3-config") / "checkpoints-s3.yaml"
        path.write_text(yaml.safe_dump(config))
        created = ok(
            cluster.master.official("experiment", "create", str(path), str(WORKLOADS))
        ).stdout
        experiment_id = int(re.findall(r"Created experiment (\d+)", created)[0])
        trial = cluster.wait(experiment_id, {"RUNNING"})
        # Paused and activated: the second run downloads the latest checkpoint from S3.
        cluster.pause_after_a_checkpoint(experiment_id, trial["id"])
        cluster.wait(experiment_id, {"PAUSED"})
        ok(cluster.master.official("experiment", "activate", str(experiment_id)))
        cluster.wait(experiment_id, {"COMPLETED"})
        text = trial_logs(cluster.master, trial["id"])
        assert "RESUMED" in text, text[-3000:]
        steps = [int(s) for s in re.findall(r"^STEP (\d+) ", text, re.M)]
        assert sorted(steps) == list(range(1, 51)), steps

        def settled() -> list[dict[str, Any]] | None:
            # Retention deletes what it does not keep in the background, within a second.
            path = f"/api/v1/trials/{trial['id']}/checkpoints"
            found: list[dict[str, Any]] = cluster.master.api("GET", path)["checkpoints"]
            done = all(c["storageState"] in ("ACTIVE", "DELETED") for c in found)
            return found if done else None

        reported = cluster.master.wait_for("retention's deletions to finish", settled, 120)
        kept = {c["uuid"] for c in reported if c["storageState"] == "ACTIVE"}
        # Every kept checkpoint is in the bucket, as Determined lays it out, and nothing
        # else. (Determined's harness also writes metadata.json beside them, and its
        # TensorBoard files under the cluster id.)
        keys = server.keys(bucket)
        in_bucket = {k.split("/")[1] for k in keys if k.endswith("/state.json")}
        assert kept and in_bucket == kept, keys
        assert all(c["storagePath"].startswith(f"s3://{bucket}/det-runs/") for c in reported)
        # The keys reached the harness through a credentials file, not the config.
        assert config["checkpoint_storage"]["secret_key"] not in text
    finally:
        server.stop()


def test_pytorch_trainer_trains_validates_and_checkpoints(cluster: Cluster) -> None:
    experiment_id = cluster.create("trainer")
    trial = cluster.wait(experiment_id, {"COMPLETED"})
    training = cluster.metrics(trial["id"], "training")
    validation = cluster.metrics(trial["id"], "validation")
    # Every 50 of 200 batches; the fit reaches the data's noise floor (1e-4) from a first
    # training loss near 1.
    assert [r["stepsCompleted"] for r in validation] == [50, 100, 150, 200], validation
    first_loss = training[0]["metrics"]["loss"]
    assert all(r["metrics"]["validation_loss"] < first_loss / 10 for r in validation), (
        first_loss,
        validation,
    )
    checkpoints = cluster.master.api("GET", f"/api/v1/trials/{trial['id']}/checkpoints")[
        "checkpoints"
    ]
    assert checkpoints, "the Trainer reported no checkpoint"
    # The Trainer copies the model definition (/run/determined/train/model) into `code/`.
    storage = Path(checkpoints[-1]["storagePath"])
    assert (storage / "code" / "trainer.py").is_file(), sorted(storage.rglob("*"))


def test_invalid_hyperparameters_end_the_trial_completed_with_the_reason(
    cluster: Cluster,
) -> None:
    experiment_id = cluster.create("invalid_hp")
    trial = cluster.wait(experiment_id, {"COMPLETED"})
    assert trial["restarts"] == 0
    assert "invalid hyperparameters" in trial["endReason"], trial


def test_nan_and_infinite_metrics_are_stored_as_reported(cluster: Cluster) -> None:
    experiment_id = cluster.create("nan_metric")
    trial = cluster.wait(experiment_id, {"COMPLETED"})
    by_step = {
        r["stepsCompleted"]: r["metrics"] for r in cluster.metrics(trial["id"], "validation")
    }
    # JSON has no NaN: they read back as Determined's client wrote them.
    assert by_step == {
        1: {"loss": "NaN", "accuracy": 0.5},
        2: {"loss": "Infinity", "accuracy": "-Infinity"},
    }


def test_kill_mid_run_stops_every_process(cluster: Cluster) -> None:
    # Our det's --config, as Determined's: a long run without editing the file.
    created = ok(
        cluster.master.det(
            "experiment",
            "create",
            str(WORKLOADS / "checkpoints.yaml"),
            str(WORKLOADS),
            "--config",
            "entrypoint=python3 checkpoints.py --steps 100000 --sleep 0.05",
        )
    )
    experiment_id = int(re.findall(r"Created experiment (\d+)", created.stdout)[0])
    trial = cluster.wait(experiment_id, {"RUNNING"})
    cluster.master.wait_for(
        "a first training metric",
        lambda: cluster.metrics(trial["id"], "training"),
        TRIAL_TIMEOUT_S,
        0.5,
    )
    assert running("--steps 100000"), "the trial's process is not running"
    ok(cluster.master.official("experiment", "kill", str(experiment_id)))
    ended = cluster.wait(experiment_id, {"CANCELED"}, timeout=120)
    assert ended["restarts"] == 0
    assert not running("--steps 100000")


def running(marker: str) -> list[str]:
    """Command lines of live processes that contain `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in args and "pytest" not in args:
            found.append(args)
    return found


def test_an_interpreter_without_determined_ends_the_trial_with_the_reason(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = yaml.safe_load((WORKLOADS / "metrics.yaml").read_text())
    config["name"] = unique("no-determined")
    # The experiment's own PATH wins over the master's default: the system python3 lacks
    # the package.
    config["environment"] = {"environment_variables": ["PATH=/usr/bin:/bin"]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = ok(cluster.master.official("experiment", "create", str(path), str(WORKLOADS)))
    experiment_id = int(re.findall(r"Created experiment (\d+)", result.stdout)[0])
    trial = cluster.wait(experiment_id, {"ERROR"}, timeout=120)
    assert trial["restarts"] == 0
    assert "/usr/bin/python3 lacks determined" in trial["endReason"], trial
    # What a user reads: our describe's Reason column and det task list's (the table wraps
    # long cells, so the full sentence is checked in their --json).
    described = ok(cluster.master.det("experiment", "describe", str(experiment_id))).stdout
    assert "lacks" in described, described
    as_json = json.loads(
        ok(cluster.master.det("experiment", "describe", str(experiment_id), "--json")).stdout
    )
    assert "/usr/bin/python3 lacks determined" in as_json["trials"][0]["endReason"]
    tasks = ok(cluster.master.det("task", "list")).stdout
    assert "unrunnable" in tasks, tasks
    listed = json.loads(ok(cluster.master.det("task", "list", "--json")).stdout)
    reasons = [t["exitReason"] for t in listed.values() if t["trialId"] == trial["id"]]
    assert reasons and "lacks determined" in reasons[0], listed


def test_adaptive_asha_stops_core_api_trials_through_should_preempt(cluster: Cluster) -> None:
    """Determined's own kind of search config, submitted as it is: the searcher's stops
    reach the trials as should_preempt(), they checkpoint and exit, and the search runs
    its max_trials."""
    preview = ok(cluster.master.official("preview-search", str(WORKLOADS / "hpsearch.yaml")))
    assert "train for 10 batches" in preview.stdout, describe_run(preview)
    assert "train for 40 batches" in preview.stdout, describe_run(preview)

    experiment_id = cluster.create("hpsearch")

    def ended() -> dict[str, Any] | None:
        experiment = cluster.master.api("GET", f"/api/v1/experiments/{experiment_id}")
        state = experiment["experiment"]["state"].removeprefix("STATE_")
        return experiment["experiment"] if state in TERMINAL else None

    experiment = cluster.master.wait_for("the search to end", ended, TRIAL_TIMEOUT_S, 1.0)
    trials = cluster.master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
    assert experiment["state"] == "STATE_COMPLETED", cluster.diagnostics()
    assert experiment["progress"] == 1.0
    assert len(trials) == 6
    stopped_early = 0
    for trial in trials:
        logs = "".join(line["message"] for line in cluster.logs(trial["id"]))
        assert (trial["state"], trial["restarts"]) == ("STATE_COMPLETED", 0), logs[-3000:]
        search = trial["searcher"]
        if search["stoppedAtRung"] == 0 and search["bracket"] == 0:
            # Stopped at 10 batches: told through should_preempt() after a later checkpoint,
            # never trained to the end. (hpsearch.py checks every 10 batches, 0.5 s apart: a
            # stop decided at 10 reaches it through the master's next hub tick and the
            # long-poll's answer, by the check at 20 idle; a loaded machine may need the one
            # at 30.)
            stopped_early += 1
            assert re.search(r"PREEMPTED at batches=(10|20|30)\b", logs), logs[-3000:]
            assert trial["totalBatchesProcessed"] < 40
            assert trial["endReason"].startswith("stopped by the searcher at rung 0"), trial
    assert stopped_early >= 1, [t["searcher"] for t in trials]

    described = ok(cluster.master.official("experiment", "describe", str(experiment_id)))
    assert "COMPLETED" in described.stdout, describe_run(described)
