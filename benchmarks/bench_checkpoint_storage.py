"""Checkpoint storage benchmark (issue 13): store and restore a checkpoint of many files in a
local S3 server (moto's standalone server on loopback), ours against a plain boto3 managed
transfer of the same files, in the same run.

    .venv/bin/python -m benchmarks.bench_checkpoint_storage [--quick | --smoke] [--rounds N]

Prints one JSON document on stdout (progress on stderr): the machine, and

- `large`: a 1 GiB checkpoint (4 x 128 MiB, 448 x 1 MiB, 1,024 x 64 KiB; `--quick`: 1/16 of
  each count and size; `--smoke`: 1/64, one round, the least that runs every path), stored
  and restored `--rounds` times, ours and plain alternating:
  - ours: `resolute.storage.S3Storage.upload` / `.download` (files in parallel, large files
    in parallel parts);
  - plain: boto3's managed transfer, `upload_file` / `download_file` for each file in turn
    with boto3's default TransferConfig (what a script would write);
  - the ratio is plain time / our time, per direction, from the medians (target >= 0.9);
- `small`: the per-checkpoint cost of a small checkpoint (3 files, 6 KiB) through
  `resolute`'s `store_path` (staging directory, upload, clean-up; no master), against the
  same 3 files put with boto3's `put_object`; the overhead is the difference of medians.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3

from benchmarks import common
from benchmarks.common import host_facts, progress
from harness.cluster import Process, free_port, wait_until
from harness.figures import ratio
from resolute.checkpoint import CheckpointContext
from resolute.storage import S3Storage

KEYS = ("bench-access", "bench-secret")
MIB = 1024 * 1024


def start_moto(port: int, log: Path) -> Process:
    server = Path(sys.executable).parent / "moto_server"
    if not server.exists():
        raise SystemExit("moto_server not installed: pip install 'moto[server]'")
    moto = Process([str(server), "-H", "127.0.0.1", "-p", str(port)], log)
    moto.launch()
    client = s3_client(port)

    def answers() -> bool:
        moto.check_running("moto_server")
        try:
            client.list_buckets()
        except Exception:
            return False
        return True

    try:
        wait_until("moto_server to answer", answers, 30, 0.2, moto.output)
    except BaseException:
        moto.stop()
        raise
    return moto


def s3_client(port: int) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id=KEYS[0],
        aws_secret_access_key=KEYS[1],
        region_name="us-east-1",
    )


def write_checkpoint(directory: Path, scale: int) -> dict[str, Any]:
    """Files of random bytes: 4 big, many medium, many small; `scale` divides counts and
    sizes (1 = 1 GiB)."""
    layout = [(4, 128 * MIB), (448, MIB), (1024, 64 * 1024)]
    total = files = 0
    for group, (count, size) in enumerate(layout):
        count = max(1, count // scale)
        size = max(1024, size // scale)
        folder = directory / f"part{group}"
        folder.mkdir(parents=True)
        for i in range(count):
            (folder / f"f{i:04d}.bin").write_bytes(os.urandom(size))
            total += size
            files += 1
    return {"files": files, "bytes": total}


def timed(work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def plain_upload(client: Any, bucket: str, source: Path, prefix: str) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(source)}")


def plain_download(client: Any, bucket: str, prefix: str, target: Path) -> None:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    for page in pages:
        for item in page.get("Contents", []):
            path = target / item["Key"][len(prefix) + 1 :]
            path.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, item["Key"], str(path))


def summary(samples: list[float], size: int) -> dict[str, Any]:
    median = statistics.median(samples)
    return {
        "seconds": [round(s, 3) for s in samples],
        "median_s": round(median, 3),
        "median_mib_per_s": round(size / MIB / median, 1),
    }


def our_storage(port: int, bucket: str, prefix: str) -> S3Storage:
    return S3Storage(
        bucket,
        prefix,
        endpoint_url=f"http://127.0.0.1:{port}",
        access_key=KEYS[0],
        secret_key=KEYS[1],
    )


def bench_large(port: int, work: Path, scale: int, rounds: int) -> dict[str, Any]:
    client = s3_client(port)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    source = work / "source"
    facts = write_checkpoint(source, scale)
    progress(f"large: {facts['files']} files, {facts['bytes'] / MIB:.0f} MiB")
    ours = our_storage(port, bucket, "ours")
    plain_view = our_storage(port, bucket, "plain")  # only to clean up between rounds
    up: dict[str, list[float]] = {"ours": [], "plain": []}
    down: dict[str, list[float]] = {"ours": [], "plain": []}
    for round_ in range(rounds):
        # Alternate who goes first, so a drift in the machine's load hits both.
        for who in ("ours", "plain") if round_ % 2 == 0 else ("plain", "ours"):
            name = f"{who}-{round_}"
            target = work / f"restore-{name}"
            if who == "ours":
                up[who].append(timed(functools.partial(ours.upload, source, name)))
                down[who].append(timed(functools.partial(ours.download, name, target)))
                ours.delete(name)
            else:
                prefix = f"plain/{name}"
                store = functools.partial(plain_upload, client, bucket, source, prefix)
                restore = functools.partial(plain_download, client, bucket, prefix, target)
                up[who].append(timed(store))
                down[who].append(timed(restore))
                plain_view.delete(name)
            restored = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
            assert restored == facts["bytes"], (who, restored, facts["bytes"])
            shutil.rmtree(target)
            progress(
                f"large round {round_} {who}: up {up[who][-1]:.2f} s, down {down[who][-1]:.2f} s"
            )
    size = facts["bytes"]
    return {
        "checkpoint": facts,
        "ours": {"store": summary(up["ours"], size), "restore": summary(down["ours"], size)},
        "plain_boto3_managed_transfer": {
            "store": summary(up["plain"], size),
            "restore": summary(down["plain"], size),
        },
        "throughput_ratio_ours_over_plain": {
            "store": ratio(statistics.median(up["plain"]), statistics.median(up["ours"])),
            "restore": ratio(statistics.median(down["plain"]), statistics.median(down["ours"])),
            "target": 0.9,
        },
    }


def bench_small(port: int, work: Path, count: int) -> dict[str, Any]:
    client = s3_client(port)
    bucket = f"small-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    store = S3Storage(
        bucket,
        "ours",
        endpoint_url=f"http://127.0.0.1:{port}",
        access_key=KEYS[0],
        secret_key=KEYS[1],
    )
    context = CheckpointContext(
        store, session=None, is_chief=True, trial_id=None, task_id=None, allocation_id=None
    )
    files = {"model.json": b"{}" * 1024, "optimizer.bin": os.urandom(2048), "meta.txt": b"x" * 2048}

    def ours() -> None:
        with context.store_path(1) as (path, _):
            for name, data in files.items():
                (path / name).write_bytes(data)

    def plain() -> None:
        prefix = uuid.uuid4().hex
        for name, data in files.items():
            client.put_object(Bucket=bucket, Key=f"plain/{prefix}/{name}", Body=data)

    ours_s: list[float] = []
    plain_s: list[float] = []
    for i in range(count):
        first, second = (ours, plain) if i % 2 == 0 else (plain, ours)
        for work_fn in (first, second):
            (ours_s if work_fn is ours else plain_s).append(timed(work_fn))
    ours_ms = statistics.median(ours_s) * 1000
    plain_ms = statistics.median(plain_s) * 1000
    return {
        "checkpoints": count,
        "files_per_checkpoint": len(files),
        "bytes_per_checkpoint": sum(len(d) for d in files.values()),
        "ours_store_path_median_ms": round(ours_ms, 2),
        "plain_put_object_median_ms": round(plain_ms, 2),
        "overhead_per_checkpoint_ms": round(ours_ms - plain_ms, 2),
    }


# (rounds, scale, small checkpoints) of each shape. The smoke shape: 1/64 of the data (24
# files, 2.1 MiB) in one round, and 4 small checkpoints.
SHAPES = {"full": (3, 1, 100), "quick": (2, 16, 20), "smoke": (1, 64, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_shape_flags(
        parser,
        quick="1/16 of the data, 2 rounds",
        smoke="1/64 of the data, 1 round, 4 small checkpoints",
    )
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    mode = common.mode_of(args)
    rounds, scale, small = SHAPES[mode]
    rounds = args.rounds or rounds
    report: dict[str, Any] = {
        "benchmark": "checkpoint storage: resolute.storage against plain boto3, local S3",
        "command": "python -m benchmarks.bench_checkpoint_storage"
        + ("" if mode == "full" else f" --{mode}"),
        "machine": host_facts(["boto3", "moto", "s3transfer"]),
        "parameters": {"rounds": rounds, "scale": scale},
    }
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as scratch:
        port = free_port()
        server = start_moto(port, Path(scratch) / "moto.log")
        try:
            report["large"] = bench_large(port, Path(scratch), scale, rounds)
            report["small"] = bench_small(port, Path(scratch), small)
        finally:
            server.stop()
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
