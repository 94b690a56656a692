"""The agent's runner with Determined's per-agent layout: what it refuses, and why, before
any process starts (the namespaces themselves are in test_agent_bootstrap.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from agent import bootstrap
from agent.runner import Runner
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.conftest import require


def per_agent_start(argv: list[str], env: dict[str, str] | None = None) -> pb.StartAllocation:
    return pb.StartAllocation(
        allocation_id="7.1",
        trial_id=7,
        experiment_id=3,
        ranks=[pb.RankSpec(rank=0, local_rank=0, slot_ids=[0, 1])],
        argv=argv,
        env=env or {},
        layout=pb.LAUNCH_LAYOUT_PER_AGENT,
        info_files={"cluster.json": "{}", "trial.json": "{}", "rendezvous.json": "{}"},
        stop_grace_s=1.0,
    )


def has_determined(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import determined"], capture_output=True, check=False)
    return probe.returncode == 0


def runner_at(work: Path, emitted: list[pb.AgentMessage], logs: list[pb.LogEntry]) -> Runner:
    devices = [pb.Device(slot_id=s, type="cpu", index=-1) for s in (0, 1)]
    return Runner("agent-a", work, devices, emitted.append, logs.append)


async def test_an_agent_without_namespaces_refuses_per_agent_trials_with_its_reason(
    tmp_path: Path,
) -> None:
    emitted: list[pb.AgentMessage] = []
    logs: list[pb.LogEntry] = []
    runner = runner_at(tmp_path, emitted, logs)
    runner.namespace_problem = "cannot create the mount and PID namespaces of a trial (EPERM)"
    await runner.start(per_agent_start(["python3", "train.py"]))
    exits = [m.exited for m in emitted if m.WhichOneof("body") == "exited"]
    assert [e.kind for e in exits] == [pb.EXIT_KIND_UNRUNNABLE]
    assert exits[0].message == (
        "this agent cannot run Determined-style launches: cannot create the mount and PID "
        "namespaces of a trial (EPERM)"
    )
    assert not exits[0].exits  # no process was started
    assert any("cannot start" in entry.message for entry in logs)
    assert not runner.runs


async def test_an_interpreter_without_determined_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    require(os.geteuid() == 0, "per-agent launches need root (or user namespaces) here")
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    require(system_python is not None, "no python3 in /usr/bin or /bin")
    emitted: list[pb.AgentMessage] = []
    runner = runner_at(tmp_path, emitted, [])
    marker = tmp_path / "ran"
    start = per_agent_start(
        ["python3", "-c", f"open({str(marker)!r}, 'w')"], {"PATH": "/usr/bin:/bin"}
    )
    require(not has_determined(str(system_python)), f"{system_python} must lack determined")
    await runner.start(start)
    exits = [m.exited for m in emitted if m.WhichOneof("body") == "exited"]
    assert [e.kind for e in exits] == [pb.EXIT_KIND_UNRUNNABLE]
    assert "lacks determined" in exits[0].message, exits[0].message
    assert not marker.exists()


def test_a_non_root_agent_makes_the_namespaces_with_a_user_namespace(tmp_path: Path) -> None:
    """As `nobody`, the probe still succeeds through user namespaces once the mount points
    exist (an admin creates them; a root agent does it itself)."""
    require(os.geteuid() == 0, "switching to nobody needs root")
    require(shutil.which("setpriv") is not None, "util-linux's setpriv is needed")
    require(bootstrap.probe_namespaces(tmp_path) is None, "root cannot make the namespaces")
    work = Path("/var/tmp") / f"resolute-probe-{os.getpid()}"
    work.mkdir(mode=0o777, exist_ok=True)
    work.chmod(0o777)
    try:
        probe = subprocess.run(
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "--",
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from agent import bootstrap; "
                "print(bootstrap.probe_namespaces(Path(sys.argv[1])))",
                str(work),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
            check=False,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr
