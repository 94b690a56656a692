"""What each program imports: the agent and the training library must run on a node that has
no master package dependencies, and `det` needs only the master's pure modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.files import ROOT

WEB_STACK = {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "jinja2", "asyncpg"}


def loaded_modules(*imports: str) -> set[str]:
    """The modules a fresh interpreter holds after these imports."""
    code = f"import json, sys, {', '.join(imports)}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


@pytest.mark.parametrize(
    "imports",
    [
        ("agent.main",),  # det-agent
        ("resolute", "resolute.storage", "resolute.storage_check"),  # what ranks import
    ],
)
def test_the_agent_and_the_library_import_nothing_of_the_master(imports: tuple[str, ...]) -> None:
    loaded = loaded_modules(*imports)
    offending = sorted(m for m in loaded if m.split(".")[0] in {"master", *WEB_STACK})
    assert not offending, f"importing {', '.join(imports)} loads {offending}"


def test_det_imports_only_the_masters_pure_modules() -> None:
    # cli/ shares master.version and master.core (stdlib and pydantic only) with the master.
    # `det` imports a group's module only when it is named: every one is imported here.
    every = sorted(f"cli.{p.stem}" for p in (ROOT / "cli").glob("*.py") if p.stem != "__init__")
    assert "cli.experiments" in every and "cli.workspaces" in every
    loaded = loaded_modules(*every, "master.core.expconf")
    masters = {m for m in loaded if m.split(".")[0] == "master"}
    assert masters <= {"master", "master.version", "master.core"} | {
        m for m in masters if m.startswith("master.core.")
    }, sorted(masters)
    assert not {m.split(".")[0] for m in loaded} & WEB_STACK


def test_det_imports_only_the_group_its_command_line_names() -> None:
    """Each `det` call imports and builds one group of commands, not all of them (all cost
    every call about 0.15 s more CPU): naming `experiment` loads none of the others."""
    code = (
        "import sys; from cli import main; "
        "main.build_app(main._named_group(['-m', 'http://x', 'e', 'list'])); "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('cli.'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "cli.experiments" in loaded
    assert not loaded & {"cli.models", "cli.users", "cli.webhooks", "cli.tasks", "cli.tokens"}


def test_det_help_before_a_group_is_the_help_of_det_itself() -> None:
    """`det -h e` prints det's own help, which lists every group, not only `experiment`."""
    det = Path(sys.executable).parent / "det"
    result = subprocess.run(
        [str(det), "-h", "e"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "120", "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stderr
    for group in ("experiment", "workspace", "model", "webhook", "token"):
        assert f" {group} " in result.stdout, result.stdout
