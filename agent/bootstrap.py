"""Determined's bootstrap for per-agent launches, without Docker.

Determined 0.38.1's harness finds the cluster by reading fixed paths (`/run/determined/info/
*.json`, `/run/determined/train/model`, `/determined_shared_fs`) and its launchers use
`/tmp/pid_server-<allocation>`. Two allocations on one agent, or two agents on one host,
must not see each other's files there, so each per-agent process runs in namespaces of its
own (util-linux `unshare`):
- a mount namespace in which the allocation's own directories are bound over those paths,
  as Docker's container filesystem would give them, and /tmp is an overlay: the host's
  /tmp shows through (an interpreter or data under /tmp stays usable) but what the trial
  writes there (Determined's `/tmp/pid_server-<allocation>` sockets) is its own;
- a PID namespace whose first process forwards SIGTERM/SIGINT/SIGHUP to the entrypoint and
  whose end kills everything left in it, so no launcher child outlives the allocation,
  even when the agent itself is killed (`--kill-child` with the agent's PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

RUN_DETERMINED = Path("/run/determined")
SHARED_FS = Path("/determined_shared_fs")
WORKDIR = RUN_DETERMINED / "workdir"
# Where a per_agent launch binds the experiment's mounts before moving them (see _INIT).
STAGING = ".bind-mounts"
# Where a TLS agent's CA file shows inside the namespace (DET_MASTER_CERT_FILE, cluster.json).
MASTER_CERT = RUN_DETERMINED / "etc" / "ssl" / "master.crt"

# The namespace's first process: bind the allocation's directories (a per_agent launch),
# make the experiment's own mounts and /dev/shm, then run the entrypoint, pass the stop
# signals on, and exit with its status. When it exits the kernel kills whatever else still
# runs in the PID namespace (launcher children, data loaders). Its tools are named by
# absolute path (the trial's PATH may hold only a venv), and `env --default-signal` undoes
# the SIGINT/SIGQUIT ignore a shell gives background commands. Every mount that fails says
# which, so a trial never ends in a bare exit status.
# The experiment's bind mounts are made in two steps when /tmp becomes an overlay: each
# host path is bound at a staging point under /run/determined first, while a host path
# under /tmp is still the host's (after, it would be the overlay's copy, and writes would
# not reach the host), then moved to its target once the overlay is up (a target under
# /tmp lands on the overlay). Without an overlay the staging point is the target.
_INIT = """set -e
mount=$1 env=$2 run=$3 shared=$4 tmp=$5 shm=$6 binds=$7
shift 7
fail() { echo "resolute: $1" >&2; exit 125; }
if [ -n "$run" ]; then
  "$mount" --bind "$run" /run/determined
  if [ -n "$shared" ]; then "$mount" --bind "$shared" /determined_shared_fs; fi
fi
count=$binds
while [ "$binds" -gt 0 ]; do
  if [ "$3" = ro ]; then
    "$mount" --bind -o ro "$1" "$2" || fail "cannot bind-mount $1 read-only (bind_mounts)"
  else
    "$mount" --bind "$1" "$2" || fail "cannot bind-mount $1 (bind_mounts)"
  fi
  shift 3
  binds=$((binds - 1))
done
if [ -n "$run" ]; then
  "$mount" -t overlay overlay -o "lowerdir=/tmp,upperdir=$tmp/upper,workdir=$tmp/work" /tmp
  cd /run/determined/workdir
fi
while [ "$count" -gt 0 ]; do
  if [ "$1" != "$2" ]; then
    "$mount" --move "$1" "$2" || fail "cannot bind-mount at $2 (bind_mounts)"
  fi
  shift 2
  count=$((count - 1))
done
if [ "$shm" != 0 ]; then
  "$mount" -t tmpfs -o "size=$shm,mode=1777,nosuid,nodev" shm /dev/shm ||
    fail "cannot mount a private /dev/shm of $shm bytes (resources.shm_size)"
fi
set +e
"$env" --default-signal=INT,QUIT "$@" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM
trap 'kill -INT $child 2>/dev/null' INT
trap 'kill -HUP $child 2>/dev/null' HUP
while :; do
  wait $child
  code=$?
  kill -0 $child 2>/dev/null || exit $code
done
"""


@dataclass(frozen=True)
class Mount:
    """One of the experiment's bind mounts, as the agent makes it: `target` is absolute
    inside the namespace, `mount_point` where that is on the agent's file system (the
    same path, except under the allocation's /run/determined)."""

    host_path: str
    target: str
    mount_point: Path
    read_only: bool


