"""resolute.init() outside a cluster, the environment it reads, metric values and
checkpoint directories."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import resolute
from resolute._env import BadEnvironment, max_length_batches, read_environment
from resolute._metrics import check_steps, convert_metrics, metric_value
from resolute.checkpoint import list_resources
from resolute.storage import directory_of, from_config

CLUSTER_ENV = {
    "DET_MASTER": "http://127.0.0.1:8080/",
    "DET_SESSION_TOKEN": "tok",
    "DET_TRIAL_ID": "12",
    "DET_EXPERIMENT_ID": "3",
    "DET_TRIAL_RUN_ID": "2",
    "DET_TRIAL_SEED": "99",
    "DET_HPARAMS": json.dumps({"lr": 0.1, "global_batch_size": 64}),
    "DET_EXPERIMENT_CONFIG": json.dumps({"searcher": {"max_length": {"batches": 500}}}),
    "DET_STEPS_COMPLETED": "40",
    "DET_LATEST_CHECKPOINT": "abc",
    "DET_ALLOCATION_ID": "12.2",
    "DET_TASK_ID": "12",
    "DET_GLOBAL_BATCH_SIZE": "64",
    "DET_PER_SLOT_BATCH_SIZE": "16",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
}


def test_cluster_environment_is_read() -> None:
    env = read_environment(CLUSTER_ENV, hparams={"ignored": 1}, seed=5)
    assert env.cluster
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert env.master_url == "http://127.0.0.1:8080"
    assert (env.trial_id, env.experiment_id, env.run_id) == (12, 3, 2)
    assert env.trial_seed == 99 and env.hparams == {"lr": 0.1, "global_batch_size": 64}
    assert (env.global_batch_size, env.per_slot_batch_size) == (64, 16)
    assert env.steps_completed == 40 and env.latest_checkpoint == "abc"
    assert env.allocation_id == "12.2" and env.task_id == "12"
    assert max_length_batches(env.config) == 500


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"DET_TRIAL_SEED": "x"}, "DET_TRIAL_SEED='x' is not an integer"),
        ({"DET_HPARAMS": "{"}, "DET_HPARAMS is not valid JSON"),
        ({"DET_HPARAMS": "[1]"}, "DET_HPARAMS must be a JSON object"),
        ({"DET_MASTER": ""}, "DET_MASTER is not"),
        ({"RANK": "4"}, "RANK=4 is not within WORLD_SIZE=4"),
    ],
)
def test_a_broken_environment_is_named(change: dict[str, str], message: str) -> None:
    with pytest.raises(BadEnvironment, match=message):
        read_environment(CLUSTER_ENV | change)


def test_max_length_forms() -> None:
    assert max_length_batches({"searcher": {"max_length": 7}}) == 7
    assert max_length_batches({"searcher": {"max_length": {"epochs": 2}}}) is None
    assert max_length_batches({}) is None


def test_local_mode_without_a_master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("DET_TRIAL_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger="resolute")
    with resolute.init(hparams={"global_batch_size": 32}, seed=11) as ctx:
        assert ctx.local and ctx.is_chief
        assert (ctx.rank, ctx.world_size, ctx.trial_seed) == (0, 1, 11)
        assert (ctx.global_batch_size, ctx.per_slot_batch_size) == (32, 32)
        assert ctx.trial_id is None and ctx.latest_checkpoint is None and ctx.max_length is None
        ctx.train.report_training_metrics(steps_completed=5, metrics={"loss": 0.25})
        ctx.train.report_validation_metrics(steps_completed=5, metrics={"acc": float("nan")})
        ctx.train.report_progress(0.5)
        assert ctx.preempt.should_preempt() is False
        assert ctx.train.get_experiment_best_validation() is None
        with ctx.checkpoint.store_path(5, {"note": "x"}) as (path, uuid):
            (path / "model.bin").write_bytes(b"12345")
        assert path == tmp_path / "checkpoints" / uuid
        with ctx.checkpoint.restore_path(uuid) as restored:
            assert (restored / "model.bin").read_bytes() == b"12345"
    assert "training metrics after 5 steps: {'loss': 0.25}" in caplog.text
    assert "'acc': 'NaN'" in caplog.text
    assert sorted(p.name for p in path.iterdir()) == ["model.bin"]  # nothing else written


def test_local_mode_honours_torchrun_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_TRIAL_ID", raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with resolute.init(checkpoint_dir=tmp_path, seed_everything=False) as ctx:
        assert (ctx.rank, ctx.world_size, ctx.is_chief) == (1, 2, False)
        ctx.train.report_training_metrics(1, {"loss": 1.0})  # a worker's report is dropped
        with pytest.raises(RuntimeError, match="chief"), ctx.checkpoint.store_path(1):
            pass


def test_a_failed_checkpoint_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DET_TRIAL_ID", raising=False)
    with resolute.init(checkpoint_dir=tmp_path / "ck", seed_everything=False) as ctx:
        with pytest.raises(OSError, match="disk full"), ctx.checkpoint.store_path(3) as (path, _):
            (path / "half").write_text("x")
            raise OSError("disk full")
        assert not path.exists()
        missing = ctx.checkpoint.restore_path("nope")
        with pytest.raises(FileNotFoundError, match="checkpoint nope not found"), missing:
            pass
        unserializable = ctx.checkpoint.store_path(3, {"bad": object()})
        with pytest.raises(ValueError, match="JSON-serializable"), unserializable:
            pass


def test_importing_resolute_imports_neither_torch_nor_numpy() -> None:
    import subprocess
    import sys

    code = "import resolute, sys; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# -- metric values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1),
        (2**70, 2**70),
        (0.5, 0.5),
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (-math.inf, "-Infinity"),
        (None, None),
        (np.float32(0.25), 0.25),
        (np.int64(3), 3.0),
        (np.float64("nan"), "NaN"),
        (torch.tensor(1.5), 1.5),
        (torch.tensor([float("-inf")]), "-Infinity"),
        (True, 1.0),
    ],
)
def test_metric_values_are_converted(value: Any, expected: Any) -> None:
    assert metric_value("m", value) == expected


@pytest.mark.parametrize("value", ["0.5", b"1", [1.0], {"a": 1}, torch.tensor([1.0, 2.0])])
def test_non_numbers_are_refused(value: Any) -> None:
    with pytest.raises(TypeError, match="metric 'm' must be a number"):
        metric_value("m", value)


def test_metric_names_and_steps_are_checked() -> None:
    assert convert_metrics({"a": 1}) == {"a": 1}
    with pytest.raises(ValueError, match="non-empty strings"):
        convert_metrics({"": 1.0})
    with pytest.raises(ValueError, match="non-empty strings"):
        convert_metrics({3: 1.0})
    with pytest.raises(TypeError, match="metrics must be a mapping"):
        convert_metrics([("a", 1.0)])
    assert check_steps(np.int64(4)) == 4
    with pytest.raises(ValueError, match=r"steps_completed must be an int >= 0, got -1"):
        check_steps(-1)
    with pytest.raises(TypeError, match="steps_completed must be an int >= 0, got float"):
        check_steps(1.0)
    with pytest.raises(TypeError, match="got a bool"):
        check_steps(True)


# -- checkpoint storage ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ({"type": "shared_fs", "host_path": "/data/ck", "storage_path": None}, "/data/ck"),
        ({"type": "shared_fs", "host_path": "/data/ck"}, "/data/ck"),
        ({"type": "shared_fs", "host_path": "/data/ck", "storage_path": "sub"}, "/data/ck/sub"),
        ({"type": "shared_fs", "host_path": "/data", "storage_path": "/data/x"}, "/data/x"),
        ({"type": "directory", "container_path": "/mnt/ck"}, "/mnt/ck"),
    ],
)
def test_storage_directory(storage: dict[str, Any], expected: str) -> None:
    assert directory_of(storage) == Path(expected)


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ({"type": "s4", "bucket": "b"}, "checkpoint_storage.type: 's4' is not one of shared_fs"),
        ({}, "checkpoint_storage.type: None is not one of"),
        ({"type": "s3"}, "checkpoint_storage.bucket: required for s3"),
        ({"type": "azure", "container": "c"}, "checkpoint_storage.connection_string: azure"),
        ({"type": "shared_fs"}, "checkpoint_storage.host_path: required"),
        ({"type": "directory"}, "checkpoint_storage.container_path: required"),
    ],
)
def test_unsupported_storage_is_named(storage: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_config(storage)


def test_local_checkpoint_dir_comes_from_the_config_when_not_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DET_TRIAL_ID", raising=False)
    config = {"checkpoint_storage": {"type": "directory", "container_path": str(tmp_path)}}
    with resolute.init(config=config, seed_everything=False) as ctx:
        assert ctx.checkpoint.directory == tmp_path


def test_resources_list_every_file_with_its_size(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_bytes(b"")
    assert list_resources(tmp_path) == {"a.bin": "3", "sub/b.txt": "0"}
