"""Trials in images, with real podman: a private registry on loopback with htpasswd basic
auth (Debian's docker-registry), images built in the set-up from Debian's registry
(harness/images.py), a real master and two agents started with `--container-runtime
podman`.

- A trial runs in an image pulled with credentials: it sees the image's Python and
  package, not the host's, and no registry password anywhere; the pull is in its logs.
- Two trials with two images holding two versions of one package, side by side on one
  agent, each see their own.
- A wrong password and a missing image each end the trial at start with the registry's
  words on one line, no restart counted.
- Bind mounts (a read-only one refuses a write, EROFS from the kernel), shm_size as the
  size of /dev/shm, a device passed through.
- Determined's Core API script and the DDP example run unchanged in the team's image
  (determined, torch, JupyterLab) pulled from the registry with credentials; the pull's
  progress is in the dashboard's log view of the trial.
- A notebook, a shell and a TensorBoard in that image answer through the master's proxy.
- The agent frozen (SIGSTOP): its fence kills the container before the master places the
  trial on the other agent (the ticks of the two runs do not overlap); the agent killed
  (SIGKILL): no container of its runs on, and the restarted agent removes what it left.
"""

from __future__ import annotations

import errno
import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import containers
from harness import images
from harness.cluster import AgentProcess, wait_until
from tests.conftest import require
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment
from tests.e2e.conftest import MasterProcess
from tests.e2e.test_determined_workloads import WORKLOADS, trial_venv

pytestmark = pytest.mark.e2e

TERMINAL = {"COMPLETED", "ERROR", "CANCELED"}
AGENTS = ("box-a", "box-b")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ddp_synthetic"

PROBE = """
import json, os, sys
report = {"python": sys.version.split()[0], "uid": os.getuid()}
try:
    import greeting
    report["greeting"] = greeting.VERSION
except ImportError:
    report["greeting"] = None
report["os"] = open("/etc/os-release").read().split("PRETTY_NAME=")[1].splitlines()[0]
report["env_has_password"] = any("s3cret-pw" in v for v in os.environ.values())
report["config_has_password"] = "s3cret-pw" in os.environ.get("DET_EXPERIMENT_CONFIG", "")
report["slot_ids"] = os.environ.get("DET_SLOT_IDS")
import resolute  # the agent's training library, bound in
report["library"] = resolute.__name__
print("REPORT " + json.dumps(report), flush=True)
"""


@dataclass
class Cluster:
    master: MasterProcess
    agents: dict[str, AgentProcess]
    registry: images.Registry
    root: Path

    def diagnostics(self) -> str:
        parts = [f"--- master ---\n{self.master.output()[-3000:]}"]
        parts += [f"--- agent {a.id} ---\n{a.output()[-3000:]}" for a in self.agents.values()]
        return "\n".join(parts)


def _podman(*args: str) -> str:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=120, check=True
    ).stdout


def _containers(label: str, running_only: bool = False) -> list[str]:
    args = ["ps", "--format", "{{.Names}}", "--filter", f"label={label}"]
    if not running_only:
        args.insert(1, "-a")
    return _podman(*args).split()


