"""Images and a private registry for the container tests, made here without any outside
registry but Debian's.

- `base_image()`: Debian bookworm with python3, built with debootstrap from Debian's
  package registry (about a minute), its root file system kept as a tar in CACHE_DIR for
  later runs, imported into podman's store.
- `package_image(version)`: the base image plus a package `greeting` whose `VERSION` is
  `version`: two of them hold two versions of one package.
- `Registry`: Debian's `docker-registry` on loopback, with htpasswd basic auth, in a
  directory of its own.

`python -m harness.images` builds the base image ahead of the suite (`make test` does, beside
lint) so the tests find it in the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.cluster import free_port, stop_process, wait_until

CACHE_DIR = Path(os.environ.get("RESOLUTE_IMAGE_CACHE", "/var/cache/resolute-test-images"))
BASE_IMAGE = "localhost/resolute-test/base:bookworm"
ROOTFS_TAR = "bookworm-python3.tar"
PACKAGE_IMAGE = "localhost/resolute-test/greeting"
REGISTRY_BIN = "/usr/bin/docker-registry"


def missing_tools() -> list[str]:
    """What the container tests need and this machine lacks."""
    wanted = {
        "podman": "podman",
        "runc": "runc",
        "catatonit": "catatonit",  # podman's --init
        "debootstrap": "debootstrap",
        "docker-registry": "docker-registry",
        "htpasswd": "apache2-utils",
    }
    return [package for tool, package in wanted.items() if shutil.which(tool) is None]


def _run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed: {result.stderr.strip()[-2000:]}")
    return result


def image_exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image]).returncode == 0


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One builder at a time across the suite's workers."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def base_image() -> str:
    with _locked("base"):
        if image_exists(BASE_IMAGE):
            return BASE_IMAGE
        tar = CACHE_DIR / ROOTFS_TAR
        if not tar.exists():
            rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=CACHE_DIR))
            try:
                _run(
                    [
                        "debootstrap",
                        "--variant=minbase",
                        "--include=python3",
                        "bookworm",
                        str(rootfs),
                    ],
                    timeout=900,
                )
                partial = tar.with_suffix(".partial")
                _run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], timeout=300)
                partial.rename(tar)
            finally:
                shutil.rmtree(rootfs, ignore_errors=True)
        _run(["podman", "import", str(tar), BASE_IMAGE], timeout=600)
    return BASE_IMAGE


def package_image(version: str) -> str:
    """The base image with `greeting.VERSION == version`, built once."""
    image = f"{PACKAGE_IMAGE}:{version}"
    base = base_image()
    with _locked("package"):
        if image_exists(image):
            return image
        with tempfile.TemporaryDirectory() as context:
            package = Path(context) / "greeting"
            package.mkdir()
            (package / "__init__.py").write_text(f"VERSION = {version!r}\n")
            (Path(context) / "Containerfile").write_text(
                f"FROM {base}\nCOPY greeting /usr/lib/python3/dist-packages/greeting\n"
            )
            _run(["podman", "build", "--quiet", "--tag", image, context], timeout=300)
    return image


# The tag names what it holds: a store with an older build (no task servers) builds this.
TRIAL_IMAGE = "localhost/resolute-test/trial:determined-0.38.1-tasks"


def trial_image(site_packages: Path) -> str:
    """The base image with the trial venv's packages (`determined` 0.38.1, torch,
    tensorboard, JupyterLab and the shell server's packages) in Debian's python3 path, as
    Determined's own images hold them. About 50-150 s on this machine kind (the commit of
    1.7 GB), so `make test` starts it in the background and it stays in podman's store for
    later runs."""
    base = base_image()
    with _locked("trial"):
        if image_exists(TRIAL_IMAGE):
            return TRIAL_IMAGE
        name = f"resolute-build-{os.getpid()}"
        subprocess.run(["podman", "rm", "-f", name], capture_output=True)
        _run(["podman", "create", "--name", name, base, "true"])
        try:
            root = Path(_run(["podman", "mount", name]).stdout.strip())
            target = root / "usr/local/lib/python3.11/dist-packages"
            target.mkdir(parents=True, exist_ok=True)
            _run(["cp", "-a", f"{site_packages}/.", str(target)], timeout=900)
            _run(["podman", "umount", name])
            _run(["podman", "commit", "--quiet", name, TRIAL_IMAGE], timeout=1800)
        finally:
            subprocess.run(["podman", "rm", "-f", name], capture_output=True)
    return TRIAL_IMAGE


@dataclass
class Registry:
    """A private registry on loopback: `address` is HOST:PORT."""

    address: str
    username: str
    password: str
    process: subprocess.Popen[bytes]
    log: Path

    def push(self, image: str, name: str) -> str:
        """Push a local image under `name` (path:tag) with the registry's credentials."""
        target = f"{self.address}/{name}"
        _run(
            [
                "podman",
                "push",
                "--quiet",
                "--tls-verify=false",
                "--creds",
                f"{self.username}:{self.password}",
                image,
                target,
            ],
            timeout=300,
        )
        return target


