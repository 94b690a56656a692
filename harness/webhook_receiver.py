"""A real HTTP receiver for webhook deliveries, on 127.0.0.1 in a thread of its own.

It records what arrives (headers, body, time), and can be told to answer an error status,
to hang longer than the master waits, or to go down (its port closed) and come back up on
the same port.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.cluster import free_port


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    received_at: float

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def event_id(self) -> str:
        return self.headers["X-Determined-AI-Event-Id"]

    def signed_with(self, key: bytes) -> bool:
        """The check a receiver makes: HMAC-SHA256 of "<timestamp>,<body>" in hex."""
        stamp = self.headers["X-Determined-AI-Signature-Timestamp"]
        expected = hmac.new(key, stamp.encode() + b"," + self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, self.headers["X-Determined-AI-Signature"])


class _Server(ThreadingHTTPServer):
    # A listen backlog for the master's concurrent deliveries (http.server's is 5).
    request_queue_size = 256
    daemon_threads = True


class Receiver:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.failures = 0  # requests answered with an error or left hanging
        self.status = 200
        self.hang_s = 0.0
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # Outside the ephemeral range (harness.cluster.free_port): while the receiver is
        # down, an outgoing connection could otherwise take its port and up() would fail.
        self.port = free_port()
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    status, hang_s = receiver.status, receiver.hang_s
                    if status >= 400 or hang_s:
                        receiver.failures += 1
                    else:
                        receiver.deliveries.append(
                            Delivery(dict(self.headers.items()), body, time.monotonic())
                        )
                if hang_s:
                    time.sleep(hang_s)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = _Server(("127.0.0.1", self.port), Handler)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Port closed: connections are refused until up() again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def received(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def close(self) -> None:
        self.down()


def state_change_webhook(name: str, url: str, *states: str) -> dict[str, Any]:
    """A POST /api/v1/webhooks body: a workspace-wide DEFAULT webhook to `url` on each of
    these experiment states."""
    return {
        "name": name,
        "url": url,
        "webhookType": "WEBHOOK_TYPE_DEFAULT",
        "mode": "WEBHOOK_MODE_WORKSPACE",
        "triggers": [
            {
                "triggerType": "TRIGGER_TYPE_EXPERIMENT_STATE_CHANGE",
                "condition": {"state": state},
            }
            for state in states
        ],
    }
