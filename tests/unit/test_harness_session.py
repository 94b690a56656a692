"""The harness's shared HTTP client per master: tests share it, so it must carry nothing
from one request to the next that a server set (a sign-in cookie above all)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.cluster import MasterProcess


class _SignsIn(BaseHTTPRequestHandler):
    """/login sets a session cookie, as the dashboard's sign-in does; /echo says which
    cookies came with the request."""

    def do_GET(self) -> None:
        body = (self.headers.get("Cookie") or "").encode()
        self.send_response(200)
        if self.path == "/login":
            self.send_header("Set-Cookie", "resolute_session=secret; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SignsIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_cookie_set_through_the_shared_client_goes_with_no_later_request(
    server_url: str, tmp_path: Path
) -> None:
    master = MasterProcess(tmp_path / "data")
    master.url = server_url  # no det-master: only the client is under test
    try:
        assert master.session.get("/login").status_code == 200
        assert master.session.get("/echo").text == ""
        # A test that means to send a cookie still can, request by request.
        sent = master.session.get("/echo", headers={"Cookie": "resolute_session=mine"})
        assert sent.text == "resolute_session=mine"
    finally:
        master.stop()
