"""master.api.proxy between real servers on loopback: a stand-in for a task's server (echo,
slow streams, redirects, cookies, a WebSocket echo) under uvicorn, and a front app that
forwards /proxy/... to it as the master's route does; clients are httpx and websockets."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin, Subprotocol

from master.api import proxy as proxy_module
from master.api.proxy import ProxyPool, Upstream

SECRET_HEADER = {"Authorization": "token s3cret", "X-Task-Secret": "also-added"}
LOGIN_COOKIE = "resolute_proxy_session"
JUPYTER_SUBPROTOCOL = Subprotocol("v1.kernel.websocket.jupyter.org")
WAIT_S = 10.0  # generous: a loaded 2-core machine
CONNECT_TIMEOUT_S = 1.0  # the front pool's TCP connect limit
SLOW_HANDSHAKE_S = 1.5  # a WebSocket upstream that answers its handshake after that


@dataclass
class UpstreamState:
    """What the task's server saw, written on its loop and read by the tests."""

    releases: dict[str, asyncio.Event] = field(default_factory=dict)
    streams_ended: dict[str, str] = field(default_factory=dict)
    ws_closed: list[tuple[int, str]] = field(default_factory=list)
    uploads_abandoned: int = 0


def task_server(state: UpstreamState) -> FastAPI:
    app = FastAPI()

    def release(stream_id: str) -> asyncio.Event:
        return state.releases.setdefault(stream_id, asyncio.Event())

    @app.api_route("/proxy/t/echo/{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "DELETE"])
    async def echo(request: Request) -> JSONResponse:
        digest, length = hashlib.sha256(), 0
        try:
            async for chunk in request.stream():
                digest.update(chunk)
                length += len(chunk)
        except ClientDisconnect:
            state.uploads_abandoned += 1
            return JSONResponse({}, status_code=400)
        return JSONResponse(
            {
                "method": request.method,
                "raw_path": request.scope["raw_path"].decode(),
                "query": request.url.query,
                "headers": request.headers.items(),
                "length": length,
                "sha256": digest.hexdigest(),
            }
        )

    @app.get("/proxy/t/stream")
    async def stream(id: str) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            outcome = "abandoned"
            try:
                yield b"first\n"
                # Held until the test has read the first chunk through the proxy.
                await asyncio.wait_for(release(id).wait(), WAIT_S)
                yield b"second\n"
                outcome = "completed"
            finally:
                state.streams_ended[id] = outcome

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/proxy/t/release")
    async def do_release(id: str) -> dict[str, bool]:
        release(id).set()
        return {"released": True}

    @app.get("/proxy/t/broken")
    async def broken() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"a start\n"
            raise RuntimeError("the task's server failed mid-body (expected in this test)")

        return StreamingResponse(chunks())  # chunked: only a dropped connection tells

    @app.get("/proxy/t/redirect")
    async def redirect(request: Request) -> RedirectResponse:
        # Absolute, to the server's own origin, as Jupyter and TensorBoard may write them.
        own = request.url.replace(path="/proxy/t/landing", query="x=1")
        return RedirectResponse(str(own), status_code=302)

    @app.get("/proxy/t/away")
    async def away() -> RedirectResponse:
        return RedirectResponse("https://example.com/elsewhere", status_code=302)

    @app.get("/proxy/t/cookie")
    async def cookie() -> Response:
        response = Response("ok")
        response.set_cookie("_xsrf", "2|abc", path="/proxy/t/")
        response.set_cookie("username-t", "x", httponly=True)
        return response

    @app.get("/proxy/t/gzip")
    async def gzipped() -> Response:
        body = gzip.compress(b"compressed " * 1000)
        return Response(body, headers={"Content-Encoding": "gzip"}, media_type="text/plain")

    @app.websocket("/proxy/t/ws-elsewhere")
    async def ws_elsewhere(websocket: WebSocket) -> None:
        # Another origin, where nothing listens: the proxy must not even try it.
        elsewhere = RedirectResponse("ws://127.0.0.2:9/proxy/t/ws", status_code=307)
        await websocket.send_denial_response(elsewhere)

    @app.websocket("/proxy/t/ws-slow")
    async def ws_slow(websocket: WebSocket) -> None:
        # As Jupyter's kernel channels: no handshake answer until the kernel has started.
        await asyncio.sleep(SLOW_HANDSHAKE_S)
        await websocket.accept()
        await websocket.send_text("kernel ready")
        await websocket.close()

    @app.websocket("/proxy/t/ws")
    async def ws(websocket: WebSocket) -> None:
        offered = websocket.scope.get("subprotocols", [])
        chosen = JUPYTER_SUBPROTOCOL if JUPYTER_SUBPROTOCOL in offered else None
        await websocket.accept(subprotocol=chosen)
        seen = {
            k: websocket.headers.get(k)
            for k in ("authorization", "x-task-secret", "cookie", "origin", "x-custom")
        }
        await websocket.send_json({"subprotocol": chosen, "headers": seen})
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                state.ws_closed.append((message["code"], message.get("reason") or ""))
                return
            if message.get("text") == "close-me":
                await websocket.close(4001, "bye from upstream")
                return
            if message.get("bytes") is not None:
                await websocket.send_bytes(message["bytes"])
            else:
                await websocket.send_text(message["text"])

    return app


@dataclass
class Activity:
    count: int = 0

    def touch(self) -> None:
        self.count += 1


def front_app(upstreams: dict[str, Upstream], activity: Activity, middleware: bool) -> FastAPI:
    """The master's side: a route that hands each request to the ProxyPool."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pool = ProxyPool(
            strip_cookies=frozenset({LOGIN_COOKIE}), connect_timeout_s=CONNECT_TIMEOUT_S
        )
        yield
        await app.state.pool.aclose()

    app = FastAPI(lifespan=lifespan)

    if middleware:
        # As master/app.py has one: streams and disconnects must pass through it.
        @app.middleware("http")
        async def passthrough(request: Request, call_next: Any) -> Response:
            response: Response = await call_next(request)
            return response

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

    @app.api_route("/proxy/{task}/{rest:path}", methods=methods)
    async def proxy_http(task: str, request: Request) -> Response:
        pool: ProxyPool = request.app.state.pool
        return await pool.forward_http(request, upstreams[task], activity.touch)

    @app.websocket("/proxy/{task}/{rest:path}")
    async def proxy_ws(task: str, websocket: WebSocket) -> None:
        pool: ProxyPool = websocket.app.state.pool
        await pool.forward_websocket(websocket, upstreams[task], activity.touch)

    @app.get("/tasks-in-the-proxy")
    async def tasks_in_the_proxy() -> int:
        """Tasks running code of master/api/proxy.py, which must end with their client."""
        return sum(
            1
            for task in asyncio.all_tasks()
            if (code := getattr(task.get_coro(), "cr_code", None))
            and code.co_filename == proxy_module.__file__
        )

    return app


def _bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """uvicorn in a thread of its own, on a socket bound here (no free-port race)."""
    sock = _bound_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


@dataclass
class Rig:
    front: str  # host:port of the front app
    front_with_middleware: str  # the same app behind a BaseHTTPMiddleware
    upstream: str  # host:port of the task's server
    dead: str  # host:port where nothing listens
    state: UpstreamState
    activity: Activity


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    state, activity = UpstreamState(), Activity()
    # Bound but never listening: connecting is refused at once.
    with _bound_socket() as dead_sock, serving(task_server(state)) as upstream:
        dead = f"127.0.0.1:{dead_sock.getsockname()[1]}"
        upstreams = {
            "t": Upstream(f"http://{upstream}", dict(SECRET_HEADER)),
            "dead": Upstream(f"http://{dead}", dict(SECRET_HEADER)),
        }
        with (
            serving(front_app(upstreams, activity, middleware=False)) as front,
            serving(front_app(upstreams, activity, middleware=True)) as front_with_middleware,
        ):
            yield Rig(front, front_with_middleware, upstream, dead, state, activity)


def http_client(front: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://{front}", trust_env=False, timeout=WAIT_S)


@pytest.fixture
async def client(rig: Rig) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(rig.front) as http:
        yield http


@pytest.fixture(params=["plain", "behind-middleware"])
async def any_client(rig: Rig, request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    front = rig.front if request.param == "plain" else rig.front_with_middleware
    async with http_client(front) as http:
        yield http


async def eventually(check: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


# -- HTTP ------------------------------------------------------------------------------------


async def test_method_path_query_and_body_arrive_unchanged(client: httpx.AsyncClient) -> None:
    reply = await client.put(
        "/proxy/t/echo/api/contents/a%2Fb/c%20d?x=1&y=%20two&y=3", content=b"the body"
    )
    assert reply.status_code == 200
    seen = reply.json()
    assert seen["method"] == "PUT"
    assert seen["raw_path"] == "/proxy/t/echo/api/contents/a%2Fb/c%20d"
    assert seen["query"] == "x=1&y=%20two&y=3"
    assert seen["length"] == len(b"the body")
    reply = await client.delete("/proxy/t/echo/x")
    assert (reply.json()["method"], reply.json()["length"]) == ("DELETE", 0)


async def test_credentials_for_the_master_stay_behind(client: httpx.AsyncClient, rig: Rig) -> None:
    reply = await client.get(
        "/proxy/t/echo/h",
        headers={
            "Authorization": "Bearer the-users-master-token",
            "Cookie": f"_xsrf=2|abc; {LOGIN_COOKIE}=signed-in; theme=dark",
            "X-Custom": "kept",
            "X-Forwarded-Proto": "spoofed",
        },
    )
    pairs = [tuple(pair) for pair in reply.json()["headers"]]
    headers = dict(pairs)
    assert [v for k, v in pairs if k == "authorization"] == ["token s3cret"]
    assert headers["x-task-secret"] == "also-added"
    assert headers["cookie"] == "_xsrf=2|abc; theme=dark"
    assert headers["x-custom"] == "kept"
    assert headers["host"] == rig.upstream
    assert headers["x-forwarded-for"] == "127.0.0.1"
    assert headers["x-forwarded-host"] == rig.front
    assert headers["x-forwarded-proto"] == "http"
    assert "signed-in" not in json.dumps(pairs)


async def test_a_5_mb_post_arrives_intact_and_a_chunked_one_too(client: httpx.AsyncClient) -> None:
    payload = os.urandom(5 * 2**20)
    reply = await client.post("/proxy/t/echo/upload", content=payload)
    assert reply.json()["length"] == len(payload)
    assert reply.json()["sha256"] == hashlib.sha256(payload).hexdigest()

    async def pieces() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * 100_000

    reply = await client.post("/proxy/t/echo/chunked", content=pieces())
    assert reply.json()["length"] == 400_000


async def test_a_stream_arrives_in_pieces_before_the_upstream_finished(
    any_client: httpx.AsyncClient, rig: Rig
) -> None:
    stream_id = f"piecewise-{any_client.base_url.port}"
    async with any_client.stream("GET", "/proxy/t/stream", params={"id": stream_id}) as reply:
        pieces = reply.aiter_raw()
        # The upstream is held at its first chunk until we release it, below.
        assert await anext(pieces) == b"first\n"
        assert stream_id not in rig.state.streams_ended
        await any_client.get("/proxy/t/release", params={"id": stream_id})
        assert b"".join([piece async for piece in pieces]) == b"second\n"
    assert rig.state.streams_ended[stream_id] == "completed"


async def test_a_client_leaving_mid_stream_closes_the_upstream_stream(
    any_client: httpx.AsyncClient, rig: Rig
) -> None:
    stream_id = f"left-{any_client.base_url.port}"
    async with any_client.stream("GET", "/proxy/t/stream", params={"id": stream_id}) as reply:
        assert await anext(reply.aiter_raw()) == b"first\n"
    # The upstream never sends again; only the proxy noticing the client can end it.
    await eventually(lambda: rig.state.streams_ended.get(stream_id) == "abandoned")


async def test_a_client_leaving_mid_upload_ends_the_upstream_upload(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    host, port = rig.front.split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /proxy/t/echo/upload HTTP/1.1\r\nHost: front\r\nContent-Length: 1000000\r\n\r\n"
    )
    writer.write(b"x" * 100_000)
    await writer.drain()
    await asyncio.sleep(0.2)  # the proxy has started the upstream request
    writer.close()
    await eventually(lambda: rig.state.uploads_abandoned == 1)
    assert (await client.get("/proxy/t/echo/still-fine")).status_code == 200


async def test_an_upstream_failing_mid_body_is_not_passed_off_as_complete(
    client: httpx.AsyncClient,
) -> None:
    # Not behind a BaseHTTPMiddleware: that ends the chunked body cleanly whatever the
    # app raised (Starlette's _StreamingResponse), so the client sees a complete reply.
    with pytest.raises(httpx.RemoteProtocolError):
        await client.get("/proxy/t/broken")
    assert (await client.get("/proxy/t/echo/after")).status_code == 200


async def test_head_gzip_redirects_and_cookies(client: httpx.AsyncClient) -> None:
    reply = await client.head("/proxy/t/echo/head")
    assert (reply.status_code, reply.content) == (200, b"")

    reply = await client.get("/proxy/t/gzip")
    assert reply.headers["content-encoding"] == "gzip"  # passed through, not decoded twice
    assert reply.content == b"compressed " * 1000
    assert len(reply.headers.get_list("date")) == len(reply.headers.get_list("server")) == 1

    reply = await client.get("/proxy/t/redirect")
    assert (reply.status_code, reply.headers["location"]) == (302, "/proxy/t/landing?x=1")
    reply = await client.get("/proxy/t/away")
    assert reply.headers["location"] == "https://example.com/elsewhere"

    reply = await client.get("/proxy/t/cookie")
    cookies = reply.headers.get_list("set-cookie")
    assert len(cookies) == 2
    assert cookies[0].startswith("_xsrf=") and "Path=/proxy/t/" in cookies[0]
    assert cookies[1].startswith("username-t=x") and "HttpOnly" in cookies[1]


async def test_an_unreachable_upstream_is_a_502_naming_it(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    reply = await client.post("/proxy/dead/api/x", content=b"lost")
    assert reply.status_code == 502
    message = reply.json()["message"]
    assert message.endswith(f"at {rig.dead} did not answer: connection refused"), message
    assert (await client.get("/proxy/t/echo/still-fine")).status_code == 200


async def test_every_request_counts_as_activity(client: httpx.AsyncClient, rig: Rig) -> None:
    before = rig.activity.count
    for _ in range(3):
        await client.get("/proxy/t/echo/a")
    assert rig.activity.count == before + 3


# -- WebSockets ------------------------------------------------------------------------------


def ws_url(rig: Rig, task: str = "t", path: str = "ws") -> str:
    return f"ws://{rig.front}/proxy/{task}/{path}"


async def test_websocket_frames_keep_their_type_and_the_handshake_its_details(rig: Rig) -> None:
    async with connect(
        ws_url(rig),
        subprotocols=[JUPYTER_SUBPROTOCOL, Subprotocol("other")],
        additional_headers={
            "Authorization": "Bearer the-users-master-token",
            "Cookie": f"{LOGIN_COOKIE}=signed-in; _xsrf=2|abc",
            "X-Custom": "kept",
        },
        origin=Origin(f"http://{rig.front}"),
        max_size=None,
        proxy=None,
    ) as ws:
        assert ws.subprotocol == JUPYTER_SUBPROTOCOL
        hello = json.loads(await ws.recv())
        assert hello["subprotocol"] == JUPYTER_SUBPROTOCOL
        assert hello["headers"] == {
            "authorization": "token s3cret",
            "x-task-secret": "also-added",
            "cookie": "_xsrf=2|abc",
            "origin": f"http://{rig.front}",
            "x-custom": "kept",
        }
        await ws.send("text stays text")
        assert await ws.recv() == "text stays text"
        await ws.send(b"\x00binary\xff")
        assert await ws.recv() == b"\x00binary\xff"
        big = os.urandom(4 * 2**20)
        await ws.send(big)
        assert await ws.recv() == big


async def test_the_upstreams_close_code_and_reason_reach_the_client(rig: Rig) -> None:
    async with connect(ws_url(rig), proxy=None) as ws:
        await ws.recv()
        await ws.send("close-me")
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert (ws.close_code, ws.close_reason) == (4001, "bye from upstream")


async def test_the_clients_close_code_and_reason_reach_the_upstream(rig: Rig) -> None:
    async with connect(ws_url(rig), proxy=None) as ws:
        await ws.recv()
        await ws.close(4002, "client bye")
    await eventually(lambda: (4002, "client bye") in rig.state.ws_closed)


async def test_an_unreachable_or_refusing_upstream_closes_the_websocket_with_1011(
    rig: Rig,
) -> None:
    # Offered a subprotocol, as JupyterLab does: the refusal must still reach the client.
    async with connect(ws_url(rig, "dead"), subprotocols=[JUPYTER_SUBPROTOCOL], proxy=None) as ws:
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1011
    assert (ws.close_reason or "").endswith(f"at {rig.dead} did not answer: connection refused")

    # The task's server has no WebSocket here and refuses the handshake itself.
    async with connect(ws_url(rig, "t", "nowhere"), proxy=None) as ws:
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1011
    assert (ws.close_reason or "").endswith(f"at {rig.upstream} refused the WebSocket: HTTP 403")

    async with connect(ws_url(rig, "t", "ws-elsewhere"), proxy=None) as ws:
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1011
    assert (ws.close_reason or "").endswith(
        f"at {rig.upstream} redirected the WebSocket, which the proxy never follows: "
        "ws://127.0.0.2:9/proxy/t/ws"
    )


async def test_a_handshake_slower_than_the_connect_timeout_still_opens(rig: Rig) -> None:
    # A notebook's kernel WebSocket on a busy agent: connected at once, answered later.
    assert SLOW_HANDSHAKE_S > CONNECT_TIMEOUT_S
    async with connect(ws_url(rig, "t", "ws-slow"), proxy=None, open_timeout=WAIT_S) as ws:
        assert await ws.recv() == "kernel ready"


async def test_activity_is_counted_at_most_about_once_a_second(rig: Rig) -> None:
    rig.activity.count = 0
    started = time.monotonic()
    async with connect(ws_url(rig), proxy=None) as ws:
        await ws.recv()
        for i in range(200):
            await ws.send(f"burst {i}")
        for i in range(200):
            assert await ws.recv() == f"burst {i}"
    elapsed = time.monotonic() - started
    assert 1 <= rig.activity.count <= 2 + elapsed, (rig.activity.count, elapsed)


async def test_nothing_is_left_running_in_the_proxy(rig: Rig) -> None:
    """After every test above: streams, uploads and WebSockets all ended with their
    clients, so no relay is left behind, on either front."""
    for front in (rig.front, rig.front_with_middleware):
        async with http_client(front) as http:
            deadline = time.monotonic() + WAIT_S
            while (running := (await http.get("/tasks-in-the-proxy")).json()) != 0:
                assert time.monotonic() < deadline, f"{running} tasks left in the proxy"
                await asyncio.sleep(0.05)
