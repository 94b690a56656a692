"""The agent's own credential: the secret the master issued when this agent id first
joined with the cluster's join token. Kept in an owner-only file and shown in every Hello;
once the master holds it, the join token alone no longer admits this id."""

from __future__ import annotations

import os
from pathlib import Path


def load(path: Path) -> str:
    """The stored secret, or "" when the agent has not enrolled yet."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def save(path: Path, secret: str) -> None:
    """Write atomically with mode 0600 from the start, so no reader ever sees it partly
    written or with looser permissions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{secret}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
