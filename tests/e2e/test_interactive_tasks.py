"""Commands, shells and notebooks on a real cluster: a det-master process, a det-agent
process, our `det`, Jupyter from PyPI, the master's proxy over real sockets, and a shell's
terminal through a real pseudo-terminal."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pty
import re
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from harness.cluster import AgentProcess
from tests.conftest import require
from tests.e2e.agents import create_experiment, wait_trial_state, write_experiment
from tests.e2e.conftest import OUR_DET, MasterProcess, client_env, describe_run
from tests.web.test_browser import REPORTING_SCRIPT

IDLE_CHECK_S = 1.0


def jupyter_installed() -> bool:
    return importlib.util.find_spec("jupyterlab") is not None


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[MasterProcess, AgentProcess]]:
    work = tmp_path_factory.mktemp("tasks-e2e")
    master = MasterProcess(
        work / "data",
        label="tasks",
        env={"DET_MASTER_IDLE_CHECK_INTERVAL_S": str(IDLE_CHECK_S)},
    )
    master.start()
    # One slot: a task holding it makes the next one wait.
    agent = AgentProcess(master, "tasks-agent", work / "agent", slots=1).start()
    try:
        agent.wait_connected()
        yield master, agent
    finally:
        agent.stop()
        master.stop()


def task(master: MasterProcess, kind: str, task_id: str) -> dict[str, Any]:
    reply: dict[str, Any] = master.api("GET", f"/api/v1/{kind}s/{task_id}")[kind]
    return reply


def wait_state(
    master: MasterProcess, kind: str, task_id: str, state: str, timeout: float = 180
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        found = task(master, kind, task_id)
        return found if found["state"] == state else None

    result: dict[str, Any] = master.wait_for(f"{kind} {task_id} {state}", reached, timeout)
    return result


def test_a_command_prints_its_output_and_exits_with_its_code(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    master, _ = cluster
    result = master.det("cmd", "run", "echo hello-$DET_TASK_TYPE-$DET_USER; exit 4", timeout=120)
    assert result.returncode == 4, describe_run(result)
    assert "hello-COMMAND-determined" in result.stdout, describe_run(result)
    listed = master.det("command", "list", "--json")
    (item,) = [c for c in json.loads(listed.stdout) if c["description"].startswith("Command (echo")]
    assert item["state"] == "STATE_TERMINATED" and item["exitCode"] == 4
    table = master.det("cmd", "list").stdout
    assert item["id"] in table and "TERMINATED" in table


def test_a_command_that_cannot_start_says_why_and_frees_its_slot(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    master, _ = cluster
    result = master.det("cmd", "run", "no-such-program-here", "--flag", timeout=120)
    assert result.returncode == 1, describe_run(result)
    assert "no-such-program-here" in result.stderr and "not found" in result.stderr, describe_run(
        result
    )
    # The slot is free again: the next command runs at once.
    result = master.det("cmd", "run", "echo", "after", timeout=120)
    assert result.returncode == 0 and "after" in result.stdout, describe_run(result)


def test_task_list_shows_a_running_command_and_kill_ends_it(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    master, _ = cluster
    result = master.det("cmd", "run", "-d", "sleep", "600")
    assert result.returncode == 0, describe_run(result)
    command_id = result.stdout.strip()
    wait_state(master, "command", command_id, "STATE_RUNNING")
    listing = master.det("task", "list")
    assert command_id in listing.stdout and "Command (sleep 600)" in listing.stdout, describe_run(
        listing
    )
    killed = master.det("cmd", "kill", command_id)
    assert killed.returncode == 0, describe_run(killed)
    ended = wait_state(master, "command", command_id, "STATE_TERMINATED")
    assert ended["endReason"] == "killed by determined"
    assert master.det("cmd", "logs", "no-such-task").returncode == 1


# What `det cmd run -c DIR python3 prep.py` runs: it reads a data file beside it.
PREP_SCRIPT = """
import os, sys
rows = open(os.path.join("data", "rows.csv")).read().split()
print("prep-read", len(rows), "rows; ignored file sent:", os.path.exists("scratch.bin"))
sys.exit(6)
"""


def project(where: Path) -> Path:
    """A directory as a person runs `det cmd run -c .` from: a script, its data, and a file
    .detignore keeps back."""
    (where / "data").mkdir(parents=True)
    (where / "prep.py").write_text(PREP_SCRIPT, encoding="utf-8")
    (where / "data" / "rows.csv").write_text("a\nb\nc\n", encoding="utf-8")
    (where / "scratch.bin").write_bytes(b"\0" * 1024)
    (where / ".detignore").write_text("scratch.bin\n", encoding="utf-8")
    return where


def command_ids(master: MasterProcess) -> set[str]:
    return {c["id"] for c in master.api("GET", "/api/v1/commands")["commands"]}


def test_a_command_runs_with_its_context_directory_in_its_working_directory(
    cluster: tuple[MasterProcess, AgentProcess], tmp_path: Path
) -> None:
    master, _ = cluster
    here = project(tmp_path / "project")
    # `-c .` from inside the project, as a person types it.
    result = subprocess.run(
        [str(OUR_DET), "cmd", "run", "-c", ".", "python3", "prep.py"],
        capture_output=True,
        text=True,
        cwd=here,
        env=client_env(master.url, XDG_CONFIG_HOME=str(tmp_path / "config")),
        timeout=120,
        check=False,
    )
    assert result.returncode == 6, describe_run(result)
    assert "prep-read 3 rows; ignored file sent: False" in result.stdout, describe_run(result)
    # The long form, from elsewhere.
    again = master.det("cmd", "run", "--context", str(here), "python3", "prep.py", timeout=120)
    assert again.returncode == 6 and "prep-read 3 rows" in again.stdout, describe_run(again)


@pytest.mark.parametrize("case", ["missing", "a-file", "too-large"])
def test_a_bad_context_directory_is_refused_before_anything_is_created(
    cluster: tuple[MasterProcess, AgentProcess], tmp_path: Path, case: str
) -> None:
    master, _ = cluster
    here = project(tmp_path / "project")
    if case == "missing":
        context, expected = tmp_path / "nope", ["context directory", "nope", "does not exist"]
    elif case == "a-file":
        context, expected = here / "prep.py", ["context directory", "prep.py", "a directory"]
    else:
        # Sparse: 97 MiB by its size, nothing on the disk; refused before it is read.
        with (here / "weights.bin").open("wb") as sink:
            sink.truncate(97 * 2**20)
        context = here
        expected = ["context directory", "97.0 MiB", "over the 96 MiB limit", ".detignore"]
    before = command_ids(master)
    result = master.det("cmd", "run", "-c", str(context), "python3", "prep.py")
    assert result.returncode == 1 and result.stdout == "", describe_run(result)
    (line,) = [x for x in result.stderr.splitlines() if x.strip()]
    assert line.startswith("Error: ") and all(word in line for word in expected), line
    assert command_ids(master) == before


@pytest.mark.official_client
def test_determineds_client_runs_a_command_in_its_context_directory(
    cluster: tuple[MasterProcess, AgentProcess], tmp_path: Path
) -> None:
    master, _ = cluster
    here = project(tmp_path / "project")
    result = master.official("cmd", "run", "-c", str(here), "python3", "prep.py", timeout=120)
    assert "Traceback" not in result.stderr, describe_run(result)
    assert "prep-read 3 rows; ignored file sent: False" in result.stdout, describe_run(result)


def launched_shell(result: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"Launched shell \(id: ([0-9a-f-]+)\)", result.stderr)
    assert found, describe_run(result)
    return found[1]


def test_a_shell_runs_the_command_after_dashes_then_ends(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    """Determined's form, `det shell start -- CMD`: only the command's output on stdout,
    its exit code, and the shell task ended (unless --keep)."""
    master, _ = cluster
    result = master.det(
        "shell", "start", "--", "echo", "shell-says-$((6*7))", ";", "exit", "3", timeout=120
    )
    assert result.returncode == 3, describe_run(result)
    assert result.stdout == "shell-says-42\n", describe_run(result)
    wait_state(master, "shell", launched_shell(result), "STATE_TERMINATED", timeout=60)

    kept = master.det("shell", "start", "--keep", "--", "ls", "/", ">/dev/null", timeout=120)
    assert kept.returncode == 0 and kept.stdout == "", describe_run(kept)
    shell_id = launched_shell(kept)
    try:
        assert task(master, "shell", shell_id)["state"] == "STATE_RUNNING"
    finally:
        master.det("shell", "kill", shell_id)
    wait_state(master, "shell", shell_id, "STATE_TERMINATED", timeout=60)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--", "-L", "8888:localhost:8888"], ["-L", "ssh options are not supported"]),
        (["-d", "--", "echo", "hi"], ["--detach", "drop -d"]),
    ],
)
def test_a_shell_command_that_cannot_run_is_refused_before_a_shell_starts(
    cluster: tuple[MasterProcess, AgentProcess], args: list[str], expected: list[str]
) -> None:
    master, _ = cluster
    before = {s["id"] for s in master.api("GET", "/api/v1/shells")["shells"]}
    result = master.det("shell", "start", *args)
    assert result.returncode == 1 and result.stdout == "", describe_run(result)
    (line,) = [x for x in result.stderr.splitlines() if x.strip()]
    assert all(word in line for word in expected), line
    assert {s["id"] for s in master.api("GET", "/api/v1/shells")["shells"]} == before


def test_a_shell_runs_what_a_pipe_gives_it_on_the_agent(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    master, _ = cluster
    script = "echo in-$DET_TASK_TYPE $((6*7)) $DET_AGENT_ID\nexit 5\n"
    result = master.det("shell", "start", input=script, timeout=120)
    assert result.returncode == 5, describe_run(result)
    assert "in-SHELL 42 tasks-agent" in result.stdout, describe_run(result)


def test_a_shell_gives_an_interactive_terminal(cluster: tuple[MasterProcess, AgentProcess]) -> None:
    """`det shell start` in a real terminal (a pty): type a command, read its output."""
    master, _ = cluster
    pid, fd = pty.fork()
    if pid == 0:  # the child: our det, as a user would run it
        env = client_env(master.url, XDG_CONFIG_HOME=str(master.scratch / ".config"))
        os.chdir(master.scratch)
        os.execve(str(OUR_DET), [str(OUR_DET), "shell", "start"], env)
    seen = b""

    def read_until(marker: bytes, timeout: float = 180.0) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while marker not in seen:
            assert time.monotonic() < deadline, f"no {marker!r} in {seen[-2000:]!r}"
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    break

    try:
        # Typed before the shell is up: the terminal keeps it until the shell reads it.
        time.sleep(0.5)
        os.write(fd, b"echo $((7*6))-from-$DET_TASK_TYPE\r")
        read_until(b"42-from-SHELL")
        os.write(fd, b"stty size; exit 3\r")
        read_until(b"exit 3")
    except BaseException:
        os.kill(pid, 9)
        raise
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 3, seen[-2000:]


def test_a_notebook_answers_through_the_proxy_then_ends_when_idle_and_frees_its_slot(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    require(jupyter_installed(), "jupyterlab is not installed (make install puts it in .venv)")
    master, _ = cluster
    started = time.monotonic()
    result = master.det(
        "notebook",
        "start",
        "--no-browser",
        "--config",
        "idle_timeout=6s",
        "--config",
        "resources.slots=1",
        timeout=180,
    )
    ready_s = time.monotonic() - started
    assert result.returncode == 0, describe_run(result)
    url = result.stdout.strip().rsplit(" ", 1)[-1]
    notebook_id = url.rstrip("/").rsplit("/", 1)[-1]
    assert url == f"{master.url}/proxy/{notebook_id}/", result.stdout
    status = master.http("GET", f"/proxy/{notebook_id}/api/status")
    assert status.status_code == 200, status.text
    assert "kernels" in status.json()
    # The slot is held: a command waits, saying why.
    queued = master.det("cmd", "run", "-d", "echo", "reused-slot")
    command_id = queued.stdout.strip()
    waiting = task(master, "command", command_id)
    assert waiting["state"] == "STATE_QUEUED", waiting
    # Nothing touches the notebook now: it ends after its idle_timeout, and the command runs.
    ended = wait_state(master, "notebook", notebook_id, "STATE_TERMINATED")
    assert ended["endReason"].startswith("idle for 6 s (idle_timeout)"), ended
    # On time: 6 s after the last request through the proxy, plus at most one check
    # interval and the stop (slack for a loaded two-core machine).
    idle_for = (
        datetime.fromisoformat(ended["endTime"]) - datetime.fromisoformat(ended["lastActivityTime"])
    ).total_seconds()
    assert 6 <= idle_for <= 6 + IDLE_CHECK_S + 8, ended
    done = wait_state(master, "command", command_id, "STATE_TERMINATED")
    assert done["exitCode"] == 0
    logs = master.det("cmd", "logs", command_id)
    assert "reused-slot" in logs.stdout, describe_run(logs)
    print(f"det notebook start -> page answered in {ready_s:.1f} s")


def test_a_notebook_with_an_open_kernel_is_not_idle(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    """Determined's default notebook_idle_type, kernels_or_terminals: a kernel left open
    (a long cell, the tab closed) keeps the notebook, however quiet the proxy."""
    require(jupyter_installed(), "jupyterlab is not installed (make install puts it in .venv)")
    master, _ = cluster
    result = master.det(
        "notebook", "start", "--no-browser", "--config", "idle_timeout=3s", timeout=180
    )
    assert result.returncode == 0, describe_run(result)
    notebook_id = result.stdout.strip().rstrip("/").rsplit("/", 1)[-1]
    try:
        kernel = master.http("POST", f"/proxy/{notebook_id}/api/kernels", json={})
        assert kernel.status_code == 201, kernel.text
        # A negative check needs time to pass: past the idle timeout, three checks later.
        time.sleep(3 + 3 * IDLE_CHECK_S + 2)
        notebook = task(master, "notebook", notebook_id)
        assert notebook["state"] == "STATE_RUNNING", notebook
        # And the kernel was what kept it: shut down, the same notebook ends as idle (so the
        # wait above was not merely shorter than a late idle check).
        kernel_id = kernel.json()["id"]
        gone = master.http("DELETE", f"/proxy/{notebook_id}/api/kernels/{kernel_id}")
        assert gone.status_code == 204, gone.text
        ended = wait_state(master, "notebook", notebook_id, "STATE_TERMINATED")
        assert ended["endReason"].startswith("idle for 3 s (idle_timeout)"), ended
    finally:
        master.det("notebook", "kill", notebook_id)


def test_a_notebook_whose_jupyter_cannot_start_says_why(
    cluster: tuple[MasterProcess, AgentProcess], tmp_path: Path
) -> None:
    require(jupyter_installed(), "jupyterlab is not installed (make install puts it in .venv)")
    master, _ = cluster
    # A broken Jupyter on the agent's path: it exits at once, saying why.
    broken = tmp_path / "broken-jupyter"
    broken.mkdir()
    (broken / "jupyterlab.py").write_text(
        "raise SystemExit('jupyterlab: this install is broken')\n"
    )
    for path in (broken, tmp_path):
        path.chmod(0o755)
    variable = f"environment.environment_variables=[PYTHONPATH={broken}]"
    result = master.det("notebook", "start", "--no-browser", "--config", variable, timeout=180)
    assert result.returncode == 1, describe_run(result)
    assert "exit code 1" in result.stderr, describe_run(result)
    assert "jupyterlab: this install is broken" in result.stderr, describe_run(result)
    # Its slot is free: a command runs at once.
    after = master.det("cmd", "run", "echo", "slot-free", timeout=120)
    assert after.returncode == 0 and "slot-free" in after.stdout, describe_run(after)


def test_the_proxy_refuses_a_notebook_of_another_user(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    master, _ = cluster
    admin = master.session.post(
        "/api/v1/auth/login", json={"username": "admin", "password": ""}, timeout=30
    ).json()["token"]
    headers = {"Authorization": f"Bearer {admin}"}
    body = {"config": {"resources": {"slots": 0}}}
    reply = master.session.post("/api/v1/shells", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    shell_id = reply.json()["shell"]["id"]
    try:
        wait_state(master, "shell", shell_id, "STATE_RUNNING")
        refused = master.http("GET", f"/proxy/{shell_id}/")
        assert refused.status_code == 403, refused.text
        assert "only its owner" in refused.json()["message"]
        # The shell's WebSocket: closed with 4403 and the reason, not a bare 403.
        mine = {"Authorization": refused.request.headers["Authorization"]}
        proxy = master.url.replace("http://", "ws://") + "/proxy/"

        async def open_shell(path: str, headers: dict[str, str]) -> tuple[int | None, str | None]:
            async with ws_connect(proxy + path, additional_headers=headers) as socket:
                with pytest.raises(ConnectionClosed):
                    await socket.recv()
                return socket.close_code, socket.close_reason

        for path in ("", "terminal"):
            code, reason = asyncio.run(open_shell(f"{shell_id}/{path}", mine))
            assert code == 4403 and reason is not None and "only its owner" in reason
        # Without a login, the terminal is refused; only the SSH tunnel (Determined's
        # det shell start, whose credential is the shell's key) may come without one.
        code, reason = asyncio.run(open_shell(f"{shell_id}/terminal", {}))
        assert code == 4401 and reason is not None and "sign in first" in reason
        command = {"config": {"entrypoint": "true", "resources": {"slots": 0}}}
        reply = master.session.post("/api/v1/commands", json=command, headers=headers, timeout=60)
        for other in (reply.json()["command"]["id"], "no-such-task"):
            code, reason = asyncio.run(open_shell(f"{other}/", {}))
            assert code == 4401 and reason is not None and "sign in first" in reason
    finally:
        master.session.post(f"/api/v1/shells/{shell_id}/kill", headers=headers, timeout=30)


def test_determineds_own_client_runs_commands_and_notebooks(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    """Determined's `det` 0.38.1, unchanged: cmd run streams the output; notebook start
    waits for the page (v1Task.isReady); task list and notebook kill."""
    master, _ = cluster
    ran = master.official("cmd", "run", "echo official-$DET_TASK_TYPE", timeout=120)
    assert ran.returncode == 0, describe_run(ran)
    assert "official-COMMAND" in ran.stdout, describe_run(ran)
    listed = master.official("cmd", "list")
    assert "Command (echo official-$DET_TASK_TYPE)" in listed.stdout, describe_run(listed)
    if not jupyter_installed():
        require(False, "jupyterlab is not installed (make install puts it in .venv)")
    started = master.official("notebook", "start", "--no-browser", timeout=180)
    assert started.returncode == 0, describe_run(started)
    assert "is ready" in started.stdout, describe_run(started)
    (notebook_id,) = [
        t["id"]
        for t in master.api("GET", "/api/v1/notebooks")["notebooks"]
        if t["state"] == "STATE_RUNNING"
    ]
    assert f"{master.url}/proxy/{notebook_id}/" in started.stdout
    tasks = master.official("task", "list")
    assert notebook_id in tasks.stdout, describe_run(tasks)
    killed = master.official("notebook", "kill", notebook_id)
    assert killed.returncode == 0, describe_run(killed)
    wait_state(master, "notebook", notebook_id, "STATE_TERMINATED")


def test_determineds_own_client_opens_a_shell_over_ssh_through_the_proxy(
    cluster: tuple[MasterProcess, AgentProcess],
) -> None:
    """Determined's `det shell start` and `det shell open`, unchanged: OpenSSH's ssh, with the
    shell's key, through determined.cli.tunnel and the master's /proxy/<id>/ to the agent."""
    master, _ = cluster
    require(
        shutil.which("ssh") is not None, "OpenSSH's ssh is not installed (make debian-packages)"
    )
    remote = "echo on-$DET_TASK_TYPE-$((6*7)) secret=${RESOLUTE_TASK_SECRET:-none}"
    started = master.official("shell", "start", "--", remote, timeout=120)
    launched = re.search(r"Launched shell \(id: ([0-9a-f-]+)", started.stdout)
    assert launched, describe_run(started)
    shell_id = launched[1]
    try:
        logs = master.det("shell", "logs", shell_id)
        assert started.returncode == 0, describe_run(started) + describe_run(logs)
        assert "on-SHELL-42 secret=none" in started.stdout, (
            describe_run(started) + logs.stdout + master.output()
        )
        # Determined keeps a shell running after its ssh ends: open it again.
        assert f"det shell open {shell_id}" in started.stdout, describe_run(started)
        opened = master.official("shell", "open", shell_id, "--", "echo again-$((2+3))")
        assert "again-5" in opened.stdout, describe_run(opened)
        # The key goes to the shell's owner only; the public half to anyone who may list it.
        listed = master.api("GET", "/api/v1/shells")["shells"]
        assert all("privateKey" not in t and t["publicKey"] for t in listed)
        assert "BEGIN OPENSSH PRIVATE KEY" in task(master, "shell", shell_id)["privateKey"]
    finally:
        killed = master.official("shell", "kill", shell_id)
    assert killed.returncode == 0, describe_run(killed)
    wait_state(master, "shell", shell_id, "STATE_TERMINATED")


def test_a_tensorboard_shows_the_metrics_stored_for_an_experiment(
    cluster: tuple[MasterProcess, AgentProcess], tmp_path: Path
) -> None:
    require(
        importlib.util.find_spec("tensorboard") is not None,
        "tensorboard is not installed (make install puts it in .venv)",
    )
    master, _ = cluster
    config, model = write_experiment(tmp_path, REPORTING_SCRIPT, slots=0, name="tb-e2e")
    experiment_id = create_experiment(master, config, model)
    trial = wait_trial_state(master, experiment_id, {"COMPLETED"})
    started = master.det("tensorboard", "start", str(experiment_id), "--no-browser", timeout=240)
    assert started.returncode == 0, describe_run(started)
    board_id = started.stdout.strip().rstrip("/").rsplit("/", 1)[-1]
    try:
        run = f"experiment_{experiment_id}/trial_{trial['id']}"

        def scalars() -> list[Any] | None:
            reply = master.http(
                "GET",
                f"/proxy/{board_id}/data/plugin/scalars/scalars",
                params={"run": run, "tag": "training/loss"},
            )
            return reply.json() if reply.status_code == 200 else None

        points = master.wait_for("TensorBoard to load the trial's scalars", scalars, 180)
        assert [step for _, step, _ in points] == [10, 20, 30, 40, 50, 60, 70, 80]
        assert points[0][2] == pytest.approx(1.0)
        runs = master.http("GET", f"/proxy/{board_id}/data/runs").json()
        assert run in runs
    finally:
        master.det("tensorboard", "kill", board_id)

    # Determined's own client, by trial (det tensorboard start -t), detached.
    by_trial = master.official("tensorboard", "start", "-t", str(trial["id"]), "-d")
    assert by_trial.returncode == 0, describe_run(by_trial)
    board_id = by_trial.stdout.strip()
    try:
        board = wait_state(master, "tensorboard", board_id, "STATE_RUNNING")
        assert board["trialIds"] == [trial["id"]] and board["experimentIds"] == []
        assert board["description"] == f"TensorBoard (Trial {trial['id']})"

        def runs_loaded() -> list[str] | None:
            reply = master.http("GET", f"/proxy/{board_id}/data/runs")
            return reply.json() or None if reply.status_code == 200 else None

        assert master.wait_for("TensorBoard to list the trial", runs_loaded, 180) == [run]
    finally:
        master.official("tensorboard", "kill", board_id)
