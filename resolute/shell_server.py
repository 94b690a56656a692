"""The agent's end of `det shell start`: interactive shells served over a WebSocket.

    RESOLUTE_TASK_SECRET=... python3 -m resolute.shell_server --port 8022

The master's proxy forwards the client's WebSocket here, and every handshake must carry
`Authorization: token <RESOLUTE_TASK_SECRET>`, or it is refused with 403. Two kinds of
connection, by the path's last part:

- `.../terminal` (our `det shell start`): its own interactive shell in a new
  pseudo-terminal. Binary frames are terminal bytes, both ways. Text frames from the client
  are JSON control messages: `{"resize": [rows, cols]}`, and in the first message only
  `{"term": "xterm"}` and `{"command": "..."}` (these keys may share that message). A
  command runs in the shell instead of an interactive one (`det shell start -- CMD`); without
  a size (the client has no terminal) it runs without a pty: stdin empty, stdout and stderr
  as binary frames. When the shell exits, its
  remaining output is sent, then the WebSocket is closed with 1000 and the reason
  `exit <code>` or `signal <n>`. When the client goes away, the shell's session is hung up.
- any other path (Determined's `det shell start`, whose ssh tunnels through the proxy's
  `/proxy/<id>/`): binary frames carry an SSH connection to a server in this process,
  which accepts only the task's key (resolute.shell_access) and runs shells and commands as
  sshd would, in a pseudo-terminal when the client asks for one.

This runs on the agent: it must not import the master's web stack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import fcntl
import hmac
import json
import logging
import os
import shutil
import signal
import socket
import struct
import sys
import termios
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import asyncssh
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from resolute.shell_access import is_terminal_path, shell_keys

SECRET_ENV = "RESOLUTE_TASK_SECRET"
DEFAULT_TERM = "xterm-256color"
# How long a new connection waits for its optional first control message (TERM and the
# initial size) before starting the shell with the defaults. Our client sends it at once.
FIRST_MESSAGE_WAIT_S = 1.0
# After the shell exits, how long to wait for the rest of its output: the pty reports EOF
# at once unless a background job still holds it open.
OUTPUT_DRAIN_S = 1.0
HANGUP_GRACE_S = 2.0

log = logging.getLogger("resolute.shell_server")


def choose_shell() -> str:
    """$SHELL if it names an executable, else bash, else sh."""
    shell = os.environ.get("SHELL", "")
    if shell and os.path.isfile(shell) and os.access(shell, os.X_OK):
        return shell
    return shutil.which("bash") or shutil.which("sh") or "/bin/sh"


def shell_argv(command: str | None) -> list[str]:
    return [choose_shell(), "-c", command] if command is not None else [choose_shell(), "-i"]


def shell_env(term: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(SECRET_ENV, None)  # the shell's user has no use for the proxy's secret
    if term:
        env["TERM"] = term
    return env


def set_window_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def parse_control(text: str) -> dict[str, object]:
    """A control message as a dict; anything malformed is ignored, not fatal."""
    try:
        message = json.loads(text)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def parse_size(value: object) -> tuple[int, int] | None:
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(n, int) and 0 < n < 65536 for n in value)
    ):
        return value[0], value[1]
    return None


def exit_reason(returncode: int) -> str:
    return f"signal {-returncode}" if returncode < 0 else f"exit {returncode}"


async def wait_fd(fd: int, *, writable: bool = False) -> None:
    """Wait, without blocking the loop, until fd can be read (or written)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if writable:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        if writable:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def write_all(fd: int, data: bytes) -> None:
    """Write everything to a non-blocking fd, waiting while the pty's input queue is full."""
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            await wait_fd(fd, writable=True)


