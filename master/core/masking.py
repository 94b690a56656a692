"""What of a settings document may be shown: secrets replaced by ********, anywhere in it
(pure: `det master config` shows the master's settings this way)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "********"
# Key names that hold a credential, whatever section they are in.
_SECRET_KEY = re.compile(
    # ^auth$: Docker's AuthConfig `auth`, base64 of username:password (registry_auth).
    r"password|secret|token|access_key|api_key|credential|connection_string|signing_key|^auth$"
)


def masked(value: Any, key: str = "") -> Any:
    """`value` with every secret hidden: values under a secret-looking key, and the
    password inside a URL."""
    if isinstance(value, dict):
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, key) for v in value]
    if value in (None, "") or isinstance(value, bool):
        return value
    if _SECRET_KEY.search(key.lower()):
        return HIDDEN
    if isinstance(value, str) and "://" in value:
        return _url_without_password(value)
    return value


def _url_without_password(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:{HIDDEN}@" if parts.username else f":{HIDDEN}@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))
