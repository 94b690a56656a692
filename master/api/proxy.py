"""Forwarding for /proxy/<task>/: HTTP (streamed both ways) and WebSockets, to a task's
server on its agent. Who may pass, and where the task listens, is the route's business
(master/api/routes/proxy.py); this module only carries bytes and headers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import websockets
from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import connect as ws_connect

# Headers that describe one hop, never forwarded (RFC 9110 7.6.1), and the client's own
# credentials for the master.
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
        "authorization",
        "content-length",
    }
)
# Set by the WebSocket handshake itself on each side.
_WS_OWN = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions"}
    | {"sec-websocket-protocol", "sec-websocket-accept"}
)
ACTIVITY_EVERY_S = 1.0


@dataclass(frozen=True)
class Upstream:
    base_url: str  # "http://198.18.0.2:41234"
    headers: dict[str, str]  # added to every upstream request (the task's secret)


class _Throttled:
    """on_activity at most once a second: it is only an idle clock."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.last = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self.last >= ACTIVITY_EVERY_S:
            self.last = now
            self.callback()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": 14, "message": message, "details": []}, status_code=status)


class ProxyPool:
    """One per master process; holds the shared HTTP client."""

    def __init__(
        self, *, strip_cookies: frozenset[str] = frozenset(), connect_timeout_s: float = 5.0
    ) -> None:
        self.strip_cookies = strip_cookies
        self.connect_timeout_s = connect_timeout_s
        # No read timeout: long polls and event streams stay open as long as they like.
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=connect_timeout_s),
            follow_redirects=False,
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(
        self, incoming: Any, upstream: Upstream, skip: frozenset[str]
    ) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for name, value in incoming.items():
            lower = name.lower()
            if lower in skip:
                continue
            if lower == "cookie":
                value = self._cookies_without_ours(value)
                if not value:
                    continue
            out.append((name, value))
        out.extend(upstream.headers.items())
        return out

    def _cookies_without_ours(self, header: str) -> str:
        kept = []
        for part in header.split(";"):
            name = part.split("=", 1)[0].strip()
            if name and name not in self.strip_cookies:
                kept.append(part.strip())
        return "; ".join(kept)

    async def forward_http(
        self, request: Request, upstream: Upstream, on_activity: Callable[[], None]
    ) -> Response:
        on_activity()
        url = upstream.base_url + request.url.path
        if request.url.query:
            url += "?" + request.url.query
        headers = self._headers(request.headers, upstream, _HOP_BY_HOP)
        client = request.client.host if request.client else ""
        headers += [
            ("X-Forwarded-For", client),
            ("X-Forwarded-Proto", request.url.scheme),
            ("X-Forwarded-Host", request.headers.get("host", "")),
        ]
        body: AsyncIterator[bytes] | None = None
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            body = request.stream()
        outgoing = self._http.build_request(request.method, url, headers=headers, content=body)
        try:
            reply = await self._http.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            where = upstream.base_url.removeprefix("http://")
            cause = str(exc) or type(exc).__name__
            return _error(502, f"the task's server at {where} did not answer: {cause}")
        headers_out = [
            (k, v)
            for k, v in reply.headers.multi_items()
            if k.lower() not in _HOP_BY_HOP or k.lower() == "content-length"
        ]
        # A redirect to the server's own origin would send the browser past the proxy.
        headers_out = [
            (k, v.removeprefix(upstream.base_url) if k.lower() == "location" else v)
            for k, v in headers_out
        ]
        response = StreamingResponse(
            reply.aiter_raw(),
            status_code=reply.status_code,
            background=BackgroundTask(reply.aclose),
        )
        response.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers_out
        ]
        return response

    async def forward_websocket(
        self, websocket: WebSocket, upstream: Upstream, on_activity: Callable[[], None]
    ) -> None:
        touch = _Throttled(on_activity)
        touch()
        path = websocket.url.path + (f"?{websocket.url.query}" if websocket.url.query else "")
        url = "ws" + upstream.base_url.removeprefix("http") + path
        headers = self._headers(websocket.headers, upstream, _HOP_BY_HOP | _WS_OWN)
        protocols = [
            p.strip()
            for p in websocket.headers.get("sec-websocket-protocol", "").split(",")
            if p.strip()
        ]
        try:
            remote = await ws_connect(
                url,
                additional_headers=headers,
                subprotocols=protocols or None,  # type: ignore[arg-type]
                max_size=None,
                open_timeout=self.connect_timeout_s,
                ping_interval=None,  # the browser and the server keep their own
                compression=None,
            )
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            where = upstream.base_url.removeprefix("http://")
            await websocket.close(code=1011, reason=f"task server at {where}: {exc}"[:120])
            return
        async with remote:
            await websocket.accept(subprotocol=remote.subprotocol)

            async def client_to_remote() -> None:
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        await remote.close(message.get("code", 1000) or 1000)
                        return
                    touch()
                    if message.get("bytes") is not None:
                        await remote.send(message["bytes"])
                    elif message.get("text") is not None:
                        await remote.send(message["text"])

            async def remote_to_client() -> None:
                try:
                    async for data in remote:
                        touch()
                        if isinstance(data, bytes):
                            await websocket.send_bytes(data)
                        else:
                            await websocket.send_text(data)
                except websockets.ConnectionClosed:
                    pass
                code = remote.close_code or 1000
                reason = remote.close_reason or ""
                with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                    # 1005/1006 are never sent on the wire.
                    await websocket.close(
                        code=1000 if code in (1005, 1006) else code, reason=reason
                    )

            tasks = [
                asyncio.create_task(client_to_remote()),
                asyncio.create_task(remote_to_client()),
            ]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
