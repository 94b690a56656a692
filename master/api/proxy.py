"""Forwarding for /proxy/<task>/...: HTTP and WebSockets, streamed both ways, to a task's
server on its agent. Who may pass, and where the task listens, is the route's business
(master/api/routes/proxy.py); this module only carries bytes and headers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.frames import EXTERNAL_CLOSE_CODES
from websockets.typing import Subprotocol

log = logging.getLogger(__name__)

# One hop's own headers (RFC 9110 7.6.1). Host is set by httpx and websockets to the
# upstream's; Expect was already answered by our own server.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "expect",
    }
)
# The client's credentials for the master, and what we set afresh for this hop.
_NOT_FORWARDED = _HOP_BY_HOP | {
    "authorization",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
}
# Each side of a WebSocket negotiates its own handshake; subprotocols are offered apart.
_HANDSHAKE = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
)
# The master's server writes its own Date and Server; the upstream's would be duplicates.
_NOT_RETURNED = _HOP_BY_HOP | {"date", "server"}
ACTIVITY_EVERY_S = 1.0
_CLOSE_REASON_BYTES = 123  # a close frame's payload is at most 125 bytes, 2 of them the code


@dataclass(frozen=True)
class Upstream:
    base_url: str  # "http://198.18.0.2:41234"
    headers: dict[str, str]  # added to every upstream request (the task's secret)


class _Throttled:
    """Calls on_activity at most once a second: it only keeps a task's idle clock."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._last = -ACTIVITY_EVERY_S

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._last >= ACTIVITY_EVERY_S:
            self._last = now
            self._callback()


class ProxyPool:
    """One per master process: the HTTP connection pool to every task's server."""

    def __init__(
        self,
        *,
        strip_cookies: frozenset[str] = frozenset(),
        connect_timeout_s: float = 5.0,
        handshake_timeout_s: float = 120.0,
    ) -> None:
        self.strip_cookies = strip_cookies
        self.connect_timeout_s = connect_timeout_s
        # Jupyter answers a kernel's WebSocket handshake only once the kernel has started
        # and replied to kernel_info (its own limit: 60 s after the start), which takes
        # longer than a TCP connect on a busy agent.
        self.handshake_timeout_s = handshake_timeout_s
        # No read or write timeout: long polls and event streams stay open as they like.
        self._timeout = httpx.Timeout(None, connect=connect_timeout_s)
        self._client: httpx.AsyncClient | None = None

    @property
    def _http(self) -> httpx.AsyncClient:
        """Made at the first proxied request: a client loads its CA bundle when made (40 ms
        of CPU, measured), which every master's start paid though most never proxy."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self._timeout,
                # Agents are reached directly, never through the master's HTTP(S)_PROXY.
                trust_env=False,
                # Each upstream request answers one client request, which bounds them already.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
                # The client would otherwise keep every task's cookies in one jar, forever.
                cookies=httpx.Cookies(CookieJar(DefaultCookiePolicy(allowed_domains=[]))),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def forward_http(
        self, request: Request, upstream: Upstream, on_activity: Callable[[], None]
    ) -> Response:
        on_activity()
        headers = self._request_headers(request, upstream, _NOT_FORWARDED)
        body = request.stream() if _has_body(request.headers) else None
        # httpx.Request, not client.build_request: the client's default headers (an
        # Accept-Encoding the browser never sent, above all) must not be added.
        outgoing = httpx.Request(
            request.method,
            upstream.base_url + _path_and_query(request.scope),
            headers=headers,
            content=body,
            extensions={"timeout": self._timeout.as_dict()},
        )
        try:
            reply = await self._http.send(outgoing, stream=True)
        except ClientDisconnect:
            # The client left mid-upload (httpx has dropped the upstream connection);
            # this reply goes nowhere.
            return Response(status_code=400)
        except httpx.HTTPError as exc:
            message = _failure(upstream, exc)
            log.info("proxy %s: %s", request.url.path, message)
            return _bad_gateway(message)
        return _Relay(reply, _response_headers(reply, upstream))

    async def forward_websocket(
        self, websocket: WebSocket, upstream: Upstream, on_activity: Callable[[], None]
    ) -> None:
        touch = _Throttled(on_activity)
        touch()
        url = "ws" + upstream.base_url.removeprefix("http") + _path_and_query(websocket.scope)
        offered = [Subprotocol(p) for p in websocket.scope.get("subprotocols", [])]
        origin = urlsplit(upstream.base_url)
        try:
            sock = await self._open_socket(origin.hostname or "", origin.port or 80)
            remote = await connect(
                url,
                # On a socket of ours, websockets follows no handshake redirect: the
                # task's code must not steer the master to other hosts.
                sock=sock,
                additional_headers=self._request_headers(
                    websocket, upstream, _NOT_FORWARDED | _HANDSHAKE
                ),
                subprotocols=offered or None,
                open_timeout=self.handshake_timeout_s,
                max_size=None,  # a notebook's outputs can be many MB in one message
                compression=None,  # the agents are on the LAN; deflate would only cost CPU
                proxy=None,  # never the master's HTTP(S)_PROXY
            )
        except (OSError, WebSocketException, ValueError) as exc:
            message = _failure(upstream, exc)
            log.info("proxy %s: %s", websocket.url.path, message)
            await _refuse(websocket, offered, message)
            return
        async with remote:
            # Accepted only now, so the client gets the subprotocol the upstream chose.
            await websocket.accept(subprotocol=remote.subprotocol)
            upward = asyncio.create_task(_client_to_upstream(websocket, remote, touch))
            try:
                await _upstream_to_client(remote, websocket, touch)
            finally:
                upward.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await upward

    async def _open_socket(self, host: str, port: int) -> socket.socket:
        """The TCP connection to a task's server within connect_timeout_s: an agent that
        is gone fails fast, however long the handshake on top of it may take."""
        loop = asyncio.get_running_loop()
        last: OSError = OSError(f"no address for {host}")
        async with asyncio.timeout(self.connect_timeout_s):
            for family, kind, proto, _, address in await loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            ):
                sock = socket.socket(family, kind, proto)
                try:
                    sock.setblocking(False)
                    await loop.sock_connect(sock, address)
                except BaseException as exc:
                    sock.close()
                    if not isinstance(exc, OSError):
                        raise
                    last = exc
                    continue
                return sock
        raise last

    def _request_headers(
        self, conn: Request | WebSocket, upstream: Upstream, dropped: frozenset[str]
    ) -> list[tuple[str, str]]:
        incoming = conn.headers
        # Connection may name more headers that are this hop's own.
        dropped = dropped | _connection_tokens(incoming.get("connection", ""))
        dropped |= {name.lower() for name in upstream.headers}
        out: list[tuple[str, str]] = []
        for name, value in incoming.items():
            if name in dropped:
                continue
            if name == "cookie":
                value = self._cookies_for_upstream(value)
                if not value:
                    continue
            out.append((name, value))
        out.extend(upstream.headers.items())
        peer = conn.client.host if conn.client else ""
        earlier = incoming.get("x-forwarded-for")
        out += [
            ("x-forwarded-for", f"{earlier}, {peer}" if earlier else peer),
            ("x-forwarded-proto", "https" if conn.url.scheme in ("https", "wss") else "http"),
            ("x-forwarded-host", incoming.get("host", "")),
        ]
        return out

    def _cookies_for_upstream(self, header: str) -> str:
        """The Cookie header less the master's own (its sign-in must not reach user code)."""
        kept = [
            part.strip()
            for part in header.split(";")
            if part.strip() and part.split("=", 1)[0].strip() not in self.strip_cookies
        ]
        return "; ".join(kept)


class _Relay(Response):
    """The upstream's reply, streamed as it came (a gzip body stays gzip). It watches for
    the client going away, so that a silent long poll or event stream does not outlive
    its reader, and it always closes the upstream response."""

    def __init__(self, reply: httpx.Response, headers: list[tuple[bytes, bytes]]) -> None:
        self.reply = reply
        self.status_code = reply.status_code
        self.raw_headers = headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def relay() -> None:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.reply.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def until_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        relaying = asyncio.create_task(relay())
        watching = asyncio.create_task(until_disconnect())
        try:
            await asyncio.wait((relaying, watching), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relaying, watching):
                task.cancel()
            await asyncio.gather(relaying, watching, return_exceptions=True)
            await self.reply.aclose()
        error = None if relaying.cancelled() else relaying.exception()
        if error is not None and not isinstance(error, OSError):  # OSError: the client left
            # The upstream broke off mid-body: raising makes our server drop the
            # connection, so the client sees a truncated reply, not a complete one.
            raise error


async def _client_to_upstream(
    websocket: WebSocket, remote: ClientConnection, touch: Callable[[], None]
) -> None:
    """Until the client leaves; then the upstream is closed, which ends the relay."""
    code, reason = 1001, ""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                code, reason = message.get("code", 1000), message.get("reason") or ""
                return
            touch()
            data = message.get("bytes")
            with contextlib.suppress(ConnectionClosed):  # the other direction reports it
                await remote.send(data if data is not None else message.get("text") or "")
    finally:
        code = code if _sendable(code) else 1000
        await remote.close(code, _truncated(reason))


