"""What every benchmark reports the same way: progress lines, the machine it ran on (the
brief asks each result to name its machine), the JSON document and the PostgreSQL server.
The processes a benchmark starts and its timing summaries are the harness's
(harness.cluster, harness.figures), shared with the tests."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import asyncpg

_STARTED = time.perf_counter()


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def seconds_since_start() -> float:
    return time.perf_counter() - _STARTED


def _proc_field(text: str, name: str) -> str | None:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def host_facts(packages: Sequence[str]) -> dict[str, Any]:
    """The machine, the interpreter and the versions of `packages`."""
    cpuinfo = _read("/proc/cpuinfo")
    mem_kib = _proc_field(_read("/proc/meminfo"), "MemTotal")  # "N kB"
    libraries: dict[str, str] = {}
    for package in packages:
        try:
            libraries[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            libraries[package] = "not installed"
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "cpu_model": _proc_field(cpuinfo, "model name") or platform.processor(),
        "cpu_processors_in_proc_cpuinfo": sum(
            1 for line in cpuinfo.splitlines() if line.startswith("processor")
        ),
        "os_cpu_count": os.cpu_count(),
        "cpus_usable_by_this_process": len(os.sched_getaffinity(0)),
        "memory_gib": round(int(mem_kib.split()[0]) / 2**20, 1) if mem_kib else None,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "libraries": libraries,
    }


def emit_report(result: dict[str, Any], out: Path | None, indent: int = 2) -> None:
    """The JSON document on stdout and, with --out, in that file too."""
    text = json.dumps(result, indent=indent) + "\n"
    sys.stdout.write(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


async def postgres_facts(admin_dsn: str) -> dict[str, Any]:
    """The server behind `admin_dsn` and the settings that decide what a commit costs."""
    conn = await asyncpg.connect(admin_dsn, timeout=10)
    try:
        facts: dict[str, Any] = {"version": await conn.fetchval("SELECT version()")}
        for setting in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "full_page_writes",
            "shared_buffers",
        ):
            facts[setting] = await conn.fetchval(f"SHOW {setting}")
    finally:
        await conn.close()
    facts["server"] = admin_dsn.rsplit("@", 1)[-1].rsplit("/", 1)[0]
    return facts


def add_shape_flags(parser: argparse.ArgumentParser, quick: str, smoke: str) -> None:
    """--quick (a smaller run for a person) and --smoke (the smallest shape that still runs
    every code path, for the smoke tests: seconds, not figures); the default is the full run."""
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--quick", action="store_true", help=quick)
    shapes.add_argument("--smoke", action="store_true", help=smoke)


def mode_of(args: argparse.Namespace) -> str:
    """The report's `mode`: smoke, quick or full."""
    if getattr(args, "smoke", False):
        return "smoke"
    return "quick" if getattr(args, "quick", False) else "full"
