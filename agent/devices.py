"""The slots an agent offers: artificial CPU slots, else its NVIDIA GPUs, else one CPU slot.

The result goes into the agent's Hello; `slot_id` is the slot's id on the master.
"""

from __future__ import annotations

import functools
import logging
import platform
from pathlib import Path

from agent.gpu import GpuBackend
from resolute_proto.agent.v1 import agent_pb2

logger = logging.getLogger(__name__)

CPU = "cpu"
CUDA = "cuda"


def detect_devices(artificial_slots: int | None, gpu: GpuBackend | None) -> list[agent_pb2.Device]:
    """Devices in slot order. GPU listing errors propagate (see `agent.gpu.NvmlBackend`)."""
    if artificial_slots is not None:
        if artificial_slots < 1:
            raise ValueError(f"artificial_slots must be at least 1, got {artificial_slots}")
        devices = _cpu_slots(artificial_slots)
        logger.info("offering %d artificial cpu slots", artificial_slots)
        return devices
    gpus = gpu.devices() if gpu is not None else []
    if gpus:
        devices = [
            agent_pb2.Device(
                slot_id=slot,
                type=CUDA,
                brand=g.name,
                uuid=g.uuid,
                memory_bytes=g.memory_total,
                index=g.index,
            )
            for slot, g in enumerate(gpus)
        ]
        for d in devices:
            logger.info("slot %d: %s %s (index %d)", d.slot_id, d.brand, d.uuid, d.index)
        return devices
    # Determined's slot_type=auto without GPUs exposes all cores as a single CPU slot
    # (agent/internal/detect/cpu.go), so a CPU-only agent runs one slotted task at a time;
    # artificial_slots is the knob for sharing it.
    logger.info("no GPUs found; offering one cpu slot")
    return _cpu_slots(1)


def _cpu_slots(count: int) -> list[agent_pb2.Device]:
    brand = cpu_model()
    return [
        agent_pb2.Device(
            slot_id=slot, type=CPU, brand=brand, uuid=f"cpu-{slot}", memory_bytes=0, index=-1
        )
        for slot in range(count)
    ]


@functools.cache
def cpu_model() -> str:
    """The CPU's model name, e.g. "AMD EPYC 7763 64-Core Processor"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass  # not Linux
    return platform.processor() or platform.machine() or "cpu"
