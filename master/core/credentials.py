"""The password pre-hash of Determined's login protocol, shared by the master and our CLI."""

from __future__ import annotations

import hashlib

CLIENT_SALT = "GubPEmmotfiK9TMD6Zdw"  # fixed by Determined's client; part of the wire protocol


def client_side_hash(password: str) -> str:
    """What Determined's client sends for `password`; the empty password is sent as is."""
    if password == "":
        return ""
    return hashlib.sha512((CLIENT_SALT + password).encode()).hexdigest()
