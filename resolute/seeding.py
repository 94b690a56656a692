"""Seeding and deterministic kernels, after the bit-for-bit recipe of seed doc 003: every
RNG gets (trial seed + rank), so ranks differ from each other but every run of a trial is
the same. numpy and torch are imported only here, and only if installed."""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import warnings

SEED_MODULUS = 2**32  # numpy's legacy seeding takes 32 bits


def rank_seed(trial_seed: int, rank: int = 0) -> int:
    return (trial_seed + rank) % SEED_MODULUS


def _installed(name: str) -> bool:
    return name in sys.modules or importlib.util.find_spec(name) is not None


def seed_everything(trial_seed: int, rank: int = 0) -> int:
    """Seed random, numpy and torch (CPU and every CUDA device); returns the seed used."""
    seed = rank_seed(trial_seed, rank)
    random.seed(seed)
    if _installed("numpy"):
        import numpy

        numpy.random.seed(seed)
    if _installed("torch"):
        import torch

        torch.manual_seed(seed)  # also seeds every CUDA device, lazily
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
    return seed


def make_deterministic() -> None:
    """Deterministic algorithms, cuDNN without autotuning, no TF32. Variables that must exist
    before the process starts (PYTHONHASHSEED) are the agent's job; warn if they are missing.
    """
    if sys.flags.hash_randomization:
        warnings.warn(
            "reproducibility.deterministic: PYTHONHASHSEED was not set to 0 before Python "
            "started, so set and dict-of-str iteration orders differ between runs",
            RuntimeWarning,
            stacklevel=2,
        )
    # cuBLAS reads this when CUDA creates its handle, so setting it now is early enough
    # unless CUDA was already used.
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch_module = sys.modules.get("torch")
        if torch_module is not None and torch_module.cuda.is_initialized():
            warnings.warn(
                "reproducibility.deterministic: CUBLAS_WORKSPACE_CONFIG was not set before "
                "CUDA started; cuBLAS matmuls may not be deterministic",
                RuntimeWarning,
                stacklevel=2,
            )
    if not _installed("torch"):
        return
    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # The legacy flags: they work on every torch version, and torch >= 2.9 maps them onto
    # fp32_precision="ieee" (mixing the two APIs is an error there).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
