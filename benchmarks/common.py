"""What every benchmark reports the same way: progress lines, percentiles, ratios and the
machine it ran on (the brief asks each result to name its machine)."""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
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


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest sample with at least p% of the samples at or below it."""
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def ms_summary(seconds: Sequence[float], digits: int = 2, mean: bool = False) -> dict[str, Any]:
    """n, p50, p99 and max of durations in seconds, as milliseconds (and the mean)."""
    ordered = sorted(seconds)
    if not ordered:
        return {"n": 0}
    summary: dict[str, Any] = {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 50) * 1000, digits),
        "p99_ms": round(percentile(ordered, 99) * 1000, digits),
        "max_ms": round(ordered[-1] * 1000, digits),
    }
    if mean:
        summary["mean_ms"] = round(statistics.fmean(ordered) * 1000, digits)
    return summary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


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


def stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: how every benchmark ends its subprocesses."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def log_tail(log: Path, chars: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return f"(no {log.name})"


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
