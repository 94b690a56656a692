"""A small HTTP client for the master: finds it, logs in, turns error replies into CliError."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from master.core.credentials import client_side_hash

DEFAULT_MASTER = "localhost:8080"


class CliError(Exception):
    """One line for stderr; the command exits 1."""


def master_urls(master: str | None) -> list[str]:
    """Like Determined's client: -m, else DET_MASTER, else DET_MASTER_ADDR, else
    localhost:8080; several, comma-separated, for a leader and its standbys."""
    raw = (
        master
        or os.environ.get("DET_MASTER")
        or os.environ.get("DET_MASTER_ADDR")
        or DEFAULT_MASTER
    )
    return [canonical_master_url(part.strip()) for part in raw.split(",") if part.strip()]


def canonical_master_url(master: str | None) -> str:
    raw = (
        master
        or os.environ.get("DET_MASTER")
        or os.environ.get("DET_MASTER_ADDR")
        or DEFAULT_MASTER
    )
    if "://" not in raw:
        raw = "http://" + raw
    try:
        parts = urlsplit(raw)
        hostname = parts.hostname if parts.scheme in ("http", "https") else None
    except ValueError:  # e.g. an unclosed IPv6 bracket
        hostname = None
    if not hostname:
        raise CliError(f"invalid master address {raw!r}; use HOST[:PORT] or http://HOST:PORT")
    try:
        port = parts.port or 8080
    except ValueError:
        raise CliError(f"invalid port in master address {raw!r}") from None
    host = f"[{hostname}]" if ":" in hostname else hostname
    return f"{parts.scheme}://{host}:{port}"


class MasterClient:
    def __init__(self, master: str | None, user: str | None, timeout: float = 60.0) -> None:
        self.base_urls = master_urls(master) or [canonical_master_url(DEFAULT_MASTER)]
        self.base_url = self.base_urls[0]
        self.user = user or os.environ.get("DET_USER") or "determined"
        # A standby master answers writes with 307 to the leader (same method and body).
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, follow_redirects=True)
        self._token: str | None = None

    def close(self) -> None:
        self._http.close()

    def _login(self) -> str:
        env_token = os.environ.get("DET_USER_TOKEN")
        if env_token and self.user == (os.environ.get("DET_USER") or self.user):
            return env_token
        password = os.environ.get("DET_PASS", "")
        reply = self._send(
            "POST",
            "/api/v1/auth/login",
            json={"username": self.user, "password": client_side_hash(password), "isHashed": True},
            auth=False,
        )
        token: str = reply["token"]
        return token

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self._send("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self._send("POST", path, **kwargs)

    def get_all(
        self, path: str, key: str, params: dict[str, Any] | None = None, limit: int = 500
    ) -> list[Any]:
        """Every item of a paginated list, page by page, as Determined's client reads them."""
        query = {**(params or {}), "offset": 0, "limit": limit}
        items: list[Any] = []
        while True:
            page = self.get(path, params=query)
            items.extend(page[key])
            pagination = page.get("pagination") or {}
            end, total = pagination.get("endIndex", 0), pagination.get("total", 0)
            # A page that adds nothing ends the walk too, so a miscounting server cannot loop us.
            if end >= total or not page[key] or end <= query["offset"]:
                return items
            query["offset"] = end

    def _send(self, method: str, path: str, *, auth: bool = True, **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", {}) or {})
        if auth:
            if self._token is None:
                self._token = self._login()
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            reply = self._request_any_master(method, path, headers=headers, **kwargs)
        except httpx.ConnectError:
            where = ", ".join(self.base_urls)
            raise CliError(
                f"cannot reach the master at {where}; is it running? (set -m or DET_MASTER)"
            ) from None
        except httpx.HTTPError as exc:
            raise CliError(f"request to {self.base_url}{path} failed: {exc}") from None
        if reply.status_code != 200:
            raise CliError(_error_message(reply))
        try:
            return reply.json()
        except ValueError:
            raise CliError(f"the master sent a reply that is not JSON for {path}") from None

    def _request_any_master(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The request to the master in use; if it cannot be reached, to the next one given
        (a standby that has taken over), which is then kept."""
        for attempt in range(len(self.base_urls)):
            try:
                return self._http.request(method, path, **kwargs)
            except httpx.ConnectError:
                if attempt == len(self.base_urls) - 1:
                    raise
                index = (self.base_urls.index(self.base_url) + 1) % len(self.base_urls)
                self.base_url = self.base_urls[index]
                self._http.base_url = httpx.URL(self.base_url)
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def stream_body(self, path: str, *, accept: str) -> Iterator[httpx.Response]:
        """A GET whose body is read as it arrives (a checkpoint download)."""
        if self._token is None:
            self._token = self._login()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": accept}
        timeout = httpx.Timeout(60.0, read=600.0)
        try:
            with self._http.stream("GET", path, headers=headers, timeout=timeout) as reply:
                if reply.status_code != 200:
                    reply.read()
                    raise CliError(_error_message(reply))
                yield reply
        except httpx.ConnectError:
            raise CliError(f"cannot reach the master at {self.base_url}") from None
        except httpx.HTTPError as exc:
            raise CliError(f"download from {self.base_url}{path} failed: {exc}") from None


def _error_message(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message: str = body["message"]
        return message
    return f"HTTP {reply.status_code} from the master: {reply.text[:200]}"