def plan_mounts(
    requested: Sequence[tuple[str, str, bool]], workdir_inside: str, workdir_outside: Path
) -> list[Mount]:
    """Each (host_path, container_path, read_only) with its container_path resolved as
    Determined resolves it: a relative one under the working directory."""
    planned: list[Mount] = []
    for host_path, container_path, read_only in requested:
        if container_path.startswith("/"):
            target = posixpath.normpath(container_path)
            mount_point = Path(target)
        else:
            relative = posixpath.normpath(container_path)
            target = posixpath.join(workdir_inside, relative)
            mount_point = workdir_outside / relative
        planned.append(Mount(host_path, target, mount_point, read_only))
    return planned


def prepare_mounts(mounts: Sequence[Mount]) -> str | None:
    """Make each mount point that is missing (a directory, or an empty file for a file),
    before anything runs. None if all is ready, else a sentence naming the path."""
    for mount in mounts:
        source = Path(mount.host_path)
        if not source.exists():
            return (
                f"bind_mounts: host_path {mount.host_path} does not exist on this agent "
                f"(for container_path {mount.target})"
            )
        try:
            if source.is_dir():
                if mount.mount_point.exists() and not mount.mount_point.is_dir():
                    return (
                        f"bind_mounts: host_path {mount.host_path} is a directory but "
                        f"{mount.target} is a file"
                    )
                mount.mount_point.mkdir(parents=True, exist_ok=True)
            elif mount.mount_point.is_dir():
                return (
                    f"bind_mounts: host_path {mount.host_path} is a file but "
                    f"{mount.target} is a directory"
                )
            elif not mount.mount_point.exists():
                mount.mount_point.parent.mkdir(parents=True, exist_ok=True)
                mount.mount_point.touch()
        except OSError as exc:
            return (
                f"bind_mounts: cannot create the mount point {mount.target} for "
                f"{mount.host_path}: {exc.strerror}"
            )
    return None


def _unshare_argv(as_root: bool) -> list[str]:
    unshare = shutil.which("unshare") or "unshare"
    user = [] if as_root else ["--user", "--map-root-user"]
    return [
        unshare,
        *user,
        "--pid",
        "--kill-child",
        "--mount-proc",
        "--propagation",
        "private",
        "--",
    ]


def probe_namespaces(work_dir: Path) -> str | None:
    """None if this agent can give per-agent launches their namespaces, else one line
    naming what is missing. Run once at start (the mount points are made here), with the
    whole mechanism: namespaces, the binds and the /tmp overlay in `work_dir`."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "util-linux's unshare and mount are not installed (apt-get install util-linux mount)"
    if shutil.which("env") is None:
        return "coreutils' env is not installed"
    as_root = os.geteuid() == 0
    for mount_point in (RUN_DETERMINED, SHARED_FS):
        if as_root:
            try:
                mount_point.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                return f"cannot create the mount point {mount_point}: {exc.strerror}"
        elif not mount_point.is_dir():
            return (
                f"the mount point {mount_point} does not exist and a non-root agent cannot "
                f"create it (as root: mkdir -p {RUN_DETERMINED} {SHARED_FS})"
            )
    try:
        with tempfile.TemporaryDirectory(prefix="probe-", dir=work_dir) as scratch:
            run_dir = Path(scratch) / "run"
            (run_dir / "workdir").mkdir(parents=True)
            probe = subprocess.run(
                wrap(["true"], run_dir, "", Path(scratch) / "tmp"),
                capture_output=True,
                text=True,
                timeout=20,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare could not run: {exc}"
    if probe.returncode != 0:
        detail = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "no output"
        hint = "" if as_root else "; run the agent as root or allow unprivileged user namespaces"
        return f"cannot create the mount and PID namespaces of a trial ({detail}){hint}"
    return None


def wrap(
    argv: Sequence[str],
    run_dir: Path | None,
    shared_fs: str,
    tmp_dir: Path | None,
    run_as: Sequence[str] = (),
    *,
    shm_size_bytes: int = 0,
    mounts: Sequence[Mount] = (),
) -> list[str]:
    """The command that runs `argv` inside the allocation's namespaces. With a `run_dir`
    (a per_agent launch) it is bound at /run/determined and /tmp is an overlay whose layers
    go in `tmp_dir`, made here; without, only the experiment's own mounts and /dev/shm are
    made (a per_slot launch that asked for them). `run_as` (setpriv and its options,
    ending in `--`) runs the entrypoint as the rank user: after the mounts, which need
    root, and while the namespace's init stays root to pass the stop signals on."""
    if tmp_dir is not None:
        for layer in ("upper", "work"):
            (tmp_dir / layer).mkdir(parents=True, exist_ok=True)
        # The merged /tmp takes the upper layer's mode: make it /tmp's, or a rank user
        # could not write its own /tmp.
        (tmp_dir / "upper").chmod(0o1777)
    stages = [_staging_point(m, i, run_dir) for i, m in enumerate(mounts)]
    binds = [
        part
        for m, stage in zip(mounts, stages, strict=True)
        for part in (m.host_path, stage, "ro" if m.read_only else "rw")
    ]
    moves = [part for m, stage in zip(mounts, stages, strict=True) for part in (stage, m.target)]
    return [
        *_unshare_argv(os.geteuid() == 0),
        "/bin/sh",
        "-c",
        _INIT,
        "resolute-init",
        shutil.which("mount") or "/bin/mount",
        shutil.which("env") or "/usr/bin/env",
        str(run_dir) if run_dir is not None else "",
        shared_fs,
        str(tmp_dir) if tmp_dir is not None else "",
        str(shm_size_bytes),
        str(len(mounts)),
        *binds,
        *moves,
        *run_as,
        *argv,
    ]


