"""A small stdlib HTTP client for the master's REST API: one persistent connection per
thread that uses it, the trial's session token, and bounded retries of transient failures
(connection refused or reset, 502/503/504) so that a master restart does not kill training."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any

logger = logging.getLogger(__name__)

TRANSIENT_STATUSES = frozenset({502, 503, 504})
MAX_BACKOFF_S = 5.0


class MasterError(RuntimeError):
    """A call to the master failed: refused (`status` set) or unreachable (`status` None)."""

    def __init__(self, call: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{call}: {message}")
        self.call = call
        self.status = status


def _message(status: int, data: bytes) -> str:
    """The master's `message` field (Determined's error shape), else the raw body."""
    text = data.decode("utf-8", errors="replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        text = body["message"]
    return f"the master answered {status}: {text[:1000] or '(empty body)'}"


def _decode(call: str, status: int, data: bytes) -> Any:
    if not data.strip():
        return {}
    try:
        return json.loads(data)
    except ValueError:
        raise MasterError(
            call,
            f"the master answered {status} with a body that is not JSON: {data[:200]!r}",
            status,
        ) from None


def tls_context() -> tuple[ssl.SSLContext, str | None]:
    """How ranks verify an https master, as Determined's harness does: DET_MASTER_CERT_FILE
    (the agent's copy of its CA) is trusted beside the system's CAs, `noverify` turns
    verification off, and DET_MASTER_CERT_NAME is the name checked instead of the host."""
    context = ssl.create_default_context()
    path = os.environ.get("DET_MASTER_CERT_FILE", "")
    if path.lower() == "noverify":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif path:
        try:
            context.load_verify_locations(cafile=path)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"DET_MASTER_CERT_FILE={path}: {exc}") from None
    return context, os.environ.get("DET_MASTER_CERT_NAME") or None


class _HTTPSConnection(http.client.HTTPSConnection):
    """Verifies (and sends as SNI) `server_name` instead of the host it connects to."""

    def __init__(self, *args: Any, server_name: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)  # type: ignore[attr-defined]


class Session:
    """One connection, used by one request at a time: a thread that long-polls makes its
    own Session so that it never holds up the others."""

    def __init__(
        self,
        master_url: str,
        token: str | None,
        *,
        timeout_s: float = 30.0,
        retry_for_s: float = 60.0,
    ) -> None:
        url = urllib.parse.urlsplit(master_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"DET_MASTER={master_url!r} is not an http(s) URL")
        self.master_url = master_url
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._prefix = url.path.rstrip("/")
        self._timeout_s = timeout_s
        self._retry_for_s = retry_for_s
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._tls = tls_context() if self._https else None
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            conn: http.client.HTTPConnection
            if self._tls is None:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
            else:
                context, name = self._tls
                if name:
                    conn = _HTTPSConnection(
                        self._host,
                        self._port,
                        timeout=self._timeout_s,
                        context=context,
                        server_name=name,
                    )
                else:
                    conn = http.client.HTTPSConnection(
                        self._host, self._port, timeout=self._timeout_s, context=context
                    )
            conn.connect()
            if conn.sock is not None:  # small requests: no waiting on Nagle's algorithm
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        """Close the connection for good. Safe from another thread: a request in flight
        there (a long-poll) has its socket shut down, fails, and closes it itself."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._reset()
            finally:
                self._lock.release()
            return
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _once(self, method: str, path: str, payload: bytes | None) -> tuple[int, bytes]:
        headers = dict(self._headers)
        if payload is not None:
            headers["Content-Type"] = "application/json"
        conn = self._connection()
        conn.request(method, self._prefix + path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.will_close:
            self._reset()
        return response.status, data

    def request(self, method: str, path: str, body: Any = None, *, call: str | None = None) -> Any:
        """The decoded JSON reply of a 2xx answer; MasterError for anything else."""
        call = call or f"{method} {path}"
        payload = None if body is None else json.dumps(body, allow_nan=False).encode()
        with self._lock:
            try:
                return self._request(method, path, payload, call)
            finally:
                if self._closed:
                    self._reset()

    def _request(self, method: str, path: str, payload: bytes | None, call: str) -> Any:
        deadline = time.monotonic() + self._retry_for_s
        delay = 0.0  # the first retry is immediate: usually a keep-alive the master closed
        while True:
            if self._closed:
                raise MasterError(call, "the connection to the master was closed")
            try:
                status, data = self._once(method, path, payload)
            except ssl.SSLCertVerificationError as exc:
                self._reset()
                # Not transient: retrying would only hide it for a minute.
                raise MasterError(
                    call,
                    f"the master's certificate at {self.master_url} did not verify against "
                    f"DET_MASTER_CERT_FILE={os.environ.get('DET_MASTER_CERT_FILE') or '(unset)'}"
                    f": {exc.verify_message}",
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                self._reset()
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if status < 300:
                    return _decode(call, status, data)
                if status not in TRANSIENT_STATUSES:
                    raise MasterError(call, _message(status, data), status)
                problem = _message(status, data)
            if time.monotonic() + delay > deadline:
                raise MasterError(
                    call,
                    f"master at {self.master_url} still failing after "
                    f"{self._retry_for_s:.0f} s of retries: {problem}",
                )
            logger.debug("%s: %s; retrying in %.1f s", call, problem, delay)
            time.sleep(delay)
            delay = min(max(delay * 2, 0.2), MAX_BACKOFF_S)
