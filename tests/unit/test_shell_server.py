"""`det shell start`'s two ends: resolute.shell_server in a real process, real shells in real
ptys, driven by websockets' client and by cli.terminal.attach."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from cli.terminal import attach, parse_close_reason
from harness.cluster import free_port
from resolute.shell_access import is_terminal_path, shell_keys
from tests.conftest import require

SECRET = "s3cret-for-tests"
PROBE = "probe-value-81f2"
AUTH = {"Authorization": f"token {SECRET}"}
TIMEOUT_S = 15.0  # generous: a loaded 2-core machine starts shells slowly

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ptys")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One shell server for the module; every test opens its own connections."""
    log = tmp_path_factory.mktemp("shell_server") / "stderr.log"
    env = dict(
        os.environ,
        RESOLUTE_TASK_SECRET=SECRET,
        RESOLUTE_PROBE=PROBE,
        SHELL=shutil.which("bash") or "/bin/sh",
    )
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "resolute.shell_server", "--host", "127.0.0.1", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
        line = proc.stdout.readline().decode() if ready else ""
        match = re.fullmatch(r"shell server listening on 127\.0\.0\.1:(\d+)\n", line)
        assert match, f"no readiness line ({line!r}); stderr: {log.read_text()}"
        yield f"ws://127.0.0.1:{match[1]}/proxy/3f1c-task/terminal"
    finally:
        proc.terminate()
        proc.wait(TIMEOUT_S)
        proc.stdout.close()


def open_shell(url: str, headers: dict[str, str] | None = None) -> connect:
    return connect(url, additional_headers=AUTH if headers is None else headers)


