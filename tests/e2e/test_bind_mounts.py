"""bind_mounts and resources.shm_size with a real master and agent: a trial reads a
bind-mounted file, its write to a read-only one is refused by the kernel (EROFS), a write
to a writable one lands on the host, and /dev/shm is a tmpfs of the configured size; in
both launch layouts. A host path gone by the time the trial starts fails it with a reason
naming the path, before anything runs. One SQLite master and one agent for the file."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import AgentProcess
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment
from tests.e2e.conftest import MasterProcess, describe_run
from tests.e2e.test_determined_workloads import trial_venv

pytestmark = pytest.mark.e2e

SHM_BYTES = 96 * 1024**2  # not Docker's 64 MiB default, which a CI container's may be

PROBE = """
import errno, json, os, sys

report = {"cwd": os.getcwd()}
report["read"] = open("data/hello.txt").read()
try:
    open("data/new.txt", "w").write("x")
    report["ro_write"] = "written"
except OSError as exc:
    report["ro_write"] = exc.errno
with open(os.path.join(os.environ["RW_TARGET"], "from-trial.txt"), "w") as out:
    out.write("written by the trial")
shm = os.statvfs("/dev/shm")
report["shm_bytes"] = shm.f_blocks * shm.f_frsize
print("REPORT " + json.dumps(report), flush=True)
"""


@dataclass
class Cluster:
    master: MasterProcess
    agent: AgentProcess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("bind-mounts")
    master = MasterProcess(root / "data", label="mounts")
    agent: AgentProcess | None = None
    try:
        master.start()
        agent = AgentProcess(master, "mounts", root / "agent", slots=1)
        agent.start().wait_connected()
        yield Cluster(master, agent)
    finally:
        if agent is not None:
            agent.stop()
        master.stop()
        shutil.rmtree(master.scratch, ignore_errors=True)


def _report(logs: str) -> dict[str, Any]:
    found = re.findall(r"^REPORT (\{.*\})$", logs, re.M)
    assert len(found) == 1, logs[-4000:]
    report: dict[str, Any] = json.loads(found[0])
    return report


@pytest.mark.parametrize("layout", ["per_slot", "per_agent"])
def test_a_trial_sees_its_mounts_and_its_own_dev_shm(
    cluster: Cluster, tmp_path: Path, layout: str
) -> None:
    variables = []
    if layout == "per_agent":  # the agent checks the interpreter has Determined's harness
        variables.append(f"PATH={trial_venv()}/bin:/usr/bin:/bin")
    read_only = tmp_path / "dataset"
    read_only.mkdir()
    (read_only / "hello.txt").write_text("from the host")
    writable = tmp_path / "outputs"
    writable.mkdir()
    # An absolute mount point that does not exist yet: the agent makes it.
    rw_target = tmp_path / "mnt" / "outputs"
    config, model = write_experiment(
        tmp_path,
        PROBE,
        extra={
            "launch_layout": layout,
            "bind_mounts": [
                {"host_path": str(read_only), "container_path": "data", "read_only": True},
                {"host_path": str(writable), "container_path": str(rw_target)},
            ],
            "resources": {"shm_size": f"{SHM_BYTES // 1024**2}M"},
            "environment": {"environment_variables": [f"RW_TARGET={rw_target}", *variables]},
        },
    )
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, {"COMPLETED", "ERROR"})
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{cluster.agent.output()[-3000:]}"
    report = _report(logs)
    if layout == "per_agent":
        assert report["cwd"] == "/run/determined/workdir", report
    assert report["read"] == "from the host", report
    assert report["ro_write"] == errno.EROFS, report
    assert not (read_only / "new.txt").exists()
    assert (writable / "from-trial.txt").read_text() == "written by the trial"
    assert report["shm_bytes"] == SHM_BYTES, report
    # The mounts were the trial's alone: the host's mount point stays an empty directory.
    assert rw_target.is_dir() and not any(rw_target.iterdir())
    assert os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize != SHM_BYTES


def test_a_host_path_gone_before_the_start_fails_the_trial_naming_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    vanishing = tmp_path / "vanishing"
    vanishing.mkdir()
    marker = tmp_path / "ran"
    config, model = write_experiment(
        tmp_path,
        f"open({str(marker)!r}, 'w').write('ran')\n",
        extra={"bind_mounts": [{"host_path": str(vanishing), "container_path": "/srv/gone"}]},
    )
    created = cluster.master.det("experiment", "create", "--paused", str(config), str(model))
    assert created.returncode == 0, describe_run(created)
    experiment_id = int(created.stdout.split("Created experiment")[1].split()[0])
    vanishing.rmdir()
    activated = cluster.master.det("experiment", "activate", str(experiment_id))
    assert activated.returncode == 0, describe_run(activated)
    trial = wait_trial_state(cluster.master, experiment_id, {"COMPLETED", "ERROR"})
    assert trial["state"] == "ERROR", trial
    assert f"host_path {vanishing} does not exist" in trial["endReason"], trial
    assert trial["restarts"] == 0, trial
    assert not marker.exists()  # nothing of the trial ran
    assert not Path("/srv/gone").exists()

    # At submit the master sees the same host as its agent: refused there, naming it.
    refused = cluster.master.det("experiment", "create", str(config), str(model))
    assert refused.returncode != 0, describe_run(refused)
    assert "bind_mounts.0.host_path" in refused.stderr + refused.stdout, describe_run(refused)
    assert str(vanishing) in refused.stderr + refused.stdout, describe_run(refused)


def test_a_command_gets_the_mounts_and_dev_shm_of_its_config(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Commands, notebooks, shells and TensorBoards take bind_mounts and shm_size as trials
    do (they were accepted and silently ignored): `det cmd run --config-file`."""
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    (dataset / "hello.txt").write_text("from the host")
    config = tmp_path / "task.yaml"
    config.write_text(
        json.dumps(
            {
                "bind_mounts": [
                    {"host_path": str(dataset), "container_path": "/srv/data", "read_only": True}
                ],
                "resources": {"shm_size": f"{SHM_BYTES // 1024**2}M"},
            }
        )
    )
    probe = (
        "import os; s = os.statvfs('/dev/shm'); "
        "print('READ', open('/srv/data/hello.txt').read(), 'SHM', s.f_blocks * s.f_frsize)"
    )
    result = cluster.master.det(
        "cmd", "run", "--config-file", str(config), "python3", "-c", probe, timeout=120
    )
    assert result.returncode == 0, f"{describe_run(result)}\n{cluster.agent.output()[-3000:]}"
    assert f"READ from the host SHM {SHM_BYTES}" in result.stdout, describe_run(result)
    assert not Path("/srv/data/hello.txt").exists()  # the mount was the command's alone

    # A mount the master can see is missing is refused before anything queues, naming it.
    config.write_text(
        json.dumps(
            {"bind_mounts": [{"host_path": str(tmp_path / "nowhere"), "container_path": "/x"}]}
        )
    )
    refused = cluster.master.det("cmd", "run", "--config-file", str(config), "true", timeout=120)
    assert refused.returncode != 0, describe_run(refused)
    assert "bind_mounts.0.host_path" in refused.stderr and "does not exist" in refused.stderr
