"""Fault matrix (issue 14): the fault tests on real processes, run `--rounds` times, their
figures gathered per fault.

    .venv/bin/python -m benchmarks.bench_fault_matrix [--rounds N] [TEST ...]

Each round runs, in one pytest process (root, network namespaces and PostgreSQL needed):

- tests/e2e/test_fencing.py: agent SIGSTOP, agent link down, blackhole master->agent,
  blackhole agent->master (old run's last line, new run's first line, their overlap on
  one monotonic clock, restarts), a flapping link and a master down 9 s (pass/fail);
- tests/e2e/test_database_outage.py: PostgreSQL stopped 12 s; its link cut 15 s;
- tests/e2e/test_standby_master.py: the leader SIGKILLed, then a leader SIGSTOPped;
- tests/e2e/test_master_kills.py: a master SIGKILLed five times while it places gangs.

Each test prints one JSON line of figures; this script collects them and prints one JSON
document: the machine, and per fault the runs, the min / median / max of every figure,
and the rounds whose tests failed (with pytest's summary lines). Given TEST paths (pytest
node ids), it runs those instead: the smoke test runs one round of a stub file that prints
such lines, in seconds and without root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import host_facts, progress

TESTS = (
    "tests/e2e/test_fencing.py",
    "tests/e2e/test_database_outage.py",
    "tests/e2e/test_standby_master.py",
    "tests/e2e/test_master_kills.py",
)
FIGURES = re.compile(r'\{"(fault|outage_s|cut_s|lease_s|trials)".*\}')


def case_of(figures: dict[str, Any]) -> str:
    if "fault" in figures:
        return str(figures["fault"])
    if "outage_s" in figures:
        return "postgres_stopped"
    if "cut_s" in figures:
        return "postgres_link_cut"
    if "trials" in figures:
        return "master_sigkill_mid_placement"
    return "standby_master_sigkill_then_sigstop"


def run_round(
    index: int, scratch: Path, tests: Sequence[str]
) -> tuple[list[dict[str, Any]], list[str], int]:
    base = scratch / f"round-{index}"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        f"--basetemp={base}",
        *tests,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    found = [json.loads(match.group(0)) for match in FIGURES.finditer(output)]
    summary = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    shutil.rmtree(base, ignore_errors=True)
    return found, summary, done.returncode


def spread(values: list[float]) -> dict[str, float]:
    return {
        "min": min(values),
        "median": round(statistics.median(values), 3),
        "max": max(values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "tests", nargs="*", metavar="TEST", help="pytest node ids (default: the fault tests)"
    )
    args = parser.parse_args()
    tests = args.tests or list(TESTS)
    if os.geteuid() != 0 and not args.tests:
        sys.exit("the fault matrix needs root (network namespaces, a private PostgreSQL)")
    report: dict[str, Any] = {
        "benchmark": "fault matrix: at most one live copy of a trial, outages, failover",
        "command": " ".join(
            ["python -m benchmarks.bench_fault_matrix", f"--rounds {args.rounds}", *args.tests]
        ),
        "machine": host_facts(["grpcio", "sqlalchemy", "asyncpg"]),
        "rounds": args.rounds,
    }
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    failures = []
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as scratch:
        for index in range(args.rounds):
            progress(f"round {index + 1} of {args.rounds}")
            found, summary, code = run_round(index, Path(scratch), tests)
            for figures in found:
                by_case[case_of(figures)].append(figures)
            if code != 0:
                failures.append({"round": index + 1, "pytest_exit": code, "failed": summary})
            progress(f"round {index + 1}: {len(found)} figure lines, pytest exit {code}")
    cases: dict[str, Any] = {}
    for case, runs in sorted(by_case.items()):
        numeric = defaultdict(list)
        for run in runs:
            for key, value in run.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    numeric[key].append(float(value))
        cases[case] = {
            "runs": len(runs),
            "figures": {key: spread(values) for key, values in sorted(numeric.items())},
        }
    report["cases"] = cases
    report["failed_rounds"] = failures
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