def _staging_point(mount: Mount, index: int, run_dir: Path | None) -> str:
    """Where `mount` is bound before /tmp's overlay (see _INIT), made here: under the
    allocation's /run/determined, a file for a file. Without an overlay, its target."""
    if run_dir is None:
        return mount.target
    outside = run_dir / STAGING / str(index)
    outside.parent.mkdir(parents=True, exist_ok=True)
    if Path(mount.host_path).is_dir():
        outside.mkdir(exist_ok=True)
    else:
        outside.touch()
    return str(RUN_DETERMINED / STAGING / str(index))


def write_info(
    run_dir: Path,
    info_files: Mapping[str, str],
    gpu_uuids: Sequence[str],
    master_cert_file: Path | None = None,
    master_cert_name: str | None = None,
) -> None:
    """/run/determined/info/*.json (the master's files, plus resources.json: the GPUs
    this agent gives the allocation, as Determined's `prep_container --resources` finds).
    A TLS agent's CA file is copied in and named in cluster.json, as Determined's master
    does, so the harness verifies the master over https with it."""
    info = run_dir / "info"
    info.mkdir(parents=True, exist_ok=True)
    files = dict(info_files)
    if master_cert_file is not None:
        inside = run_dir / MASTER_CERT.relative_to(RUN_DETERMINED)
        inside.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(master_cert_file, inside)
        inside.chmod(0o644)  # a CA certificate is public; the ranks may run as another user
        if "cluster.json" in files:
            cluster = json.loads(files["cluster.json"])
            cluster.update(master_cert_file=str(MASTER_CERT), master_cert_name=master_cert_name)
            files["cluster.json"] = json.dumps(cluster)
    for name, content in files.items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad bootstrap file name {name!r}")
        (info / name).write_text(content)
    (info / "resources.json").write_text(json.dumps({"gpu_uuids": list(gpu_uuids)}))


def interpreter_problem(
    argv: Sequence[str],
    env: Mapping[str, str],
    run_dir: Path,
    shared_fs: str,
    tmp_dir: Path,
    run_as: Sequence[str] = (),
    *,
    shm_size_bytes: int = 0,
    mounts: Sequence[Mount] = (),
) -> str | None:
    """None if the entrypoint's Python has what Determined's harness imports at start,
    else a sentence naming the interpreter and what it lacks. Checked inside the same
    namespaces and as the same user as the launch, so it sees what the entrypoint will
    see (a private /tmp, the files that user may read)."""
    name = argv[0] if Path(argv[0]).name.startswith("python") else "python3"
    how = "choose the interpreter with PATH in environment.environment_variables"
    check = (
        "import importlib.util as u, shutil, sys\n"
        "python = shutil.which(sys.argv[1]) if '/' not in sys.argv[1] else sys.argv[1]\n"
        "if python is None:\n"
        "    print('NOPYTHON'); sys.exit()\n"
        "has = lambda m: u.find_spec(m) is not None\n"
        "missing = [] if has('determined') else ['determined']\n"
        "if not ((has('torch') and has('tensorboard')) or has('tensorflow')):\n"
        "    missing.append('torch + tensorboard')\n"
        "print(python, ', '.join(missing), sep='\\t')\n"
    )
    # The check runs under the interpreter it checks, found the way the shell will find it.
    path = env.get("PATH", "")
    found = shutil.which(name, path=path) if "/" not in name else name
    if found is None:
        return f"no {name} on the trial's PATH ({path}); {how}"
    command = wrap(
        [found, "-c", check, name],
        run_dir,
        shared_fs,
        tmp_dir,
        run_as,
        shm_size_bytes=shm_size_bytes,
        mounts=mounts,
    )
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{found} could not run: {exc}; {how}"
    if result.returncode != 0 or not result.stdout.strip():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{found} could not run in the trial's namespace: {last}; {how}"
    python, _, missing = result.stdout.strip().partition("\t")
    if missing:
        return f"{python} lacks {missing}, which Determined's harness needs; {how}"
    return None
