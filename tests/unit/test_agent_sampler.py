"""System metrics from real psutil: rates between samples, memory, and GPUs from the backend."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from agent.gpu import open_nvml
from agent.sampler import SystemSampler
from tests.fake_nvml import FakeNvml, fake_gpus, fake_uuid

RATES = (
    "disk_throughput_read",
    "disk_throughput_write",
    "disk_iops",
    "net_throughput_sent",
    "net_throughput_recv",
)


def send_over_loopback(nbytes: int) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    received = 0

    def drain() -> None:
        nonlocal received
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(65536):
                received += len(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    with socket.create_connection(server.getsockname()) as client:
        client.sendall(b"x" * nbytes)
    reader.join(timeout=10)
    server.close()
    assert received == nbytes


def test_first_sample_has_zero_rates_and_real_memory() -> None:
    sample = SystemSampler(None).sample()

    assert all(getattr(sample, field) == 0 for field in RATES)
    assert sample.memory_free > 0
    assert sample.memory_used > 0
    assert 0 <= sample.cpu_util_simple <= 100
    assert list(sample.gpus) == []


def test_second_sample_reports_traffic_since_the_first() -> None:
    sampler = SystemSampler(None)
    sampler.sample()
    send_over_loopback(4 * 1024 * 1024)
    time.sleep(0.05)

    sample = sampler.sample()

    assert all(getattr(sample, field) >= 0 for field in RATES)
    # psutil's totals include loopback, so the bytes just sent must show.
    assert sample.net_throughput_sent > 0
    assert sample.net_throughput_recv > 0
    assert 0 <= sample.cpu_util_simple <= 100
    assert sample.memory_free > 0


def test_cpu_busy_since_the_last_sample_shows_whichever_thread_samples() -> None:
    sampler = SystemSampler(None)
    sampler.sample()
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        pass  # keep one core busy

    # The agent samples through asyncio.to_thread, so consecutive samples may come from
    # different threads.
    with ThreadPoolExecutor(1) as pool:
        sample = pool.submit(sampler.sample).result()

    assert sample.cpu_util_simple > 5
    assert sample.cpu_util_simple <= 100


def test_timestamp_is_given_or_now() -> None:
    sampler = SystemSampler(None)

    assert sampler.sample(now_millis=1_700_000_000_123).unix_millis == 1_700_000_000_123
    before = time.time_ns() // 1_000_000
    stamped = sampler.sample().unix_millis
    assert before <= stamped <= time.time_ns() // 1_000_000


def test_gpu_readings_come_from_the_backend() -> None:
    sampler = SystemSampler(open_nvml(FakeNvml(fake_gpus(8, power_mw=None))))

    sample = sampler.sample()

    assert [(g.index, g.uuid) for g in sample.gpus] == [(i, fake_uuid(i)) for i in range(8)]
    assert {g.power_w for g in sample.gpus} == {0.0}
    assert {g.gpu_util for g in sample.gpus} == {37.0}


def test_sampling_is_cheap() -> None:
    sampler = SystemSampler(open_nvml(FakeNvml(fake_gpus(8))))
    sampler.sample()

    start = time.perf_counter()
    for _ in range(20):
        sampler.sample()
    # Called once a second on the agent; a generous bound that still catches a blocking call.
    assert (time.perf_counter() - start) / 20 < 0.05
