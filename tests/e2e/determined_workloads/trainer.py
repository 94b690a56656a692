"""A PyTorchTrial run by Determined's Trainer: a linear model fits a synthetic regression.

    python3 -m determined.launch.torch_distributed python3 trainer.py

The data are drawn from fixed seeds with torch (nothing is downloaded). Off-cluster, the
Trainer runs in local mode with LOCAL_HPARAMS.
"""

import argparse
import logging
from collections.abc import Sequence
from typing import Any, cast

import determined as det
import torch
from determined import pytorch
from torch import nn
from torch.utils.data import TensorDataset

FEATURES = 8
LOCAL_HPARAMS = {"global_batch_size": 32, "lr": 0.1}


def synthetic(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    weights = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    noise = 0.01 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, inputs @ weights + 0.5 + noise)


class LinearTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(FEATURES, 1))
        optimizer = torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"))
        self.optimizer = context.wrap_optimizer(optimizer)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        batch_size = self.context.get_per_slot_batch_size()
        return pytorch.DataLoader(synthetic(2048, seed=1), batch_size=batch_size, shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        batch_size = self.context.get_per_slot_batch_size()
        return pytorch.DataLoader(synthetic(256, seed=2), batch_size=batch_size)

    def mse(self, batch: pytorch.TorchData) -> torch.Tensor:
        inputs, targets = cast(Sequence[torch.Tensor], batch)  # TensorDataset: (x, y) pairs
        return nn.functional.mse_loss(self.model(inputs), targets)

    def train_batch(
        self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int
    ) -> dict[str, Any]:
        loss = self.mse(batch)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> dict[str, Any]:
        return {"validation_loss": self.mse(batch)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info is not None else LOCAL_HPARAMS
    latest = info.latest_checkpoint if info is not None else None
    with pytorch.init(hparams=hparams) as train_context:
        trainer = pytorch.Trainer(LinearTrial(train_context), train_context)
        trainer.fit(
            max_length=pytorch.Batch(args.batches),
            validation_period=pytorch.Batch(50),
            checkpoint_period=pytorch.Batch(100),
            latest_checkpoint=latest,
        )
