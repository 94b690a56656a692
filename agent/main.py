"""`det-agent`: placeholder until the agent lands (issue: agent gRPC protocol and launch)."""

from __future__ import annotations

import sys


def main() -> None:
    sys.stderr.write("det-agent: the agent is not implemented yet in this version of resolute\n")
    sys.exit(2)
