"""The README's walkthroughs, run as a newcomer runs them (issue 28): each block marked
`<!-- walkthrough: NAME -->` is run by bash, word for word and in the README's order, from
a directory laid out like a fresh clone, against scripts/local-cluster.sh started there as
`make run` starts it (relative DATA_DIR, an agent with one CPU slot per core).

Two things differ from a person's terminal, and only these: the master's port (the README's
`127.0.0.1:8080` becomes a free port, so parallel test workers do not collide), and the
clone's `.venv`, `.venv-trial` and `examples` are links to this checkout's (the README asks
for `make torch` and `make trial-venv` beforehand; the suite's venvs have both).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.cluster import Process, free_port, wait_until
from tests.e2e.conftest import client_env, describe_run
from tests.e2e.test_determined_workloads import trial_venv

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README_PORT = "127.0.0.1:8080"
MARKED_BLOCK = re.compile(r"<!-- walkthrough: (\S+) -->\n```sh\n(.*?)```", re.DOTALL)
# What each walkthrough may take on two loaded cores (pytest's own timeout is 300 s).
WALKTHROUGH_TIMEOUT_S = 240


def walkthroughs() -> list[tuple[str, str]]:
    return MARKED_BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_readme_marks_its_walkthroughs() -> None:
    # The test below runs what is marked: a walkthrough that loses its marker would stop
    # being run without anyone noticing.
    names = [name for name, _ in walkthroughs()]
    assert names == ["first-experiment", "train", "determined", "asha"], names
    for name, script in walkthroughs():
        assert README_PORT in script, f"walkthrough {name} does not set DET_MASTER"


class Clone:
    def __init__(self, path: Path, port: int) -> None:
        self.path, self.port = path, port
        self.url = f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clone]:
    path = tmp_path_factory.mktemp("newcomer")
    (path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    (path / ".venv-trial").symlink_to(trial_venv())
    (path / "examples").symlink_to(ROOT / "examples")
    (path / "scripts").symlink_to(ROOT / "scripts")
    port, agent_port = free_port(), free_port()
    cluster = Process(
        ["bash", "scripts/local-cluster.sh"],
        path / "make-run.log",
        # What `make run` passes, but the ports.
        {"BIN": ".venv/bin", "PORT": str(port), "AGENT_PORT": str(agent_port), "DATA_DIR": "data"},
        cwd=path,
    )
    cluster.launch()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            def agent_up() -> bool:
                cluster.check_running("scripts/local-cluster.sh")
                try:
                    token = http.post(
                        "/api/v1/auth/login", json={"username": "determined", "password": ""}
                    ).json()["token"]
                    agents = http.get(
                        "/api/v1/agents", headers={"Authorization": f"Bearer {token}"}
                    ).json()["agents"]
                except (httpx.HTTPError, KeyError, ValueError):
                    return False
                return bool(agents)

            wait_until("make run's master and agent", agent_up, 90, 0.2, cluster.output)
        yield Clone(path, port)
    finally:
        cluster.stop()


@pytest.mark.parametrize("name", ["first-experiment", "train", "determined", "asha"])
def test_walkthrough_runs_as_written(clone: Clone, name: str) -> None:
    script = dict(walkthroughs())[name].replace(README_PORT, f"127.0.0.1:{clone.port}")
    env = client_env(clone.url, HOME=str(clone.path / "home"))
    env.pop("DET_MASTER")  # the walkthrough sets it, as a reader does
    env.pop("VIRTUAL_ENV", None)
    (clone.path / "home").mkdir(exist_ok=True)
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=clone.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WALKTHROUGH_TIMEOUT_S,
        check=False,
    )
    assert ran.returncode == 0, f"walkthrough {name} failed:\n{describe_run(ran)}"
    check = CHECKS[name]
    check(ran.stdout)


def _first_experiment(out: str) -> None:
    assert "ended: COMPLETED" in out, out
    # What the walkthrough's text promises: the trials say they never trained.
    assert "exited 0 after 0 of 1,000 batches" in out, out
    assert "hello from a trial" in out, out


def _train(out: str) -> None:
    assert "FINISHED steps=40" in out, out
    assert "ended: COMPLETED" in out, out
    assert re.search(r"validation_loss", out), out


def _determined(out: str) -> None:
    assert "ended: COMPLETED" in out, out
    assert "per_agent" in out, out
    assert "validation_loss" in out, out


def _asha(out: str) -> None:
    assert "ended: COMPLETED" in out, out
    assert re.search(r"stopped by the searcher at rung \d", out), out


CHECKS = {
    "first-experiment": _first_experiment,
    "train": _train,
    "determined": _determined,
    "asha": _asha,
}
