"""Once-a-second system metrics for the heartbeat: CPU, memory, disk, network and GPUs.

Field meanings follow Determined's profiler (`harness/determined/core/_profiler.py`), so the
master can store them in the same groups and units.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import psutil

from agent.gpu import GpuBackend
from resolute_proto.agent.v1 import agent_pb2

logger = logging.getLogger(__name__)


class _Counters(NamedTuple):
    """Cumulative counters; None where psutil has none (see `_read_counters`)."""

    at: float  # time.monotonic()
    disk_read_bytes: int | None
    disk_write_bytes: int | None
    disk_ops: int | None
    net_sent: int | None
    net_recv: int | None


class SystemSampler:
    """Turns psutil's cumulative counters into rates between consecutive samples.

    The first sample only sets the baseline for disk and network, so its rates are 0; CPU
    is measured from construction on. Not for concurrent calls, but any thread will do: the
    CPU baseline is kept here, because `psutil.cpu_percent(interval=None)` keeps one per
    thread and the agent samples through `asyncio.to_thread`, whose worker threads vary.
    """

    def __init__(self, gpu: GpuBackend | None) -> None:
        self._gpu = gpu
        self._last: _Counters | None = None
        self._last_cpu = psutil.cpu_times()

    def sample(self, now_millis: int | None = None) -> agent_pb2.MetricSample:
        counters = _read_counters()
        cpu, self._last_cpu = self._last_cpu, psutil.cpu_times()
        memory = psutil.virtual_memory()
        out = agent_pb2.MetricSample(
            unix_millis=now_millis if now_millis is not None else time.time_ns() // 1_000_000,
            cpu_util_simple=_cpu_percent(cpu, self._last_cpu),
            memory_free=memory.available,
            memory_used=memory.used,
        )
        last, self._last = self._last, counters
        elapsed = counters.at - last.at if last is not None else 0.0
        if last is not None and elapsed > 0:

            def rate(now: int | None, before: int | None) -> float:
                if now is None or before is None:
                    return 0.0
                # A disk or NIC that disappears lowers the summed counter; report 0, not < 0.
                return max(now - before, 0) / elapsed

            out.disk_throughput_read = rate(counters.disk_read_bytes, last.disk_read_bytes)
            out.disk_throughput_write = rate(counters.disk_write_bytes, last.disk_write_bytes)
            out.disk_iops = rate(counters.disk_ops, last.disk_ops)
            out.net_throughput_sent = rate(counters.net_sent, last.net_sent)
            out.net_throughput_recv = rate(counters.net_recv, last.net_recv)
        if self._gpu is not None:
            out.gpus.extend(self._gpu.sample())
        return out


def _read_counters() -> _Counters:
    # Containers without /proc/diskstats (and hosts without NICs) get None, or on Linux
    # without /sys/block either an exception; both mean no rate rather than a failed sample.
    try:
        disk = psutil.disk_io_counters()
    except (OSError, NotImplementedError):
        disk = None
    try:
        net = psutil.net_io_counters()
    except OSError:
        net = None
    return _Counters(
        at=time.monotonic(),
        disk_read_bytes=disk.read_bytes if disk is not None else None,
        disk_write_bytes=disk.write_bytes if disk is not None else None,
        disk_ops=disk.read_count + disk.write_count if disk is not None else None,
        net_sent=net.bytes_sent if net is not None else None,
        net_recv=net.bytes_recv if net is not None else None,
    )


def _cpu_percent(before: Any, after: Any) -> float:
    """Busy share of all cores between two `psutil.cpu_times()`, as `psutil.cpu_percent` does."""
    busy_before, total_before = _busy_total(before)
    busy_after, total_after = _busy_total(after)
    total = total_after - total_before
    if total <= 0:
        return 0.0
    return min(max(busy_after - busy_before, 0.0) / total * 100.0, 100.0)


def _busy_total(times: Any) -> tuple[float, float]:
    # Linux counts guest time inside user time already, so it must not be added twice.
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total
