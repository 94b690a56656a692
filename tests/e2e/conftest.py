"""Real `det-master` processes, driven by our `det` and by Determined's official client."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import PostgresServer, require
from tests.factories import EXPERIMENT_YAML, TEMPLATE_CONFIG

BIN = Path(sys.executable).parent
OUR_DET = BIN / "det"
DET_MASTER_BIN = BIN / "det-master"
DEFAULT_OFFICIAL = Path(__file__).resolve().parents[2] / ".venv-det" / "bin" / "det"
START_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 60.0

# Variables that would change who the clients log in as or which master they reach.
_CLIENT_ENV_DROP = ("DET_USER", "DET_PASS", "DET_USER_TOKEN", "DET_MASTER", "DET_MASTER_ADDR")


def official_client_path() -> Path | None:
    configured = os.environ.get("DET_OFFICIAL_CLIENT")
    path = Path(configured) if configured else DEFAULT_OFFICIAL
    return path if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unique(prefix: str) -> str:
    """A name no other test (or earlier run against the same master) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _client_env(master_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV_DROP}
    env.update(DET_MASTER=master_url, NO_COLOR="1", COLUMNS="200", PYTHONUNBUFFERED="1")
    env.pop("FORCE_COLOR", None)
    env.update(extra)
    return env


class MasterProcess:
    """One `det-master` subprocess on a free port, its output captured in `log`."""

    def __init__(
        self,
        data_dir: Path,
        db_url: str = "",
        label: str = "master",
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.data_dir = data_dir
        self.db_url = db_url
        self.label = label
        self.extra_env = dict(env or {})
        self.host = host
        self.port = free_port()
        self.agent_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"{data_dir.name}-{label}.log"
        self.scratch = Path(tempfile.mkdtemp(prefix="clients-", dir=data_dir.parent))
        self._proc: subprocess.Popen[bytes] | None = None
        self._token: str | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(DET_MASTER_BIN),
            "--port",
            str(self.port),
            "--agent-port",
            str(self.agent_port),
            "--data-dir",
            str(self.data_dir),
            "--host",
            self.host,
        ]
        if self.db_url:
            command += ["--db-url", self.db_url]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_MASTER_")}
        env["PYTHONUNBUFFERED"] = "1"
        if self.host not in ("127.0.0.1", "localhost"):
            # Tests reach the namespaces' masters with the default users' empty passwords;
            # a real deployment sets passwords instead (the master refuses otherwise).
            env["DET_MASTER_SECURITY__ALLOW_EMPTY_PASSWORDS"] = "true"
        env.update(self.extra_env)
        with self.log.open("ab") as sink:
            self._proc = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        last_error = "no reply yet"
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"det-master ({self.label}) exited with {code} while starting:\n{self.output()}"
                )
            try:
                reply = httpx.get(f"{self.url}/info", timeout=1.0)
                if reply.status_code == 200:
                    return
                last_error = f"GET /info -> {reply.status_code}: {reply.text[:200]}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"det-master ({self.label}) not ready after {timeout:.0f} s ({last_error}):\n"
            f"{self.output()}"
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    @property
    def agent_address(self) -> str:
        """What `det-agent --master` takes."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{host}:{self.agent_port}"

    @property
    def join_token_file(self) -> Path:
        return self.data_dir / "agent_join_token"

    def wait_for(self, what: str, check: Any, timeout: float = 30.0, interval: float = 0.2) -> Any:
        """Poll `check()` until it returns something truthy; fail naming `what`."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(
            f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}\n"
            f"--- master log ---\n{self.output()}"
        )

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def output(self, tail: int = 8000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-tail:]
        except OSError:
            return "(no master log)"

    # -- clients ---------------------------------------------------------------------------

    def det(
        self, *args: str, input: str | None = None, timeout: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run OUR `det` with DET_MASTER pointing at this master."""
        return run_our_det(self.url, *args, input=input, timeout=timeout, cwd=self.scratch)

    def http(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request straight to the master as `determined`: a fast way to look behind the
        clients at what was stored (not the code under test)."""
        if self._token is None:
            self._token = self._login()
        headers = {"Authorization": f"Bearer {self._token}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """`http()` that must answer 200; returns the JSON body."""
        reply = self.http(method, path, **kwargs)
        assert reply.status_code == 200, f"{method} {path} -> {reply.status_code}: {reply.text}"
        return reply.json()

    def _login(self) -> str:
        body = {"username": "determined", "password": ""}
        reply = httpx.post(f"{self.url}/api/v1/auth/login", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        token: str = reply.json()["token"]
        # Wait until the token works, so these checks never trip over a slow commit.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            me = httpx.get(
                f"{self.url}/api/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=30
            )
            if me.status_code == 200:
                break
            time.sleep(0.05)
        return token

    def official(
        self, *args: str, input: str | None = None, timeout: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run Determined's official `det` with a token cache of its own (fresh XDG_CONFIG_HOME)."""
        path = official_client_path()
        if path is None:
            require(False, "official det client not installed: run `make official-client`")
            raise AssertionError("unreachable")  # require() skips or fails
        config_home = tempfile.mkdtemp(prefix="xdg-", dir=self.scratch)
        env = _client_env(self.url, XDG_CONFIG_HOME=config_home)
        env.pop("DET_DEBUG_CONFIG_PATH", None)
        return subprocess.run(
            [str(path), *args],
            input=input,
            capture_output=True,
            text=True,
            env=env,
            cwd=self.scratch,
            timeout=timeout,
            check=False,
        )


def run_our_det(
    master_url: str,
    *args: str,
    input: str | None = None,
    timeout: float = COMMAND_TIMEOUT_S,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run OUR `det` (the one installed beside this interpreter) against `master_url`."""
    # Its own config directory: a login stored by `det user login` elsewhere (the
    # developer's own) must not decide who the test acts as.
    config = {"XDG_CONFIG_HOME": str(cwd / ".config")} if cwd is not None else {}
    return subprocess.run(
        [str(OUR_DET), *args],
        input=input,
        capture_output=True,
        text=True,
        env=_client_env(master_url, **config),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def describe_run(result: subprocess.CompletedProcess[str]) -> str:
    """For assertion messages: the command, its status and both streams."""
    return (
        f"$ {' '.join(str(a) for a in result.args)}\n"
        f"exit {result.returncode}\n--- stdout ---\n{result.stdout}\n"
        f"--- stderr ---\n{result.stderr}"
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, describe_run(result)
    return result


def lines(text: str) -> list[str]:
    """Lines as a person sees them: \\r-overwritten progress text split off, blanks dropped."""
    return [line.strip() for line in text.splitlines() if line.strip()]


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@contextmanager
def running_master(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    label: str,
    env: dict[str, str] | None = None,
) -> Iterator[MasterProcess]:
    """A det-master process on the backend of `request.param`, stopped afterwards."""
    backend: str = request.param
    db_url = ""
    if backend == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        db_url = server.new_database()
    data_dir = tmp_path_factory.mktemp(f"{label}-{backend}") / "data"
    proc = MasterProcess(data_dir, db_url, label=f"{label}-{backend}", env=env)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(proc.scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def _shared_masters() -> Iterator[tuple[ExitStack, dict[str, MasterProcess]]]:
    """The shared masters started so far, by backend, stopped at the end of the run (not
    when a pytest-xdist worker's next file wants the other backend)."""
    with ExitStack() as stack:
        yield stack, {}


@pytest.fixture(scope="session", params=BACKENDS)
def master(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    _shared_masters: tuple[ExitStack, dict[str, MasterProcess]],
) -> MasterProcess:
    """One master per backend for the e2e run; tests share it, so names must be unique."""
    stack, started = _shared_masters
    backend: str = request.param
    if backend not in started:
        started[backend] = stack.enter_context(running_master(request, tmp_path_factory, "master"))
    return started[backend]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """An experiment config, a template file and a model directory, as a user would have them."""
    config = tmp_path / "config.yaml"
    config.write_text(EXPERIMENT_YAML, encoding="utf-8")
    template = tmp_path / "template.yaml"
    template.write_text(yaml.safe_dump(TEMPLATE_CONFIG, sort_keys=False), encoding="utf-8")
    model_dir = tmp_path / "model_dir"
    model_dir.mkdir()
    (model_dir / "train.py").write_text("print('training')\n", encoding="utf-8")
    (model_dir / "lib").mkdir()
    (model_dir / "lib" / "util.py").write_text("X = 1\n", encoding="utf-8")
    return {"config": config, "template": template, "model_dir": model_dir}
