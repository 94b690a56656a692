"""Who an agent's ranks run as (setting `rank_user`), as Determined's `agent_user_group`
does for its containers: an unprivileged user cannot read the agent's join token, its
credential, its environment or its /proc, all of which a rank running as root can.

The switch is an exec, not a hook between fork and exec: util-linux `setpriv` sets the
user, its group and the user's supplementary groups (initgroups) and then execs the rank.
So the agent keeps spawning with vfork (runner.py says why a fork with gRPC's threads is
avoided), and Determined's per-agent bootstrap can drop to the user after it has set up its
mounts as root, inside the namespace (bootstrap.wrap).
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SETPRIV = shutil.which("setpriv")
ENV = shutil.which("env") or "/usr/bin/env"


@dataclass(frozen=True)
class RankUser:
    name: str
    uid: int
    gid: int
    # A user of /etc/passwd gets its supplementary groups (initgroups); a uid of
    # rank_uid_range has no passwd entry, so it gets none.
    init_groups: bool = True


# uids below this are system and login users on every distribution.
FIRST_RANK_UID = 1000

# What an agent running as root uses when given neither rank_user nor rank_uid_range: a
# block of DEFAULT_BLOCK uids of this space, the first half of the range systemd's
# UIDS-GIDS.md leaves unused (1879048192-2147483647), clear of login users, systemd's
# dynamic users (61184-65519) and its container ranges. The agent's id picks the block
# (default_uid_range), so agents on several nodes, or on one, rarely hand out the same uid
# at once (a shared_fs store would see their runs as one user); disjoint rank_uid_range
# settings make it certain.
DEFAULT_UID_SPACE = "1879048192-2013265919"
DEFAULT_BLOCK = 1024
# An allocation with a uid of its own runs in its owner's group, this plus the owner's
# user id on the master, the same on every agent: a later run of the same owner reads the
# checkpoints it wrote (RANK_UMASK, then seal_checkpoints); another owner's runs cannot.
OWNER_GID_BASE = 2013265920
# Files a rank with a uid of its own creates: its owner's group may use them, nobody else.
# Group write lets the ranks of one trial on several agents (a uid each, one group) write
# one checkpoint; seal_checkpoints takes it away when the run ends.
RANK_UMASK = 0o007


def parse_uid_range(text: str) -> tuple[int, int]:
    """`START-END` (rank_uid_range) as two ints; ValueError says what is wrong with it."""
    start, sep, end = text.strip().partition("-")
    try:
        first, last = int(start), int(end)
    except ValueError:
        raise ValueError(f"{text!r} is not START-END (two integers, e.g. 61000-61999)") from None
    if not sep or not FIRST_RANK_UID <= first <= last < 2**31:
        raise ValueError(
            f"{text!r}: START-END must satisfy {FIRST_RANK_UID} <= START <= END < 2**31"
        )
    return first, last


def default_uid_range(agent_id: str) -> tuple[int, int]:
    """The block of DEFAULT_UID_SPACE an agent with this id uses by default."""
    low, high = parse_uid_range(DEFAULT_UID_SPACE)
    blocks = (high - low + 1) // DEFAULT_BLOCK
    digest = hashlib.sha256(agent_id.encode()).digest()
    first = low + int.from_bytes(digest[:8], "big") % blocks * DEFAULT_BLOCK
    return first, first + DEFAULT_BLOCK - 1


def range_user(uid: int, gid: int | None = None) -> RankUser:
    """A uid of rank_uid_range as a RankUser: group `gid` (its owner's, owner_group), else
    its own; no passwd entry needed."""
    return RankUser(f"rank-{uid}", uid, uid if gid is None else gid, init_groups=False)


def owner_group(owner_id: int) -> int | None:
    """The gid of the master's user `owner_id` (None: unknown, an older master)."""
    if owner_id <= 0 or OWNER_GID_BASE + owner_id >= 2**31:
        return None
    return OWNER_GID_BASE + owner_id


class UidPool:
    """The uids of rank_uid_range, one per current run of this agent, so one trial's ranks
    cannot read another's run directory, S3 keys or /proc (as a shared rank_user can)."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self._held: dict[str, int] = {}  # allocation id -> its uid

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def take(self, owner: str, gid: int | None = None) -> RankUser:
        """The lowest free uid, now `owner`'s (the same one if asked again), in group
        `gid` (None: the uid's own); RuntimeError when every uid is in use."""
        if owner not in self._held:
            used = set(self._held.values())
            if len(used) > self.last - self.first:
                raise RuntimeError(f"no free uid in rank_uid_range {self} ({len(used)} runs)")
            self._held[owner] = next(u for u in range(self.first, self.last + 1) if u not in used)
        return range_user(self._held[owner], gid)

    def release(self, owner: str) -> None:
        self._held.pop(owner, None)


def lookup(user: str, group: str | None = None) -> RankUser:
    """The user (and group: the user's primary group unless named); LookupError names
    what does not exist."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise LookupError(f"no such user {user!r}") from None
    gid = entry.pw_gid
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise LookupError(f"no such group {group!r}") from None
    return RankUser(entry.pw_name, entry.pw_uid, gid)


def switch_options(rank: RankUser) -> list[str]:
    """setpriv's options that make the process `rank`: real, effective and saved ids, the
    supplementary groups /etc/group gives the user, or none for a uid of rank_uid_range
    (never the agent's), and no privileges gained by exec from then on."""
    groups = "--init-groups" if rank.init_groups else "--clear-groups"
    # --no-new-privs: no setuid program gives a rank back the root it was switched from
    # (a bind mount may put the user's own file where such a program reads its settings).
    return [f"--reuid={rank.uid}", f"--regid={rank.gid}", groups, "--no-new-privs"]


def command(
    argv: Sequence[str],
    *,
    setpriv: str | None,
    die_with_agent: bool = False,
    rank: RankUser | None = None,
) -> list[str]:
    """`argv` run through setpriv: killed when the agent dies (PR_SET_PDEATHSIG, which
    setpriv sets after the switch, so the switch does not clear it) and/or as `rank`."""
    options: list[str] = []
    if die_with_agent:
        options += ["--pdeathsig", "KILL"]
    if rank is not None:
        options += switch_options(rank)
        # setpriv still holds root's capabilities while it looks the command up, so it
        # would run an interpreter under /root that the user cannot reach (and that then
        # half-loads). `env` looks it up again as the user: a rank runs only what its
        # user can run, the way the interpreter checks saw it.
        argv = [ENV, "--", *argv]
    if not options:
        return list(argv)
    if setpriv is None:
        if rank is not None:  # never run a rank as the agent's user by accident
            raise RuntimeError("util-linux's setpriv is not installed: ranks cannot switch user")
        return list(argv)  # no pdeathsig without setpriv; the fence still stops the ranks
    return [setpriv, *options, "--", *argv]


def for_agent(
    rank: RankUser | None,
    *,
    euid: int,
    egid: int,
    setpriv: str | None,
    join_token_file: Path | None = None,
) -> tuple[RankUser | None, list[str]]:
    """Whom this agent switches its ranks to (None: they run as the agent's own user), and
    the warnings to log once at start. ValueError says why the agent must not start."""
    warnings = _token_file_warnings(join_token_file)
    if rank is None:
        who = "root, the agent's user," if euid == 0 else "the agent's own user"
        warnings.append(
            f"ranks run as {who} and can read its credentials and its join token; run the "
            "agent as root: each allocation's ranks then run as a uid of their own "
            "(rank_uid_range), or as rank_user (--rank-user, DET_AGENT_RANK_USER)"
        )
        return None, warnings
    if euid != 0:
        if (rank.uid, rank.gid) == (euid, egid):
            return None, warnings  # the agent's own user: nothing to switch
        raise ValueError(
            f"the agent runs as uid {euid}, not root, and only root can start ranks as "
            f"another user ({rank.name!r}); run the agent as root or leave rank_user unset"
        )
    if setpriv is None:
        raise ValueError(
            "util-linux's setpriv is not installed, and it is what switches the ranks' user"
        )
    if rank.uid == 0:
        warnings.append(ROOT_RANKS_WARNING)
    return rank, warnings


ROOT_RANKS_WARNING = (
    "rank_user is root: every rank runs as root and can read this agent's join token (and "
    "its file), its credential, its environment and /proc, and every other allocation's "
    "run directory and checkpoints; leave rank_user unset (each allocation then gets a uid "
    f"of its own, from a block of {DEFAULT_UID_SPACE}) or name an unprivileged user"
)


def for_range(
    pool: UidPool, *, euid: int, setpriv: str | None, join_token_file: Path | None = None
) -> list[str]:
    """The warnings to log once at start when ranks run as uids of rank_uid_range;
    ValueError says why the agent must not start."""
    if euid != 0:
        raise ValueError(
            f"the agent runs as uid {euid}, not root, and only root can start ranks as the "
            f"uids of rank_uid_range {pool}; run the agent as root or leave rank_uid_range unset"
        )
    if setpriv is None:
        raise ValueError(
            "util-linux's setpriv is not installed, and it is what switches the ranks' user"
        )
    return _token_file_warnings(join_token_file)


def _token_file_warnings(join_token_file: Path | None) -> list[str]:
    if join_token_file is not None:
        with contextlib.suppress(OSError):  # an unreadable file fails settings already
            mode = stat.S_IMODE(join_token_file.stat().st_mode)
            if mode & 0o044:
                return [
                    f"join_token_file {join_token_file} is readable by other users "
                    f"(mode {mode:04o}): chmod 600 it"
                ]
    return []


def reach_problem(
    rank: RankUser, work_dir: Path, setpriv: str, what: str = "work_dir"
) -> str | None:
    """None if `rank` can enter `work_dir` (its run directories live below it), else why
    not. Asked of the kernel as that user, so every directory above counts."""
    probe = subprocess.run(
        [setpriv, *switch_options(rank), "--", "/bin/sh", "-c", 'cd -- "$1"', "sh", str(work_dir)],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if probe.returncode == 0:
        return None
    detail = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return (
        f"user {rank.name!r} cannot enter {what} {work_dir.resolve()} ({detail}); every "
        f"directory above it must be searchable by that user (chmod o+x, or move {what})"
    )


def open_checkpoint_dir(directory: Path) -> str | None:
    """Make `directory` (a shared_fs store) one where ranks with uids of their own can
    write checkpoints: created if missing; others may create and enter entries (o+wx) but
    not list them (o-r), and the sticky bit keeps them from removing each other's. None,
    or what went wrong; what it changed is logged."""
    try:
        if not directory.exists():
            directory.mkdir(parents=True)
            log.info("checkpoint storage %s created for the ranks' uids", directory)
        mode = stat.S_IMODE(directory.stat().st_mode)
        wanted = (mode | stat.S_ISVTX | 0o003) & ~0o004
        if mode != wanted:
            directory.chmod(wanted)
            log.info(
                "checkpoint storage %s: mode %04o -> %04o, so the ranks' uids can write "
                "checkpoints in it, each its own, which the others can neither list nor remove",
                directory,
                mode,
                wanted,
            )
    except OSError as exc:
        return f"checkpoint storage {directory}: {exc.strerror}"
    return None


def seal_checkpoints(directory: Path, uid: int, to: int = 0) -> int:
    """Give user `to` (root, or the store's owner: runner.Runner._seal) every entry
    directly in `directory` (a shared_fs store) that `uid` owns, and all below it, keeping
    their group, which may then read them but no longer change them (g-w): the run that
    wrote them has ended, and the uid will serve another owner's run next. How many it
    gave."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    sealed = 0
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            _seal(entry.path, to)
            if entry.is_dir(follow_symlinks=False):
                for below, dirs, files in os.walk(entry.path):
                    for name in (*dirs, *files):
                        _seal(os.path.join(below, name), to)
            sealed += 1
        except OSError as exc:  # one that cannot be changed must not keep the others open
            log.warning("checkpoint %s stays uid %d's: %s", entry.path, uid, exc.strerror)
    return sealed


def run_problem(rank: RankUser, python: str, setpriv: str) -> str | None:
    """None if `rank` can run the agent's interpreter (entrypoints' `python3` and the
    storage check use it), else why not."""
    probe = subprocess.run(
        command([python, "-c", "import resolute.storage"], setpriv=setpriv, rank=rank),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    if probe.returncode == 0:
        return None
    detail = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return f"user {rank.name!r} cannot run {python} with the training library ({detail})"


def _seal(path: str, to: int) -> None:
    os.lchown(path, to, -1)
    info = os.lstat(path)
    if not stat.S_ISLNK(info.st_mode) and info.st_mode & stat.S_IWGRP:
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~stat.S_IWGRP)


def chown_tree(root: Path, rank: RankUser) -> None:
    """Give `root` and everything below it to `rank` (links themselves, never followed)."""
    os.lchown(root, rank.uid, rank.gid)
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.lchown(os.path.join(directory, name), rank.uid, rank.gid)
