"""GPU discovery and sampling through NVML, against the fake NVML module (CI has no GPU)."""

from __future__ import annotations

import logging

import pytest

from agent.gpu import NvmlBackend, open_nvml
from tests.fake_nvml import GIB, FakeGpu, FakeNvml, fake_gpus, fake_uuid


def test_eight_gpus_are_listed_in_nvml_order() -> None:
    backend = open_nvml(FakeNvml(fake_gpus(8, memory_total=80 * GIB)))

    assert backend is not None
    gpus = backend.devices()
    assert [g.index for g in gpus] == list(range(8))
    assert [g.uuid for g in gpus] == [fake_uuid(i) for i in range(8)]
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.memory_total for g in gpus} == {80 * GIB}


def test_no_driver_gives_no_backend_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent.gpu")

    assert open_nvml(FakeNvml(driver_loaded=False)) is None
    assert "Driver Not Loaded" in caplog.text


def test_bytes_from_older_pynvml_become_str() -> None:
    backend = open_nvml(FakeNvml(fake_gpus(2), return_bytes=True))

    assert backend is not None
    assert [(g.uuid, g.name) for g in backend.devices()] == [
        (fake_uuid(0), "NVIDIA H100 80GB HBM3"),
        (fake_uuid(1), "NVIDIA H100 80GB HBM3"),
    ]
    assert [s.uuid for s in backend.sample()] == [fake_uuid(0), fake_uuid(1)]


def test_sample_reports_every_reading_in_metric_units() -> None:
    gpu = FakeGpu(
        uuid="GPU-a",
        memory_total=80 * GIB,
        memory_used=30 * GIB,
        utilization=93,
        temperature=71,
        power_mw=412_250,
    )
    backend = open_nvml(FakeNvml([gpu]))

    assert backend is not None
    (s,) = backend.sample()
    assert (s.index, s.uuid) == (0, "GPU-a")
    assert s.gpu_util == 93.0
    assert s.gpu_memory_used == 30 * GIB
    assert s.gpu_free_memory == 50 * GIB
    assert s.temperature_c == 71.0
    assert s.power_w == pytest.approx(412.25)


def test_unsupported_power_reads_zero_and_the_rest_still_samples() -> None:
    gpus = [FakeGpu(uuid="GPU-a", power_mw=None), FakeGpu(uuid="GPU-b", power_mw=250_000)]
    backend = open_nvml(FakeNvml(gpus))

    assert backend is not None
    a, b = backend.sample()
    assert a.power_w == 0.0
    assert a.gpu_util == 37.0
    assert a.temperature_c == 51.0
    assert a.gpu_memory_used == 2 * GIB
    assert b.power_w == 250.0


def test_a_gpu_supporting_no_reading_samples_as_zeros() -> None:
    gpu = FakeGpu(uuid="GPU-a", memory_used=None, utilization=None, temperature=None, power_mw=None)
    backend = open_nvml(FakeNvml([gpu]))

    assert backend is not None
    (s,) = backend.sample()
    assert s.uuid == "GPU-a"
    assert (s.gpu_util, s.gpu_memory_used, s.gpu_free_memory, s.temperature_c, s.power_w) == (
        0,
        0,
        0,
        0,
        0,
    )


def test_close_shuts_nvml_down() -> None:
    nvml = FakeNvml(fake_gpus(1))
    backend = open_nvml(nvml)

    assert isinstance(backend, NvmlBackend)
    backend.close()
    assert not nvml.initialized


def test_real_nvml_where_there_is_one(caplog: pytest.LogCaptureFixture) -> None:
    """Without a driver (CI) the real pynvml must give None; with one, real readings."""
    caplog.set_level(logging.INFO, logger="agent.gpu")

    backend = open_nvml()

    if backend is None:
        assert "no GPUs will be offered" in caplog.text
        return
    try:
        gpus = backend.devices()
        samples = backend.sample()
        assert [s.uuid for s in samples] == [g.uuid for g in gpus]
        for g, s in zip(gpus, samples, strict=True):
            assert g.uuid.startswith(("GPU-", "MIG-"))
            assert g.memory_total > 0
            assert s.gpu_memory_used + s.gpu_free_memory <= g.memory_total
            assert 0 <= s.gpu_util <= 100
    finally:
        backend.close()
