"""PyTorch DDP regression on a synthetic dataset, elastically deterministic.

Run by the cluster (`entrypoint: python3 train.py`, one process per slot) or by hand:

    export PYTHONHASHSEED=0       # as the agent sets it for deterministic runs (else a warning)
    python3 train.py                                   # one process, no master (local mode)
    python3 train.py --resume UUID                     # from ./checkpoints/UUID
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 train.py &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 train.py

Everything random comes from seeds: the dataset from the `data_seed` hyperparameter (no
download), the initial weights and the data order from the trial seed the master assigns.
With the same global_batch_size and num_canonical_nodes the loss curve is the same on 1, 2
or 4 slots, and a run stopped on one slot count resumes from its checkpoint on another:

- resolute.data.ElasticSampler gives every global batch the same samples whatever the world
  size; each rank takes a contiguous slice of it;
- each rank's loss is the mean over its slice and DDP averages the gradients over the
  ranks, so the update is that of the mean over the global batch (the slices are equal);
  DDP's all-reduce sums in float64 (sum_in_float64), so its order does not matter;
- the reported loss is the squared error summed over the global batch in float64;
- no dropout or other randomness in the step; reproducibility.deterministic picks
  deterministic kernels.

On the same number of slots the curve is bit-identical, resumed or not. Across slot counts
the model's float32 arithmetic still differs in the last bits (a 64-sample matmul is not
four 16-sample ones), which training amplifies slowly: over this example's 40 steps on CPU
the loss stays within 4e-7 relative of the 4-slot run (the tests allow 1e-6). float32 is
enough for that; set the `dtype` hyperparameter to float64 for much longer runs that must
stay as close (about 1e-15).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import resolute
from resolute.data import ElasticSampler

# Used only when run by hand without a cluster (local mode).
LOCAL_HPARAMS: dict[str, Any] = {
    "global_batch_size": 64,
    "lr": 0.05,
    "momentum": 0.9,
    "hidden_size": 64,
    "num_canonical_nodes": 4,
    "num_samples": 4096,
    "num_features": 32,
    "noise": 0.1,
    "data_seed": 20260521,
    "dtype": "float32",
    "step_sleep_s": 0.0,
}
LOCAL_CONFIG: dict[str, Any] = {
    "searcher": {"max_length": {"batches": 40}},
    "min_validation_period": {"batches": 10},
    "min_checkpoint_period": {"batches": 10},
    "reproducibility": {"deterministic": True},
}
VALIDATION_SAMPLES = 1024
STATE_FILE = "state.pt"


def period(config: dict[str, Any], key: str) -> int:
    """min_validation_period / min_checkpoint_period in batches; 0 (or unset) means never."""
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("batches")
    return value if isinstance(value, int) and value > 0 else 0


def make_dataset(hparams: dict[str, Any], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Inputs and targets of a fixed random teacher network plus noise, from data_seed only:
    every rank and every run builds the same tensors. Made in float64, then cast, so that
    float32 and float64 runs learn the same data."""
    generator = torch.Generator().manual_seed(int(hparams["data_seed"]))
    n = int(hparams["num_samples"]) + VALIDATION_SAMPLES
    features = int(hparams["num_features"])
    x = torch.randn(n, features, generator=generator, dtype=torch.float64)
    w1 = torch.randn(features, 16, generator=generator, dtype=torch.float64) / features**0.5
    w2 = torch.randn(16, 1, generator=generator, dtype=torch.float64) / 4
    noise = torch.randn(n, 1, generator=generator, dtype=torch.float64)
    y = torch.tanh(x @ w1) @ w2 + float(hparams["noise"]) * noise
    x, y = x.to(dtype), y.to(dtype)
    train = int(hparams["num_samples"])
    return x[:train], y[:train], x[train:], y[train:]


