"""A plain `det-agent` started as root, with no rank options, keeps teams apart on the node:
each allocation's ranks run as a uid of their own (the default range), in their owner's
group. From inside a trial, the join token file, the agent's credential, its
/proc/<pid>/environ, another owner's running trial's directory, environment and
checkpoint all stay closed; the trial's own checkpoint is written, given to root when its
run ends (its group kept), and read back by the run after a restart.

A real master and a real agent running as root; the ranks report what they could read in
their logs, read back through the REST logs route. Root only (CI runs as root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.rank_user import OWNER_GID_BASE, default_uid_range
from harness.cluster import AgentProcess
from master.core.credentials import client_side_hash
from tests.conftest import require
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment
from tests.e2e.conftest import MasterProcess, ok, unique
from tests.e2e.test_rank_isolation import (
    CREDENTIAL_NAME,
    DETERMINED_CHECKPOINT,
    PROBE_SCRIPT,
    interpreter_for_ranks,
)

pytestmark = pytest.mark.e2e

PASSWORD = "Correct-Horse-9"

# The first trial (its owner: determined) stores a checkpoint, leaves a file in its run
# directory, says where both are and its pid in the shared directory, and lives on until
# the second trial has tried to read them; then it fails, so the trial runs again. That
# run (DET_LATEST_CHECKPOINT) reads the checkpoint back.
FIRST_TRIAL = """
import json, os, sys, time
from pathlib import Path

import resolute

share = Path(os.environ["SHARE"])
latest = os.environ.get("DET_LATEST_CHECKPOINT")
with resolute.init() as ctx:
    if latest:
        with ctx.checkpoint.restore_path(latest) as path:
            data = (path / "weights.bin").read_bytes()
        report = {"uid": os.getuid(), "gid": os.getgid(), "uuid": latest, "data": data.decode()}
        print("RESTORED " + json.dumps(report), flush=True)
    else:
        with ctx.checkpoint.store_path(1) as (path, uuid):
            (path / "weights.bin").write_text("the first trial's weights")
        ctx.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
        Path("secret.txt").write_text("the first trial's")
        mine = {"pid": os.getpid(), "cwd": os.getcwd(), "checkpoint": str(path), "uuid": uuid}
        (share / "first.tmp").write_text(json.dumps(mine))
        os.chmod(share / "first.tmp", 0o644)  # its umask gives other owners nothing
        os.rename(share / "first.tmp", share / "first.json")
        print("FIRST " + json.dumps({"uid": os.getuid(), "gid": os.getgid()}), flush=True)
        deadline = time.monotonic() + 180
        while not (share / "second-done").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
if not latest:
    sys.exit(1)  # the restart's run restores what this one stored
"""

# The second trial (another owner) tries to read all of it, and stores its own checkpoint.
SECOND_TRIAL = """
import json, os, time
from pathlib import Path

import resolute

share = Path(os.environ["SHARE"])
deadline = time.monotonic() + 180
while not (share / "first.json").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
first = json.loads((share / "first.json").read_text())
agent = os.environ["AGENT_PID"]
report = {"uid": os.getuid(), "gid": os.getgid(), "first": first}

def attempt(name, action):
    try:
        action()
        report[name] = "read"
    except PermissionError:
        report[name] = "PermissionError"
    except FileNotFoundError:
        report[name] = "absent"

attempt("token_file", lambda: open(os.environ["TOKEN_FILE"]).read())
attempt("credential", lambda: open(os.environ["CREDENTIAL_FILE"]).read())
attempt("agent_environ", lambda: open(f"/proc/{agent}/environ", "rb").read())
attempt("first_dir", lambda: os.listdir(first["cwd"]))
attempt("first_file", lambda: open(os.path.join(first["cwd"], "secret.txt")).read())
attempt("first_environ", lambda: open(f"/proc/{first['pid']}/environ", "rb").read())
attempt("first_checkpoint_dir", lambda: os.listdir(first["checkpoint"]))
attempt(
    "first_checkpoint_file",
    lambda: open(os.path.join(first["checkpoint"], "weights.bin")).read(),
)
attempt("checkpoints_listing", lambda: os.listdir(Path(first["checkpoint"]).parent))
with resolute.init() as ctx:
    with ctx.checkpoint.store_path(1) as (path, uuid):
        (path / "weights.bin").write_text("the second trial's weights")
    ctx.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
