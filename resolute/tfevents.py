"""TensorBoard event files for scalar metrics, without TensorFlow or TensorBoard installed.

A TensorBoard over experiments (issue 17) shows the metrics the master stores; this module
writes them in the format TensorBoard reads: a file named `events.out.tfevents.*` holding
TFRecord frames, each an `Event` protocol buffer (a `file_version` event first, then one
`Summary` with a `simple_value` per scalar). The frames and the few protobuf fields needed
are encoded here, so the agent and the training library can write them with no extra
dependency.

    with EventFileWriter(logdir / "trial_7") as writer:
        writer.add_scalar("training/loss", 0.25, step=100, wall_time=1763700000.0)
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import struct
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

FILE_VERSION = "brain.Event:2"  # what TensorBoard's readers expect first


class EventFileError(ValueError):
    """A scalar that cannot be written (the message names the field)."""


# --- CRC-32C (Castagnoli), as TFRecord frames use it ------------------------------------------


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord stores CRCs rotated and offset, so a CRC of CRC-bearing data stays sound."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One frame: length, its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


# --- the protobuf fields TensorBoard reads ---------------------------------------------------


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 in two's complement, as protobuf encodes it
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    """Event: wall_time = 1 (double), step = 2 (int64), then the body's own field."""
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + body


def file_version_event(wall_time: float) -> bytes:
    return _event(wall_time, 0, _length_delimited(3, FILE_VERSION.encode()))


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """Event{summary: Summary{value: [Value{tag, simple_value}]}} (fields 5; 1; 1 and 2)."""
    if not isinstance(tag, str) or not tag:
        raise EventFileError(f"tag: must be a non-empty string, got {tag!r}")
    if not isinstance(step, int) or isinstance(step, bool) or not -(2**63) <= step < 2**63:
        raise EventFileError(f"{tag}: step must be a 64-bit integer, got {step!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventFileError(f"{tag}: value must be a number, got {type(value).__name__}")
    if not math.isfinite(wall_time):
        raise EventFileError(f"{tag}: wall_time must be finite, got {wall_time!r}")
    try:
        as_float32 = struct.pack("<f", float(value))
    except OverflowError:  # TensorBoard's simple_value is a float32: beyond it is infinite
        as_float32 = struct.pack("<f", math.inf if value > 0 else -math.inf)
    summary_value = _length_delimited(1, tag.encode()) + b"\x15" + as_float32
    summary = _length_delimited(1, summary_value)
    return _event(wall_time, step, _length_delimited(5, summary))


def report_scalars(
    group: str, steps_completed: int, wall_time: float, metrics: Mapping[str, Any]
) -> list[tuple[str, float, int, float]]:
    """The points of one metrics report (a trial's "training" or "validation" group at a
    step, as the master stores them), tagged "<group>/<name>". TensorBoard plots numbers
    only: other values (text, lists, None, booleans) are left out."""
    return [
        (f"{group}/{name}", value, steps_completed, wall_time)
        for name, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]


# --- files -----------------------------------------------------------------------------------


class EventFileWriter(contextlib.AbstractContextManager["EventFileWriter"]):
    """Appends scalars to a new event file in `logdir` (created if missing). TensorBoard
    picks up every `events.out.tfevents.*` file under a run's directory."""

    def __init__(self, logdir: Path | str) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}"
        self.path = self.logdir / name
        self._file = self.path.open("xb")
        self._file.write(tfrecord(file_version_event(now)))

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float) -> None:
        self._file.write(tfrecord(scalar_event(tag, value, step, wall_time)))

    def add_scalars(self, points: Iterable[tuple[str, float, int, float]]) -> int:
        """(tag, value, step, wall_time) each; returns how many were written. All or
        nothing: one bad point raises EventFileError before any is written."""
        frames = [tfrecord(scalar_event(*point)) for point in points]
        self._file.write(b"".join(frames))
        return len(frames)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
