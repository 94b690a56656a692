"""Ranks run as an unprivileged user (`det-agent --rank-user nobody`) and cannot read the
agent's secrets: its join token file, its credential, its environment or its /proc. A real
master and a real agent running as root; the ranks report what they could read in their
logs, read back through the REST logs route.

Root only (the agent must be root to switch users); CI runs as root, so there it never
skips.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.rank_user import OWNER_GID_BASE
from harness.cluster import AgentProcess
from tests.conftest import require
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment
from tests.e2e.conftest import MasterProcess

pytestmark = pytest.mark.e2e

RANK_USER = "nobody"
# Where the agent keeps the credential it got when it enrolled (owner-only).
CREDENTIAL_NAME = "agent-credential"

PROBE_SCRIPT = """
import json, os, sys
from pathlib import Path

agent = os.environ["AGENT_PID"]
report = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}

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
attempt("agent_fds", lambda: os.listdir(f"/proc/{agent}/fd"))
attempt("other_allocations", lambda: os.listdir(Path.cwd().parent))
try:
    report["agent_cmdline"] = open(f"/proc/{agent}/cmdline", "rb").read().decode().split("\\0")
except FileNotFoundError:  # a per-agent trial's PID namespace does not show the agent
    report["agent_cmdline"] = None
report["cwd"] = os.getcwd()
report["env"] = dict(os.environ)
home = Path(os.environ["HOME"])
(home / "written-by-the-rank").write_text("ok")
report["home_writable"] = True
import tempfile
with tempfile.TemporaryFile(dir="/tmp") as scratch:  # a per-agent trial's /tmp is its own
    scratch.write(b"ok")
print("PROBE " + json.dumps(report), flush=True)
"""

RESOLUTE_CHECKPOINT = """
import resolute

with resolute.init() as ctx:
    with ctx.checkpoint.store_path(1, {"note": "rank user"}) as (path, uuid):
        (path / "weights.bin").write_bytes(bytes(64))
    ctx.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
    print("CHECKPOINT " + uuid, flush=True)
"""

# Determined's Core API, launched in the per-agent layout (the script imports determined).
DETERMINED_CHECKPOINT = """
import determined as det

with det.core.init() as core:
    core.train.report_training_metrics(steps_completed=1, metrics={"x": 1.0})
    with core.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
        (path / "weights.bin").write_bytes(bytes(64))
    print(f"CHECKPOINT {uuid}", flush=True)
