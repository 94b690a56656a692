"""A stand-in for the `pynvml` module, for the agent's GPU code.

It exists because CI machines have no GPU and no NVIDIA driver: it implements exactly the
pynvml functions `agent.gpu` calls, for any number of fake GPUs with configurable readings,
and can play a host without a driver (`nvmlInit` raises) or a GPU that does not support a
reading (that call raises `NVMLError`, as NVML's NOT_SUPPORTED does).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

GIB = 1024**3


class FakeNVMLError(Exception):
    """What pynvml's `NVMLError` is to the real library."""


@dataclass
class FakeGpu:
    """One fake GPU; a reading set to None raises `NVMLError` (not supported)."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * GIB
    memory_used: int | None = 2 * GIB
    utilization: int | None = 37
    temperature: int | None = 51
    power_mw: int | None = 312_500


def fake_gpus(count: int, **readings: Any) -> list[FakeGpu]:
    """`count` GPUs that share `readings`; GPU i has the UUID `fake_uuid(i)`."""
    return [FakeGpu(uuid=fake_uuid(i), **readings) for i in range(count)]


def fake_uuid(index: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{index:012d}"


class FakeNvml:
    """Module-like: pass an instance wherever `agent.gpu` expects the `pynvml` module."""

    NVMLError = FakeNVMLError
    NVML_TEMPERATURE_GPU = 0

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_loaded: bool = True,
        return_bytes: bool = False,
    ) -> None:
        self.gpus = gpus if gpus is not None else fake_gpus(8)
        self.driver_loaded = driver_loaded
        self.return_bytes = return_bytes  # older pynvml returned bytes for strings
        self.initialized = False

    def nvmlInit(self) -> None:
        if not self.driver_loaded:
            raise FakeNVMLError("Driver Not Loaded")
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise FakeNVMLError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str | bytes:
        return self._string(handle.uuid)

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str | bytes:
        return self._string(handle.name)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        used = self._supported(handle.memory_used)
        return SimpleNamespace(
            total=handle.memory_total, used=used, free=handle.memory_total - used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._supported(handle.utilization), memory=0)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise FakeNVMLError("Invalid Argument")
        return self._supported(handle.temperature)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._supported(handle.power_mw)

    def _check_init(self) -> None:
        if not self.initialized:
            raise FakeNVMLError("Uninitialized")

    def _supported(self, value: int | None) -> int:
        self._check_init()
        if value is None:
            raise FakeNVMLError("Not Supported")
        return value

    def _string(self, value: str) -> str | bytes:
        self._check_init()
        return value.encode() if self.return_bytes else value