class Shell:
    """One interactive shell on its own pseudo-terminal, a session leader."""

    def __init__(self, proc: asyncio.subprocess.Process, master_fd: int) -> None:
        self.proc = proc
        self.master_fd = master_fd

    @classmethod
    async def start(
        cls, term: str, size: tuple[int, int] | None, command: str | None = None
    ) -> Shell:
        """An interactive shell, or `command` run by the shell (as sshd runs `ssh host cmd`)."""
        master_fd, slave_fd = os.openpty()
        try:
            if size is not None:
                set_window_size(slave_fd, *size)  # before the shell starts, so it reads it
            proc = await asyncio.create_subprocess_exec(
                *shell_argv(command),
                stdin=slave_fd,
                stdout=slave_fd,
                stderr=slave_fd,
                env=shell_env(term),
                start_new_session=True,
                # After setsid: make the pty the new session's controlling terminal, so
                # job control, ^C and hangups reach the shell and its jobs.
                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
            )
        except BaseException:
            os.close(master_fd)
            raise
        finally:
            # Only the shell may hold the slave: the master then reads EOF when it exits.
            os.close(slave_fd)
        os.set_blocking(master_fd, False)
        return cls(proc, master_fd)

    async def read(self) -> bytes:
        """The next output of the pty; b"" once nothing holds its other end."""
        while True:
            await wait_fd(self.master_fd)
            try:
                return os.read(self.master_fd, 65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EIO:  # Linux's EOF on a pty master
                    return b""
                raise

    def signal_session(self, signum: int) -> None:
        """Signal the shell's process group and the terminal's foreground job."""
        groups = {self.proc.pid}
        with contextlib.suppress(OSError):
            groups.add(os.tcgetpgrp(self.master_fd))
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signum)

    async def hang_up(self) -> None:
        """The client went away: SIGHUP, then SIGKILL if the shell is still alive; reap it."""
        self.signal_session(signal.SIGHUP)
        try:
            await asyncio.wait_for(self.proc.wait(), HANGUP_GRACE_S)
        except TimeoutError:
            self.signal_session(signal.SIGKILL)
            await self.proc.wait()

    def close(self) -> None:
        os.close(self.master_fd)


async def pump_output(ws: ServerConnection, shell: Shell) -> None:
    while data := await shell.read():
        await ws.send(data)


async def pump_input(ws: ServerConnection, shell: Shell) -> None:
    """Client frames into the pty, until the client closes the connection."""
    with contextlib.suppress(ConnectionClosed):
        async for message in ws:
            if isinstance(message, bytes):
                await write_all(shell.master_fd, message)
            elif size := parse_size(parse_control(message).get("resize")):
                set_window_size(shell.master_fd, *size)


async def first_message(ws: ServerConnection) -> str | bytes | None:
    with contextlib.suppress(TimeoutError):
        return await asyncio.wait_for(ws.recv(), FIRST_MESSAGE_WAIT_S)
    return None


async def handle(ws: ServerConnection, ssh: SshServer) -> None:
    assert ws.request is not None
    if is_terminal_path(ws.request.path):
        await handle_terminal(ws)
    else:
        await ssh.serve(ws)


async def handle_terminal(ws: ServerConnection) -> None:
    peer = ws.remote_address
    term, size, early_input = DEFAULT_TERM, None, b""
    command: str | None = None
    try:
        first = await first_message(ws)
    except ConnectionClosed:
        log.info("connection from %s closed before its shell started", peer)
        return
    if isinstance(first, bytes):
        early_input = first
    elif first is not None:
        control = parse_control(first)
        if isinstance(control.get("term"), str) and control["term"]:
            term = str(control["term"])
        size = parse_size(control.get("resize"))
        if isinstance(control.get("command"), str):
            command = str(control["command"])
    if command is not None and size is None:
        await run_piped(ws, command)
        return

    try:
        shell = await Shell.start(term, size, command)
    except OSError as exc:
        log.error("connection from %s: cannot start a shell: %s", peer, exc)
        await ws.close(1011, f"cannot start a shell: {exc.strerror}"[:120])
        return
    log.info("connection from %s opened: shell pid %d", peer, shell.proc.pid)
    output = asyncio.create_task(pump_output(ws, shell))
    client = asyncio.create_task(pump_input(ws, shell))
    exited = asyncio.create_task(shell.proc.wait())
    outcome = "connection closed, shell hung up"
    try:
        if early_input:
            await write_all(shell.master_fd, early_input)
        await asyncio.wait({client, exited}, return_when=asyncio.FIRST_COMPLETED)
        if exited.done():
            reason = exit_reason(exited.result())
            outcome = f"shell ended ({reason})"
            # Send what is left of its output, then say how it ended.
            with contextlib.suppress(TimeoutError, ConnectionClosed):
                await asyncio.wait_for(output, OUTPUT_DRAIN_S)
            await ws.close(1000, reason)
        else:
            await shell.hang_up()
    finally:
        for task in (output, client, exited):
            task.cancel()
        await asyncio.gather(output, client, exited, return_exceptions=True)
        if shell.proc.returncode is None:  # cancelled (server shutting down): still hang up
            await shell.hang_up()
        shell.close()
        log.info("connection from %s closed: %s", peer, outcome)


