"""resolute.seeding: (trial seed + rank) for every RNG, and torch's deterministic switches."""

from __future__ import annotations

import os
import random
import sys
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from resolute.seeding import make_deterministic, rank_seed, seed_everything


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.random()), float(torch.rand(1).item())


def test_equal_seeds_give_equal_draws_and_ranks_differ() -> None:
    seed_everything(1234, rank=0)
    first = draws()
    seed_everything(1234, rank=0)
    assert draws() == first
    seed_everything(1234, rank=1)
    assert draws() != first
    seed_everything(1235, rank=0)  # rank 1 of seed 1234 is the same stream as seed 1235
    second = draws()
    seed_everything(1234, rank=1)
    assert draws() == second


def test_seed_wraps_to_32_bits() -> None:
    assert rank_seed(2**32 - 1, 1) == 0
    assert seed_everything(2**32 - 1, rank=3) == 2
    assert rank_seed(5, 2) == 7


@pytest.fixture
def torch_flags() -> Iterator[None]:
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic = saved[1]
    torch.backends.cudnn.benchmark = saved[2]
    torch.backends.cuda.matmul.allow_tf32 = saved[3]
    torch.backends.cudnn.allow_tf32 = saved[4]
    if saved[5] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[5]


def deterministic_quietly() -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_deterministic()
    return [str(w.message) for w in caught]


@pytest.mark.usefixtures("torch_flags")
def test_deterministic_mode_sets_the_torch_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    deterministic_quietly()
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic is True
    assert torch.backends.cudnn.benchmark is False
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.mark.usefixtures("torch_flags")
def test_deterministic_mode_warns_without_a_fixed_hash_seed() -> None:
    messages = deterministic_quietly()
    hash_warnings = [m for m in messages if "PYTHONHASHSEED" in m]
    assert len(hash_warnings) == (1 if sys.flags.hash_randomization else 0)


@pytest.mark.usefixtures("torch_flags")
def test_an_existing_cublas_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    deterministic_quietly()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