"""


@dataclass
class Isolated:
    master: MasterProcess
    agent: AgentProcess
    root: Path  # searchable by the rank user: its work dir and checkpoints live here
    token: str
    token_file: Path
    checkpoints: Path

    def run(self, tmp_path: Path, script: str, extra: dict[str, Any]) -> tuple[dict[str, Any], str]:
        assert self.agent.proc is not None
        variables = [
            f"AGENT_PID={self.agent.proc.pid}",
            f"TOKEN_FILE={self.token_file}",
            f"CREDENTIAL_FILE={self.agent.work_dir / CREDENTIAL_NAME}",
            *extra.pop("variables", []),
        ]
        config, model = write_experiment(
            tmp_path,
            script,
            extra={
                "environment": {"environment_variables": variables},
                "checkpoint_storage": {"type": "shared_fs", "host_path": str(self.checkpoints)},
                **extra,
            },
        )
        experiment_id = create_experiment(self.master, config, model)
        trial = wait_trial_state(self.master, experiment_id, {"COMPLETED", "ERROR"}, 240)
        logs = trial_logs(self.master, trial["id"])
        assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{self.agent.output()}"
        return trial, logs


def as_rank_user(*argv: str) -> subprocess.CompletedProcess[str]:
    user = pwd.getpwnam(RANK_USER)
    setpriv = shutil.which("setpriv") or "setpriv"
    switch = [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--"]
    return subprocess.run(
        [*switch, "/bin/sh", "-c", '"$@"', "sh", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )


def interpreter_for_ranks(venv: Path) -> list[str]:
    """The trial's variables that give the rank user `venv`'s packages. Its own python when
    the rank user can run it; otherwise (an interpreter under root's 0700 home, as on this
    project's machines) a system python3 of the same version, with `venv`'s import path."""
    python = venv / "bin" / "python3"
    if as_rank_user(str(python), "-c", "import sys").returncode == 0:
        return [f"PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin"]
    probe = "import json, sys; print(json.dumps([sys.version_info[:2], sys.path]))"
    version, paths = json.loads(
        subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, check=True
        ).stdout
    )
    for directory in ("/usr/local/bin", "/usr/bin"):
        system = as_rank_user(f"{directory}/python3", "-c", probe)
        if system.returncode == 0 and json.loads(system.stdout)[0] == version:
            own = [p for p in paths if p.startswith(str(venv)) or not p.startswith("/root")]
            site = [p for p in own if p and os.path.isdir(p) and "site-packages" in p]
            extra = [p for p in own if p and os.path.isdir(p) and p not in site]
            print(f"the rank user cannot run {python}: using {directory}/python3")
            return [
                f"PATH={directory}:/usr/bin:/bin",
                f"PYTHONPATH={os.pathsep.join([*site, *extra])}",
            ]
    require(False, f"user {RANK_USER} can run neither {python} nor a python3 {version}")
    raise AssertionError("unreachable")


def probe_report(logs: str) -> dict[str, Any]:
    found = re.findall(r"^PROBE (\{.*\})$", logs, re.M)
    assert len(found) == 1, logs[-4000:]
    report: dict[str, Any] = json.loads(found[0])
    return report


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Isolated]:
    require(os.geteuid() == 0, "the agent must run as root to start ranks as another user")
    try:
        nobody = pwd.getpwnam(RANK_USER)
    except KeyError:
        require(False, f"no user {RANK_USER!r} on this machine")
        raise
    require(shutil.which("setpriv") is not None, "util-linux's setpriv is not installed")
    # pytest's own temporary directories are 0700: the rank user could not enter a work
    # dir below them. A directory of our own that it may pass through, as an admin would.
    root = Path(tempfile.mkdtemp(prefix="rank-isolation-"))
    root.chmod(0o711)
    master = MasterProcess(tmp_path_factory.mktemp("rank-isolation") / "data", label="ranks")
    agent: AgentProcess | None = None
    try:
        master.start()
        token = master.join_token_file.read_text().strip()
        token_file = root / "join-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        checkpoints = root / "checkpoints"  # an admin gives the rank user its storage
        checkpoints.mkdir()
        os.chown(checkpoints, nobody.pw_uid, nobody.pw_gid)
        agent = AgentProcess(
            master, "ranks-as-nobody", root / "work", slots=1, join_token="", ranks_as_root=False
        )
        # The token as a systemd EnvironmentFile would give it too, so /proc/<agent>/environ
        # holds it; and the token file on the command line, never the token.
        agent.command = [
            "env",
            f"DET_AGENT_JOIN_TOKEN={token}",
            "DET_AGENT_LOG_LEVEL=INFO",
            *agent.command,
            "--join-token-file",
            str(token_file),
            "--rank-user",
            RANK_USER,
        ]
        agent.start().wait_connected()
        yield Isolated(master, agent, root, token, token_file, checkpoints)
    finally:
        if agent is not None:
            agent.stop()
        master.stop()
        shutil.rmtree(master.scratch, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def test_a_rank_runs_as_the_rank_user_and_cannot_read_the_agent_s_secrets(
    isolated: Isolated, tmp_path: Path
) -> None:
    agent_venv = Path(sys.executable).parent.parent  # the resolute library's
    _, logs = isolated.run(
        tmp_path,
        PROBE_SCRIPT + RESOLUTE_CHECKPOINT,
        {"variables": interpreter_for_ranks(agent_venv)},
    )
    report = probe_report(logs)
    nobody = pwd.getpwnam(RANK_USER)
    assert (report["uid"], report["gid"]) == (nobody.pw_uid, nobody.pw_gid), report
    assert report["groups"] in ([], [nobody.pw_gid]), report  # none of root's groups
    assert report["token_file"] == "PermissionError", report
    assert report["agent_environ"] == "PermissionError", report
    assert report["agent_fds"] == "PermissionError", report
    assert report["other_allocations"] == "PermissionError", report
    credential = isolated.agent.work_dir / CREDENTIAL_NAME
    # The agent enrolled with the master before it ran anything: its credential is there.
    assert credential.exists()
    assert report["credential"] == "PermissionError", report
    cmdline = report["agent_cmdline"]
    assert "--join-token-file" in cmdline and RANK_USER in cmdline, cmdline
    assert not any(isolated.token in arg for arg in cmdline), cmdline
    env: dict[str, str] = report["env"]
    assert not any(isolated.token in value for value in env.values()), sorted(env)
    # DET_AGENT_ID is Determined's own variable for ranks; no agent setting comes through.
    assert [k for k in env if k.upper().startswith("DET_AGENT_")] == ["DET_AGENT_ID"], sorted(env)
    assert env["USER"] == env["LOGNAME"] == RANK_USER
    assert report["home_writable"] is True
    # Its checkpoint is in the store, written as the rank user.
    uuid = re.findall(r"^CHECKPOINT (\S+)$", logs, re.M)
    assert len(uuid) == 1, logs[-3000:]
    weights = [p for p in isolated.checkpoints.rglob("weights.bin") if uuid[0] in str(p)]
    assert len(weights) == 1 and weights[0].stat().st_uid == nobody.pw_uid, weights
    # The agent's side: the ranks' parent directory is passable, not listable, and the
    # agent said at start whom ranks run as.
    allocations = isolated.agent.work_dir / "allocations"
    assert stat.S_IMODE(allocations.stat().st_mode) == 0o711
    assert "ranks run as user nobody" in isolated.agent.output()
    assert "ranks run as root" not in isolated.agent.output()


def test_a_determined_per_agent_trial_runs_as_the_rank_user(
    isolated: Isolated, tmp_path: Path
) -> None:
    venv = Path(os.environ.get("DET_TRIAL_VENV") or "")
    require(
        bool(os.environ.get("DET_TRIAL_VENV")) and (venv / "bin" / "python3").exists(),
        "no trial interpreter with determined: run `make trial-venv` and set DET_TRIAL_VENV",
    )
    _, logs = isolated.run(
        tmp_path,
        PROBE_SCRIPT + DETERMINED_CHECKPOINT,
        {"variables": interpreter_for_ranks(venv)},
    )
    report = probe_report(logs)
    assert report["cwd"] == "/run/determined/workdir", report  # Determined's layout
    nobody = pwd.getpwnam(RANK_USER)
    assert (report["uid"], report["gid"]) == (nobody.pw_uid, nobody.pw_gid), report
    # In its PID namespace the agent is not even visible; the token file still is not read.
    assert report["token_file"] == "PermissionError", report
    assert report["agent_environ"] in ("PermissionError", "absent"), report
    uuid = re.findall(r"^CHECKPOINT (\S+)$", logs, re.M)
    assert len(uuid) == 1, logs[-3000:]
    weights = [p for p in isolated.checkpoints.rglob("weights.bin") if uuid[0] in str(p)]
    assert len(weights) == 1 and weights[0].stat().st_uid == nobody.pw_uid, weights


# -- rank_uid_range: each allocation's ranks as a uid of their own ----------------------------

UID_RANGE = (61000, 61999)

# The first trial leaves a file in its run directory, says where it is and its pid in the
# shared directory, and stays alive until the second trial has tried to read them.
FIRST_TRIAL = """
import json, os, time
from pathlib import Path

share = Path(os.environ["SHARE"])
Path("secret.txt").write_text("the first trial's")
(share / "first.tmp").write_text(json.dumps({"pid": os.getpid(), "cwd": os.getcwd()}))
os.rename(share / "first.tmp", share / "first.json")
print("PROBE " + json.dumps({"uid": os.getuid(), "gid": os.getgid()}), flush=True)
deadline = time.monotonic() + 120
while not (share / "second-done").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""

SECOND_TRIAL = """
import json, os, time
from pathlib import Path

share = Path(os.environ["SHARE"])
deadline = time.monotonic() + 120
while not (share / "first.json").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
first = json.loads((share / "first.json").read_text())
report = {"uid": os.getuid(), "gid": os.getgid(), "first": first}

def attempt(name, action):
    try:
        action()
        report[name] = "read"
    except PermissionError:
        report[name] = "PermissionError"

attempt("first_file", lambda: open(os.path.join(first["cwd"], "secret.txt")).read())
attempt("first_dir", lambda: os.listdir(first["cwd"]))
attempt("first_environ", lambda: open(f"/proc/{first['pid']}/environ", "rb").read())
print("PROBE " + json.dumps(report), flush=True)
(share / "second-done").write_text("")
"""


def test_with_a_uid_range_two_trials_cannot_read_each_other(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    require(os.geteuid() == 0, "the agent must run as root to start ranks as another user")
    require(shutil.which("setpriv") is not None, "util-linux's setpriv is not installed")
    root = Path(tempfile.mkdtemp(prefix="rank-uid-range-"))
    root.chmod(0o711)  # pytest's own directories are 0700: the ranks could not enter them
    share = root / "share"  # where the first trial tells the second its pid and directory
    share.mkdir()
    share.chmod(0o1777)
    checkpoints = root / "checkpoints"
    checkpoints.mkdir()
    checkpoints.chmod(0o1777)
    master = MasterProcess(tmp_path_factory.mktemp("rank-uid-range") / "data", label="uids")
    agent = AgentProcess(master, "ranks-own-uids", root / "work", slots=2, ranks_as_root=False)
    agent.command += ["--rank-uid-range", "-".join(map(str, UID_RANGE))]
    try:
        master.start()
        agent.start().wait_connected()
        variables = [
            f"SHARE={share}",
            *interpreter_for_ranks(Path(sys.executable).parent.parent),
        ]
        experiments = []
        for name, script in (("first", FIRST_TRIAL), ("second", SECOND_TRIAL)):
            config, model = write_experiment(
                tmp_path / name,
                script,
                extra={
                    "environment": {"environment_variables": variables},
                    "checkpoint_storage": {"type": "shared_fs", "host_path": str(checkpoints)},
                },
            )
            experiments.append(create_experiment(master, config, model))
        reports = []
        for experiment_id in experiments:
            trial = wait_trial_state(master, experiment_id, {"COMPLETED", "ERROR"}, 240)
            logs = trial_logs(master, trial["id"])
            assert trial["state"] == "COMPLETED", f"{logs[-4000:]}\n{agent.output()}"
            reports.append(probe_report(logs))
        first, second = reports
        uids = [first["uid"], second["uid"]]
        assert uids[0] != uids[1], reports
        assert all(UID_RANGE[0] <= uid <= UID_RANGE[1] for uid in uids), reports
        # Both run in their owner's group: the same owner, so the same group.
        owner = master.api("GET", f"/api/v1/experiments/{experiments[0]}")["experiment"]["userId"]
        assert first["gid"] == second["gid"] == OWNER_GID_BASE + owner, reports
        # The first was running (its pid and directory are real) while the second tried.
        assert second["first"]["cwd"].startswith(str(agent.work_dir / "allocations")), second
        assert second["first_file"] == "PermissionError", second
        assert second["first_dir"] == "PermissionError", second
        assert second["first_environ"] == "PermissionError", second
        assert "ranks run as a uid of their own per allocation, from 61000-61999" in (
            agent.output()
        )
    finally:
        agent.stop()
        master.stop()
        shutil.rmtree(master.scratch, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