class Screen:
    """Output received so far, and how far the tests have read it."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.pos = 0

    def find(self, pattern: bytes) -> re.Match[bytes] | None:
        """The next match after the previous one, if the output holds it yet."""
        match = re.compile(pattern, re.MULTILINE).search(self.data, self.pos)
        if match:
            self.pos = match.end()
        return match


async def read_until(ws: ClientConnection, screen: Screen, pattern: bytes) -> re.Match[bytes]:
    async with asyncio.timeout(TIMEOUT_S):
        while not (match := screen.find(pattern)):
            message = await ws.recv()
            assert isinstance(message, bytes), message
            screen.data += message
    return match


async def read_to_close(ws: ClientConnection) -> str:
    seen = bytearray()
    async with asyncio.timeout(TIMEOUT_S):
        async for message in ws:
            assert isinstance(message, bytes)
            seen += message
    return seen.decode(errors="replace")


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for a reaper that may never come."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def eventually(condition: Callable[[], bool]) -> None:
    """Poll: a process going away or a terminal changing mode has no event to await."""
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def wait_gone(*pids: int) -> None:
    await eventually(lambda: not any(alive(pid) for pid in pids))


# --- the server -----------------------------------------------------------------------------


def test_the_server_refuses_to_start_without_a_secret() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RESOLUTE_TASK_SECRET"}
    for secret in (None, ""):
        if secret is not None:
            env["RESOLUTE_TASK_SECRET"] = secret
        done = subprocess.run(
            [sys.executable, "-m", "resolute.shell_server", "--port", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 2
        assert "RESOLUTE_TASK_SECRET is not set" in done.stderr


async def test_the_shell_has_the_tasks_environment_and_its_exit_code_closes_the_socket(
    server_url: str,
) -> None:
    async with open_shell(server_url) as ws:
        await ws.send(json.dumps({"term": "dumb"}))
        await ws.send(
            b"echo probe=$RESOLUTE_PROBE term=$TERM secret=${RESOLUTE_TASK_SECRET:-none}\n"
        )
        await ws.send(b"exit 3\n")
        output = await read_to_close(ws)
    assert f"probe={PROBE} term=dumb secret=none" in output
    assert (ws.close_code, ws.close_reason) == (1000, "exit 3")


async def test_without_a_first_control_message_the_shell_gets_the_default_term(
    server_url: str,
) -> None:
    async with open_shell(server_url) as ws:
        await ws.send(b'echo "term=$TERM"; kill -KILL $$\n')
        output = await read_to_close(ws)
    assert "term=xterm-256color" in output
    assert (ws.close_code, ws.close_reason) == (1000, "signal 9")


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "token wrong"}, {"Authorization": f"Bearer {SECRET}"}],
    ids=["missing", "wrong", "other-scheme"],
)
async def test_a_handshake_without_the_task_secret_is_forbidden(
    server_url: str, headers: dict[str, str]
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with open_shell(server_url, headers):
            pass
    assert refused.value.response.status_code == 403
    assert b"task token" in refused.value.response.body


async def test_resize_sets_the_terminal_size(server_url: str) -> None:
    screen = Screen()
    async with open_shell(server_url) as ws:
        await ws.send(json.dumps({"term": "dumb", "resize": [20, 70]}))
        await ws.send(b"stty size\n")
        await read_until(ws, screen, rb"^20 70\r?$")
        await ws.send(json.dumps({"resize": [33, 111]}))
        await ws.send(b"stty size\n")
        await read_until(ws, screen, rb"^33 111\r?$")
        await ws.send(b"exit\n")
        await read_to_close(ws)


async def test_two_connections_get_two_shells(server_url: str) -> None:
    screen_a, screen_b = Screen(), Screen()
    async with open_shell(server_url) as a, open_shell(server_url) as b:
        for ws in (a, b):
            await ws.send(json.dumps({"term": "dumb"}))
        await a.send(b"X=from-a; echo pid=$$\n")
        await b.send(b"echo pid=$$ x=${X:-unset}\n")
        pid_a = (await read_until(a, screen_a, rb"^pid=(\d+)\r?$"))[1]
        match_b = await read_until(b, screen_b, rb"^pid=(\d+) x=(\w+)\r?$")
        assert pid_a != match_b[1]
        assert match_b[2] == b"unset"
        await a.send(b"exit 4\n")
        await b.send(b"exit 5\n")
        await asyncio.gather(read_to_close(a), read_to_close(b))
    assert a.close_reason == "exit 4"
    assert b.close_reason == "exit 5"


async def test_closing_the_client_kills_the_shell_and_its_foreground_job(server_url: str) -> None:
    screen = Screen()
    async with open_shell(server_url) as ws:
        await ws.send(json.dumps({"term": "dumb"}))
        await ws.send(b"echo shell=$$; sh -c 'echo job=$$; exec sleep 1000'\n")
        shell = int((await read_until(ws, screen, rb"^shell=(\d+)\r?$"))[1])
        job = int((await read_until(ws, screen, rb"^job=(\d+)\r?$"))[1])
        assert alive(shell) and alive(job)
    await wait_gone(shell, job)


async def test_a_shell_that_ignores_the_hangup_is_killed(server_url: str) -> None:
    screen = Screen()
    async with open_shell(server_url) as ws:
        await ws.send(json.dumps({"term": "dumb"}))
        await ws.send(b"trap '' HUP; echo shell=$$\n")
        shell = int((await read_until(ws, screen, rb"^shell=(\d+)\r?$"))[1])
    await wait_gone(shell)


# --- the client -----------------------------------------------------------------------------


async def test_attach_with_a_pipe_prints_the_output_and_returns_the_exit_code(
    server_url: str,
) -> None:
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    try:
        os.write(stdin_w, b"echo hello-from-pipe; exit 7\n")
        os.close(stdin_w)
        async with asyncio.timeout(TIMEOUT_S):
            status = await attach(server_url, AUTH, stdin_fd=stdin_r, stdout_fd=stdout_w)
        os.close(stdout_w)
        with os.fdopen(stdout_r, "rb") as out:
            output = out.read().decode(errors="replace")
    finally:
        os.close(stdin_r)
    assert status == 7
    # A line of its own: the echoed command line contains the words too.
    assert re.search(r"^hello-from-pipe\r?$", output, re.MULTILINE), output


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def test_attach_with_a_terminal_goes_raw_follows_its_size_and_restores_it(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERM", "dumb")  # attach passes it on; no escapes around the output
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    set_size(slave, 21, 67)
    before = termios.tcgetattr(slave)
    screen = Screen()

    async def screen_until(pattern: bytes) -> re.Match[bytes]:
        async with asyncio.timeout(TIMEOUT_S):
            while not (match := screen.find(pattern)):
                try:
                    screen.data += os.read(master, 65536)
                except BlockingIOError:
                    await asyncio.sleep(0.02)
        return match

    session = asyncio.create_task(attach(server_url, AUTH, stdin_fd=slave, stdout_fd=slave))
    try:
        # Raw mode: no local echo, and keys go as they are.
        await eventually(lambda: not termios.tcgetattr(slave)[3] & termios.ICANON)
        os.write(master, b"stty size\r")
        await screen_until(rb"[\r\n]21 67\r\n")

        # The kernel sends SIGWINCH to the pty's foreground group, which we are not: send it.
        set_size(slave, 30, 100)
        os.kill(os.getpid(), signal.SIGWINCH)
        async with asyncio.timeout(TIMEOUT_S):
            while True:  # the resize travels beside the keys: ask until it has arrived
                os.write(master, b"stty size\r")
                if (await screen_until(rb"[\r\n](\d+ \d+)\r\n"))[1] == b"30 100":
                    break
        os.write(master, b"exit 5\r")
        async with asyncio.timeout(TIMEOUT_S):
            assert await session == 5
        assert termios.tcgetattr(slave) == before
    finally:
        session.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await session
        os.close(master)
        os.close(slave)


async def test_attach_says_why_it_could_not_connect(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    unused = free_port()  # a port nobody listens on
    stdin_r, stdin_w = os.pipe()
    try:
        assert await attach(f"ws://127.0.0.1:{unused}/", AUTH, stdin_fd=stdin_r) == 1
        assert "connection refused" in capsys.readouterr().err
        assert await attach(server_url, {"Authorization": "token no"}, stdin_fd=stdin_r) == 1
        err = capsys.readouterr().err
        assert "HTTP 403" in err and "Traceback" not in err and err.count("\n") == 1
    finally:
        os.close(stdin_r)
        os.close(stdin_w)


def test_close_reasons_become_exit_statuses() -> None:
    assert parse_close_reason(1000, "exit 0") == 0
    assert parse_close_reason(1000, "exit 255") == 255
    assert parse_close_reason(1000, "signal 9") == 137
    assert parse_close_reason(1000, "exit 256") is None
    assert parse_close_reason(1001, "exit 0") is None  # the server went away
    assert parse_close_reason(1006, "") is None
    assert parse_close_reason(None, None) is None


# --- Determined's det shell start: OpenSSH's ssh over the WebSocket ----------------------------

# ssh's ProxyCommand, as determined.cli.tunnel is: stdin to binary frames, frames to stdout.
TUNNEL = """
import contextlib, os, sys, threading
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