report["own_checkpoint"] = str(path)
print("PROBE " + json.dumps(report), flush=True)
(share / "second-done").write_text("")
"""


def found(logs: str, tag: str) -> dict[str, Any]:
    lines = re.findall(rf"^{tag} (\{{.*\}})$", logs, re.M)
    assert len(lines) == 1, logs[-4000:]
    report: dict[str, Any] = json.loads(lines[0])
    return report


@dataclass
class Plain:
    master: MasterProcess
    agent: AgentProcess
    root: Path  # searchable by every uid: the share, the token file, the store
    share: Path
    checkpoints: Path
    token_file: Path

    def variables(self, venv: Path) -> list[str]:
        assert self.agent.proc is not None
        return [
            f"SHARE={self.share}",
            f"AGENT_PID={self.agent.proc.pid}",
            f"TOKEN_FILE={self.token_file}",
            f"CREDENTIAL_FILE={self.agent.work_dir / CREDENTIAL_NAME}",
            *interpreter_for_ranks(venv),
        ]


@contextmanager
def plain_agent(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Plain]:
    """A master and a det-agent started as root with no rank option at all."""
    require(os.geteuid() == 0, "the agent must run as root to start ranks as another user")
    require(shutil.which("setpriv") is not None, "util-linux's setpriv is not installed")
    # pytest's own directories are 0700: a directory of our own the ranks may pass
    # through, as an admin's /var/lib would be.
    root = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    root.chmod(0o711)
    share = root / "share"  # where the first trial tells the second what to try
    share.mkdir()
    share.chmod(0o1777)
    # As an admin (or `make run`'s master) leaves it: root's, 0755; the agent opens it.
    checkpoints = root / "checkpoints"
    checkpoints.mkdir(mode=0o755)
    master = MasterProcess(tmp_path_factory.mktemp(name) / "data", label=name)
    agent: AgentProcess | None = None
    try:
        master.start()
        token = master.join_token
        token_file = root / "join-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        # The token also in the agent's environment, as a systemd EnvironmentFile would
        # give it, so /proc/<agent>/environ holds it.
        agent = AgentProcess(master, name, root / "work", join_token="", ranks_as_root=False)
        agent.command = [
            "env",
            f"DET_AGENT_JOIN_TOKEN={token}",
            *agent.command,
            "--join-token-file",
            str(token_file),
        ]
        assert not any(arg.startswith("--rank") for arg in agent.command), agent.command
        agent.start().wait_connected()
        yield Plain(master, agent, root, share, checkpoints, token_file)
    finally:
        if agent is not None:
            agent.stop()
        master.stop()
        shutil.rmtree(master.scratch, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def test_a_plain_root_agent_gives_each_allocation_a_uid_of_its_own(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    with plain_agent(tmp_path_factory, "rank-default") as plain:
        two_owners_two_trials(plain, tmp_path)


def two_owners_two_trials(plain: Plain, tmp_path: Path) -> None:
    master, agent, checkpoints = plain.master, plain.agent, plain.checkpoints
    second_owner = unique("rank-default")
    body = {
        "user": {"username": second_owner, "active": True},
        "password": client_side_hash(PASSWORD),
        "isHashed": True,
    }
    headers = {"Authorization": f"Bearer {master.login('admin')}"}
    made = master.session.post("/api/v1/users", json=body, headers=headers)
    assert made.status_code == 200, made.text
    variables = plain.variables(Path(sys.executable).parent.parent)
    experiments = []
    for name, script, restarts, user in (
        ("first", FIRST_TRIAL, 1, None),
        ("second", SECOND_TRIAL, 0, second_owner),
    ):
        config, model = write_experiment(
            tmp_path / name,
            script,
            max_restarts=restarts,
            extra={
                "environment": {"environment_variables": variables},
                "checkpoint_storage": {"type": "shared_fs", "host_path": str(checkpoints)},
            },
        )
        if user is None:
            experiments.append(create_experiment(master, config, model))
        else:
            env = {"DET_USER": user, "DET_PASS": PASSWORD}
            created = ok(master.det("experiment", "create", str(config), str(model), env=env))
            experiments.append(int(created.stdout.split("Created experiment")[1].split()[0]))
    owners = [
        master.api("GET", f"/api/v1/experiments/{e}")["experiment"]["userId"] for e in experiments
    ]
    assert owners[0] != owners[1], owners
    logs = []
    for experiment_id in experiments:
        trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"}, 300)
        text = trial_logs(master, trial["id"])
        assert trial["state"] == "COMPLETED", f"{text[-4000:]}\n{agent.output()}"
        logs.append(text)
    first, restored, second = (
        found(logs[0], "FIRST"),
        found(logs[0], "RESTORED"),
        found(logs[1], "PROBE"),
    )
    # The agent's block of the default space, picked by its id.
    low, high = default_uid_range(agent.id)
    assert low <= first["uid"] <= high and low <= second["uid"] <= high, (first, second)
    assert first["uid"] != second["uid"], (first, second)
    # Each in its owner's group, the same on every agent.
    assert first["gid"] == restored["gid"] == OWNER_GID_BASE + owners[0], (first, restored)
    assert second["gid"] == OWNER_GID_BASE + owners[1], second
    # The first was running (its pid, directory and checkpoint are real) while the
    # second tried, and the second could read none of it, nor the agent's secrets.
    assert second["first"]["cwd"].startswith(str(agent.work_dir / "allocations")), second
    assert second["first"]["checkpoint"].startswith(str(checkpoints)), second
    for what in (
        "token_file",
        "credential",
        "agent_environ",
        "first_dir",
        "first_file",
        "first_environ",
        "first_checkpoint_dir",
        "first_checkpoint_file",
        "checkpoints_listing",
    ):
        assert second[what] == "PermissionError", (what, second)
    assert (agent.work_dir / CREDENTIAL_NAME).exists()  # it was there to be refused
    # The first trial's checkpoint, once its run ended: root's, in its owner's group,
    # closed to everyone else; the run after the restart read it back.
    stored = Path(second["first"]["checkpoint"])
    for path in (stored, stored / "weights.bin"):
        info = path.stat()
        assert (info.st_uid, info.st_gid) == (0, OWNER_GID_BASE + owners[0]), path
        assert stat.S_IMODE(info.st_mode) & 0o027 == 0, (path, oct(info.st_mode))
    assert restored["uuid"] == second["first"]["uuid"], restored
    assert restored["data"] == "the first trial's weights", restored
    # The second trial's own checkpoint was written and is root's after its run too.
    own = Path(second["own_checkpoint"])
    assert (own / "weights.bin").read_text() == "the second trial's weights"
    assert own.stat().st_uid == 0 and own.stat().st_gid == OWNER_GID_BASE + owners[1]
    # The store: others may add entries and enter them, not list or remove them.
    mode = stat.S_IMODE(checkpoints.stat().st_mode)
    assert mode & (stat.S_ISVTX | 0o007) == stat.S_ISVTX | 0o003, oct(mode)
    said = agent.output()
    assert f"per allocation, from {low}-{high} (the default" in said, said[-3000:]
    assert "ranks run as root" not in said and "rank_user is root" not in said
    # A store below a directory closed to other users (pytest's own, 0700): the trial does
    # not start, and says which path its ranks cannot reach.
    closed = tmp_path / "closed-store"
    config, model = write_experiment(
        tmp_path / "closed",
        "print('never runs')",
        extra={"checkpoint_storage": {"type": "shared_fs", "host_path": str(closed)}},
    )
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"}, 300)
    text = trial_logs(master, trial["id"])
    assert trial["state"] == "ERROR", text[-3000:]
    assert f"cannot enter checkpoint_storage.host_path {closed}" in text, text[-3000:]
    assert "--rank-user root" in text and "never runs" not in text, text[-3000:]


def test_a_determined_per_agent_trial_under_the_default(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Determined's layout: mounts as root in its namespace, then the drop to the run's uid;
    its checkpoint through /determined_shared_fs lands in the store and becomes root's."""
    venv = Path(os.environ.get("DET_TRIAL_VENV") or "")
    require(
        bool(os.environ.get("DET_TRIAL_VENV")) and (venv / "bin" / "python3").exists(),
        "no trial interpreter with determined: run `make trial-venv` and set DET_TRIAL_VENV",
    )
    with plain_agent(tmp_path_factory, "rank-default-det") as plain:
        config, model = write_experiment(
            tmp_path,
            PROBE_SCRIPT + DETERMINED_CHECKPOINT,
            extra={
                "environment": {"environment_variables": plain.variables(venv)},
                "checkpoint_storage": {
                    "type": "shared_fs",
                    "host_path": str(plain.checkpoints),
                    "storage_path": "team",
                },
            },
        )
        experiment_id = create_experiment(plain.master, config, model)
        trial = wait_trial_state(plain.master, experiment_id, {"COMPLETED", "ERROR"}, 300)
        logs = trial_logs(plain.master, trial["id"])
        assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{plain.agent.output()}"
        report = found(logs, "PROBE")
        assert report["cwd"] == "/run/determined/workdir", report  # Determined's layout
        low, high = default_uid_range(plain.agent.id)
        assert low <= report["uid"] <= high, report
        owner = plain.master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
        assert report["gid"] == OWNER_GID_BASE + owner["userId"], report
        assert report["groups"] in ([], [report["gid"]]), report  # none of root's
        assert report["token_file"] == "PermissionError", report
        assert report["agent_environ"] in ("PermissionError", "absent"), report
        assert report["home_writable"] is True
        uuid = re.findall(r"^CHECKPOINT (\S+)$", logs, re.M)
        assert len(uuid) == 1, logs[-3000:]
        stored = plain.checkpoints / "team" / uuid[0]
        weights = stored / "weights.bin"
        assert weights.stat().st_size == 64
        for path in (stored, weights):
            info = path.stat()
            assert (info.st_uid, info.st_gid) == (0, report["gid"]), path
            assert stat.S_IMODE(info.st_mode) & 0o007 == 0, (path, oct(info.st_mode))


def test_a_plain_root_agent_refuses_a_work_dir_its_ranks_cannot_enter(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """pytest's 0700 directories, as a home directory would be: the agent says so at start,
    naming the path and the way to keep ranks as root, rather than failing every trial."""
    require(os.geteuid() == 0, "the agent must run as root to start ranks as another user")
    require(shutil.which("setpriv") is not None, "util-linux's setpriv is not installed")
    base = tmp_path_factory.mktemp("rank-default-closed")
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    master = MasterProcess(base / "data", label="closed")
    agent = AgentProcess(master, "default-closed", closed / "work", ranks_as_root=False)
    try:
        master.start()
        agent.start()
        assert agent.proc is not None
        code = agent.proc.wait(timeout=60)
        said = agent.output()
        assert code == 2, said
        assert f"cannot enter work_dir {closed / 'work'}" in said, said
        assert "--rank-user root" in said, said
    finally:
        agent.stop()
        master.stop()
        shutil.rmtree(master.scratch, ignore_errors=True)
