"""Ranks in images: the agent's container runtime (podman, or Docker's CLI).

An agent started with `--container-runtime podman|docker` runs each rank of a launch whose
config names `environment.image` in a container of that image, one container per rank
process, so logs stay by rank and a rank's exit is its container's:
- the host's network (the gang's ports and `dtrain_network_interface` work as on the
  host), the rank's own PID namespace with an init that passes signals on and reaps;
- the allocation's directory bound at the same path (a per_slot launch) or at
  /run/determined (a per_agent launch: everything Determined's harness reads), the
  shared_fs store, the experiment's bind_mounts and devices, a /dev/shm of shm_size;
- only the rank's own variables (`--env NAME`, read from the runtime client's
  environment, so no value shows on a command line), and the image's own PATH unless the
  config sets one.

The rank's process is the runtime's client, attached. The container's processes are not
its children (conmon's), so a signal to the client alone would not reach them: the agent
reads the container's first process from `--pidfile`, stops it by signal, and hands it to
the fence (agent/fence.py), whose SIGKILL to a PID namespace's first process ends every
process in it. Each container carries the agent's label: an agent that was killed removes
what it left when it starts again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import resource
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Docker's rule for an image's registry, shared with the masking of configs.
from resolute.storage import registry_of as registry_of

log = logging.getLogger(__name__)

RUNTIMES = ("podman", "docker")
AGENT_LABEL = "ai.resolute.agent"
ALLOCATION_LABEL = "ai.resolute.allocation"
# Where the agent's `resolute` package (the training library, standard library only) is
# bound read-only, on the ranks' PYTHONPATH, so per_slot trials `import resolute` in any
# image with a Python 3.11 or newer.
LIBRARY_DIR = "/opt/resolute/lib"
# Determined gives a container 4 GiB of /dev/shm unless the config says otherwise; the
# runtimes' own default (64 MiB) starves PyTorch's data loader workers.
DEFAULT_SHM_BYTES = 4 << 30
# A pull that has said nothing for this long has stalled (the registry stopped answering).
PULL_TIMEOUT_S = 1800.0


class ImageProblem(Exception):
    """The image cannot be had: one line, the registry's own words where it gave some."""


@dataclass(frozen=True)
class Runtime:
    """A container runtime's client on this agent."""

    kind: str  # "podman" or "docker"
    binary: str
    # Registries served over plain HTTP or with a certificate the host does not trust
    # (podman: --tls-verify=false on the pull; Docker's daemon decides for itself).
    insecure_registries: tuple[str, ...] = ()

    def command(self, *args: str) -> list[str]:
        return [self.binary, *args]


