"""What a trial's `bind_mounts` and `resources.shm_size` mean here: pure parsing and checks.

Agents run trials as processes in a private mount namespace, not containers, so a bind
mount is made inside that namespace and `/dev/shm` there is a tmpfs of its own. These
functions decide what is mounted where and which requests are refused at submit; the
agent does the mounting (agent/bootstrap.py) and the master service checks host paths.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from master.core.errors import ConfigProblem

RUN_DETERMINED = "/run/determined"
WORKDIR = RUN_DETERMINED + "/workdir"

DEFAULT_SHM_BYTES = 64 * 1024**2
"""Docker's /dev/shm when a container asks for size 0 (Determined passes shm_size on to
Docker unchanged, so `shm_size: 0` gave trials 64 MiB)."""

# Docker's units: k, m, g, t, p are powers of 1024, with or without "b"/"ib"; a bare
# number or "b" is bytes. The same pattern Determined's schema checks at submit.
_SIZE = re.compile(r"^(\d+(?:\.\d+)?|\.\d+) ?(?:([kmgtp])(?:i?b)?|b)?$", re.IGNORECASE)
_UNIT_POWER = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}

PROPAGATIONS = ("rprivate", "private", "rshared", "shared", "rslave", "slave")
PRIVATE_PROPAGATIONS = ("rprivate", "private")


MAX_SHM_BYTES = 2**63 - 1


def parse_memory_size(value: int | str) -> int:
    """Bytes for `shm_size`: an integer of bytes, or a size such as "4G", "512 MiB", "1.5g".
    Raises ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError('must be a number of bytes or a size such as "4G"')
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return _at_most_int64(value)
    match = _SIZE.match(value.strip())
    if match is None:
        raise ValueError(f'{value!r} is not a size such as 4294967296, "4G" or "512 MiB"')
    number, unit = match.groups()
    power = _UNIT_POWER[unit.lower()] if unit else 0
    return _at_most_int64(int(float(number) * 1024**power))


def _at_most_int64(size: int) -> int:
    # The agent protocol carries it as an int64; no host has that much memory anyway.
    if size > MAX_SHM_BYTES:
        raise ValueError(f"{size} bytes is more than the largest size, {MAX_SHM_BYTES}")
    return size


def shm_bytes(value: int | str | None) -> int:
    """The size of the trial's private /dev/shm; 0 means none (the host's /dev/shm)."""
    if value is None:
        return 0
    size = parse_memory_size(value)
    return size if size > 0 else DEFAULT_SHM_BYTES


# Directories of the host's system: a mount over them (or inside them) could put a file the
# user wrote where root's programs read their configuration, and the agent would create
# missing mount points there.
SYSTEM_DIRS: tuple[str, ...] = ("/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
SYSTEM_DIRS += ("/libx32", "/boot", "/root", "/sys", "/run")


def container_target(container_path: str, workdir: str) -> str:
    """Where a bind mount lands, as the kernel resolves it: an absolute container_path with
    its slashes collapsed (normpath keeps a leading `//`, the kernel does not) and /var/run
    read as /run (a link to it on the hosts agents run on); a relative one under the trial's
    working directory, as Determined joins it with the container's."""
    if not container_path.startswith("/"):
        return posixpath.normpath(posixpath.join(workdir, container_path))
    path = posixpath.normpath("/" + container_path.lstrip("/"))
    if _is_within(path, "/var/run"):
        path = "/run" + path[len("/var/run") :]
    return path


@dataclass(frozen=True)
class MountRequest:
    host_path: str
    container_path: str
    read_only: bool


def requested_mounts(config: Mapping[str, Any]) -> list[MountRequest]:
    """The stored (validated) config's bind_mounts, in order."""
    return [
        MountRequest(str(m["host_path"]), str(m["container_path"]), bool(m.get("read_only")))
        for m in config.get("bind_mounts") or []
        if isinstance(m, Mapping)
    ]


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def mount_problems(
    bind_mounts: Sequence[MountRequest],
    own_files: Iterable[str],
    *,
    shared_fs: bool,
) -> list[ConfigProblem]:
    """Mounts that would cover what the trial itself needs: the file system root,
    /run/determined (Determined's bootstrap: info files, the model's clean copy), the
    model definition's files in the working directory, /determined_shared_fs when
    checkpoints go there, or /dev/shm and /tmp, which the trial gets privately. `own_files`:
    the model definition's paths, relative."""
    own = {posixpath.normpath(path) for path in own_files}
    problems: list[ConfigProblem] = []
    for index, mount in enumerate(bind_mounts):
        where = f"bind_mounts.{index}.container_path"
        relative = not mount.container_path.startswith("/")
        target = container_target(mount.container_path, WORKDIR)
        if relative and not _is_within(target, WORKDIR):
            problems.append(
                ConfigProblem(where, f"{mount.container_path!r} leaves the working directory")
            )
        elif relative and target == WORKDIR:
            problems.append(
                ConfigProblem(
                    where,
                    f"{mount.container_path!r} is the working directory itself, which holds "
                    "the model definition; mount into a directory below it",
                )
            )
        elif target == "/":
            problems.append(ConfigProblem(where, "cannot mount over the file system root"))
        elif relative:
            inside = posixpath.relpath(target, WORKDIR)
            covered = sorted(p for p in own if _is_within(p, inside) or _is_within(inside, p))
            if covered:
                problems.append(
                    ConfigProblem(
                        where,
                        f"{mount.container_path!r} would cover the model definition's own "
                        f"{covered[0]!r}; mount it at a path the model definition does not use",
                    )
                )
        elif _is_within(target, RUN_DETERMINED) or _is_within(RUN_DETERMINED, target):
            problems.append(
                ConfigProblem(
                    where,
                    f"{target} would cover {RUN_DETERMINED}, where the trial's bootstrap files "
                    "and working directory are; use a relative path to mount into the "
                    "working directory",
                )
            )
        elif shared_fs and (_is_within(target, "/determined_shared_fs")):
            problems.append(
                ConfigProblem(
                    where,
                    f"{target} would cover /determined_shared_fs, where this experiment's "
                    "shared_fs checkpoint storage is mounted",
                )
            )
        elif target in ("/tmp", "/dev/shm", "/dev", "/proc"):
            problems.append(
                ConfigProblem(where, f"{target} is the trial's own; mount below it or elsewhere")
            )
        elif any(_is_within(target, system) for system in SYSTEM_DIRS):
            system = next(d for d in SYSTEM_DIRS if _is_within(target, d))
            problems.append(
                ConfigProblem(
                    where,
                    f"{target} is in the host's {system}, which trials may not mount over; "
                    "mount data elsewhere (for example under /mnt, /data or the working "
                    "directory)",
                )
            )
    return problems
