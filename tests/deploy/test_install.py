"""deploy/Dockerfile's images, built the way Docker would build them but without Docker (no
registry image can be pulled here): exactly the files its COPY lines name, made into a wheel,
installed by its `pip install` lines into fresh virtualenvs, one per stage. The agent image
must run ranks that import the training library and carry none of the master's web stack;
the master image must migrate with the Alembic history in the wheel."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from agent.settings import CONFIG_FILE_ENV as AGENT_CONFIG_ENV
from agent.settings import AgentSettings
from harness.cluster import AgentProcess
from master.settings import CONFIG_FILE_ENV as MASTER_CONFIG_ENV
from master.settings import MasterSettings
from tests.deploy.files import (
    ROOT,
    Stage,
    chain,
    lay_out_context,
    parse_dockerfile,
    setting_of,
)
from tests.e2e import conftest as e2e
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment

PIP_TIMEOUT_S = 300
PIP = [sys.executable, "-m", "pip"]
# What only the master needs: none of it may be importable on an agent-only node.
WEB_STACK = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "aiosqlite", "asyncpg")


@dataclass
class Image:
    stage: str
    wheel: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
        env.pop("PYTHONPATH", None)  # only what the image installed
        # Run from the venv, never the checkout, whose packages would shadow the image's.
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, env=env, cwd=self.venv
        )


def _checked(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    assert result.returncode == 0, (
        f"{what} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )


def build_wheel(stages: list[Stage], where: Path) -> Path:
    """The wheel of what the COPY lines of `stages` put in the WORKDIR."""
    context = where / "workdir"
    lay_out_context(stages, ROOT, context)
    if importlib.util.find_spec("hatchling") is None:
        pytest.fail("hatchling is not installed in this venv: `make install` adds it (test group)")
    # The build backend comes from this venv, so the wheel builds without a download.
    build = ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(where / "dist")]
    _checked([*PIP, *build, str(context)], "building the wheel from the Dockerfile's files")
    (wheel,) = (where / "dist").glob("resolute-*.whl")
    return wheel


# uv resolves and installs what the Dockerfile's `pip install` lines name in seconds where
# pip took most of a minute for the two images; what is installed is the same (uv installs
# no bytecode, and the tests below compile only what they import).
UV = Path(sys.executable).parent / "uv"


def install_image(stages: list[Stage], wheel: Path, where: Path) -> Image:
    """A bare venv (never --system-site-packages) into which the `pip install` lines of
    `stages` are run, base first, with `wheel` standing for the WORKDIR."""
    venv = where / "venv"
    _checked([sys.executable, "-m", "venv", "--without-pip", str(venv)], "python -m venv")
    for specs in (s for st in stages for s in st.pip_installs):
        for spec in specs:
            assert spec.startswith("."), f"Dockerfile: pip install {spec}: not this project"
            python, requirement = str(venv / "bin" / "python"), f"{wheel}{spec[1:]}"
            if UV.is_file():
                install = [str(UV), "pip", "install", "-q", "--python", python, requirement]
            else:
                install = [*PIP, "--python", python, "install", "-q", "--no-compile", requirement]
            _checked(install, f"pip install {spec}")
    return Image(stages[-1].name, wheel, venv)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Image]:
    """Each stage's image. Stages whose COPY lines lay out the same WORKDIR (the master is
    built FROM the agent and copies nothing more) share one wheel, built once."""
    dockerfile = parse_dockerfile()
    wheels: dict[str, Path] = {}
    made = {}
    for name in ("agent", "master"):
        stages = chain(dockerfile, name)
        layout = repr([stage.copies for stage in stages])
        if layout not in wheels:
            wheels[layout] = build_wheel(stages, tmp_path_factory.mktemp(f"wheel-{name}"))
        made[name] = install_image(stages, wheels[layout], tmp_path_factory.mktemp(f"image-{name}"))
    return made


def test_the_wheel_from_the_dockerfiles_files_holds_every_package(
    images: dict[str, Image],
) -> None:
    names = set(zipfile.ZipFile(images["agent"].wheel).namelist())
    for needed in (
        "resolute/__init__.py",
        "resolute/storage.py",
        "agent/main.py",
        "cli/main.py",
        "master/main.py",
        "master/_migrations/env.py",
        "resolute_proto/agent/v1/agent_pb2.py",
    ):
        assert needed in names, f"the image's wheel lacks {needed}: a COPY line is missing"
    # Every source file of every package pyproject.toml ships, not only those above.
    hatch = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    sources = {pkg: Path(pkg).name for pkg in hatch["targets"]["wheel"]["packages"]}
    sources.update(hatch["targets"]["wheel"]["force-include"])
    for source, inside in sources.items():
        for path in (ROOT / source).rglob("*.py"):
            name = f"{inside}/{path.relative_to(ROOT / source).as_posix()}"
            assert name in names, f"the image's wheel lacks {name} (from {source}/)"


def test_the_agent_image_runs_the_agent_and_the_library_without_the_web_stack(
    images: dict[str, Image],
) -> None:
    image = images["agent"]
    assert parse_dockerfile()["agent"].entrypoint == ["det-agent"]
    helped = image.run(str(image.bin / "det-agent"), "--help")
    assert helped.returncode == 0 and "det-agent" in helped.stdout, helped.stderr
    assert image.run(str(image.bin / "det"), "--help").returncode == 0

    probe = (
        "import json, sys, agent.main, resolute, resolute.storage; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    imported = image.run(str(image.bin / "python"), "-c", probe)
    assert imported.returncode == 0, imported.stderr
    loaded = {m.split(".")[0] for m in json.loads(imported.stdout)}
    assert not loaded & {"master", *WEB_STACK}
    for module in WEB_STACK:
        absent = image.run(str(image.bin / "python"), "-c", f"import {module}")
        assert "ModuleNotFoundError" in absent.stderr, f"{module} is installed on an agent node"

    # det-master says what is missing instead of a traceback.
    master = image.run(str(image.bin / "det-master"))
    assert master.returncode == 1
    assert "master extra, e.g. pip install '.[master]'" in master.stderr, master.stderr
    assert "fastapi" in master.stderr and "Traceback" not in master.stderr


def test_the_master_image_migrates_with_the_history_in_its_wheel(
    images: dict[str, Image], tmp_path: Path
) -> None:
    image = images["master"]
    assert parse_dockerfile()["master"].entrypoint == ["det-master"]
    migrated = image.run(str(image.bin / "det-master"), "migrate", "--data-dir", str(tmp_path))
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "database is at the newest schema" in migrated.stdout + migrated.stderr
    assert (tmp_path / "resolute.db").is_file()


LIBRARY_SCRIPT = """
import resolute

