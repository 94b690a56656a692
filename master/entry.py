"""`det-master`'s console script: a clear error instead of a traceback when the install lacks
the `master` extra (an agent-only node's `pip install resolute` has no web stack)."""

from __future__ import annotations

import re
import sys
from importlib import metadata


def missing_master_requirements() -> list[str]:
    """Distributions of the installed `master` extra that are absent, read from the wheel's
    metadata so that this never drifts from pyproject.toml."""
    try:
        requirements = metadata.requires("resolute") or []
    except metadata.PackageNotFoundError:  # a source tree without an install: nothing to check
        return []
    missing = []
    for requirement in requirements:
        if not re.search(r"""extra\s*==\s*["']master["']""", requirement):
            continue
        name = re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0]
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def main() -> None:
    missing = missing_master_requirements()
    if missing:
        sys.exit(
            f"det-master: this install lacks the master's dependencies ({', '.join(missing)}): "
            "install resolute with its master extra, e.g. pip install '.[master]' in a checkout "
            "(docs/deploying.md)"
        )
    from master.main import main as run_master  # imported here: it needs the extra

    run_master()