def _agent(master: MasterProcess, agent_id: str, root: Path, registry: str) -> AgentProcess:
    return AgentProcess(
        master,
        agent_id,
        root / agent_id,
        slots=2,
        args=["--container-runtime", "podman", "--insecure-registry", registry],
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = images.missing_tools()
    require(not missing, f"container tests need {' '.join(missing)} (apt-get install)")
    root = tmp_path_factory.mktemp("containers")
    master = MasterProcess(root / "data", label="containers")
    started: dict[str, AgentProcess] = {}
    with images.registry(root / "registry") as registry:
        # Built once per machine and cached (make test builds the base beside lint).
        for version in ("1", "2"):
            registry.push(images.package_image(version), f"team/greeting:{version}")
        try:
            master.start()
            for agent_id in AGENTS:
                started[agent_id] = _agent(master, agent_id, root, registry.address).start()
            for agent in started.values():
                agent.wait_connected()
            yield Cluster(master, started, registry, root)
        finally:
            for agent in started.values():
                agent.stop()
            master.stop()
            for agent_id in AGENTS:
                names = _containers(f"ai.resolute.agent={agent_id}")
                if names:
                    subprocess.run(["podman", "rm", "-f", *names], capture_output=True)
            # The pulled copies' names: the registry's port is new each run (the layers
            # are the local images' own, so only the names would pile up).
            listed = _podman("images", "--format", "{{.Repository}}:{{.Tag}}").split()
            pulled = [name for name in listed if name.startswith(f"{registry.address}/")]
            if pulled:
                subprocess.run(["podman", "rmi", "--force", *pulled], capture_output=True)
            shutil.rmtree(master.scratch, ignore_errors=True)


def _trial_image() -> str:
    """The image with determined, torch and tensorboard (make test starts its build beside
    lint; it stays in podman's store)."""
    venv = trial_venv()
    packages = sorted(venv.glob("lib/python3*/site-packages"))
    require(bool(packages), f"no site-packages in {venv}")
    return images.trial_image(packages[0])


def _report(logs: str) -> dict[str, Any]:
    found = re.findall(r"^REPORT (\{.*\})$", logs, re.M)
    assert len(found) == 1, logs[-4000:]
    report: dict[str, Any] = json.loads(found[0])
    return report


def _environment(cluster: Cluster, tag: str, password: str | None = None) -> dict[str, Any]:
    return _pulled(cluster, f"{cluster.registry.address}/team/greeting:{tag}", password)


def _pulled(cluster: Cluster, image: str, password: str | None = None) -> dict[str, Any]:
    """An environment that names an image of the private registry, with its credentials."""
    return {
        "image": image,
        "registry_auth": {
            "username": cluster.registry.username,
            "password": password or cluster.registry.password,
            "serveraddress": cluster.registry.address,
        },
    }


def _wait_terminated(master: MasterProcess, kind: str, task_id: str) -> None:
    def ended() -> bool:
        return bool(
            master.api("GET", f"/api/v1/{kind}s/{task_id}")[kind]["state"] == "STATE_TERMINATED"
        )

    master.wait_for(f"{kind} {task_id} terminated", ended, 120)


@pytest.fixture(scope="module")
def team_trial_image(cluster: Cluster) -> str:
    """The trial image (determined, torch, JupyterLab) in the private registry, as a team
    keeps its own image: trials and notebooks pull it with credentials."""
    return cluster.registry.push(_trial_image(), "team/trial:determined-0.38.1")


def _run(
    cluster: Cluster, directory: Path, script: str, **extra: Any
) -> tuple[dict[str, Any], str]:
    config, model = write_experiment(directory, script, extra=extra)
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL)
    return trial, trial_logs(cluster.master, trial["id"])


def test_a_trial_runs_in_an_image_pulled_with_credentials(cluster: Cluster, tmp_path: Path) -> None:
    config, model = write_experiment(
        tmp_path, PROBE, extra={"environment": _environment(cluster, "1")}
    )
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{cluster.diagnostics()}"
    report = _report(logs)
    assert report["greeting"] == "1", report  # the image's package: the host has none
    assert report["os"].startswith('"Debian GNU/Linux 12'), report
    assert report["python"] != ".".join(map(str, sys.version_info[:3])), report
    assert report["env_has_password"] is False and report["config_has_password"] is False
    assert report["library"] == "resolute"
    assert f"pulling image {cluster.registry.address}/team/greeting:1" in logs, logs[-3000:]
    # Secret like a storage key: the config the API shows has no password either.
    shown = cluster.master.api("GET", f"/api/v1/experiments/{experiment_id}")
    assert cluster.registry.password not in json.dumps(shown)
    # Nothing of the trial is left in the runtime's store.
    assert _containers("ai.resolute.agent") == []


MEET = """
import os, time
# Meet the other trial: each says it runs, then waits (under a deadline) until both do.
meet = "/meet"
open(os.path.join(meet, os.environ["DET_TRIAL_ID"]), "w").write(os.environ["DET_AGENT_ID"])
deadline = time.monotonic() + 120
while len(os.listdir(meet)) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
print("MET", len(os.listdir(meet)), flush=True)
"""