def make_model(hparams: dict[str, Any], seed: int, dtype: torch.dtype) -> nn.Module:
    # The same initial weights on every world size: from the trial seed, not seed + rank
    # (DDP would broadcast rank 0's anyway; this makes a 1-slot run start from them too).
    torch.manual_seed(seed)
    hidden = int(hparams["hidden_size"])
    return nn.Sequential(
        nn.Linear(int(hparams["num_features"]), hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, 1),
    ).to(dtype)


def rank_batches(sampler: ElasticSampler) -> Iterator[list[int]]:
    """This rank's slice of each global batch, epoch after epoch, from the sampler's position."""
    while True:
        indices = iter(sampler)
        while batch := list(islice(indices, sampler.per_rank_batch_size)):
            yield batch
        sampler.set_epoch(sampler.epoch + 1)


def init_distributed(ctx: resolute.Context) -> torch.device:
    if torch.cuda.is_available():
        backend, device = "nccl", torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
        # One process per slot shares the cores: no more threads than its share. (A 1-slot
        # run may use more threads than a 4-slot one; at most that changes float rounding,
        # which the slot counts differ in anyway.)
        cores = len(os.sched_getaffinity(0))
        torch.set_num_threads(max(1, cores // max(1, ctx.local_world_size)))
    if ctx.local:
        # By hand: RANK/WORLD_SIZE/MASTER_* from the shell, or a one-process group of our own.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group(
        backend,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    return device


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# No annotations: DDP checks the hook's signature against the real classes, and this
# module's annotations are strings (from __future__ import annotations).
def sum_in_float64(state, bucket):  # type: ignore[no-untyped-def]
    """DDP's gradient all-reduce, summed in float64 and rounded once.

    DDP rebuilds its buckets after the first step (in the order the gradients became
    ready), and a ring all-reduce over more than two ranks adds each element in an order
    that depends on where it sits in the bucket: so a run resumed from a checkpoint (whose
    first step uses the initial buckets) would round differently from the uninterrupted
    one. Sums of a few float32 values are exact in float64, in any order."""
    buffer = bucket.buffer()
    wide = buffer.to(torch.float64)
    world_size = dist.get_world_size()
    future = dist.all_reduce(wide, async_op=True).get_future()

    def narrow(done):  # type: ignore[no-untyped-def]
        return (done.value()[0] / world_size).to(buffer.dtype)

    return future.then(narrow)


class Trainer:
    def __init__(self, ctx: resolute.Context, device: torch.device) -> None:
        self.ctx = ctx
        self.device = device
        hparams = ctx.hparams
        self.dtype = {"float32": torch.float32, "float64": torch.float64}[
            str(hparams.get("dtype", "float32"))
        ]
        x, y, self.val_x, self.val_y = make_dataset(hparams, self.dtype)
        self.x, self.y = x.to(device), y.to(device)
        self.val_x, self.val_y = self.val_x.to(device), self.val_y.to(device)
        self.global_batch_size = int(hparams["global_batch_size"])
        self.sampler = ElasticSampler(
            len(self.x),
            self.global_batch_size,
            rank=ctx.rank,
            world_size=ctx.world_size,
            seed=ctx.trial_seed,
            num_canonical_nodes=int(hparams["num_canonical_nodes"]),
        )
        self.model = make_model(hparams, ctx.trial_seed, self.dtype).to(device)
        device_ids = None if device.type == "cpu" else [device]
        self.ddp = DistributedDataParallel(self.model, device_ids=device_ids)
        self.ddp.register_comm_hook(None, sum_in_float64)
        self.optimizer = torch.optim.SGD(
            self.ddp.parameters(), lr=float(hparams["lr"]), momentum=float(hparams["momentum"])
        )
        self.steps = 0
        self.last_checkpoint_steps = -1
        self.max_length = ctx.max_length or 40
        self.validate_every = period(ctx.config, "min_validation_period")
        self.checkpoint_every = period(ctx.config, "min_checkpoint_period")
        self.step_sleep_s = float(hparams.get("step_sleep_s") or 0.0)

    # -- checkpoints ------------------------------------------------------------------------

    def save(self) -> None:
        """The chief writes; every rank waits for it, so no rank runs ahead of a checkpoint
        that might be lost."""
        if self.ctx.is_chief:
            state = {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "steps_completed": self.steps,
                "sampler": self.sampler.state_dict(),
            }
            metadata = {"world_size": self.ctx.world_size, "torch": torch.__version__}
            with self.ctx.checkpoint.store_path(self.steps, metadata) as (path, uuid):
                torch.save(state, path / STATE_FILE)
            print(f"CHECKPOINT uuid={uuid} steps={self.steps}", flush=True)
        dist.barrier()
        self.last_checkpoint_steps = self.steps

    def restore(self, uuid: str) -> None:
        """Every rank reads the same files from the shared checkpoint directory."""
        with self.ctx.checkpoint.restore_path(uuid) as path:
            state = torch.load(Path(path) / STATE_FILE, map_location=self.device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.steps = self.last_checkpoint_steps = int(state["steps_completed"])
        if self.ctx.is_chief:
            print(
                f"RESUMED uuid={uuid} steps={self.steps} world_size={self.ctx.world_size}",
                flush=True,
            )

    # -- the loop ---------------------------------------------------------------------------

    def global_mean_loss(self, prediction: torch.Tensor, target: torch.Tensor) -> float:
        """The mean squared error over the global batch, summed in float64: the ranks'
        float32 means all-reduced in another order on another world size would differ in
        the last bits even when the models are the same."""
        total = (prediction.detach().double() - target.double()).square().sum()
        dist.all_reduce(total)
        return float(total) / self.global_batch_size

    def validate(self) -> None:
        # The chief alone, on the whole validation set: no collective, and the same figure
        # on every world size.
        if not self.ctx.is_chief:
            return
        with torch.no_grad():
            loss = nn.functional.mse_loss(self.model(self.val_x), self.val_y)
        self.ctx.train.report_validation_metrics(self.steps, {"validation_loss": float(loss)})
        print(f"VALIDATION steps={self.steps} validation_loss={float(loss):.6f}", flush=True)

    def train(self) -> None:
        ctx = self.ctx
        if ctx.latest_checkpoint:
            self.restore(ctx.latest_checkpoint)
        elif ctx.is_chief:
            print(f"STARTED steps=0 world_size={ctx.world_size}", flush=True)
        batches = rank_batches(self.sampler)
        while self.steps < self.max_length:
            indices = torch.tensor(next(batches), device=self.device)
            self.optimizer.zero_grad(set_to_none=True)
            prediction, target = self.ddp(self.x[indices]), self.y[indices]
            nn.functional.mse_loss(prediction, target).backward()
            self.optimizer.step()
            self.steps += 1
            loss = self.global_mean_loss(prediction, target)
            ctx.train.report_training_metrics(self.steps, {"loss": loss})
            if self.validate_every and self.steps % self.validate_every == 0:
                self.validate()
            if self.checkpoint_every and self.steps % self.checkpoint_every == 0:
                self.save()
                ctx.train.report_progress(self.steps / self.max_length)
            if self.step_sleep_s:
                time.sleep(self.step_sleep_s)
            if ctx.preempt.should_preempt():
                if self.last_checkpoint_steps != self.steps:
                    self.save()
                if ctx.is_chief:
                    print(f"PREEMPTED steps={self.steps}", flush=True)
                return
        if self.last_checkpoint_steps != self.steps:
            self.save()
        if self.validate_every and self.steps % self.validate_every:
            self.validate()
        ctx.train.report_progress(1.0)
        if ctx.is_chief:
            print(f"FINISHED steps={self.steps}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--resume", metavar="UUID", help="local mode: start from this checkpoint in ./checkpoints"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with resolute.init(
        hparams=LOCAL_HPARAMS, config=LOCAL_CONFIG, latest_checkpoint=args.resume
    ) as ctx:
        device = init_distributed(ctx)
        try:
            Trainer(ctx, device).train()
        finally:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