async def run_piped(ws: ServerConnection, command: str) -> None:
    """A command for a client without a terminal: its output (stdout and stderr as it comes)
    in binary frames, then the close that says how it ended; hung up if the client goes."""
    peer = ws.remote_address
    try:
        proc = await asyncio.create_subprocess_exec(
            *shell_argv(command),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=shell_env(None),
            start_new_session=True,
        )
    except OSError as exc:
        log.error("connection from %s: cannot run a command: %s", peer, exc)
        await ws.close(1011, f"cannot start a shell: {exc.strerror}"[:120])
        return
    assert proc.stdout is not None
    log.info("connection from %s opened: command pid %d", peer, proc.pid)

    async def output(source: asyncio.StreamReader) -> None:
        while data := await source.read(65536):
            await ws.send(data)

    async def until_closed() -> None:
        # Read (and drop) what the client sends, so its close is seen.
        with contextlib.suppress(ConnectionClosed):
            async for _ in ws:
                pass

    pump = asyncio.create_task(output(proc.stdout))
    client = asyncio.create_task(until_closed())
    try:
        await asyncio.wait({pump, client}, return_when=asyncio.FIRST_COMPLETED)
        if pump.done() and pump.exception() is None:
            reason = exit_reason(await proc.wait())
            await ws.close(1000, reason)
            log.info("connection from %s closed: command ended (%s)", peer, reason)
    finally:
        for task in (pump, client):
            task.cancel()
        await asyncio.gather(pump, client, return_exceptions=True)
        if proc.returncode is None:  # the client went away first
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGHUP)
            await proc.wait()
            log.info("connection from %s closed: command hung up", peer)


# -- SSH (Determined's det shell start) --------------------------------------------------------


