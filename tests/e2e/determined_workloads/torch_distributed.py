"""A trial started by Determined's torch.distributed launcher (one process per slot).

    python3 -m determined.launch.torch_distributed python3 torch_distributed.py

Every rank joins a Gloo process group, then all-reduces a tensor each step; the chief
checks the sum and reports it.
"""

import argparse
import logging
import os
import sys

import determined as det
import torch
import torch.distributed as dist


def train(core_context: det.core.Context, steps: int, fail: tuple[int, int] | None) -> None:
    rank, size = core_context.distributed.rank, core_context.distributed.size
    for step in range(1, steps + 1):
        if fail is not None and fail == (rank, step):
            print(f"FAILING rank={rank} step={step}", flush=True)
            sys.exit(3)
        value = torch.tensor([float(rank + step)])
        dist.all_reduce(value)  # sum over ranks: size * step + 0 + 1 + ... + (size - 1)
        expected = size * step + size * (size - 1) / 2
        assert value.item() == expected, (value.item(), expected)
        if core_context.distributed.rank == 0:
            print(f"ALLREDUCE step={step} size={size} sum={value.item()}", flush=True)
            core_context.train.report_training_metrics(
                steps_completed=step, metrics={"sum": value.item()}
            )
        if core_context.preempt.should_preempt():
            return
    if core_context.distributed.rank == 0:
        core_context.train.report_validation_metrics(
            steps_completed=steps, metrics={"world_size": size}
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--fail-first-run",
        nargs=2,
        type=int,
        metavar=("RANK", "STEP"),
        help="in the trial's first run, this rank exits 3 at this step",
    )
    args = parser.parse_args()
    first_run = os.environ.get("DET_TRIAL_RUN_ID") == "1"  # set by the master, per run
    fail = tuple(args.fail_first_run) if args.fail_first_run and first_run else None
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR... come from torchrun
    distributed = det.core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        train(core_context, args.steps, fail)  # type: ignore[arg-type]
    dist.destroy_process_group()
