"""Text a database cannot store: Postgres takes no NUL in text or JSONB, and no lone
surrogate (a JSON body may spell one as "\\ud800") encodes as UTF-8, so input holding
either is refused, naming its field, before anything is written (else a 500)."""

from __future__ import annotations

from typing import Any


def unstorable(text: str) -> bool:
    return "\x00" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def any_unstorable(value: Any) -> bool:
    """Anywhere in a JSON value: its strings, its keys, nested."""
    if isinstance(value, str):
        return unstorable(value)
    if isinstance(value, dict):
        return any(unstorable(str(k)) or any_unstorable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(any_unstorable(v) for v in value)
    return False
