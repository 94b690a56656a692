"""What each program imports: the agent and the training library must run on a node that has
no master package dependencies, and `det` needs only the master's pure modules."""

from __future__ import annotations

import json
import subprocess
import sys

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
    loaded = loaded_modules("cli.main", "cli.experiments", "master.core.expconf")
    masters = {m for m in loaded if m.split(".")[0] == "master"}
    assert masters <= {"master", "master.version", "master.core"} | {
        m for m in masters if m.startswith("master.core.")
    }, sorted(masters)
    assert not {m.split(".")[0] for m in loaded} & WEB_STACK
