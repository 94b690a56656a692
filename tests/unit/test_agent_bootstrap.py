"""Per-agent (Determined-style) processes in real mount and PID namespaces: what the
entrypoint sees at Determined's fixed paths, how it is stopped, and that nothing outlives it.
Needs root and util-linux's unshare (required when CI=true)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent import bootstrap
from tests.conftest import require


@dataclass(frozen=True)
class Allocation:
    run: Path  # bound over /run/determined
    shared: Path  # bound over /determined_shared_fs
    tmp: Path  # holds what the trial writes to /tmp (an overlay on the host's)

    def wrap(self, script: str) -> list[str]:
        return bootstrap.wrap(["sh", "-c", script], self.run, str(self.shared), self.tmp)

    def run_script(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.wrap(script), capture_output=True, text=True, timeout=30, start_new_session=True
        )

    @contextlib.contextmanager
    def start(self, argv: list[str]) -> Iterator[subprocess.Popen[str]]:
        """The wrapper started as the agent starts it (a process group of its own); killed
        with its group at the end if it still runs."""
        with subprocess.Popen(
            bootstrap.wrap(argv, self.run, str(self.shared), self.tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as wrapper:
            try:
                yield wrapper
            finally:
                if wrapper.poll() is None:
                    os.killpg(wrapper.pid, signal.SIGKILL)
                wrapper.communicate()


def make_allocation(base: Path, name: str = "alloc") -> Allocation:
    alloc = Allocation(base / name / "run", base / name / "shared", base / name / "tmp")
    for path in (alloc.run / "workdir", alloc.run / "info", alloc.shared, alloc.tmp):
        path.mkdir(parents=True)
    (alloc.run / "info" / "cluster.json").write_text(f'{{"agent_id": "{name}"}}')
    return alloc


def require_root_and_unshare() -> None:
    require(os.geteuid() == 0, "the namespace tests run as root (as the agent does)")
    require(shutil.which("unshare") is not None, "util-linux's unshare is not installed")


@pytest.fixture
def base() -> Iterator[Path]:
    """Outside /tmp, which every wrapped process sees overlaid with its own."""
    require_root_and_unshare()
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="resolute-bootstrap-"))
    try:
        problem = bootstrap.probe_namespaces(path)
        require(problem is None, f"no namespaces here: {problem}")
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def alloc(base: Path) -> Allocation:
    return make_allocation(base)


def processes(argv: list[str]) -> list[int]:
    """Live processes (anywhere on the host, in any PID namespace) running exactly `argv`."""
    want = "\0".join(argv).encode() + b"\0"
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes() == want:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def wait_for(condition: Callable[[], object], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def unique_sleep() -> list[str]:
    """`sleep` with a duration no other process on the host uses, to find it in /proc."""
    return ["sleep", f"{1000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6:06d}"]


@pytest.mark.parametrize("parent", ["/var/tmp", "/tmp"])
def test_this_machine_can_make_the_namespaces(parent: str) -> None:
    require_root_and_unshare()
    with tempfile.TemporaryDirectory(dir=parent) as work_dir:
        assert bootstrap.probe_namespaces(Path(work_dir)) is None
        assert os.listdir(work_dir) == []  # the probe cleans up after itself


def test_the_entrypoint_sees_the_allocation_at_determineds_paths(alloc: Allocation) -> None:
    (alloc.shared / "checkpoint").write_text("ck")
    done = alloc.run_script(
        "cat /run/determined/info/cluster.json; echo; cat /determined_shared_fs/checkpoint; "
        "echo; pwd"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        '{"agent_id": "alloc"}',
        "ck",
        "/run/determined/workdir",
    ]


@pytest.mark.parametrize("code", [0, 3])
def test_the_entrypoints_exit_status_comes_back(alloc: Allocation, code: int) -> None:
    assert alloc.run_script(f"exit {code}").returncode == code


def written_to_tmp(alloc: Allocation, name: str) -> list[str]:
    """What the trial wrote to its /tmp as `name`, wherever the agent keeps it."""
    return [path.read_text() for path in alloc.tmp.rglob(name) if path.is_file()]


def test_the_hosts_tmp_shows_through_but_writes_stay_private(alloc: Allocation) -> None:
    host_file = Path(tempfile.mkstemp(dir="/tmp", prefix="resolute-host-")[1])
    host_file.write_text("host")
    inside = f"resolute-inside-{uuid.uuid4().hex}"
    try:
        done = alloc.run_script(f"cat {host_file}; rm {host_file}; echo x > /tmp/{inside}")
        assert (done.returncode, done.stdout) == (0, "host"), done.stderr
        assert host_file.read_text() == "host"  # the trial's rm changed only its own view
        assert not (Path("/tmp") / inside).exists()
        assert written_to_tmp(alloc, inside) == ["x\n"]
    finally:
        host_file.unlink()


def test_an_allocation_kept_under_tmp_works_too() -> None:
    """The bind sources are resolved before /tmp is covered, and an overlay on /tmp can keep
    its own layer under /tmp."""
    require_root_and_unshare()
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="resolute-bootstrap-"))
    try:
        alloc = make_allocation(base)
        (alloc.shared / "checkpoint").write_text("ck")
        done = alloc.run_script(
            "cat /run/determined/info/cluster.json /determined_shared_fs/checkpoint; "
            "echo x > /tmp/inside; pwd"
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == '{"agent_id": "alloc"}ck/run/determined/workdir\n'
        assert written_to_tmp(alloc, "inside") == ["x\n"]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_two_allocations_at_once_each_see_only_their_own(base: Path) -> None:
    shared = base / "barrier"
    shared.mkdir()
    mine = f"resolute-{uuid.uuid4().hex}"
    started = []
    for name in ("one", "two"):
        alloc = make_allocation(base, name)
        # Both wait until both run, so their namespaces exist at the same time.
        script = (
            f"touch /determined_shared_fs/{name}; "
            "while [ $(ls /determined_shared_fs | wc -l) -lt 2 ]; do sleep 0.05; done; "
            f"echo {name} > /tmp/pid_server-1.1; sleep 0.2; "
            "cat /run/determined/info/cluster.json /tmp/pid_server-1.1; "
            f"echo {name} > /run/determined/{mine}"
        )
        argv = ["sh", "-c", script]
        wrapped = bootstrap.wrap(argv, alloc.run, str(shared), alloc.tmp)
        started.append(subprocess.Popen(wrapped, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=30)[0] for p in started]
    assert outputs == ['{"agent_id": "one"}one\n', '{"agent_id": "two"}two\n']
    assert [(base / n / "run" / mine).read_text() for n in ("one", "two")] == ["one\n", "two\n"]
    assert not (Path("/run/determined") / mine).exists()  # nothing leaked onto the host's


# A trial that stops cleanly when asked: it notes the request, finishes what it was doing
# (saving a checkpoint, say) and exits 0.
HANDLES_SIGTERM = """
import signal, time
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
open("ready", "w").close()
deadline = time.monotonic() + 60
while not asked and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.5)
open("stopped", "w").write("SIGTERM" if asked else "timeout")
"""


def test_sigterm_to_the_group_reaches_the_entrypoint(alloc: Allocation) -> None:
    with alloc.start([sys.executable, "-c", HANDLES_SIGTERM]) as wrapper:
        assert wait_for((alloc.run / "workdir" / "ready").exists)
        sent = time.monotonic()
        os.killpg(wrapper.pid, signal.SIGTERM)
        assert wrapper.wait(timeout=10) == 0
        assert time.monotonic() - sent < 5
    assert (alloc.run / "workdir" / "stopped").read_text() == "SIGTERM"


def test_a_process_the_entrypoint_leaves_behind_dies_with_it(alloc: Allocation) -> None:
    sleep = unique_sleep()
    done = alloc.run_script(f"{' '.join(sleep)} & sleep 0.2; kill -0 $! && echo running")
    assert (done.returncode, done.stdout) == (0, "running\n")
    assert wait_for(lambda: not processes(sleep), 5), processes(sleep)


def test_sigkill_of_the_wrapper_group_leaves_nothing_behind(alloc: Allocation) -> None:
    in_group, own_session = unique_sleep(), unique_sleep()
    # One child in the wrapper's process group, one that left it with setsid.
    script = f"{' '.join(in_group)} & setsid {' '.join(own_session)} & wait"
    with alloc.start(["sh", "-c", script]) as wrapper:
        assert wait_for(lambda: processes(in_group) and processes(own_session))
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait(timeout=10)
    assert wait_for(lambda: not processes(in_group) and not processes(own_session), 5)


# -- the entrypoint's interpreter ---------------------------------------------------------------

SYSTEM_PYTHON = "/usr/bin/python3"


def lacks_determined(python: str) -> bool:
    probe = [python, "-c", "import importlib.util as u; print(u.find_spec('determined'))"]
    return (
        Path(python).exists()
        and subprocess.run(probe, capture_output=True, text=True).stdout.strip() == "None"
    )


def problem(alloc: Allocation, path: str, **env: str) -> str | None:
    return bootstrap.interpreter_problem(
        ["python3", "train.py"], {"PATH": path, **env}, alloc.run, "", alloc.tmp
    )


def test_an_interpreter_without_determined_is_named(alloc: Allocation) -> None:
    require(lacks_determined(SYSTEM_PYTHON), f"{SYSTEM_PYTHON} without determined is needed")
    message = problem(alloc, "/usr/bin:/bin")
    assert message is not None and message.startswith(f"{SYSTEM_PYTHON} lacks determined")
    assert "PATH" in message  # how to choose another


def test_a_path_without_python3_says_so(alloc: Allocation) -> None:
    message = problem(alloc, str(alloc.shared))
    assert message is not None and message.startswith("no python3 on the trial's PATH")


def test_an_interpreter_under_tmp_is_usable(alloc: Allocation) -> None:
    require(lacks_determined(SYSTEM_PYTHON), f"{SYSTEM_PYTHON} without determined is needed")
    venv_bin = Path(tempfile.mkdtemp(dir="/tmp", prefix="resolute-venv-")) / "bin"
    try:
        venv_bin.mkdir()
        (venv_bin / "python3").symlink_to(SYSTEM_PYTHON)
        message = problem(alloc, f"{venv_bin}:/usr/bin:/bin")
        assert message is not None and message.startswith(f"{venv_bin}/python3 lacks determined")
    finally:
        shutil.rmtree(venv_bin.parent)


def test_an_interpreter_with_what_the_harness_imports_passes(alloc: Allocation, base: Path) -> None:
    require(Path(SYSTEM_PYTHON).exists(), f"{SYSTEM_PYTHON} is needed")
    packages = base / "site"  # stand-ins: the check only looks the packages up
    for name in ("determined", "torch", "tensorboard"):
        (packages / name).mkdir(parents=True)
        (packages / name / "__init__.py").write_text("")
    assert problem(alloc, "/usr/bin:/bin", PYTHONPATH=str(packages)) is None
    (packages / "torch" / "__init__.py").unlink()
    (packages / "torch").rmdir()
    message = problem(alloc, "/usr/bin:/bin", PYTHONPATH=str(packages))
    assert message is not None and message.startswith(f"{SYSTEM_PYTHON} lacks torch + tensorboard")


def test_the_trial_venv_passes(alloc: Allocation) -> None:
    venv = os.environ.get("DET_TRIAL_VENV", "")
    python = Path(venv) / "bin" / "python3"
    require(bool(venv) and python.exists(), f"DET_TRIAL_VENV ({venv or 'unset'}) has no python3")
    has_torch = (
        subprocess.run(
            [str(python), "-c", "import torch, tensorboard"], capture_output=True
        ).returncode
        == 0
    )
    message = problem(alloc, f"{python.parent}:/usr/bin:/bin")
    if has_torch:
        assert message is None
    else:  # a client-only venv: determined is found, torch is what it lacks
        assert message is not None and message.startswith(f"{python} lacks torch + tensorboard")


# -- found by these tests, fixed in the init script ------------------------------------------


def test_the_entrypoint_can_be_interrupted(alloc: Allocation) -> None:
    done = alloc.run_script(
        f"{sys.executable} -c 'import signal; print(signal.getsignal(signal.SIGINT))'"
    )
    # A shell's background command has SIGINT ignored; the init undoes that.
    assert "default_int_handler" in done.stdout, done.stdout


def test_a_venv_only_path_reaches_the_interpreter_check(alloc: Allocation, base: Path) -> None:
    require(lacks_determined(SYSTEM_PYTHON), f"{SYSTEM_PYTHON} without determined is needed")
    venv_bin = base / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python3").symlink_to(SYSTEM_PYTHON)
    message = problem(alloc, str(venv_bin))
    assert message is not None and message.startswith(f"{venv_bin}/python3 lacks determined")
