"""The agent's Docker runtime (`--container-runtime docker`), with a real dockerd (Debian's
docker.io, a private one with a data root of its own) and the private registry of
tests/e2e/test_containers.py, where podman's runs the wider matrix. What differs from
podman is what these check: the pull through `docker --config` with credentials, the
container's first process read from `--cidfile` and `docker inspect` (what the fence
kills), the grouped ranks' launcher under Docker, and the removal of what a killed agent
left.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import images
from harness.cluster import AgentProcess, wait_until
from tests.conftest import require
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment
from tests.e2e.conftest import MasterProcess
from tests.e2e.test_containers import GANG_SCRIPT, PROBE, TERMINAL, _report

pytestmark = pytest.mark.e2e

AGENT = "docker-box"


@dataclass
class Cluster:
    master: MasterProcess
    agent: AgentProcess
    registry: images.Registry
    docker_host: str
    root: Path

    def docker(self, *args: str) -> str:
        return subprocess.run(
            ["docker", "--host", self.docker_host, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout

    def containers(self, label: str, running_only: bool = False) -> list[str]:
        args = ["ps", "--format", "{{.Names}}", "--filter", f"label={label}"]
        return self.docker(*args if running_only else ["ps", "-a", *args[1:]]).split()

    def environment(self, tag: str) -> dict[str, Any]:
        return {
            "image": f"{self.registry.address}/team/greeting:{tag}",
            "registry_auth": {
                "username": self.registry.username,
                "password": self.registry.password,
                "serveraddress": self.registry.address,
            },
        }

    def diagnostics(self) -> str:
        return (
            f"--- master ---\n{self.master.output()[-3000:]}\n"
            f"--- agent ---\n{self.agent.output()[-3000:]}"
        )


def _agent(master: MasterProcess, root: Path, docker_host: str) -> AgentProcess:
    agent = AgentProcess(
        master, AGENT, root / AGENT, slots=2, args=["--container-runtime", "docker"]
    )
    agent.extra_env["DOCKER_HOST"] = docker_host  # the private daemon, through the CLI
    return agent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = images.missing_tools() + images.docker_missing()
    require(not missing, f"Docker tests need {' '.join(missing)} (apt-get install)")
    root = tmp_path_factory.mktemp("docker")
    master = MasterProcess(root / "data", label="docker")
    with (
        images.docker_daemon(root / "dockerd") as docker_host,
        images.registry(root / "registry") as registry,
    ):
        registry.push(images.package_image("1"), "team/greeting:1")
        # A test may start the agent again: the one to stop is the cluster's at the end.
        made = Cluster(master, _agent(master, root, docker_host), registry, docker_host, root)
        try:
            master.start()
            made.agent.start().wait_connected()
            yield made
        finally:
            made.agent.stop()
            master.stop()
            shutil.rmtree(master.scratch, ignore_errors=True)


def test_a_trial_runs_in_an_image_docker_pulled_with_credentials(
    cluster: Cluster, tmp_path: Path
) -> None:
    config, model = write_experiment(
        tmp_path, PROBE, extra={"environment": cluster.environment("1")}
    )
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{cluster.diagnostics()}"
    report = _report(logs)
    assert report["greeting"] == "1", report  # the image's package
    assert report["env_has_password"] is False and report["config_has_password"] is False
    assert report["library"] == "resolute"
    assert f"pulled image {cluster.registry.address}/team/greeting:1" in logs, logs[-3000:]
    # Docker's daemon holds the image now; the agent's auth file is gone.
    assert cluster.docker("image", "ls", "-q", cluster.environment("1")["image"]).strip()
    pulls = cluster.root / AGENT / "secrets" / "pulls"
    assert not pulls.exists() or not any(pulls.iterdir())
    assert cluster.containers("ai.resolute.agent") == []


def test_a_gangs_ranks_share_one_docker_container_and_a_failing_rank_stops_the_rest(
    cluster: Cluster, tmp_path: Path
) -> None:
    config, model = write_experiment(
        tmp_path, GANG_SCRIPT, slots=2, extra={"environment": cluster.environment("1")}
    )
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL, timeout=120)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "ERROR", f"{trial}\n{cluster.diagnostics()}"
    assert "rank 1 exited with code 3" in trial["endReason"], trial
    assert "hello from rank 0" in logs and "hello from rank 1" in logs, logs[-3000:]
    assert cluster.containers(f"ai.resolute.allocation={trial['id']}.1") == []


def test_a_killed_agents_docker_container_ends_and_its_restart_removes_what_it_left(
    cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL the agent while a trial's container runs: its fence kills the container's
    first process (found through --cidfile and docker inspect), and the agent, started
    again, removes every container labelled with its id."""
    config, model = write_experiment(
        tmp_path,
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('LONG', flush=True)\ntime.sleep(300)\n",
        extra={"environment": cluster.environment("1"), "max_restarts": 0},
    )
    experiment_id = create_experiment(cluster.master, config, model)
    label = f"ai.resolute.agent={AGENT}"
    wait_until("the trial's container to run", lambda: cluster.containers(label, True), 120)
    cluster.agent.kill(signal.SIGKILL)
    wait_until("the fence to end the container", lambda: not cluster.containers(label, True), 30)
    left = cluster.containers(label)
    # What a host's crash would leave (agent and fence gone at once): a running container.
    cluster.docker(
        "run", "--detach", "--network", "none", "--name", "resolute-stray", "--label", label,
        cluster.environment("1")["image"], "sleep", "600",
    )  # fmt: skip
    cluster.agent = _agent(cluster.master, cluster.root, cluster.docker_host).start()
    cluster.agent.wait_connected()
    remaining = ({"resolute-stray"} | set(left)) & set(cluster.containers(label))
    assert not remaining, f"the restarted agent left {remaining}"
    cluster.master.api("POST", f"/api/v1/experiments/{experiment_id}/kill")
    wait_trial_state(cluster.master, experiment_id, TERMINAL, timeout=120)
