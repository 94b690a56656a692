"""A small HTTP client for the master: finds it, logs in, turns error replies into CliError."""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from cli.errors import CliError
from cli.token_store import TokenStore
from master.core.credentials import client_side_hash

DEFAULT_MASTER = "localhost:8080"
CERT_FILE_ENV = "DET_MASTER_CERT_FILE"
CERT_NAME_ENV = "DET_MASTER_CERT_NAME"


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


class TlsTrust:
    """How https masters are verified, as Determined's client does it: DET_MASTER_CERT_FILE
    names a CA bundle trusted beside the system's (`noverify` turns verification off), and
    DET_MASTER_CERT_NAME is the name checked instead of the URL's host."""

    def __init__(self) -> None:
        path = os.environ.get(CERT_FILE_ENV, "")
        self.name = os.environ.get(CERT_NAME_ENV) or None
        self.verify: ssl.SSLContext | bool = True
        self.source = f"the system's trusted CAs (set {CERT_FILE_ENV} to the cluster's CA file)"
        if path.lower() == "noverify":
            self.verify, self.source = False, f"nothing ({CERT_FILE_ENV}=noverify)"
        elif path:
            context = ssl.create_default_context()
            try:
                context.load_verify_locations(cafile=path)
            except ssl.SSLError:  # an OSError too: first
                raise CliError(f"{CERT_FILE_ENV}={path}: no PEM certificate in it") from None
            except OSError as exc:
                raise CliError(f"{CERT_FILE_ENV}={path}: cannot read it: {exc.strerror}") from None
            self.verify, self.source = context, f"{CERT_FILE_ENV}={path}"
        if self.name:
            self.source += f" for the name {self.name!r} ({CERT_NAME_ENV})"

    def name_request(self, request: httpx.Request) -> None:
        # httpcore verifies (and sends as SNI) this name instead of the URL's host.
        request.extensions["sni_hostname"] = self.name

    def problem(self, exc: BaseException) -> str | None:
        """One line if `exc` was a failed TLS handshake, else None."""
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, ssl.SSLCertVerificationError):
                return (
                    f"the master's certificate did not verify against {self.source}: "
                    f"{cause.verify_message}"
                )
            if isinstance(cause, ssl.SSLError):
                return (
                    f"TLS with the master failed ({cause.reason or cause}); does it serve "
                    "https on this port?"
                )
            cause = cause.__cause__ or cause.__context__
        return None


def _refuse_https(request: httpx.Request) -> None:
    if request.url.scheme == "https":
        raise CliError(
            f"the master sent this command on to {request.url.copy_with(query=None)}, but the "
            "masters named (-m, DET_MASTER) are plain http: name the https address instead"
        )


class MasterClient:
    def __init__(self, master: str | None, user: str | None, timeout: float = 60.0) -> None:
        self.base_urls = master_urls(master) or [canonical_master_url(DEFAULT_MASTER)]
        self.base_url = self.base_urls[0]
        # Without -u or DET_USER: the active user of `det user login`, else determined.
        self.requested_user = user or os.environ.get("DET_USER")
        self.user = self.requested_user or "determined"
        # Read only for https masters: a stale DET_MASTER_CERT_FILE must not break plain http.
        https = any(url.startswith("https://") for url in self.base_urls)
        self.tls = TlsTrust() if https else None
        hooks = {"request": [self.tls.name_request]} if self.tls and self.tls.name else {}
        if self.tls is None:
            # Plain-http masters need no CA bundle, whose loading cost every command's start
            # 0.06-0.1 s; so that nothing goes to https unverified, such a redirect stops.
            hooks = {"request": [_refuse_https]}
        # A standby master answers writes with 307 to the leader (same method and body).
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            follow_redirects=True,
            verify=self.tls.verify if self.tls else False,
            event_hooks=hooks,
        )
        self._token: str | None = None
        self._store: TokenStore | None = None
        self._token_from_store = False

    def close(self) -> None:
        self._http.close()

    def _login(self) -> str:
        env_token = os.environ.get("DET_USER_TOKEN")
        if env_token and self.user == (os.environ.get("DET_USER") or self.user):
            return env_token
        store = self.token_store()
        active = store.active_user() if self.requested_user is None else None
        self.user = active or self.user
        stored = store.token(self.user)
        if stored:
            self._token_from_store = True
            return stored
        password = os.environ.get("DET_PASS")
        if password is None and active:
            # The active user's kept login has ended: ask for a new one rather than try an
            # empty password, a failed login that would count towards the rate limit.
            raise CliError(
                f"the login of user {active} on {self.base_url} has ended; "
                f"run `det user login {active}` (or `det user logout` to act as determined)"
            )
        password = password or ""
        reply = self._send(
            "POST",
            "/api/v1/auth/login",
            json={"username": self.user, "password": client_side_hash(password), "isHashed": True},
            auth=False,
        )
        token: str = reply["token"]
        return token

    def session_token(self) -> str:
        """The token requests carry: logs in first if no request has yet."""
        if self._token is None:
            self._token = self._login()
        return self._token

    def token_store(self) -> TokenStore:
        """The tokens `det user login` keeps for this master."""
        if self._store is None:
            self._store = TokenStore(self.base_url)
        return self._store

    def _refusal(self, reply: httpx.Response, auth: bool) -> str:
        message = _error_message(reply)
        if reply.status_code == 401 and auth and self._token_from_store:
            # An expired or revoked stored token is of no more use; the user stays active,
            # so the next command asks for a new login instead of acting as someone else.
            self.token_store().drop(self.user, keep_active=True)
            message = (
                f"{message.removesuffix('; log in again')}: "
                f"run `det user login {self.user}` to log in again"
            )
        return message

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
        except httpx.ConnectError as exc:
            where = ", ".join(self.base_urls)
            raise CliError(
                self._tls_problem(exc)
                or f"cannot reach the master at {where}; is it running? (set -m or DET_MASTER)"
            ) from None
        except httpx.HTTPError as exc:
            hint = ""
            # Plain http to a TLS port ends as a protocol error, or, as seen under load, as a
            # connection reset: either way the likely cause is the scheme.
            plain_to_tls = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError)
            if plain_to_tls and self.base_url.startswith("http:"):
                hint = " (if the master serves https, use https://)"
            raise CliError(f"request to {self.base_url}{path} failed: {exc}{hint}") from None
        if reply.status_code != 200:
            raise CliError(self._refusal(reply, auth))
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
        except httpx.ConnectError as exc:
            raise CliError(
                self._tls_problem(exc) or f"cannot reach the master at {self.base_url}"
            ) from None
        except httpx.HTTPError as exc:
            raise CliError(f"download from {self.base_url}{path} failed: {exc}") from None

    def _tls_problem(self, exc: BaseException) -> str | None:
        return self.tls.problem(exc) if self.tls is not None else None


def _error_message(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message: str = body["message"]
        return message
    return f"HTTP {reply.status_code} from the master: {reply.text[:200]}"