def test_two_images_with_two_versions_of_a_package_on_one_agent(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Both trials run at the same time (each waits for the other), on one agent: the
    cluster is idle and the pool's best fit puts the second beside the first."""
    meet = tmp_path / "meet"
    meet.mkdir()
    ids = []
    for version in ("1", "2"):
        config, model = write_experiment(
            tmp_path / version,
            PROBE + MEET,
            extra={
                "environment": _environment(cluster, version),
                "bind_mounts": [{"host_path": str(meet), "container_path": "/meet"}],
            },
        )
        ids.append((version, create_experiment(cluster.master, config, model)))
    for version, experiment_id in ids:
        trial = wait_trial_state(cluster.master, experiment_id, TERMINAL)
        logs = trial_logs(cluster.master, trial["id"])
        assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{cluster.diagnostics()}"
        assert _report(logs)["greeting"] == version
        assert "MET 2" in logs, logs[-2000:]  # the other trial ran meanwhile
    agents = {path.read_text() for path in meet.iterdir()}
    assert len(agents) == 1, f"the two trials ran on {agents}"


@pytest.mark.parametrize(
    ("what", "tag", "password", "registry_words"),
    [
        ("wrong password", "1", "not-the-password", "unauthorized"),
        ("missing image", "no-such-tag", None, "manifest unknown"),
    ],
)
def test_a_failed_pull_ends_the_trial_at_start_without_a_restart(
    cluster: Cluster, tmp_path: Path, what: str, tag: str, password: str | None, registry_words: str
) -> None:
    # Pulled even when the agent has the image (an earlier test pulled tag 1): without
    # force_pull_image the runtime would use its copy and never ask for the password.
    environment = {**_environment(cluster, tag, password), "force_pull_image": True}
    trial, logs = _run(
        cluster, tmp_path, "print('RAN', flush=True)\n", environment=environment, max_restarts=3
    )
    assert trial["state"] == "ERROR", f"{what}: {logs[-3000:]}"
    assert trial["restarts"] == 0, trial  # a pull that fails is not retried
    assert "RAN" not in logs
    failure = [line for line in logs.splitlines() if "cannot start: pulling image" in line]
    assert len(failure) == 1, logs[-3000:]
    assert registry_words in failure[0].lower(), failure
    assert "not-the-password" not in logs


def test_a_variable_no_container_can_be_given_ends_the_trial_at_start(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A value with a line break (a PEM key, say) cannot go in the runtime's env file: the
    trial ends at start naming the variable, before any pull, with no restart."""
    environment = {
        **_environment(cluster, "2"),
        "environment_variables": ["TEAM_KEY=-----BEGIN KEY-----\nabc"],
    }
    trial, logs = _run(
        cluster, tmp_path, "print('RAN', flush=True)\n", environment=environment, max_restarts=3
    )
    assert trial["state"] == "ERROR" and trial["restarts"] == 0, f"{trial}\n{logs[-3000:]}"
    assert "environment variable 'TEAM_KEY' cannot be given to a container" in trial["endReason"]
    assert "RAN" not in logs and "pulling image" not in logs, logs[-3000:]


def test_mounts_shm_and_a_device_in_a_container(cluster: Cluster, tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    (dataset / "hello.txt").write_text("from the host")
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    script = """
import errno, json, os
report = {"read": open("/data/hello.txt").read()}
try:
    open("/data/new.txt", "w").write("x")
    report["ro_write"] = "written"
except OSError as exc:
    report["ro_write"] = exc.errno
open("/outputs/from-trial.txt", "w").write("written in the container")
shm = os.statvfs("/dev/shm")
report["shm_bytes"] = shm.f_blocks * shm.f_frsize
with open("/dev/resolute-zero", "rb") as device:
    report["device_bytes"] = len(device.read(16))
print("REPORT " + json.dumps(report), flush=True)
"""
    trial, logs = _run(
        cluster,
        tmp_path,
        script,
        environment=_environment(cluster, "1"),
        bind_mounts=[
            {"host_path": str(dataset), "container_path": "/data", "read_only": True},
            {"host_path": str(outputs), "container_path": "/outputs"},
        ],
        resources={
            "shm_size": "96M",
            "devices": [{"host_path": "/dev/zero", "container_path": "/dev/resolute-zero"}],
        },
    )
    assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{cluster.diagnostics()}"
    report = _report(logs)
    assert report["read"] == "from the host"
    assert report["ro_write"] == errno.EROFS
    assert not (dataset / "new.txt").exists()
    assert (outputs / "from-trial.txt").read_text() == "written in the container"
    assert report["shm_bytes"] == 96 * 1024**2
    assert report["device_bytes"] == 16


def test_a_host_path_gone_before_the_start_fails_the_trial_naming_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    vanishing = tmp_path / "vanishing"
    vanishing.mkdir()
    config, model = write_experiment(
        tmp_path,
        "print('RAN', flush=True)\n",
        extra={
            "environment": _environment(cluster, "1"),
            "bind_mounts": [{"host_path": str(vanishing), "container_path": "/data"}],
        },
    )
    created = cluster.master.det("experiment", "create", "--paused", str(config), str(model))
    assert created.returncode == 0, created.stderr
    experiment_id = int(created.stdout.split("Created experiment")[1].split()[0])
    vanishing.rmdir()
    activated = cluster.master.det("experiment", "activate", str(experiment_id))
    assert activated.returncode == 0, activated.stderr
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "ERROR" and trial["restarts"] == 0, logs[-3000:]
    assert f"bind_mounts: host_path {vanishing} does not exist" in trial["endReason"], trial
    assert "RAN" not in logs
    assert _containers(f"ai.resolute.allocation={trial['id']}.1") == []


def test_determined_core_api_runs_unchanged_in_an_image_pulled_with_credentials(
    cluster: Cluster, team_trial_image: str, tmp_path: Path
) -> None:
    config, model = write_experiment(
        tmp_path,
        (WORKLOADS / "metrics.py").read_text(),
        extra={
            "entrypoint": "python3 train.py --steps 20 --sleep 0.01",
            "environment": _pulled(cluster, team_trial_image),
            "searcher": {"name": "single", "metric": "x", "max_length": 20},
        },
    )
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{cluster.diagnostics()}"
    assert "DONE steps=20" in logs
    rows = cluster.master.api("GET", f"/api/v1/trials/{trial['id']}/metrics")["metrics"]
    validations = [r["stepsCompleted"] for r in rows if r["group"] == "validation"]
    assert validations == [10, 20], rows  # reported through the master from the container
    # The pull's progress, as the dashboard's log view of the trial shows it.
    token = cluster.master.login()
    feed = cluster.master.http(
        "GET",
        f"/ui/trials/{trial['id']}/logs.json",
        headers={"Cookie": f"resolute_session={token}"},
    )
    assert feed.status_code == 200, feed.text
    shown = [re.sub(r"^\[agent [^]]+\] ", "", line["message"]) for line in feed.json()["lines"]]
    assert f"pulling image {team_trial_image}" in shown, shown[:20]
    assert any(m.startswith(f"pull {team_trial_image}: ") for m in shown), shown[:20]
    assert f"pulled image {team_trial_image}" in shown, shown[:20]
    assert cluster.registry.password not in json.dumps(shown)


def test_the_ddp_example_runs_in_an_image(
    cluster: Cluster, team_trial_image: str, tmp_path: Path
) -> None:
    """examples/ddp_synthetic as the walkthrough submits it, two ranks in one container on
    one agent (Gloo over the host's network), in the team's image that holds torch."""
    config = yaml.safe_load((EXAMPLES / "config.yaml").read_text())
    config["environment"] = _pulled(cluster, team_trial_image)
    config["max_restarts"] = 0
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    experiment_id = create_experiment(cluster.master, path, EXAMPLES)
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL, timeout=240)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{cluster.diagnostics()}"
    rows = cluster.master.api("GET", f"/api/v1/trials/{trial['id']}/metrics")["metrics"]
    assert [r["stepsCompleted"] for r in rows if r["group"] == "validation"] == [10, 20, 30, 40]
    checkpoints = list((tmp_path / "ckpt").iterdir())
    assert checkpoints, "the ranks' checkpoints did not reach the shared_fs store"


def test_a_command_runs_in_an_image(cluster: Cluster, tmp_path: Path) -> None:
    """`det cmd run` with the image in its config: commands run in containers as trials do
    (a local image: the agent has it, nothing is pulled)."""
    config = tmp_path / "command.yaml"
    config.write_text(yaml.safe_dump({"environment": {"image": images.package_image("2")}}))
    probe = "import greeting; print('GREETING', greeting.VERSION)"
    result = cluster.master.det(
        "cmd", "run", "--config-file", str(config), "python3", "-c", probe, timeout=180
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.diagnostics()}"
    assert "GREETING 2" in result.stdout, result.stdout


def test_a_notebook_runs_in_the_teams_image_and_answers_through_the_proxy(
    cluster: Cluster, team_trial_image: str, tmp_path: Path
) -> None:
    """`det notebook start` with the team's image from the registry: JupyterLab and its
    kernels run in the container (the kernel's interpreter is the image's python3, not the
    agent's), reached through the master's proxy over the host's network."""
    config = tmp_path / "notebook.yaml"
    config.write_text(
        yaml.safe_dump(
            {"environment": _pulled(cluster, team_trial_image), "resources": {"slots": 1}}
        )
    )
    master = cluster.master
    result = master.det(
        "notebook", "start", "--no-browser", "--config-file", str(config), timeout=240
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.diagnostics()}"
    url = result.stdout.strip().rsplit(" ", 1)[-1]
    notebook_id = url.rstrip("/").rsplit("/", 1)[-1]
    assert url == f"{master.url}/proxy/{notebook_id}/", result.stdout
    try:
        status = master.http("GET", f"/proxy/{notebook_id}/api/status")
        assert status.status_code == 200, status.text
        specs = master.http("GET", f"/proxy/{notebook_id}/api/kernelspecs").json()
        kernel_argv = specs["kernelspecs"][specs["default"]]["spec"]["argv"]
        assert kernel_argv[0] == "/usr/bin/python3", specs  # Debian's, in the image
        kernel = master.http("POST", f"/proxy/{notebook_id}/api/kernels", json={})
        assert kernel.status_code == 201, kernel.text
        running = _containers("ai.resolute.agent", running_only=True)
        assert len(running) == 1, running  # the notebook's, and its kernel inside it
    finally:
        killed = master.det("notebook", "kill", notebook_id)
    assert killed.returncode == 0, f"{killed.stdout}\n{killed.stderr}"
    _wait_terminated(master, "notebook", notebook_id)
    assert _containers("ai.resolute.agent") == []


def test_a_shell_runs_in_the_teams_image(
    cluster: Cluster, team_trial_image: str, tmp_path: Path
) -> None:
    """`det shell start -- CMD` with the team's image: the command runs in the container
    (podman's /run/.containerenv is there, python3 is the image's), through the proxy."""
    config = tmp_path / "shell.yaml"
    config.write_text(yaml.safe_dump({"environment": _pulled(cluster, team_trial_image)}))
    probe = [
        "test",
        "-f",
        "/run/.containerenv",
        "&&",
        "python3",
        "-c",
        "'import sys; print(sys.version)'",
    ]
    result = cluster.master.det(
        "shell", "start", "--config-file", str(config), "--", *probe, timeout=240
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.diagnostics()}"
    # The marker file says it ran in a container; the image's python3 (Debian's 3.11.2)
    # is not the one the agent runs on.
    assert result.stdout.split()[0] != ".".join(map(str, sys.version_info[:3])), result.stdout
    launched = re.search(r"Launched shell \(id: ([0-9a-f-]+)\)", result.stderr)
    assert launched, result.stderr
    _wait_terminated(cluster.master, "shell", launched[1])  # it ends with its command
    assert _containers("ai.resolute.agent") == []


BOARD_SCRIPT = """
import resolute
with resolute.init() as ctx:
    for step in (1, 2, 3):
        ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": 1.0 / step})
"""


def test_a_tensorboard_runs_in_the_teams_image(
    cluster: Cluster, team_trial_image: str, tmp_path: Path
) -> None:
    """`det tensorboard start EXP` with the team's image: TensorBoard (the image's) serves
    the metrics the master stored for a trial that ran on the host."""
    config, model = write_experiment(tmp_path, BOARD_SCRIPT)
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL)
    assert trial["state"] == "COMPLETED", trial_logs(cluster.master, trial["id"])[-3000:]
    board_config = tmp_path / "board.yaml"
    board_config.write_text(yaml.safe_dump({"environment": _pulled(cluster, team_trial_image)}))
    master = cluster.master
    started = master.det(
        "tensorboard",
        "start",
        str(experiment_id),
        "--no-browser",
        "--config-file",
        str(board_config),
        timeout=240,
    )
    assert started.returncode == 0, f"{started.stdout}\n{started.stderr}\n{cluster.diagnostics()}"
    board_id = started.stdout.strip().rstrip("/").rsplit("/", 1)[-1]
    try:
        assert len(_containers("ai.resolute.agent", running_only=True)) == 1

        def scalars() -> list[Any] | None:
            reply = master.http(
                "GET",
                f"/proxy/{board_id}/data/plugin/scalars/scalars",
                params={
                    "run": f"experiment_{experiment_id}/trial_{trial['id']}",
                    "tag": "training/loss",
                },
            )
            return reply.json() if reply.status_code == 200 else None

        points = master.wait_for("TensorBoard to load the trial's scalars", scalars, 120)
        assert [step for _, step, _ in points] == [1, 2, 3]
    finally:
        master.det("tensorboard", "kill", board_id)
    _wait_terminated(master, "tensorboard", board_id)
    assert _containers("ai.resolute.agent") == []


GANG_SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"hello from rank {rank}", flush=True)
print(f"rank {rank} on stderr", file=sys.stderr, flush=True)
if rank == 1:
    # Rank 0 has printed before rank 1 fails (the working directory is theirs to share).
    deadline = time.monotonic() + 120
    while not os.path.exists("rank0-printed") and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(3)
open("rank0-printed", "w").close()
time.sleep(300)  # until the gang rule stops it
"""


def test_a_gangs_ranks_share_one_container_and_one_failing_rank_stops_the_rest(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Two ranks of a per_slot trial on one agent run in one container (one start, not
    two); their lines stay by rank and stream, and rank 1's exit status 3 stops rank 0
    and fails the trial naming rank 1, as for processes on the host."""
    config, model = write_experiment(
        tmp_path, GANG_SCRIPT, slots=2, extra={"environment": _environment(cluster, "1")}
    )
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, TERMINAL, timeout=120)
    assert trial["state"] == "ERROR", f"{trial}\n{cluster.diagnostics()}"
    assert "rank 1 exited with code 3" in trial["endReason"], trial
    allocation = f"{trial['id']}.1"
    said = [
        line
        for agent in cluster.agents.values()
        for line in agent.output(tail=200_000).splitlines()
        if f"allocation {allocation}: rank(s)" in line
    ]
    assert len(said) == 1 and "rank(s) 0,1 in container" in said[0], said
    reply = cluster.master.http("GET", f"/api/v1/trials/{trial['id']}/logs")
    lines = [json.loads(line)["result"] for line in reply.text.splitlines() if line.strip()]
    by_rank = {(r["rankId"], r["stdtype"], r["message"].strip()) for r in lines}
    for rank in (0, 1):
        assert (rank, "stdout", f"hello from rank {rank}") in by_rank, by_rank
        assert (rank, "stderr", f"rank {rank} on stderr") in by_rank, by_rank
    assert not any("resolute-rank-exit" in r["message"] for r in lines)
    assert _containers(f"ai.resolute.allocation={trial['id']}.1") == []


TICK_SCRIPT = """
import os, signal, time
TICKS = "/ticks/ticks.txt"
rerun = os.path.exists(TICKS) and os.path.getsize(TICKS) > 0
if not rerun:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the fence's SIGKILL ends it
end = time.monotonic() + (2.0 if rerun else 120.0)
fd = os.open(TICKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
while time.monotonic() < end:
    os.write(fd, f"{time.monotonic():.3f} {os.environ['DET_AGENT_ID']}\\n".encode())
    time.sleep(0.05)
print("DONE", flush=True)
"""


def test_the_fence_kills_the_container_and_a_killed_agent_leaves_none(
    cluster: Cluster, tmp_path: Path
) -> None:
    ticks_dir = tmp_path / "ticks"
    ticks_dir.mkdir()
    config, model = write_experiment(
        tmp_path,
        TICK_SCRIPT,
        extra={
            "environment": _environment(cluster, "1"),
            "bind_mounts": [{"host_path": str(ticks_dir), "container_path": "/ticks"}],
        },
    )
    experiment_id = create_experiment(cluster.master, config, model)
    ticks = ticks_dir / "ticks.txt"
    wait_until("the first run to tick", lambda: ticks.exists() and ticks.stat().st_size > 0, 120)
    first_agent = ticks.read_text().split()[1]
    frozen = cluster.agents[first_agent]
    frozen.send(signal.SIGSTOP)
    try:
        trial = wait_trial_state(cluster.master, experiment_id, TERMINAL, timeout=180)
    finally:
        frozen.send(signal.SIGCONT)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{cluster.diagnostics()}"
    lines = [line.split() for line in ticks.read_text().splitlines()]
    old = [float(t) for t, agent in lines if agent == first_agent]
    new = [float(t) for t, agent in lines if agent != first_agent]
    assert old and new, lines[-5:]
    assert max(old) < min(new), (
        f"overlap: old run's last tick {max(old)}, new run's first {min(new)}"
    )
    assert "fence: SIGKILL" in frozen.output(), frozen.output()[-3000:]

    # Killed outright while a trial runs on it: nothing of it runs on, and once started
    # again it removes what it left in the store.
    config, model = write_experiment(
        tmp_path / "long",
        "import time\nprint('LONG', flush=True)\ntime.sleep(300)\n",
        extra={"environment": _environment(cluster, "1")},
    )
    long_id = create_experiment(cluster.master, config, model)
    victim_id = wait_until("a container of the trial to run", lambda: _running_on(cluster), 120)
    victim = cluster.agents[victim_id]
    label = f"ai.resolute.agent={victim_id}"
    old_containers = _containers(label)
    victim.kill(signal.SIGKILL)
    wait_until(
        "the fence to end the container", lambda: not _containers(label, running_only=True), 30
    )
    # What a host's crash would leave (agent and fence gone at once): a running container
    # of the agent's. The agent's next start removes it.
    stray = f"resolute-stray-{victim_id}"
    _podman(
        "run",
        "--detach",
        "--name",
        stray,
        "--label",
        label,
        *_limits(),
        images.base_image(),
        "sleep",
        "600",
    )
    assert stray in _containers(label, running_only=True)
    cluster.agents[victim_id] = restarted = _agent(
        cluster.master, victim_id, cluster.root, cluster.registry.address
    ).start()
    restarted.wait_connected()
    # Gone from the store, not only stopped (the trial may be placed on it again: a new
    # allocation's container is not one of them).
    left = ({stray} | set(old_containers)) & set(_containers(label))
    assert not left, f"the restarted agent left {left} in the store"
    cluster.master.api("POST", f"/api/v1/experiments/{long_id}/kill")
    wait_trial_state(cluster.master, long_id, TERMINAL, timeout=120)


def _limits() -> list[str]:
    return containers.host_limits(containers.Runtime("podman", "podman"))


def _running_on(cluster: Cluster) -> str | None:
    """The agent one of whose containers runs, if any."""
    for agent_id in cluster.agents:
        if _containers(f"ai.resolute.agent={agent_id}", running_only=True):
            return agent_id
    return None