def find_runtime(kind: str, insecure_registries: Sequence[str] = ()) -> Runtime:
    """The runtime `kind` on this host, checked by running its client once; ValueError
    with one line saying what is missing."""
    if kind not in RUNTIMES:
        raise ValueError(f"container_runtime must be one of none, {', '.join(RUNTIMES)}")
    binary = shutil.which(kind)
    if binary is None:
        hint = "apt-get install podman runc" if kind == "podman" else "install Docker's CLI"
        raise ValueError(f"container_runtime {kind}: {kind} is not on PATH ({hint})")
    try:
        probe = subprocess.run(
            [binary, "version", "--format", "{{.Client.Version}}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"container_runtime {kind}: {binary} could not run: {exc}") from None
    if probe.returncode != 0:
        raise ValueError(f"container_runtime {kind}: {binary} version failed: {_last_line(probe)}")
    return Runtime(kind, binary, tuple(insecure_registries))


def remove_leftovers(runtime: Runtime, agent_id: str) -> list[str]:
    """Remove every container this agent's id labelled (what a killed agent left
    running); the names removed."""
    listed = subprocess.run(
        runtime.command(
            "ps", "-a", "--filter", f"label={AGENT_LABEL}={agent_id}", "--format", "{{.Names}}"
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if listed.returncode != 0:
        log.warning(
            "could not list the containers an earlier run of this agent left: %s",
            _last_line(listed),
        )
    names = listed.stdout.split() if listed.returncode == 0 else []
    if names:
        subprocess.run(
            runtime.command("rm", "-f", *names), capture_output=True, text=True, timeout=300
        )
    return names


DOCKER_HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")


def auth_file(auth: Mapping[str, str], image: str, kind: str = "podman") -> dict[str, object]:
    """Docker's config.json (which podman's --authfile reads too) holding `auth` under the
    key each runtime looks the registry up by: the serveraddress's host (or the image's
    registry); Docker Hub as podman names it (docker.io) or Docker does (its v1 URL)."""
    server = auth.get("serveraddress") or registry_of(image)
    host = urllib.parse.urlsplit(server if "://" in server else f"//{server}").netloc or server
    if host in DOCKER_HUB_HOSTS:
        host = "https://index.docker.io/v1/" if kind == "docker" else "docker.io"
    entry: dict[str, str] = {}
    if auth.get("auth"):
        entry["auth"] = auth["auth"]
    elif auth.get("username"):
        pair = f"{auth['username']}:{auth.get('password', '')}"
        entry["auth"] = base64.b64encode(pair.encode()).decode()
    if auth.get("identitytoken"):
        entry["identitytoken"] = auth["identitytoken"]
    if auth.get("registrytoken"):
        entry["registrytoken"] = auth["registrytoken"]
    return {"auths": {host: entry}}


Note = Callable[[str], None]


@dataclass
class ImagePuller:
    """Pulls each image once per agent: a launch that needs an image another launch is
    pulling waits for that pull, and an image already here is not pulled again unless
    the config forces it."""

    runtime: Runtime
    secrets_dir: Path
    # (image, the credentials' digest, forced) -> the fetch under way: launches share a
    # fetch only with the same credentials, so one launch's wrong password never fails
    # another's pull, nor does a right one pull for a launch that gave none.
    _fetches: dict[tuple[str, str, bool], asyncio.Task[None]] = field(default_factory=dict)

    async def ensure(
        self, image: str, auth: Mapping[str, str] | None, force: bool, note: Note
    ) -> None:
        """Have `image` here, or raise ImageProblem."""
        digest = hashlib.sha256(json.dumps(auth or {}, sort_keys=True).encode()).hexdigest()
        key = (image, digest, force)
        fetching = self._fetches.get(key)
        if fetching is None:
            fetching = asyncio.create_task(self._fetch(image, auth, force, note))
            self._fetches[key] = fetching

            def forget(done: asyncio.Task[None]) -> None:
                if self._fetches.get(key) is done:
                    del self._fetches[key]

            fetching.add_done_callback(forget)
        else:
            note(f"waiting for the pull of {image} another launch started")
        await asyncio.shield(fetching)  # a launch that stops leaves the pull to the others

    async def _fetch(
        self, image: str, auth: Mapping[str, str] | None, force: bool, note: Note
    ) -> None:
        if force or not await self._present(image):
            await self._pull(image, auth, note)

    async def _present(self, image: str) -> bool:
        args = (
            ("image", "exists", image)
            if self.runtime.kind == "podman"
            else ("image", "inspect", image)
        )
        check = await asyncio.create_subprocess_exec(
            *self.runtime.command(*args),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return await check.wait() == 0

    async def _pull(self, image: str, auth: Mapping[str, str] | None, note: Note) -> None:
        note(f"pulling image {image}")
        self.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        options: list[str] = []
        config_dir: Path | None = None
        if auth:
            # A file only root reads, removed after the pull: never argv, never the ranks'.
            config_dir = Path(tempfile.mkdtemp(prefix="pull-", dir=self.secrets_dir))  # 0700
            written = auth_file(auth, image, self.runtime.kind)
            (config_dir / "config.json").write_text(json.dumps(written))
        if self.runtime.kind == "podman":
            if config_dir is not None:
                options += ["--authfile", str(config_dir / "config.json")]
            if registry_of(image) in self.runtime.insecure_registries:
                options.append("--tls-verify=false")
            argv = self.runtime.command("pull", *options, image)
        else:
            argv = [self.runtime.binary]
            if config_dir is not None:
                argv += ["--config", str(config_dir)]
            argv += ["pull", image]
        try:
            pull = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            assert pull.stdout is not None
            last = ""
            while True:
                try:
                    line = await asyncio.wait_for(pull.stdout.readline(), PULL_TIMEOUT_S)
                except TimeoutError:
                    pull.kill()
                    await pull.wait()
                    raise ImageProblem(
                        f"pulling image {image} stalled: nothing for {PULL_TIMEOUT_S:g} s"
                    ) from None
                if not line:
                    break
                text = line.decode(errors="replace").strip()
                if text:
                    last = text
                    note(f"pull {image}: {text}")
            if await pull.wait() != 0:
                raise ImageProblem(f"pulling image {image} failed: {_one_line(last)}")
        finally:
            if config_dir is not None:
                shutil.rmtree(config_dir, ignore_errors=True)
        note(f"pulled image {image}")


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line.removeprefix("Error: ").removeprefix("error: ") or "no output"


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit status {result.returncode}"


@dataclass(frozen=True)
class Volume:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True)
class RankContainer:
    """Everything one rank's `run` says, as data (built by the runner, tested alone)."""

    name: str
    agent_id: str
    allocation_id: str
    image: str
    argv: Sequence[str]
    workdir: str
    env_file: str
    volumes: Sequence[Volume] = ()
    devices: Sequence[tuple[str, str, str]] = ()  # host_path, container_path, permissions
    gpus: Sequence[str] = ()  # UUIDs of the rank's CUDA devices
    shm_size_bytes: int = DEFAULT_SHM_BYTES
    user: tuple[int, int] | None = None  # uid, gid; None: the image's user
    groups: Sequence[int] = ()  # the user's supplementary groups (rank_user's, as on the host)
    # Where the runtime writes what finds the container's first process: podman its pid
    # (--pidfile), Docker the container's id (--cidfile, then `docker inspect`).
    id_file: str = ""


# podman's own nproc default; podman itself runs with it as its hard limit, so a higher
# one is refused at the container's start even below the host's (seen with 4.3.1: a hard
# limit of 96365 refused, 32768 started).
PODMAN_NPROC = 32768


def host_limits(runtime: Runtime) -> list[str]:
    """`--ulimit` options no higher than this host allows: podman's defaults (nofile
    1048576) can lie above the hard limits a host, or the container the agent runs in,
    allows, and then every container fails to start (setrlimit: operation not permitted).
    Docker's daemon sets its own."""
    if runtime.kind != "podman":
        return []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    options: list[str] = []
    if hard != resource.RLIM_INFINITY:
        soft = hard if soft == resource.RLIM_INFINITY else soft
        options += ["--ulimit", f"nofile={soft}:{hard}"]
    _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = PODMAN_NPROC if nproc == resource.RLIM_INFINITY else min(nproc, PODMAN_NPROC)
    return [*options, "--ulimit", f"nproc={nproc}:{nproc}"]


def run_argv(runtime: Runtime, spec: RankContainer, limits: Sequence[str] = ()) -> list[str]:
    """The runtime client's command that runs one rank in its container, attached."""
    argv = runtime.command(
        "run",
        "--rm",
        "--name",
        spec.name,
        "--label",
        f"{AGENT_LABEL}={spec.agent_id}",
        "--label",
        f"{ALLOCATION_LABEL}={spec.allocation_id}",
        "--pull",
        "never",  # pulled before, once per agent, with the config's credentials
        "--network",
        "host",
        "--init",
        "--workdir",
        spec.workdir,
        "--shm-size",
        str(spec.shm_size_bytes),
        *limits,
    )
    if spec.id_file:
        argv += ["--pidfile" if runtime.kind == "podman" else "--cidfile", spec.id_file]
    if spec.user is not None:
        argv += ["--user", f"{spec.user[0]}:{spec.user[1]}"]
    for group in spec.groups:
        argv += ["--group-add", str(group)]
    for volume in spec.volumes:
        suffix = ":ro" if volume.read_only else ""
        argv += ["--volume", f"{volume.host_path}:{volume.container_path}{suffix}"]
    for host_path, container_path, permissions in spec.devices:
        argv += ["--device", f"{host_path}:{container_path}:{permissions or 'rwm'}"]
    for uuid in spec.gpus:
        if runtime.kind == "podman":
            argv += ["--device", f"nvidia.com/gpu={uuid}"]  # CDI (nvidia-ctk cdi generate)
        else:
            argv += ["--gpus", f"device={uuid}"]
    argv += ["--env-file", spec.env_file]
    return [*argv, spec.image, *spec.argv]


def env_problem(env: Mapping[str, str]) -> str | None:
    """The variable an env file cannot carry (a line break, an '=' in its name), named."""
    for key, value in env.items():
        if "\n" in key or "\n" in value or "=" in key or not key:
            return (
                f"environment variable {key.splitlines()[0] if key else '(empty)'!r} cannot be "
                "given to a container: its name or value holds a line break or its name an '='"
            )
    return None


def env_file_text(env: Mapping[str, str]) -> str:
    """The rank's variables as an env file (KEY=VALUE lines): a file only root reads, so
    no value shows on a command line, and the runtime's client keeps the agent's own
    environment (a config's PATH or CONTAINERS_CONF must not steer the runtime). Raises
    ValueError naming a variable an env file cannot carry."""
    problem = env_problem(env)
    if problem:
        raise ValueError(problem)
    return "".join(f"{key}={value}\n" for key, value in env.items())


# Paths the runtime makes itself, or the agent binds for Determined's harness: a bind
# mount or device there would hide them.
RUNTIME_PATHS = ("/", "/proc", "/sys", "/dev", "/dev/shm", "/run/determined", LIBRARY_DIR)


def mounts_problem(
    mounts: Sequence[tuple[str, str]], devices: Sequence[tuple[str, str]]
) -> str | None:
    """Why the experiment's bind mounts (host_path, target) or devices (host_path,
    container_path) cannot be given to a container on this agent, else None."""
    for host_path, target in mounts:
        clean = os.path.normpath(target)
        if clean in RUNTIME_PATHS or clean.startswith(("/proc/", "/sys/")):
            instead = (
                "resources.shm_size sizes a container's own /dev/shm"
                if clean == "/dev/shm"
                else "choose another"
            )
            return (
                f"bind_mounts: container_path {target} is a path the container runtime or "
                f"the agent makes itself; {instead}"
            )
        if not os.path.exists(host_path):
            return (
                f"bind_mounts: host_path {host_path} does not exist on this agent "
                f"(for container_path {target})"
            )
    for host_path, container_path in devices:
        if not os.path.exists(host_path):
            return (
                f"resources.devices: {host_path} does not exist on this agent "
                f"(for {container_path})"
            )
    return None


# The first process of a container that runs several ranks of a per_slot launch (one
# container per allocation and agent, as Determined runs one per agent: starting eight
# containers took 1.2 s more than eight processes, one about 0.2 s). POSIX sh only, so any
# image with /bin/sh runs it. Arguments: the ranks' directory, the number of ranks, the
# ranks, then the entrypoint. The agent made, per rank, its variables `<rank>.env` and two
# FIFOs `<rank>.out` and `<rank>.err` there, and reads the FIFOs itself (a rank's output
# never passes through a shell). When a rank ends its status goes to `<rank>.exit` and a
# line `RANK_EXIT_MARKER <rank> <status>` on the container's stdout says so at once.
# SIGTERM goes on to every rank.
RANK_EXIT_MARKER = "\x1eresolute-rank-exit"
GROUP_LAUNCHER = """dir=$1 n=$2
shift 2
ranks=""
while [ "$n" -gt 0 ]; do ranks="$ranks $1"; shift; n=$((n - 1)); done
waiters=""
for rank in $ranks; do
  (
    (
      while IFS= read -r kv || [ -n "$kv" ]; do export "$kv"; done < "$dir/$rank.env"
      exec "$@"
    ) > "$dir/$rank.out" 2> "$dir/$rank.err" &
    child=$!
    trap 'kill -TERM $child 2>/dev/null' TERM
    while :; do
      wait $child
      code=$?
      kill -0 $child 2>/dev/null || break
    done
    printf '%s\\n' "$code" > "$dir/$rank.exit"
    printf '\\036resolute-rank-exit %s %s\\n' "$rank" "$code"
  ) &
  waiters="$waiters $!"
done
trap 'kill -TERM $waiters 2>/dev/null' TERM INT HUP
while :; do
  wait
  [ $? -gt 128 ] || break
done
"""


def group_argv(ranks_dir: str, ranks: Sequence[int], entrypoint: Sequence[str]) -> list[str]:
    """The command of a container that runs `ranks` (GROUP_LAUNCHER)."""
    return [
        "/bin/sh",
        "-c",
        GROUP_LAUNCHER,
        "resolute-ranks",
        ranks_dir,
        str(len(ranks)),
        *(str(rank) for rank in ranks),
        *entrypoint,
    ]


def parse_rank_exit(line: bytes) -> tuple[int, int] | None:
    """(rank, exit status) from a GROUP_LAUNCHER line that says a rank ended, else None."""
    marker = RANK_EXIT_MARKER.encode()
    if not line.startswith(marker):
        return None
    words = line[len(marker) :].split()
    if len(words) != 2 or not all(w.isdigit() for w in words):
        return None
    return int(words[0]), int(words[1])


def container_name(allocation_id: str, rank: int) -> str:
    return f"resolute-{allocation_id}-{rank}"


async def container_pid(
    runtime: Runtime, id_file: Path, client: asyncio.subprocess.Process
) -> int | None:
    """The first process of the rank's container once it runs; None when the client ended
    first (the container never started, or already ended). No deadline: until it is found
    the fence can stop only the client, so the agent keeps looking as long as it runs."""
    while client.returncode is None:
        if runtime.kind == "podman":
            pid = _read_pid(id_file)
        else:
            pid = await _docker_pid(runtime, id_file)
        if pid:
            return pid
        await asyncio.sleep(0.02)
    return None


def _read_text(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text().strip()
    return ""


def _read_pid(pidfile: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = pidfile.read_text().strip()
        if text:
            return int(text)
    return None


async def _docker_pid(runtime: Runtime, cidfile: Path) -> int | None:
    container = _read_text(cidfile)
    if not container:
        return None
    found = await _output(runtime.command("inspect", "--format", "{{.State.Pid}}", container))
    return int(found) if found.strip().isdigit() else None


async def remove_allocation(runtime: Runtime, allocation_id: str) -> None:
    """Remove whatever container of the allocation is left (its client was killed before
    the container's --rm could act)."""
    listed = await _output(
        runtime.command(
            "ps",
            "-a",
            "--filter",
            f"label={ALLOCATION_LABEL}={allocation_id}",
            "--format",
            "{{.Names}}",
        )
    )
    names = listed.split()
    if names:
        await _output(runtime.command("rm", "-f", *names))


async def _output(argv: Sequence[str]) -> str:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await process.communicate()
    return out.decode(errors="replace")


def signal_exit(code: int) -> int:
    """A container killed by signal N exits 128+N through the client; the agent reports
    it as a host process's -N, so a stop and the fence read alike in both."""
    if 128 < code < 128 + 65:
        return -(code - 128)
    return code


def library_volume() -> Volume:
    """The agent's `resolute` package, for `import resolute` inside any image."""
    import resolute

    return Volume(str(Path(resolute.__file__).parent), f"{LIBRARY_DIR}/resolute", True)


def python_path(env: Mapping[str, str]) -> str:
    """PYTHONPATH with the library's directory after the config's own entries."""
    own = env.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (own, LIBRARY_DIR) if p)