class SshServer:
    """An SSH server per WebSocket, in this process: a socket pair joins the two."""

    def __init__(self, secret: str) -> None:
        self.authorized = asyncssh.import_authorized_keys(shell_keys(secret).public_openssh)
        # A host key of this run's own: Determined's client does not check it (it connects
        # through the master, which checked the task), and nothing of it is stored.
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")

    async def serve(self, ws: ServerConnection) -> None:
        peer = ws.remote_address
        ours, theirs = socket.socketpair()
        try:
            reader, writer = await asyncio.open_connection(sock=ours)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        server = asyncio.create_task(self._run(theirs, peer))
        into_ssh = asyncio.create_task(_frames_to_stream(ws, writer))
        out_of_ssh = asyncio.create_task(_stream_to_frames(reader, ws))
        log.info("ssh connection from %s opened", peer)
        try:
            await asyncio.wait({into_ssh, out_of_ssh}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            writer.close()
            for task in (into_ssh, out_of_ssh, server):
                task.cancel()
            await asyncio.gather(into_ssh, out_of_ssh, server, return_exceptions=True)
            with contextlib.suppress(ConnectionClosed):
                await ws.close()
            log.info("ssh connection from %s closed", peer)

    async def _run(self, sock: socket.socket, peer: Any) -> None:
        try:
            conn = await asyncssh.run_server(
                sock,
                server_host_keys=[self.host_key],
                authorized_client_keys=self.authorized,
                process_factory=ssh_session,
                encoding=None,  # bytes, as the terminal gives them
                line_editor=False,  # the remote shell edits its own lines, as under sshd
                allow_scp=False,
                x11_forwarding=False,
                agent_forwarding=False,
            )
        except (OSError, asyncssh.Error) as exc:
            log.info("ssh connection from %s refused: %s", peer, exc)
            sock.close()
            return
        await conn.wait_closed()


async def _frames_to_stream(ws: ServerConnection, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for message in ws:
            writer.write(message if isinstance(message, bytes) else message.encode())
            await writer.drain()


async def _stream_to_frames(reader: asyncio.StreamReader, ws: ServerConnection) -> None:
    with contextlib.suppress(ConnectionClosed):
        while data := await reader.read(65536):
            await ws.send(data)


async def ssh_session(process: asyncssh.SSHServerProcess[bytes]) -> None:
    """A session as sshd runs it: the shell or `command`, in a pty when one was asked for."""
    term = process.get_terminal_type()
    try:
        if term:
            code = await _in_pty(process, term)
        else:
            code = await _piped(process)
    except OSError as exc:
        process.stderr.write(f"cannot start a shell: {exc.strerror}\r\n".encode())
        code = 127
    if code < 0 and -code in {s.value for s in signal.Signals}:
        process.exit_with_signal(signal.Signals(-code).name.removeprefix("SIG"))
    else:
        process.exit(code if code >= 0 else 128 - code)  # a shell's status for a signal


async def _in_pty(process: asyncssh.SSHServerProcess[bytes], term: str) -> int:
    cols, rows, _, _ = process.get_terminal_size()
    shell = await Shell.start(term, (rows, cols) if rows and cols else None, process.command)

    async def output() -> None:
        while data := await shell.read():
            process.stdout.write(data)
            await process.stdout.drain()

    async def client_input() -> None:
        while True:
            try:
                data = await process.stdin.read(65536)
            except asyncssh.TerminalSizeChanged as change:
                set_window_size(shell.master_fd, change.height, change.width)
                continue
            if not data:  # EOF: a pty has no end of input to pass it on as (nor has sshd)
                return
            await write_all(shell.master_fd, data)

    pumps = [asyncio.create_task(output()), asyncio.create_task(client_input())]
    exited = asyncio.create_task(shell.proc.wait())
    closed = asyncio.create_task(process.wait_closed())
    try:
        await asyncio.wait({closed, exited}, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():  # the client is gone: hang up, as a closed terminal does
            await shell.hang_up()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pumps[0]), OUTPUT_DRAIN_S)
        return await exited
    finally:
        for task in (*pumps, exited, closed):
            task.cancel()
        await asyncio.gather(*pumps, exited, closed, return_exceptions=True)
        if shell.proc.returncode is None:
            await shell.hang_up()
        shell.close()


async def _piped(process: asyncssh.SSHServerProcess[bytes]) -> int:
    proc = await asyncio.create_subprocess_exec(
        *shell_argv(process.command),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=shell_env(None),
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    # Pumped by hand, not redirect(): its stdout's end would end the channel's output
    # while stderr still had some to send.

    async def pump(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()

    async def client_input(sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await process.stdin.read(65536):
                sink.write(data)
                await sink.drain()
            sink.close()  # the client's EOF, passed on

    feeding = asyncio.create_task(client_input(proc.stdin))
    try:
        await asyncio.gather(pump(proc.stdout, process.stdout), pump(proc.stderr, process.stderr))
        return await proc.wait()
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        if proc.returncode is None:  # the client went away first
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGHUP)
            await proc.wait()


# -- the server ---------------------------------------------------------------------------------


def check_token(secret: str) -> Callable[[ServerConnection, Request], Response | None]:
    """process_request: refuse a handshake without `Authorization: token <secret>`."""
    expected = f"token {secret}".encode()

    def process_request(ws: ServerConnection, request: Request) -> Response | None:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if hmac.compare_digest(given, expected):
            return None
        log.info("connection from %s refused: bad or missing task token", ws.remote_address)
        return ws.respond(HTTPStatus.FORBIDDEN, "403 Forbidden: bad or missing task token\n")

    return process_request


class _OneLineHandshakeErrors(logging.Filter):
    """Port probes and plain HTTP requests fail the handshake: one line, not a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "opening handshake failed" and record.exc_info:
            record.msg = f"opening handshake failed: {record.exc_info[1]!r}"
            record.exc_info = None
        return True


async def run(host: str, port: int, secret: str) -> None:
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    ssh = SshServer(secret)

    async def route(ws: ServerConnection) -> None:
        await handle(ws, ssh)

    async with serve(route, host, port, process_request=check_token(secret)) as server:
        bound = server.sockets[0].getsockname()[1]
        print(f"shell server listening on {host}:{bound}", flush=True)
        await stop.wait()
    log.info("shell server stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m resolute.shell_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    args = parser.parse_args(argv)
    secret = os.environ.get(SECRET_ENV, "")
    if not secret:
        print(f"shell server: {SECRET_ENV} is not set; refusing to start", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # Our own lines say when connections open and close; websockets' say it again.
    logging.getLogger("websockets").setLevel(logging.WARNING)
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    logging.getLogger("websockets.server").addFilter(_OneLineHandshakeErrors())
    asyncio.run(run(args.host, args.port, secret))
    return 0


if __name__ == "__main__":
    sys.exit(main())
