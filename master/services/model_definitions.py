"""Model definitions: the v1File list Determined's client sends, checked and packed as tar.gz.
A command's context directory (`det cmd run -c DIR`, the request's `files`) is packed the same.

Every entry is checked here even though our CLI checks too: the API is public, and an
unsafe path in the archive would later be unpacked on an agent.
"""

from __future__ import annotations

import base64
import binascii
import io
import posixpath
import tarfile
from dataclasses import dataclass
from typing import Any

from master.errors import InvalidArgument, PayloadTooLarge

FILE_TYPE = 48  # ord("0"), a regular file in tar terms
DIR_TYPE = 53  # ord("5")
SYMLINK_TYPE = 50  # ord("2"); content is the link target


@dataclass(frozen=True)
class PackedModelDefinition:
    archive: bytes
    size_bytes: int  # decoded file contents, what the limit applies to
    file_count: int


def safe_relative_path(path: str, where: str) -> str:
    """A normalised relative path, or an error naming `where`."""
    if not isinstance(path, str) or path.strip() == "":
        raise InvalidArgument(f"{where}: path must be a non-empty string")
    if "\x00" in path or "\\" in path:
        raise InvalidArgument(f"{where}: path {path!r} contains a NUL or a backslash")
    if path.startswith("/"):
        raise InvalidArgument(f"{where}: path {path!r} is absolute; paths must be relative")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument(f"{where}: path {path!r} has a '..' component")
    if not parts:
        raise InvalidArgument(f"{where}: path {path!r} names the model directory itself")
    return "/".join(parts)


def pack_model_definition(
    files: Any, limit_bytes: int, field: str = "modelDefinition"
) -> PackedModelDefinition:
    """`field`: the request's key, which every error names."""
    if files is None:
        files = []
    if not isinstance(files, list):
        raise InvalidArgument(f"{field}: must be a list of files")
    seen: set[str] = set()
    links: dict[str, tuple[str, str]] = {}  # path -> (target, where)
    total = 0
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for index, entry in enumerate(files):
            where = f"{field}[{index}]"
            if not isinstance(entry, dict):
                raise InvalidArgument(f"{where}: must be an object")
            path = safe_relative_path(entry.get("path"), where)  # type: ignore[arg-type]
            if path in seen:
                raise InvalidArgument(f"{where}: path {path!r} appears twice")
            seen.add(path)
            kind = entry.get("type", FILE_TYPE)
            content = _decode(entry.get("content") or "", where)
            info = tarfile.TarInfo(path)
            info.mtime = _mtime(entry.get("mtime"), where)
            info.mode = _mode(entry.get("mode"), kind)
            if kind == DIR_TYPE:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == FILE_TYPE:
                total += len(content)
                if total > limit_bytes:
                    continue  # only counted from here on, so that the error names the size
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            elif kind == SYMLINK_TYPE:
                info.type = tarfile.SYMTYPE
                info.linkname = _link_target(path, content, where)
                links[path] = (info.linkname, where)
                tar.addfile(info)
            else:
                raise InvalidArgument(
                    f"{where}: type {kind!r} is not supported; use 48 (file), 53 (directory) "
                    "or 50 (symbolic link)"
                )
    if total > limit_bytes:
        raise PayloadTooLarge(
            f"{field}: the files add up to {total / 2**20:.1f} MiB, over the "
            f"{limit_bytes / 2**20:g} MiB limit (DET_MASTER_MAX_MODEL_DEFINITION_MB)"
        )
    _check_no_path_through_links(seen, links, field)
    return PackedModelDefinition(buffer.getvalue(), total, len(seen))


def _check_no_path_through_links(
    paths: set[str], links: dict[str, tuple[str, str]], field: str
) -> None:
    """A path that goes through a link is resolved by the link, not by its text, so
    `l -> ..` then `x -> l/..` would leave the directory although each looks inside.
    Links to files are fine; nothing may pass *through* a link."""
    if not links:
        return
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in links:
                raise InvalidArgument(
                    f"{field}: {path!r} is inside the link {'/'.join(parts[:i])!r}"
                )
    for path, (target, where) in links.items():
        stack = path.split("/")[:-1]
        components = [c for c in target.split("/") if c not in ("", ".")]
        for n, component in enumerate(components):
            if component == "..":
                stack.pop()  # _link_target already proved this never leaves the root
                continue
            stack.append(component)
            if n < len(components) - 1 and "/".join(stack) in links:
                raise InvalidArgument(
                    f"{where}: link {path!r} points through another link ({'/'.join(stack)!r})"
                )


def _decode(content: Any, where: str) -> bytes:
    if not isinstance(content, str):
        raise InvalidArgument(f"{where}: content must be a base64 string")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"{where}: content is not valid base64") from exc


def _mtime(value: Any, where: str) -> int:
    if value in (None, ""):
        return 0
    try:
        mtime = int(float(value))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"{where}: mtime {value!r} is not a number of seconds") from exc
    return max(mtime, 0)


def _mode(value: Any, kind: Any) -> int:
    default = 0o755 if kind == DIR_TYPE else 0o644
    if not isinstance(value, int) or isinstance(value, bool):
        return default
    # Permission bits only: the archive must never carry setuid or device bits to an agent.
    return (value & 0o777) or default


def _link_target(path: str, content: bytes, where: str) -> str:
    target = content.decode("utf-8", errors="replace")
    if target.startswith("/"):
        raise InvalidArgument(f"{where}: link {path!r} points to an absolute path")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../"):
        raise InvalidArgument(f"{where}: link {path!r} points outside the model directory")
    return target


def read_text_file(archive: bytes, path: str, limit_bytes: int = 4 * 2**20) -> str | None:
    """A regular file's text from a packed model definition (None if absent or larger
    than `limit_bytes`); the launch-layout rule reads the entry script with it."""
    if not archive:
        return None
    wanted = posixpath.normpath(path)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar:
            if posixpath.normpath(member.name) != wanted:
                continue
            if not member.isfile() or member.size > limit_bytes:
                return None
            handle = tar.extractfile(member)
            return handle.read().decode("utf-8", errors="replace") if handle else None
    return None


def archive_paths(archive: bytes) -> list[str]:
    """Every path a packed model definition holds (files, directories, links), relative."""
    if not archive:
        return []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return [posixpath.normpath(name) for name in tar.getnames()]