@contextlib.contextmanager
def registry(
    directory: Path, username: str = "team", password: str = "s3cret-pw"
) -> Iterator[Registry]:
    directory.mkdir(parents=True, exist_ok=True)
    htpasswd = _run(["htpasswd", "-nbB", username, password]).stdout.strip()
    (directory / "htpasswd").write_text(htpasswd + "\n")
    port = free_port()
    (directory / "config.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {directory / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {os.urandom(8).hex()}\n"
        f"auth:\n  htpasswd:\n    realm: resolute-test\n    path: {directory / 'htpasswd'}\n"
    )
    log = directory / "registry.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(directory / "config.yml")],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Registry(f"127.0.0.1:{port}", username, password, process, log)
    try:

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return True
            return False

        wait_until("the registry to listen", answering, 30)
        yield served
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


DOCKERD_BIN = "/usr/sbin/dockerd"  # Debian's docker.io


def docker_missing() -> list[str]:
    """What the Docker tests need beyond missing_tools()'s: a daemon and a client."""
    have = os.access(DOCKERD_BIN, os.X_OK) and shutil.which("docker") is not None
    return [] if have else ["docker.io"]


@contextlib.contextmanager
def docker_daemon(directory: Path) -> Iterator[str]:
    """A private dockerd with roots of its own, no bridge and no iptables rules (its
    containers use the host's network, as the agent runs them): yields its DOCKER_HOST.
    The machine's own Docker, if any, is never touched.

    Its roots are under /var/tmp, never /tmp: dockerd mounts there (its netns file, the
    containers' overlays; the netns one it leaves behind), and a mount under /tmp makes
    the overlay on /tmp that per_agent launches get fail in an unprivileged user namespace
    (seen: tests/unit/test_agent_runner_layout.py, beside this daemon). Short, too:
    containerd's sockets live under the exec root (a socket path has 108 bytes)."""
    directory.mkdir(parents=True, exist_ok=True)
    roots = Path(tempfile.mkdtemp(prefix="resolute-dockerd-", dir="/var/tmp"))
    host = f"unix://{roots}/docker.sock"
    log = directory / "dockerd.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                DOCKERD_BIN,
                "--iptables=false",
                "--ip-masq=false",
                "--bridge=none",
                "--data-root",
                str(roots / "data"),
                "--exec-root",
                str(roots / "exec"),
                "--pidfile",
                str(roots / "dockerd.pid"),
                "--host",
                host,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    docker = ["docker", "--host", host]
    try:

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"dockerd exited: {log.read_text()[-2000:]}")
            probe = subprocess.run([*docker, "version"], capture_output=True, timeout=30)
            return probe.returncode == 0

        wait_until("dockerd to answer", answering, 60)
        yield host
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            listed = subprocess.run(
                [*docker, "ps", "-aq"], capture_output=True, text=True, timeout=60
            )
            if listed.stdout.split():
                subprocess.run(
                    [*docker, "rm", "-f", *listed.stdout.split()], capture_output=True, timeout=120
                )
        stop_process(process, 30)  # and its session: containerd and the shims go with it
        _unmount_under(roots)
        shutil.rmtree(roots, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """Whatever is still mounted under `root`, deepest first."""
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    inside = [p for p in points if p == str(root) or p.startswith(f"{root}/")]
    for point in sorted(inside, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=30)


def main() -> None:
    """Build the base image, and the trial image from `--trial-venv VENV` if given."""
    missing = missing_tools()
    if missing:
        print(f"container test images not built: missing {' '.join(missing)}", file=sys.stderr)
        return
    started = time.monotonic()
    print(f"{base_image()} ready after {time.monotonic() - started:.1f} s", flush=True)
    if len(sys.argv) == 3 and sys.argv[1] == "--trial-venv":
        packages = sorted(Path(sys.argv[2]).glob("lib/python3*/site-packages"))
        if packages:
            print(f"{trial_image(packages[0])} ready after {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
