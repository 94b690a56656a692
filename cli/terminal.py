"""The user's end of `det shell start`: a local terminal bridged to a remote shell's WebSocket.

The other end is resolute.shell_server, behind the master's proxy. Binary frames carry
terminal bytes both ways; text frames we send are JSON control messages (`term` and
`resize` first, `resize` on SIGWINCH; `command` first for `det shell start -- CMD`). The
server closes with 1000 and `exit N` or `signal N` when the shell ends, and that becomes
our exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import ssl
import sys
import termios
import tty
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
)

from resolute.shell_server import wait_fd

OPEN_TIMEOUT_S = 20.0


class AttachError(Exception):
    """Why the connection could not be made, in one line."""


async def attach(
    url: str,
    headers: dict[str, str],
    ssl_context: ssl.SSLContext | None = None,
    *,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    command: str | None = None,
) -> int:
    """Bridge this terminal (or pipe) to the remote shell, or to `command` run by it;
    return the shell's exit status.

    128+n when it died of signal n, 1 (with a message on stderr) when the connection
    failed or broke.
    """
    try:
        ws = await _connect(url, headers, ssl_context)
    except AttachError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 1

    is_tty = os.isatty(stdin_fd)
    saved = termios.tcgetattr(stdin_fd) if is_tty else None
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()  # resize sends in flight
    output_error: OSError | None = None

    def send_size() -> None:
        task = loop.create_task(_send_control(ws, {"resize": _window_size(stdin_fd)}))
        pending.add(task)
        task.add_done_callback(pending.discard)

    try:
        if is_tty:
            # TCSANOW, not setraw's default TCSAFLUSH: what the user typed while the
            # shell was starting is sent, not thrown away.
            tty.setraw(stdin_fd, termios.TCSANOW)
            loop.add_signal_handler(signal.SIGWINCH, send_size)
            first: dict[str, object] = {
                "term": os.environ.get("TERM") or "xterm-256color",
                "resize": _window_size(stdin_fd),
            }
        else:
            first = {"term": "dumb"}  # output goes to a pipe: no colours, no escapes
        if command is not None:
            first["command"] = command
        await _send_control(ws, first)
        sender = asyncio.create_task(_pump_stdin(ws, stdin_fd))
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    await _write_all(stdout_fd, message)
        except ConnectionClosed:
            pass  # reported below from the close code
        except OSError as exc:  # our stdout went away (`det shell start | head`)
            output_error = exc
        finally:
            sender.cancel()
            for task in pending:
                task.cancel()
            await asyncio.gather(sender, *pending, return_exceptions=True)
    finally:
        if is_tty:
            loop.remove_signal_handler(signal.SIGWINCH)
            assert saved is not None
            termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
        await ws.close()

    if output_error is not None:
        print(f"Error: cannot write the shell's output: {output_error}", file=sys.stderr)
        return 1
    status = parse_close_reason(ws.close_code, ws.close_reason)
    if status is None:
        print(f"Error: {_why_closed(ws.close_code, ws.close_reason)}", file=sys.stderr)
        return 1
    return status


def parse_close_reason(code: int | None, reason: str | None) -> int | None:
    """`exit N` -> N, `signal N` -> 128+N, for a normal closure; None for anything else."""
    if code != 1000 or not reason:
        return None
    if match := re.fullmatch(r"exit (\d{1,3})", reason):
        status = int(match[1])
        return status if status <= 255 else None
    if match := re.fullmatch(r"signal (\d{1,2})", reason):
        return 128 + int(match[1])
    return None


def _why_closed(code: int | None, reason: str | None) -> str:
    if code == 1001:
        return "the shell server shut down (1001)"
    if code in (None, 1006):
        return "the connection to the shell was lost"
    detail = f"{code} {reason}" if reason else str(code)
    return f"the shell's connection closed abnormally ({detail})"


async def _connect(
    url: str, headers: dict[str, str], ssl_context: ssl.SSLContext | None
) -> ClientConnection:
    where = urlsplit(url).netloc or url
    # websockets refuses an ssl argument for ws://; for wss:// None means its default.
    tls = ssl_context if url.startswith("wss://") else None
    try:
        return await connect(
            url,
            additional_headers=headers,
            ssl=tls,
            open_timeout=OPEN_TIMEOUT_S,
            max_size=None,  # terminal output is trusted and chunked by the server anyway
        )
    except InvalidStatus as exc:
        response = exc.response
        body = response.body.decode(errors="replace").strip().splitlines()
        detail = f": {body[0][:200]}" if body else ""
        raise AttachError(
            f"{where} refused the shell's WebSocket: HTTP {response.status_code} "
            f"{response.reason_phrase}{detail}"
        ) from None
    except InvalidURI as exc:
        raise AttachError(f"not a WebSocket URL: {exc.uri}") from None
    except InvalidHandshake as exc:
        raise AttachError(f"WebSocket handshake with {where} failed: {exc}") from None
    except TimeoutError:
        raise AttachError(f"timed out connecting to {where}") from None
    except ConnectionRefusedError:
        raise AttachError(f"cannot connect to {where}: connection refused") from None
    except socket.gaierror as exc:
        raise AttachError(f"cannot resolve {where}: {exc.strerror}") from None
    except ssl.SSLError as exc:
        raise AttachError(f"TLS with {where} failed: {exc.reason or exc}") from None
    except OSError as exc:
        raise AttachError(f"cannot connect to {where}: {exc.strerror or exc}") from None


async def _pump_stdin(ws: ClientConnection, fd: int) -> None:
    """Local input to the shell, as binary frames.

    At EOF the connection stays open until the shell exits, so piped commands print their
    output. A pipe should end with `exit`: a ^D sent after it is turned into a NUL by the
    pty when it arrives before the shell's readline is waiting for it.
    """
    try:
        while data := await _read(fd):
            await ws.send(data)
    except (ConnectionClosed, OSError):
        pass  # the receiving side reports how the connection ended


async def _read(fd: int) -> bytes:
    while True:
        try:
            await wait_fd(fd)
        except PermissionError:
            # A regular file or /dev/null cannot be polled (epoll says EPERM), but its
            # reads never block.
            return os.read(fd, 65536)
        with contextlib.suppress(BlockingIOError):  # woken for nothing: wait again
            return os.read(fd, 65536)


async def _write_all(fd: int, data: bytes) -> None:
    """Write everything, waiting (not spinning) if the fd is non-blocking and full."""
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            await wait_fd(fd, writable=True)


async def _send_control(ws: ClientConnection, message: dict[str, object]) -> None:
    with contextlib.suppress(ConnectionClosed):
        await ws.send(json.dumps(message))


def _window_size(fd: int) -> list[int]:
    size = os.get_terminal_size(fd)
    return [size.lines, size.columns]
