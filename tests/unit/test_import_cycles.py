"""The import-circle check `make lint` runs (scripts/check-import-cycles.py): it finds the
circles a deferred import hides, names each edge, and passes the project as it is."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_import_cycles", ROOT / "scripts" / "check-import-cycles.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_through_a_deferred_import_fails_and_names_each_edge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "def helper():\n    from pkg import high  # deferred\n    return high\n",
            "pkg/high.py": "from pkg.low import helper\n",
            "pkg/apart.py": "import pkg.low\n",
        },
    )
    assert checker().main(["pkg"], tmp_path) == 1
    out = capsys.readouterr().out
    assert "import circle of 2 modules: pkg.high, pkg.low" in out
    assert "pkg/low.py:2: pkg.low imports pkg.high" in out
    assert "pkg/high.py:1: pkg.high imports pkg.low" in out
    assert "pkg.apart" not in out  # it imports into the circle but is not part of it


def test_relative_imports_and_three_module_circles_are_found(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from . import a\n",
            "pkg/sub/a.py": "from .b import thing\n",
            "pkg/sub/b.py": "from ..c import other\nthing = 1\n",
            "pkg/c.py": "from pkg.sub import a\nother = 2\n",
        },
    )
    module = checker()
    graph = module.import_graph(module.collect_modules(["pkg"], tmp_path))
    # pkg.sub too: importing pkg.sub.a runs pkg/sub/__init__.py first, which imports a.
    assert module.strongly_connected(graph) == [["pkg.c", "pkg.sub", "pkg.sub.a", "pkg.sub.b"]]


def test_a_tree_without_circles_passes(tmp_path: Path) -> None:
    write(
        tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "import os\n", "pkg/b.py": "import pkg.a\n"}
    )
    assert checker().main(["pkg"], tmp_path) == 0


def test_the_project_has_no_import_circle(capsys: pytest.CaptureFixture[str]) -> None:
    assert checker().main([]) == 0, capsys.readouterr().out
