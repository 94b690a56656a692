"""Which slots an agent offers: artificial CPU slots, its GPUs, or one CPU slot."""

from __future__ import annotations

import pytest

from agent.devices import cpu_model, detect_devices
from agent.gpu import GpuInfo, open_nvml
from resolute_proto.agent.v1 import agent_pb2
from tests.fake_nvml import GIB, FakeNvml, fake_gpus, fake_uuid


class ListedGpus:
    """A backend whose NVML indices need not start at 0 (e.g. CUDA_VISIBLE_DEVICES=2,5)."""

    def __init__(self, gpus: list[GpuInfo]) -> None:
        self.gpus = gpus

    def devices(self) -> list[GpuInfo]:
        return self.gpus

    def sample(self) -> list[agent_pb2.GpuSample]:
        return []


def test_eight_gpus_become_eight_cuda_slots() -> None:
    backend = open_nvml(FakeNvml(fake_gpus(8, memory_total=80 * GIB)))

    devices = detect_devices(None, backend)

    assert [d.slot_id for d in devices] == list(range(8))
    assert [d.index for d in devices] == list(range(8))
    assert [d.uuid for d in devices] == [fake_uuid(i) for i in range(8)]
    assert {d.type for d in devices} == {"cuda"}
    assert {d.brand for d in devices} == {"NVIDIA H100 80GB HBM3"}
    assert {d.memory_bytes for d in devices} == {80 * GIB}


def test_slot_ids_count_from_zero_whatever_the_nvml_indices() -> None:
    backend = ListedGpus([GpuInfo(2, "GPU-c", "A100", 40 * GIB), GpuInfo(5, "GPU-f", "A100", 1)])

    devices = detect_devices(None, backend)

    assert [(d.slot_id, d.index, d.uuid) for d in devices] == [(0, 2, "GPU-c"), (1, 5, "GPU-f")]


def assert_one_cpu_slot(devices: list[agent_pb2.Device]) -> None:
    assert len(devices) == 1
    (d,) = devices
    assert (d.slot_id, d.type, d.uuid, d.index, d.memory_bytes) == (0, "cpu", "cpu-0", -1, 0)
    assert d.brand == cpu_model()


def test_no_driver_falls_back_to_one_cpu_slot() -> None:
    backend = open_nvml(FakeNvml(driver_loaded=False))

    assert backend is None
    assert_one_cpu_slot(detect_devices(None, backend))


def test_a_driver_with_no_gpus_falls_back_to_one_cpu_slot() -> None:
    assert_one_cpu_slot(detect_devices(None, open_nvml(FakeNvml([]))))


def test_artificial_slots_override_gpus() -> None:
    backend = open_nvml(FakeNvml(fake_gpus(8)))

    devices = detect_devices(4, backend)

    assert [(d.slot_id, d.type, d.uuid, d.index) for d in devices] == [
        (i, "cpu", f"cpu-{i}", -1) for i in range(4)
    ]
    assert {d.brand for d in devices} == {cpu_model()}


@pytest.mark.parametrize("slots", [0, -1])
def test_artificial_slots_below_one_are_rejected(slots: int) -> None:
    with pytest.raises(ValueError, match="artificial_slots"):
        detect_devices(slots, None)


def test_cpu_model_names_the_processor() -> None:
    assert cpu_model().strip()
