"""Real `det-master` and `det-agent` processes for tests and benchmarks.

Each process runs in a session of its own with its output in a log file; `start()` returns
once it is ready (the master answers `/info`), and `stop()` ends it and whatever is left of
its process group, so a failing test leaves nothing running. Every wait polls a condition
under a deadline sized for a loaded machine at half speed, never a fixed sleep.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import httpx

from agent import ports

BIN = Path(sys.executable).parent
DET_MASTER_BIN = BIN / "det-master"
DET_AGENT_BIN = BIN / "det-agent"
# A master starts in 1-3 s on an idle 2-core machine; a loaded one at half speed, with other
# masters migrating beside it, has been seen to take over 15 s.
START_TIMEOUT_S = 60.0

T = TypeVar("T")


# Ports for test servers: below the kernel's ephemeral range (32768-60999 by default), so an
# outgoing connection cannot take one between free_port() and the server's bind. Each
# xdist worker has a slice of its own, and a worker never hands out a port twice in a row.
_TEST_PORTS = (10000, 19999)
# Agents hand trials ports from their --port-range (agent/ports.py): each agent the harness
# starts gets a block of its own there, so agents sharing this host never pick one port.
_AGENT_PORTS = (20000, 32767)
_AGENT_BLOCK = 64
_handed: collections.deque[int] = collections.deque(maxlen=500)
_agent_blocks = itertools.count()


def worker_slice(first: int, last: int) -> tuple[int, int]:
    """This test worker's share of first..last (all of it outside xdist)."""
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % workers if worker.isdigit() else 0
    size = (last - first + 1) // workers
    return first + index * size, first + (index + 1) * size - 1


def free_port() -> int:
    """A TCP port nothing holds now, from this test worker's slice of 10000-19999."""
    first, last = worker_slice(*_TEST_PORTS)
    [port] = ports.pick_ports(1, list(range(first, last + 1)), taken=set(_handed))
    _handed.append(port)
    return port


def agent_port_range() -> str:
    """A --port-range no other agent this worker started lately has (blocks of 64, in turn)."""
    first, last = worker_slice(*_AGENT_PORTS)
    blocks = (last - first + 1) // _AGENT_BLOCK
    start = first + (next(_agent_blocks) % blocks) * _AGENT_BLOCK
    return f"{start}-{start + _AGENT_BLOCK - 1}"


def wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout: float,
    interval: float = 0.2,
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """Poll `check()` until it returns something truthy and return that; past `timeout`
    fail naming `what`, with the last value seen and `diagnostics()` (logs, say)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    details = f"\n{diagnostics()}" if diagnostics is not None else ""
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}{details}"
    )


def stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float = 20.0) -> None:
    """SIGTERM, SIGKILL after `grace_s`, then SIGKILL to what is left of its process group
    (the processes here lead their own sessions, so the group is theirs alone)."""
    if proc is None:
        return
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    finally:  # whatever the leader did, nothing of its group outlives it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def log_tail(log: Path, chars: int = 8000) -> str:
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return f"(no {log.name})"


class Process:
    """A subprocess in a session of its own, stdout and stderr appended to `log`. Its
    environment is ours without the DET_* variables of `drop_env_prefixes`, plus `env`."""

    drop_env_prefixes: tuple[str, ...] = ("DET_",)

    def __init__(
        self,
        command: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.command = list(command)
        self.log = log
        self.extra_env = dict(env or {})
        self.cwd = cwd  # None: the caller's
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(self.drop_env_prefixes)}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(
                self.command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.command[0]} was never started"
        return self.proc.pid

    def check_running(self, what: str, when: str = "") -> None:
        """Fail at once, with the log, if the process has exited ("`what` exited with 2
        `when`")."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {self.proc.returncode}{when}:\n{self.output()}")

    def send(self, sig: int) -> None:
        """Signal the process itself, not its group."""
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process alone and reap it: what it started must die with it by itself."""
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=20)

    def stop(self, grace_s: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, grace_s)

    def output(self, tail: int = 8000) -> str:
        return log_tail(self.log, tail)


# uvicorn closes a connection idle for 5 s (timeout_keep_alive); httpx keeps one for 5 s
# too, so a request sent just then met a connection the master was closing ("Server
# disconnected without sending a response", seen once in a CI run). The harness's clients
# let idle connections go well before the master does.
KEEP_ALIVE_LIMITS = httpx.Limits(keepalive_expiry=2.0)


# The environment variable that hands MasterProcess.sqlite_schema_dir to a subprocess.
SQLITE_SCHEMA_ENV = "RESOLUTE_SQLITE_SCHEMA_DIR"


class MasterProcess(Process):
    """One `det-master` on free ports over `data_dir` (SQLite there, or `db_url`)."""

    drop_env_prefixes = ("DET_MASTER_",)
    # Where a migrated SQLite database is kept for new masters to start from (made there by
    # `det-master migrate` on first use): creating the schema costs a master about a second
    # of CPU, the copy nothing. The test suite sets it, and hands it to the benchmarks its
    # smoke tests run (SQLITE_SCHEMA_ENV); None (a benchmark run by hand): each migrates.
    sqlite_schema_dir: ClassVar[Path | None] = (
        Path(os.environ[SQLITE_SCHEMA_ENV]) if os.environ.get(SQLITE_SCHEMA_ENV) else None
    )

    def __init__(
        self,
        data_dir: Path,
        db_url: str = "",
        label: str = "master",
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        *,
        program: Sequence[str] = (),
        scheme: str = "http",
        verify: Any = True,
    ) -> None:
        self.data_dir = data_dir
        self.db_url = db_url
        self.label = label
        self.host = host
        self.port = free_port()
        self.agent_port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.verify = verify  # what httpx checks the master's certificate with
        self._token: str | None = None
        # One kept-alive client for every request of the harness: a new httpx client costs
        # about 40 ms of CPU (its SSL context), which polls every 0.2 s made a fifth of a
        # core per waiting test.
        self._client: httpx.Client | None = None
        super().__init__([], data_dir.parent / f"{data_dir.name}-{label}.log", env)
        self.program = list(program) or [str(DET_MASTER_BIN)]

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.db_url and self.program == [str(DET_MASTER_BIN)]:
            self._seed_sqlite_schema()
        self.command = [
            *self.program,
            *("--port", str(self.port), "--agent-port", str(self.agent_port)),
            *("--data-dir", str(self.data_dir), "--host", self.host),
        ]
        if self.db_url:
            self.command += ["--db-url", self.db_url]
        self._forget_client()
        if self.host not in ("127.0.0.1", "localhost"):
            # Tests reach such masters with the default users' empty passwords; a real
            # deployment sets passwords instead (the master refuses otherwise).
            self.extra_env.setdefault("DET_MASTER_SECURITY__ALLOW_EMPTY_PASSWORDS", "true")
        self._token = None
        self.launch()
        last = "no reply yet"

        def ready() -> bool:
            nonlocal last
            self.check_running(f"det-master ({self.label})", " while starting")
            try:
                reply = self.session.get("/info", timeout=2.0)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                return False
            last = f"GET /info -> {reply.status_code}: {reply.text[:200]}"
            return reply.status_code == 200

        try:
            wait_until(f"det-master ({self.label}) to answer /info", ready, timeout, 0.1)
        except AssertionError:
            self.stop()
            raise RuntimeError(
                f"det-master ({self.label}) not ready after {timeout:.0f} s ({last}):\n"
                f"{self.output()}"
            ) from None
        except RuntimeError:  # it exited while starting: what it started goes too
            self.stop()
            raise

    @classmethod
    def migrated_sqlite_schema(cls) -> Path | None:
        """The migrated database new SQLite masters copy, made on first use; None when
        sqlite_schema_dir is unset."""
        template_dir = cls.sqlite_schema_dir
        if template_dir is None:
            return None
        template = template_dir / "resolute.db"
        if not template.exists():
            template_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [str(DET_MASTER_BIN), "migrate", "--data-dir", str(template_dir)],
                check=True,
                capture_output=True,
                timeout=START_TIMEOUT_S,
            )
        return template

    def _seed_sqlite_schema(self) -> None:
        database = self.data_dir / "resolute.db"  # where det-master keeps SQLite
        if self.sqlite_schema_dir is None or database.exists():
            return
        template = self.migrated_sqlite_schema()
        assert template is not None
        shutil.copyfile(template, database)

    @property
    def agent_address(self) -> str:
        """What `det-agent --master` takes."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{host}:{self.agent_port}"

    @property
    def join_token_file(self) -> Path:
        return self.data_dir / "agent_join_token"

    @property
    def join_token(self) -> str:
        return self.join_token_file.read_text().strip()

    def wait_for(
        self, what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2
    ) -> Any:
        """`wait_until` with this master's log as the diagnostics."""
        return wait_until(
            what, check, timeout, interval, lambda: f"--- master log ---\n{self.output()}"
        )

    @property
    def session(self) -> httpx.Client:
        """The harness's own client for this master (no token), made on first use. Tests
        share it, so it keeps no cookies: a sign-in one test makes through it must not
        authenticate another test's request."""
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.url,
                timeout=60,
                verify=self.verify,
                cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
                limits=KEEP_ALIVE_LIMITS,
            )
        return self._client

    def _forget_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def stop(self, grace_s: float = 20.0) -> None:
        # The client's kept-alive connection goes first: a stopping master waits for open
        # connections, and over TLS an idle one it closes stays open until this client
        # answers the close (it never would): 5 s of uvicorn's grace per stop.
        self._forget_client()
        super().stop(grace_s)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        super().kill(sig)
        self._forget_client()

    def login(self, username: str = "determined", password: str = "") -> str:
        reply = self.session.post(
            "/api/v1/auth/login", json={"username": username, "password": password}
        )
        assert reply.status_code == 200, f"login as {username}: {reply.status_code} {reply.text}"
        token: str = reply.json()["token"]
        return token

    def http(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request straight to the master as `determined`: a fast way to look behind the
        clients at what was stored (not the code under test)."""
        if self._token is None:
            self._token = self.login()
        headers = {"Authorization": f"Bearer {self._token}", **kwargs.pop("headers", {})}
        return self.session.request(method, path, headers=headers, **kwargs)

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """`http()` that must answer 200; returns the JSON body."""
        reply = self.http(method, path, **kwargs)
        assert reply.status_code == 200, f"{method} {path} -> {reply.status_code}: {reply.text}"
        return reply.json()

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """A kept-alive client signed in as `determined` (or with `token`)."""
        token = token or self.login()
        kwargs.setdefault("limits", KEEP_ALIVE_LIMITS)
        return httpx.Client(
            base_url=self.url,
            verify=self.verify,
            timeout=60,
            headers={"Authorization": f"Bearer {token}"},
            **kwargs,
        )


class AgentProcess(Process):
    """One `det-agent` of `master`, optionally inside a network namespace (`netns`)."""

    def __init__(
        self,
        master: MasterProcess,
        agent_id: str,
        work_dir: Path,
        *,
        slots: int | None = 2,
        join_token: str | None = None,
        master_address: str | None = None,
        netns: str | None = None,
        pool: str | None = None,
        args: Sequence[str] = (),
        ranks_as_root: bool = True,
    ) -> None:
        """`ranks_as_root`: an agent running as root keeps its ranks as root, explicitly
        (`--rank-user root`), instead of its default, a uid of their own per allocation.
        The suite's work dirs and checkpoints live under pytest's 0700 directories and its
        interpreter may sit under root's 0700 home, which no such uid can reach; the tests
        of that default (tests/e2e/test_rank_isolation.py) pass False."""
        self.master = master
        self.id = agent_id
        self.work_dir = work_dir
        command = [
            str(DET_AGENT_BIN),
            *("--master", master_address or master.agent_address),
            *("--id", agent_id, "--work-dir", str(work_dir)),
        ]
        if slots is not None:
            command += ["--artificial-slots", str(slots)]
        if pool is not None:
            command += ["--resource-pool", pool]
        if join_token is None:
            command += ["--join-token-file", str(master.join_token_file)]
        elif join_token:
            command += ["--join-token", join_token]
        command += list(args)
        rank_options = ("--rank-user", "--rank-uid-range")
        if ranks_as_root and os.geteuid() == 0 and not any(a in args for a in rank_options):
            command += ["--rank-user", "root"]
        if "--port-range" not in args:
            command += ["--port-range", agent_port_range()]
        if netns is not None:
            # `ip netns exec` execs the agent: the pid we hold is the agent's own.
            command = ["ip", "netns", "exec", netns, *command]
        super().__init__(command, work_dir.parent / f"{work_dir.name}.log")

    def start(self) -> AgentProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.launch()
        return self

    def wait_connected(self, timeout: float = 60.0) -> dict[str, Any]:
        def connected() -> dict[str, Any] | None:
            self.check_running(f"agent {self.id}")
            reply = self.master.http("GET", f"/api/v1/agents/{self.id}")
            if reply.status_code != 200:
                return None
            agent: dict[str, Any] = reply.json()["agent"]
            return agent if agent.get("connected") else None

        return wait_until(
            f"agent {self.id} to connect",
            connected,
            timeout,
            diagnostics=lambda: (
                f"--- agent log ---\n{self.output()}\n--- master log ---\n{self.master.output()}"
            ),
        )
