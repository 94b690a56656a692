"""A Determined Core API script, as Determined's tutorials write them, run unchanged here:
a toy regression trained data-parallel by every rank that Determined's torch.distributed
launcher starts, with training and validation metrics, a checkpoint at every validation,
resume from the latest checkpoint, and preemption (pause, kill) honoured between steps.

    entrypoint: python3 -m determined.launch.torch_distributed python3 train.py
"""

import logging
import pathlib

import determined as det
import torch
import torch.distributed as dist


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of global batch `step`: y = 3x - 1 plus a little noise."""
    generator = torch.Generator().manual_seed(step * size + rank)
    x = torch.rand(32, 1, generator=generator)
    return x, 3 * x - 1 + 0.01 * torch.randn(32, 1, generator=generator)


def main(core_context: det.core.Context, info: det.ClusterInfo) -> None:
    assert info.trial is not None
    hparams = info.trial.hparams
    rank, size = core_context.distributed.rank, core_context.distributed.size
    model = torch.nn.Linear(1, 1)
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=hparams["lr"])
    steps_done = 0
    if info.latest_checkpoint is not None:  # a resumed pause, or a restart after a failure
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            state = torch.load(pathlib.Path(path) / "state.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        steps_done = state["steps"]
    for step in range(steps_done + 1, hparams["steps"] + 1):
        x, y = batch(step, rank, size)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            core_context.train.report_training_metrics(
                steps_completed=step, metrics={"loss": loss.item()}
            )
        if step % hparams["validate_every"] == 0:
            x, y = batch(0, 0, 1)  # the same held-out batch every time
            with torch.no_grad():
                validation_loss = torch.nn.functional.mse_loss(model(x), y).item()
            if rank == 0:
                core_context.train.report_validation_metrics(
                    steps_completed=step, metrics={"validation_loss": validation_loss}
                )
                checkpoint = {"steps_completed": step}
                with core_context.checkpoint.store_path(checkpoint) as (path, _):
                    state = {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "steps": step,
                    }
                    torch.save(state, pathlib.Path(path) / "state.pt")
            if core_context.preempt.should_preempt():  # every rank asks, at the same step
                return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR... from the launcher
    distributed = det.core.DistributedContext.from_torch_distributed()
    cluster_info = det.get_cluster_info()
    assert cluster_info is not None, "a Determined trial: submit it to a cluster"
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, cluster_info)
    dist.destroy_process_group()