ws = connect(sys.argv[1], additional_headers={"Authorization": sys.argv[2]})

def upstream():
    with contextlib.suppress(ConnectionClosed, OSError):
        while data := os.read(0, 65536):
            ws.send(data)

threading.Thread(target=upstream, daemon=True).start()
try:
    for message in ws:
        os.write(1, message)
except ConnectionClosed:
    pass
"""


def ssh(
    url: str, key: str, tmp_path: Path, *remote: str, tty: bool = False
) -> subprocess.CompletedProcess[str]:
    require_ssh()
    tunnel = tmp_path / "tunnel.py"
    tunnel.write_text(TUNNEL)
    key_file = tmp_path / "key"
    key_file.write_text(key)
    key_file.chmod(0o600)
    ssh_url = url.removesuffix("terminal")  # Determined's client opens /proxy/<id>/
    proxy = f"{sys.executable} {tunnel} {ssh_url} 'token {SECRET}'"
    argv = [
        "ssh",
        "-F",
        "/dev/null",
        "-o",
        f"ProxyCommand={proxy}",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-i",
        str(key_file),
        *(["-tt"] if tty else ["-T"]),
        "someone@3f1c-task",
        *remote,
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
    )


def require_ssh() -> None:
    require(
        shutil.which("ssh") is not None, "OpenSSH's ssh is not installed (make debian-packages)"
    )


def test_ssh_with_the_tasks_key_runs_a_command_with_its_environment_and_exit_code(
    server_url: str, tmp_path: Path
) -> None:
    key = shell_keys(SECRET).private_openssh
    done = ssh(
        server_url,
        key,
        tmp_path,
        "echo probe=$RESOLUTE_PROBE secret=${RESOLUTE_TASK_SECRET:-none}"
        "; echo to-stderr >&2; exit 4",
    )
    assert done.returncode == 4, done.stderr
    assert done.stdout == f"probe={PROBE} secret=none\n"
    assert "to-stderr" in done.stderr


def test_ssh_with_a_terminal_runs_the_command_in_a_pty(server_url: str, tmp_path: Path) -> None:
    key = shell_keys(SECRET).private_openssh
    done = ssh(server_url, key, tmp_path, "tty; echo term=$TERM; exit 5", tty=True)
    assert done.returncode == 5, done.stderr
    assert re.search(r"^/dev/pts/\d+$", done.stdout, re.M), done.stdout
    assert "term=" in done.stdout and "not a tty" not in done.stdout


def test_ssh_with_another_key_is_refused(server_url: str, tmp_path: Path) -> None:
    other = shell_keys("another task's secret").private_openssh
    done = ssh(server_url, other, tmp_path, "echo should-not-run")
    assert done.returncode == 255
    assert "Permission denied" in done.stderr and "should-not-run" not in done.stdout


def test_only_a_path_ending_in_terminal_is_the_terminal() -> None:
    assert is_terminal_path("/proxy/3f1c-task/terminal")
    assert is_terminal_path("/proxy/3f1c-task/terminal/?x=1")
    assert is_terminal_path("terminal")
    # Determined's tunnel opens /proxy/<id>/: SSH, whose credential is the key, not a login.
    assert not is_terminal_path("/proxy/3f1c-task/")
    assert not is_terminal_path("/proxy/3f1c-task")
    assert not is_terminal_path("/proxy/terminal-task/x")
    assert not is_terminal_path("")


def test_each_secret_gives_its_own_key_and_no_secret_gives_none() -> None:
    first, again = shell_keys("secret-one"), shell_keys("secret-one")
    assert first.public_openssh == again.public_openssh
    assert first.public_openssh != shell_keys("secret-two").public_openssh
    assert "secret-one" not in first.private_openssh + first.public_openssh
    with pytest.raises(ValueError, match="empty"):
        shell_keys("")
