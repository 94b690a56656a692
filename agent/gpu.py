"""NVIDIA GPU discovery and per-second sampling through NVML, behind a small backend interface.

The agent offers the GPUs `devices()` lists as cuda slots and ships `sample()` with every
heartbeat; without a usable NVML (`open_nvml` returns None) it falls back to CPU slots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from resolute_proto.agent.v1 import agent_pb2

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it; `index` is what CUDA_VISIBLE_DEVICES names."""

    index: int
    uuid: str
    name: str
    memory_total: int  # bytes


class GpuBackend(Protocol):
    def devices(self) -> list[GpuInfo]: ...

    def sample(self) -> list[agent_pb2.GpuSample]: ...


class NvmlModule(Protocol):
    """The part of `pynvml` the agent uses; `tests/fake_nvml.FakeNvml` implements the same."""

    @property
    def NVMLError(self) -> type[Exception]: ...

    @property
    def NVML_TEMPERATURE_GPU(self) -> int: ...

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .total, .free, .used in bytes

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu in percent

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # milliwatts


@dataclass(frozen=True)
class _Gpu:
    index: int
    uuid: str
    handle: Any


class NvmlBackend:
    """GPUs through an NVML module on which `nvmlInit` has already succeeded (see `open_nvml`).

    The GPU list is read once and kept: NVML numbers GPUs at init, and the agent reports its
    devices once per connection anyway. Errors while listing GPUs propagate, since offering
    the wrong slots is worse than not starting; errors while sampling do not.
    """

    def __init__(self, module: NvmlModule) -> None:
        self._nvml = module
        self._gpus: list[_Gpu] | None = None

    def devices(self) -> list[GpuInfo]:
        nvml = self._nvml
        return [
            GpuInfo(
                index=gpu.index,
                uuid=gpu.uuid,
                name=_text(nvml.nvmlDeviceGetName(gpu.handle)),
                memory_total=int(nvml.nvmlDeviceGetMemoryInfo(gpu.handle).total),
            )
            for gpu in self._list()
        ]

    def sample(self) -> list[agent_pb2.GpuSample]:
        return [self._sample_one(gpu) for gpu in self._list()]

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            logger.debug("nvmlShutdown failed: %s", exc)

    def _list(self) -> list[_Gpu]:
        if self._gpus is None:
            nvml = self._nvml
            gpus = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(_Gpu(index, _text(nvml.nvmlDeviceGetUUID(handle)), handle))
            self._gpus = gpus
        return self._gpus

    def _sample_one(self, gpu: _Gpu) -> agent_pb2.GpuSample:
        nvml, h = self._nvml, gpu.handle
        mem = self._read(nvml.nvmlDeviceGetMemoryInfo, h)
        util = self._read(nvml.nvmlDeviceGetUtilizationRates, h)
        temperature = self._read(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        milliwatts = self._read(nvml.nvmlDeviceGetPowerUsage, h)
        return agent_pb2.GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            gpu_util=float(util.gpu) if util is not None else 0.0,
            gpu_memory_used=int(mem.used) if mem is not None else 0,
            gpu_free_memory=int(mem.free) if mem is not None else 0,
            temperature_c=float(temperature) if temperature is not None else 0.0,
            power_w=milliwatts / 1000.0 if milliwatts is not None else 0.0,
        )

    def _read(self, read: Callable[..., Any], *args: Any) -> Any:
        # Consumer and older GPUs answer NOT_SUPPORTED for some readings (power, temperature);
        # one missing reading must not cost the whole sample.
        try:
            return read(*args)
        except self._nvml.NVMLError as exc:
            logger.debug("%s unavailable: %s", read.__name__, exc)
            return None


def open_nvml(module: NvmlModule | None = None) -> NvmlBackend | None:
    """Initialise NVML; None when the library or the driver is missing, so CPU slots are used.

    `module` defaults to `pynvml`; tests pass `tests.fake_nvml.FakeNvml`.
    """
    if module is None:
        try:
            import pynvml
        except ImportError:
            logger.info("pynvml is not installed; no GPUs will be offered")
            return None
        module = pynvml
    try:
        module.nvmlInit()
    except module.NVMLError as exc:
        logger.info("NVML is unavailable (%s); no GPUs will be offered", exc)
        return None
    return NvmlBackend(module)


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes for names and UUIDs.
    return value.decode() if isinstance(value, bytes) else value
