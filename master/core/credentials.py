"""The password pre-hash of Determined's login protocol, shared by the master and our CLI,
and the secrets the master hands out."""

from __future__ import annotations

import hashlib
import secrets

CLIENT_SALT = "GubPEmmotfiK9TMD6Zdw"  # fixed by Determined's client; part of the wire protocol


def client_side_hash(password: str) -> str:
    """What Determined's client sends for `password`; the empty password is sent as is."""
    if password == "":
        return ""
    return hashlib.sha512((CLIENT_SALT + password).encode()).hexdigest()


def new_token() -> str:
    """A bearer secret (256 random bits, URL-safe) that never starts with "-": one in 64
    drawn by `token_urlsafe` does, and a command line then reads it as an option
    (`det token login -abc...` fails in Determined's client, as `--join-token -abc` would)."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token
