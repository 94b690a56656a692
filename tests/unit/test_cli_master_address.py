"""Where our `det` looks for the master: every bad address is one clear line, no traceback."""

from __future__ import annotations

import pytest

from cli.client import canonical_master_url
from cli.errors import CliError


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("localhost", "http://localhost:8080"),
        ("10.0.0.5:9000", "http://10.0.0.5:9000"),
        ("https://master.example", "https://master.example:8080"),
        ("[::1]:9", "http://[::1]:9"),
    ],
)
def test_addresses_are_made_canonical(given: str, url: str) -> None:
    assert canonical_master_url(given) == url


@pytest.mark.parametrize("given", ["http://[::1", "ftp://x", "http://", "localhost:99999"])
def test_bad_addresses_are_a_cli_error(given: str) -> None:
    with pytest.raises(CliError, match="master address"):
        canonical_master_url(given)


def test_several_masters_are_tried_in_the_order_given() -> None:
    from cli.client import master_urls

    assert master_urls("a:8080, b:9090,") == ["http://a:8080", "http://b:9090"]


def test_a_plain_http_master_redirecting_to_https_is_refused_not_followed_unverified() -> None:
    """Plain-http masters are reached without loading a CA bundle, so a redirect to https
    must stop with a clear line instead of being followed with no certificate check."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from cli.client import MasterClient

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", "https://127.0.0.1:9/api/v1/master?x=1")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = MasterClient(f"127.0.0.1:{server.server_port}", None, timeout=5)
        with pytest.raises(CliError) as refused:
            client.get("/api/v1/master", auth=False)
        assert str(refused.value) == (
            "the master sent this command on to https://127.0.0.1:9/api/v1/master, but the "
            "masters named (-m, DET_MASTER) are plain http: name the https address instead"
        )
        client.close()
    finally:
        server.shutdown()
        server.server_close()
