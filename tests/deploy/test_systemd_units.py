"""deploy/resolute-master.service and deploy/resolute-agent.service: what systemd itself says
of them (`systemd-analyze verify`, where it is installed), and the choices the README makes
for them: the master as its own user in a read-only system, the agent as root starting ranks
as a uid of their own per allocation, the join token read from a root-only file."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agent.settings import CONFIG_FILE_ENV as AGENT_CONFIG_ENV
from agent.settings import AgentSettings
from master.settings import CONFIG_FILE_ENV as MASTER_CONFIG_ENV
from master.settings import MasterSettings
from tests.deploy.files import ROOT, setting_of

UNITS = {"master": ROOT / "deploy" / "resolute-master.service",
         "agent": ROOT / "deploy" / "resolute-agent.service"}  # fmt: skip
INSTALL_BIN = "/opt/resolute/venv/bin/"


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Sections of (key, value) pairs in order; systemd keys may repeat (Environment=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert current is not None and sep, f"{path.name}:{number}: not KEY=VALUE in a section"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], key: str) -> list[str]:
    return [v for k, v in unit.get("Service", []) if k == key]


def one(unit: dict[str, list[tuple[str, str]]], key: str) -> str | None:
    found = values(unit, key)
    assert len(found) <= 1, f"{key}= given {len(found)} times"
    return found[0] if found else None


def environment(unit: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    pairs = (item.partition("=") for line in values(unit, "Environment") for item in line.split())
    return {key: value for key, _, value in pairs}


@pytest.mark.parametrize("name", UNITS)
def test_each_unit_starts_the_packages_console_script(name: str) -> None:
    unit = parse_unit(UNITS[name])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    exec_start = one(unit, "ExecStart")
    assert exec_start is not None and exec_start.startswith(INSTALL_BIN), exec_start
    program = exec_start.removeprefix(INSTALL_BIN).split()[0]
    assert program == f"det-{name}" and program in scripts
    assert one(unit, "Restart") == "on-failure"
    assert dict(unit["Unit"]).get("Description")
    assert dict(unit["Install"]).get("WantedBy") == "multi-user.target"


@pytest.mark.parametrize("name", UNITS)
def test_every_det_variable_of_a_unit_is_a_setting(name: str) -> None:
    """pydantic-settings ignores an unknown DET_* variable: a typo would go unseen."""
    settings, prefix, config_env = {
        "master": (MasterSettings, "DET_MASTER_", MASTER_CONFIG_ENV),
        "agent": (AgentSettings, "DET_AGENT_", AGENT_CONFIG_ENV),
    }[name]
    for variable in environment(parse_unit(UNITS[name])):
        assert variable == config_env or setting_of(settings, prefix, variable), (
            f"{UNITS[name].name}: {variable} is no {name} setting"
        )


def test_the_master_runs_as_its_own_user_in_a_read_only_system() -> None:
    unit = parse_unit(UNITS["master"])
    assert one(unit, "User") == "resolute"
    assert one(unit, "NoNewPrivileges") == "yes"
    assert one(unit, "ProtectSystem") == "strict"
    data_dir = environment(unit)["DET_MASTER_DATA_DIR"]
    assert data_dir in " ".join(values(unit, "ReadWritePaths")).split()
    assert one(unit, "StateDirectory") == Path(data_dir).name


def test_the_agent_runs_as_root_and_reads_its_token_from_a_file() -> None:
    unit = parse_unit(UNITS["agent"])
    assert one(unit, "User") in (None, "root")  # it starts ranks as another user
    env = environment(unit)
    # No rank setting: as root, each allocation's ranks get a uid of their own.
    assert "DET_AGENT_RANK_USER" not in env and "DET_AGENT_RANK_UID_RANGE" not in env
    assert env["DET_AGENT_JOIN_TOKEN_FILE"] == "/etc/resolute/agent_join_token"
    # Never in the unit: its command line is in /proc/*/cmdline and `systemctl show` for all.
    assert "DET_AGENT_JOIN_TOKEN" not in env
    assert "--join-token " not in f"{one(unit, 'ExecStart')} "
    # Ranks inherit no_new_privs; CUDA's setuid nvidia-modprobe would then fail.
    assert one(unit, "NoNewPrivileges") in (None, "no")


def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        # Only when systemd is not installed at all; the checks above still ran.
        pytest.skip("systemd-analyze is not installed here")
    bin_dir = Path(sys.executable).parent  # where this checkout's console scripts are
    for program in ("det-master", "det-agent"):
        assert (bin_dir / program).is_file(), f"no {program} in {bin_dir}"
    for path in UNITS.values():
        # verify checks that ExecStart exists: point it at this checkout's install.
        text = path.read_text(encoding="utf-8").replace(INSTALL_BIN, f"{bin_dir}/")
        (tmp_path / path.name).write_text(text, encoding="utf-8")
    result = subprocess.run(
        [analyze, "verify", *(path.name for path in UNITS.values())],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    # An unknown or misspelt key is only a warning (exit 0): any output at all fails.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )
