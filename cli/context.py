"""Packs a model or context directory into Determined's v1File list, refusing anything unsafe."""

from __future__ import annotations

import base64
import fnmatch
import os
import stat
from pathlib import Path
from typing import Any

from cli.errors import CliError

FILE_TYPE = 48
DIR_TYPE = 53
DEFAULT_LIMIT_BYTES = 96 * 2**20
# Skipped like Determined's client does, plus whatever .detignore lists.
DEFAULT_IGNORES = ("__pycache__/", "*.pyc", "*.pyo", ".git/", ".detignore", ".idea/", ".vscode/")


def _ignore_patterns(root: Path) -> list[str]:
    patterns = list(DEFAULT_IGNORES)
    detignore = root / ".detignore"
    if detignore.is_file():
        for line in detignore.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                patterns.append(line)
    return patterns


def _ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        pat = pattern.rstrip("/").lstrip("/")
        if dir_only and not is_dir:
            continue
        if fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(name, pat):
            return True
    return False


def read_model_dir(
    path: Path, limit_bytes: int = DEFAULT_LIMIT_BYTES, what: str = "model directory"
) -> list[dict[str, Any]]:
    """`what`: how errors name the directory ("model directory", "context directory")."""
    if not path.exists():
        raise CliError(f"{what} {path} does not exist")
    if not path.is_dir():
        raise CliError(f"{what} {path} must be a directory")
    root = path.resolve()
    patterns = _ignore_patterns(root)
    found: list[tuple[Path, dict[str, Any]]] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in sorted(dirnames + filenames):
            full = here / name
            rel = full.relative_to(root).as_posix()
            is_dir = full.is_dir() and not full.is_symlink()
            if _ignored(rel, is_dir, patterns):
                if name in dirnames:
                    dirnames.remove(name)
                continue
            if full.is_symlink():
                target = full.resolve()
                if not target.is_relative_to(root):
                    raise CliError(f"{rel}: symbolic link points outside the {what}")
                if target.is_dir():
                    raise CliError(f"{rel}: symbolic links to directories are not supported")
            info = full.stat()
            entry: dict[str, Any] = {
                "path": rel,
                "mtime": str(int(info.st_mtime)),
                "mode": info.st_mode,
                "uid": 0,
                "gid": 0,
            }
            if stat.S_ISDIR(info.st_mode):
                entry.update(type=DIR_TYPE, content="")
            elif stat.S_ISREG(info.st_mode):
                total += info.st_size
                entry.update(type=FILE_TYPE)
            else:
                raise CliError(f"{rel}: only regular files and directories can be sent")
            found.append((full, entry))
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
    # Sizes first, contents after: an oversized directory is refused before any is read.
    if total > limit_bytes:
        raise CliError(
            f"{what} {path} holds {total / 2**20:.1f} MiB of files, over the "
            f"{limit_bytes / 2**20:g} MiB limit; list large files in .detignore"
        )
    for full, entry in found:
        if entry["type"] == FILE_TYPE:
            entry["content"] = base64.b64encode(full.read_bytes()).decode()
    return [entry for _, entry in found]
