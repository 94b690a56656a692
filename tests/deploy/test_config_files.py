"""The YAML config files the deployment points at (DET_MASTER_CONFIG_FILE in docker-compose.yml
and the master's unit, DET_AGENT_CONFIG_FILE for an agent): the shipped example loads, and a
missing or broken file stops det-master and det-agent with one line naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from master.settings import MasterSettings
from tests.deploy.files import ROOT

BIN = Path(sys.executable).parent


def test_the_example_master_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    example = ROOT / "deploy" / "master.yaml"
    monkeypatch.setenv("DET_MASTER_CONFIG_FILE", str(example))
    settings = MasterSettings()
    written = yaml.safe_load(example.read_text())
    assert settings.db.url == written["db"]["url"]
    assert settings.agent_link.port == written["agent_link"]["port"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read it: No such file or directory"),
        ("port: [1\n", "not valid YAML: line 2, column 1: expected ',' or ']'"),
        ("- a list\n", "the config file must be a YAML mapping"),
        (b"\xff\xfe", "not valid YAML: 'utf-8' codec can't decode"),
    ],
    ids=["missing", "bad-yaml", "not-a-mapping", "not-utf8"],
)
@pytest.mark.parametrize("program", ["det-master", "det-agent"])
def test_a_bad_config_file_is_named_in_one_line(
    program: str, content: str | bytes | None, problem: str, tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    elif content is not None:
        path.write_bytes(content)
    variable = "DET_MASTER_CONFIG_FILE" if program == "det-master" else "DET_AGENT_CONFIG_FILE"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env[variable] = str(path)
    result = subprocess.run(
        [str(BIN / program), *(["--data-dir", str(tmp_path)] if program == "det-master" else [])],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"{program}: setting {variable}: {path}: {problem}"), (
        result.stderr
    )
    assert "Traceback" not in result.stderr
