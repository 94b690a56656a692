"""resolute.tfevents: scalar event files that the real TensorBoard reads back."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from resolute.tfevents import (
    EventFileError,
    EventFileWriter,
    crc32c,
    file_version_event,
    masked_crc32c,
    report_scalars,
    scalar_event,
    tfrecord,
)
from tests.conftest import require

WALL = 1_763_700_000.25


def tensorboard_scalars(logdir: Path) -> Any:
    """TensorBoard's own reader over one run directory, loaded."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        require(False, "tensorboard is not installed (the test dependency group has it)")
    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return accumulator


def test_crc32c_matches_the_castagnoli_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert masked_crc32c(b"") == 0xA282EAD8


def test_tensorboard_reads_back_every_scalar(tmp_path: Path) -> None:
    run = tmp_path / "experiment_1" / "trial_3"
    with EventFileWriter(run) as writer:
        for step in (100, 200, 300):
            writer.add_scalar("training/loss", 1.0 / step, step, WALL + step)
        written = writer.add_scalars(
            [
                ("validation/accuracy", 0.5, 200, WALL + 201),
                ("validation/accuracy", 0.75, 400, WALL + 401),
            ]
        )
    assert written == 2
    assert writer.path.name.startswith("events.out.tfevents.")

    scalars = tensorboard_scalars(run)
    assert sorted(scalars.Tags()["scalars"]) == ["training/loss", "validation/accuracy"]
    loss = scalars.Scalars("training/loss")
    assert [e.step for e in loss] == [100, 200, 300]
    assert [e.value for e in loss] == pytest.approx([0.01, 0.005, 1 / 300], rel=1e-6)
    assert [e.wall_time for e in loss] == [WALL + 100, WALL + 200, WALL + 300]
    accuracy = scalars.Scalars("validation/accuracy")
    assert [(e.step, e.value) for e in accuracy] == [(200, 0.5), (400, 0.75)]


def test_values_a_float32_cannot_hold(tmp_path: Path) -> None:
    with EventFileWriter(tmp_path) as writer:
        writer.add_scalars(
            [
                ("m/huge", 1e39, 1, WALL),
                ("m/huge_negative", -(10**400), 1, WALL),
                ("m/nan", math.nan, 1, WALL),
                ("m/int", 7, 1, WALL),
            ]
        )
    scalars = tensorboard_scalars(tmp_path)
    assert scalars.Scalars("m/huge")[0].value == math.inf
    assert scalars.Scalars("m/huge_negative")[0].value == -math.inf
    assert math.isnan(scalars.Scalars("m/nan")[0].value)
    assert scalars.Scalars("m/int")[0].value == 7.0


@pytest.mark.parametrize(
    ("point", "message"),
    [
        (("", 1.0, 1, WALL), "tag: must be a non-empty string"),
        (("loss", "0.5", 1, WALL), "loss: value must be a number, got str"),
        (("loss", True, 1, WALL), "loss: value must be a number, got bool"),
        (("loss", 0.5, 1.5, WALL), "loss: step must be a 64-bit integer"),
        (("loss", 0.5, 2**63, WALL), "loss: step must be a 64-bit integer"),
        (("loss", 0.5, 1, math.inf), "loss: wall_time must be finite"),
    ],
)
def test_a_bad_point_is_refused_and_nothing_is_written(
    tmp_path: Path, point: tuple[Any, ...], message: str
) -> None:
    with EventFileWriter(tmp_path) as writer:
        good = ("loss", 0.5, 1, WALL)
        with pytest.raises(EventFileError, match=message):
            writer.add_scalars([good, point])
    # Only the file-version record: the good point before the bad one was not written.
    assert writer.path.read_bytes() == tfrecord(file_version_event(_first_wall_time(writer.path)))
    assert tensorboard_scalars(tmp_path).Tags()["scalars"] == []


def test_negative_steps_round_trip(tmp_path: Path) -> None:
    # int64 in two's complement: ten bytes of varint, as protobuf writes it.
    assert scalar_event("s", 1.0, -1, WALL).count(b"\xff") >= 9
    with EventFileWriter(tmp_path) as writer:
        writer.add_scalar("s", 1.0, -5, WALL)
    assert [e.step for e in tensorboard_scalars(tmp_path).Scalars("s")] == [-5]


def _first_wall_time(path: Path) -> float:
    import struct

    data = path.read_bytes()
    # Frame header 12 bytes, then Event field 1 (tag 0x09) and its 8-byte double.
    assert data[12] == 0x09
    wall: float = struct.unpack("<d", data[13:21])[0]
    return wall


def test_a_stored_report_becomes_tagged_points(tmp_path: Path) -> None:
    metrics = {"loss": 0.25, "batches": 64, "note": "warm", "done": True, "per_class": [1, 2]}
    points = report_scalars("training", 640, WALL, metrics)
    assert points == [("training/loss", 0.25, 640, WALL), ("training/batches", 64, 640, WALL)]
    with EventFileWriter(tmp_path) as writer:
        writer.add_scalars(points)
        writer.add_scalars(report_scalars("validation", 640, WALL, {"validation_loss": 0.5}))
    scalars = tensorboard_scalars(tmp_path)
    assert sorted(scalars.Tags()["scalars"]) == [
        "training/batches",
        "training/loss",
        "validation/validation_loss",
    ]
