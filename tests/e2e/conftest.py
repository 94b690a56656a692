"""Real `det-master` processes, driven by our `det` and by Determined's official client."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import cluster as harness
from tests.conftest import PostgresServer, require
from tests.factories import EXPERIMENT_YAML, TEMPLATE_CONFIG

OUR_DET = harness.BIN / "det"
DEFAULT_OFFICIAL = Path(__file__).resolve().parents[2] / ".venv-det" / "bin" / "det"
# A det command on a loaded machine at half speed: seconds; a minute is far beyond it.
COMMAND_TIMEOUT_S = 120.0

# Variables that would change who the clients log in as or which master they reach.
_CLIENT_ENV_DROP = ("DET_USER", "DET_PASS", "DET_USER_TOKEN", "DET_MASTER", "DET_MASTER_ADDR")


def official_client_path() -> Path | None:
    configured = os.environ.get("DET_OFFICIAL_CLIENT")
    path = Path(configured) if configured else DEFAULT_OFFICIAL
    return path if path.is_file() and os.access(path, os.X_OK) else None


def unique(prefix: str) -> str:
    """A name no other test (or earlier run against the same master) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def client_env(master_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV_DROP}
    env.update(DET_MASTER=master_url, NO_COLOR="1", COLUMNS="200", PYTHONUNBUFFERED="1")
    env.pop("FORCE_COLOR", None)
    env.update(extra)
    return env


class MasterProcess(harness.MasterProcess):
    """The harness's det-master, with both det clients run against it from a scratch
    directory of its own."""

    def __init__(
        self,
        data_dir: Path,
        db_url: str = "",
        label: str = "master",
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        **kwargs: Any,
    ) -> None:
        super().__init__(data_dir, db_url, label, env, host, **kwargs)
        self.scratch = Path(tempfile.mkdtemp(prefix="clients-", dir=data_dir.parent))

    def det(
        self,
        *args: str,
        input: str | None = None,
        timeout: float = COMMAND_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run OUR `det` with DET_MASTER pointing at this master (`env`: more variables)."""
        return run_our_det(self.url, *args, input=input, timeout=timeout, cwd=self.scratch, env=env)

    def official(
        self, *args: str, input: str | None = None, timeout: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run Determined's official `det` with a token cache of its own (fresh XDG_CONFIG_HOME)."""
        path = official_client_path()
        if path is None:
            require(False, "official det client not installed: run `make official-client`")
            raise AssertionError("unreachable")  # require() skips or fails
        config_home = tempfile.mkdtemp(prefix="xdg-", dir=self.scratch)
        env = client_env(self.url, XDG_CONFIG_HOME=config_home)
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
    env: dict[str, str] | None = None,
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
        env=client_env(master_url, **config, **(env or {})),
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


# The e2e tests drive real processes through the REST API and both CLIs, whose behaviour does
# not depend on the database: tests/api runs every route on both backends, in process. So the
# masters these tests share run on Postgres, as production does, once; the clusters that
# files start for themselves (faults, training, tasks, the browser) run on SQLite, as
# `make run` does, and the tests of the database itself (outages, migrations, standby
# masters) choose theirs.
BACKENDS = [pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


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
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(proc.scratch, ignore_errors=True)


@pytest.fixture(scope="session", params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    """One master for the e2e run (on Postgres: see BACKENDS); tests share it, so names
    must be unique."""
    with running_master(request, tmp_path_factory, "master") as proc:
        yield proc


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