async def _upstream_to_client(
    remote: ClientConnection, websocket: WebSocket, touch: Callable[[], None]
) -> None:
    """Until the upstream connection closes; then the client gets its code and reason."""
    try:
        async for data in remote:
            touch()
            if isinstance(data, bytes):
                await websocket.send_bytes(data)
            else:
                await websocket.send_text(data)
    except ConnectionClosed:
        pass  # reported below, from close_code
    except WebSocketDisconnect:
        await remote.close(1001)  # the client went away while we wrote to it
        return
    code, reason = remote.close_code, remote.close_reason or ""
    if code is None or code == 1006:
        code, reason = 1011, "the task's server closed the connection abnormally"
    elif not _sendable(code):  # 1005: it closed without a code
        code = 1000
    # Already closed when the client left first; nothing more to tell it then.
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await websocket.close(code, _truncated(reason))


async def _refuse(websocket: WebSocket, offered: list[Subprotocol], message: str) -> None:
    """Accepts, then closes at once with 1011 and the cause, which a browser's script and
    det's terminal both read. A close before accepting reaches the client as a bare
    HTTP 403 (uvicorn), the cause lost; a denial response (websocket.send_denial_response)
    is hidden from browser scripts, and uvicorn's websockets-sansio logs a spurious
    error after each one (Kludex/uvicorn#3138)."""
    # Chrome fails a handshake that picks none of the subprotocols it offered, and the
    # reason with it; any of them will do for a connection closed at once.
    await websocket.accept(subprotocol=offered[0] if offered else None)
    await websocket.close(1011, _truncated(message))


def _response_headers(reply: httpx.Response, upstream: Upstream) -> list[tuple[bytes, bytes]]:
    dropped = _NOT_RETURNED | _connection_tokens(reply.headers.get("connection", ""))
    out: list[tuple[bytes, bytes]] = []
    for raw_name, value in reply.headers.raw:
        name = raw_name.lower()
        if name.decode("latin-1") in dropped:
            continue
        if name == b"location":
            value = _relative(value.decode("latin-1"), upstream).encode("latin-1")
        out.append((name, value))
    return out


def _relative(location: str, upstream: Upstream) -> str:
    """A redirect to the upstream's own origin would send the browser past the proxy; the
    path alone keeps it on the master (the upstream serves under the same prefix)."""
    target, origin = urlsplit(location), urlsplit(upstream.base_url)
    if target.scheme in ("http", "https") and target.netloc.lower() == origin.netloc.lower():
        return urlunsplit(("", "", target.path or "/", target.query, target.fragment))
    return location


def _path_and_query(scope: Scope) -> str:
    # raw_path keeps percent escapes as the client sent them (a%2Fb stays one segment).
    raw: bytes | None = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(scope["path"])
    query: bytes = scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


def _has_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0") != "0"


def _connection_tokens(value: str) -> frozenset[str]:
    return frozenset(token.strip().lower() for token in value.split(",") if token.strip())


def _sendable(code: int) -> bool:
    return code in EXTERNAL_CLOSE_CODES or 3000 <= code < 5000


def _truncated(reason: str) -> str:
    return reason.encode()[:_CLOSE_REASON_BYTES].decode(errors="ignore")


def _failure(upstream: Upstream, exc: Exception) -> str:
    where = f"the task's server at {urlsplit(upstream.base_url).netloc}"
    if isinstance(exc, InvalidStatus):
        return f"{where} refused the WebSocket: HTTP {exc.response.status_code}"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return f"{where} did not answer: timed out"
    if isinstance(exc, ValueError) and isinstance(exc.__cause__, InvalidStatus):
        location = exc.__cause__.response.headers.get("Location", "")
        return f"{where} redirected the WebSocket, which the proxy never follows: {location}"
    if isinstance(exc, WebSocketException | ValueError):
        return f"{where} failed the WebSocket handshake: {exc}"
    errno = _errno(exc)
    cause = os.strerror(errno).lower() if errno else str(exc) or type(exc).__name__
    return f"{where} did not answer: {cause}"


def _errno(exc: BaseException | None) -> int | None:
    """The socket error under httpx's and anyio's wrappers ("All connection attempts
    failed" says less than "connection refused")."""
    if exc is None:
        return None
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    inner = [exc.__cause__, exc.__context__]
    if isinstance(exc, BaseExceptionGroup):
        inner += exc.exceptions
    return next((e for e in map(_errno, inner) if e), None)


def _bad_gateway(message: str) -> JSONResponse:
    # The API's error shape (grpc-gateway's), as every other error of the master.
    return JSONResponse({"code": 14, "message": message, "details": []}, status_code=502)
