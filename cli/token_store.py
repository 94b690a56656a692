"""Tokens kept by `det user login` and `det token login`, per master and user, with the
active user: `$XDG_CONFIG_HOME/resolute/auth.json` (else `~/.config/...`), owner-only.

Like Determined's token store, but a file of our own: its format is not Determined's, so
the two clients never read each other's tokens.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cli.errors import CliError

FILE_NAME = "auth.json"


def store_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "resolute" / FILE_NAME


class TokenStore:
    """`{"masters": {URL: {"active": USER|null, "tokens": {USER: TOKEN}}}}`. Every change
    is a locked read-modify-write, then an atomic replace of a 0600 file."""

    def __init__(self, master_url: str, path: Path | None = None) -> None:
        self.master_url = master_url
        self.path = path or store_path()

    # -- reading ---------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"masters": {}}
        except OSError as exc:
            raise CliError(f"cannot read the token store {self.path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("masters"), dict):
            raise CliError(
                f"the token store {self.path} is not one this client wrote; "
                "remove it and log in again"
            )
        return data

    def _entry(self, data: dict[str, Any]) -> dict[str, Any]:
        entry = data["masters"].get(self.master_url)
        if not isinstance(entry, dict):
            entry = {}
        tokens = entry.get("tokens")
        return {
            "active": entry.get("active") if isinstance(entry.get("active"), str) else None,
            "tokens": {k: v for k, v in (tokens or {}).items() if isinstance(v, str)}
            if isinstance(tokens, dict)
            else {},
        }

    def active_user(self) -> str | None:
        active: str | None = self._entry(self._read())["active"]
        return active

    def token(self, user: str) -> str | None:
        token: str | None = self._entry(self._read())["tokens"].get(user)
        return token

    # -- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _change(self) -> Iterator[dict[str, Any]]:
        """The entry of this master, written back when the block ends without an error."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock = self.path.with_name(f".{FILE_NAME}.lock")
            lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CliError(f"cannot write the token store {self.path}: {exc.strerror}") from None
        try:
            # Two `det` at once (a login beside a logout) must not lose each other's change.
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            data = self._read()
            entry = self._entry(data)
            yield entry
            if entry["tokens"] or entry["active"]:
                data["masters"][self.master_url] = entry
            else:
                data["masters"].pop(self.master_url, None)
            self._write(data)
        finally:
            os.close(lock_fd)

    def _write(self, data: dict[str, Any]) -> None:
        temporary = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        try:
            # 0600 from creation: a token is as good as the password that made it.
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise CliError(f"cannot write the token store {self.path}: {exc.strerror}") from None

    def set_token(self, user: str, token: str, *, activate: bool = True) -> None:
        with self._change() as entry:
            entry["tokens"][user] = token
            if activate:
                entry["active"] = user

    def drop(self, user: str, *, keep_active: bool = False) -> bool:
        """Forget `user`'s token (and, unless told, that it is active); whether there was one."""
        with self._change() as entry:
            had = entry["tokens"].pop(user, None) is not None
            if entry["active"] == user and not keep_active:
                entry["active"] = None
        return had

    def users(self) -> list[str]:
        return sorted(self._entry(self._read())["tokens"])