print("LIBRARY " + resolute.__file__)
with resolute.init() as ctx:
    for step in (1, 2, 3):
        ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": 1.0 / step})
"""


@pytest.fixture
def image_master(images: dict[str, Image], tmp_path: Path) -> Iterator[e2e.MasterProcess]:
    program = [str(images["master"].bin / "det-master")]
    proc = e2e.MasterProcess(tmp_path / "master-data", label="image-master", program=program)
    proc.start()
    yield proc
    proc.stop()


@pytest.mark.e2e
def test_the_images_run_a_trial_that_reports_through_the_agent_images_library(
    images: dict[str, Image], image_master: e2e.MasterProcess, tmp_path: Path
) -> None:
    """docker-compose.yml's pair: the master image's det-master, the agent image's det-agent,
    whose ranks run on the agent image's interpreter and import resolute from it."""
    agent = AgentProcess(image_master, "image-agent", tmp_path / "agent", slots=1)
    agent.command[0] = str(images["agent"].bin / "det-agent")
    agent.start()
    try:
        agent.wait_connected()
        config, model = write_experiment(tmp_path / "exp", LIBRARY_SCRIPT)
        experiment_id = create_experiment(image_master, config, model)
        trial = wait_trial_state(image_master, experiment_id, {"COMPLETED", "ERROR"})
        logs = trial_logs(image_master, trial["id"])
        assert trial["state"] == "COMPLETED", logs
    finally:
        agent.stop()
    (library,) = re.findall(r"LIBRARY (\S+)", logs)
    assert Path(library).is_relative_to(images["agent"].venv), library
    rows = image_master.api("GET", f"/api/v1/trials/{trial['id']}/metrics?group=training")
    assert [r["metrics"]["loss"] for r in rows["metrics"]] == [1.0, 0.5, 1 / 3]


def test_compose_builds_each_service_from_the_stage_it_runs() -> None:
    stages = parse_dockerfile()
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for service, entrypoint in (("master", "det-master"), ("agent", "det-agent")):
        build = services[service]["build"]
        assert build["dockerfile"] == "deploy/Dockerfile"
        assert (ROOT / build["context"] / build["dockerfile"]).is_file()
        stage = stages[build["target"]]
        assert services[service].get("entrypoint", stage.entrypoint) == [entrypoint]
    # The agent image installs the project without extras: no web stack on a node.
    installs = [spec for s in chain(stages, "agent") for specs in s.pip_installs for spec in specs]
    assert installs == ["."]


def test_every_det_variable_of_the_deployment_files_is_a_setting() -> None:
    """pydantic-settings ignores an unknown DET_AGENT_* variable: a typo would go unseen."""
    stages = parse_dockerfile()
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    variables = {k: f"Dockerfile stage {s.name}" for s in stages.values() for k in s.env}
    for name, service in services.items():
        variables.update({k: f"docker-compose.yml {name}" for k in service.get("environment", {})})
    for variable, where in variables.items():
        if variable.startswith("DET_"):
            assert (
                variable in (MASTER_CONFIG_ENV, AGENT_CONFIG_ENV)
                or setting_of(MasterSettings, "DET_MASTER_", variable)
                or setting_of(AgentSettings, "DET_AGENT_", variable)
            ), f"{where}: {variable} is no master or agent setting"
