"""A data order that does not depend on the number of ranks (seed doc 000, "elastic
determinism"): the same global batches, in the same order, on 1, 2 or 4 slots, as long as
the global batch size, the seed and num_canonical_nodes stay the same.

The global order is built like MosaicML Streaming's: [0, num_samples) is split into
`num_canonical_nodes` contiguous partitions, each partition is shuffled with a generator
seeded from (seed, epoch, partition), and the partitions are interleaved round-robin into one
stream. Global batch b is stream[b*G:(b+1)*G]; rank r takes the r-th contiguous slice of it.
The incomplete last global batch is dropped. Pure Python: no torch needed.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Iterator, Mapping
from typing import Any


def _int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def batches_per_epoch(num_samples: int, global_batch_size: int) -> int:
    """Whole global batches in one epoch (the incomplete last one is dropped)."""
    return _int(num_samples, "num_samples", 0) // _int(global_batch_size, "global_batch_size", 1)


def _partition_generator(seed: int, epoch: int, partition: int) -> random.Random:
    # A str seed is hashed with SHA-512 by random.Random: the same stream on every
    # Python version and platform, unlike hash()-based seeding.
    return random.Random(f"resolute.data:{seed}:{epoch}:{partition}")


def global_order(num_samples: int, *, seed: int, epoch: int, num_canonical_nodes: int) -> list[int]:
    """Every sample index of one epoch in its global order (before dropping the tail)."""
    n = _int(num_samples, "num_samples", 0)
    nodes = _int(num_canonical_nodes, "num_canonical_nodes", 1)
    seed = _int(seed, "seed", -(2**63))
    epoch = _int(epoch, "epoch", 0)
    base, extra = divmod(n, nodes)
    partitions: list[list[int]] = []
    start = 0
    for p in range(nodes):
        size = base + (1 if p < extra else 0)
        part = list(range(start, start + size))
        _partition_generator(seed, epoch, p).shuffle(part)
        partitions.append(part)
        start += size
    order = [index for group in zip(*partitions, strict=False) for index in group]
    # The first `extra` partitions are one sample longer: they add a last, shorter round.
    order.extend(part[-1] for part in partitions[:extra])
    return order


class ElasticSampler:
    """This rank's indices, batch by batch: a torch-compatible sampler (use it with
    `DataLoader(batch_size=sampler.per_rank_batch_size, sampler=sampler)`).

    Iterating yields the rest of the current epoch from the current position, and moves the
    position on by one global batch as each of this rank's slices is handed out, so
    state_dict() taken after training a batch already counts it. A DataLoader with workers
    fetches ahead of training; then position the sampler from your own step count with
    set_step() or set_position() when resuming instead of trusting state_dict().
    """

    def __init__(
        self,
        num_samples: int,
        global_batch_size: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
        num_canonical_nodes: int,
        epoch: int = 0,
    ) -> None:
        self.num_samples = _int(num_samples, "num_samples", 0)
        self.global_batch_size = _int(global_batch_size, "global_batch_size", 1)
        self.world_size = _int(world_size, "world_size", 1)
        self.rank = _int(rank, "rank", 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be < world_size ({self.world_size}), got {self.rank}")
        if self.global_batch_size % self.world_size:
            raise ValueError(
                f"global_batch_size ({self.global_batch_size}) must be divisible by "
                f"world_size ({self.world_size})"
            )
        if self.num_samples < self.global_batch_size:
            raise ValueError(
                f"num_samples ({self.num_samples}) is smaller than global_batch_size "
                f"({self.global_batch_size}): an epoch would have no batch"
            )
        self.seed = _int(seed, "seed", -(2**63))
        self.num_canonical_nodes = _int(num_canonical_nodes, "num_canonical_nodes", 1)
        self.per_rank_batch_size = self.global_batch_size // self.world_size
        self.batches_per_epoch = self.num_samples // self.global_batch_size
        self._epoch = _int(epoch, "epoch", 0)
        self._samples_seen = 0
        self._order: tuple[int, list[int]] | None = None  # (epoch, its order), cached
        self._moves = 0  # bumped by every repositioning, which ends running iterators

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def samples_seen(self) -> int:
        """Global samples of the current epoch already handed out (a multiple of G)."""
        return self._samples_seen

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning."""
        self.set_position(epoch, 0)

    def set_position(self, epoch: int, samples_seen: int) -> None:
        """Continue `epoch` after `samples_seen` global samples, whatever the world size of
        the run that saw them (the global batch size must be the same)."""
        epoch = _int(epoch, "epoch", 0)
        seen = _int(samples_seen, "samples_seen", 0)
        if seen % self.global_batch_size:
            raise ValueError(
                f"samples_seen ({seen}) must be a multiple of global_batch_size "
                f"({self.global_batch_size})"
            )
        if seen > self.batches_per_epoch * self.global_batch_size:
            raise ValueError(
                f"samples_seen ({seen}) is past the end of the epoch "
                f"({self.batches_per_epoch} batches of {self.global_batch_size})"
            )
        self._epoch = epoch
        self._samples_seen = seen
        self._moves += 1

    def set_step(self, steps_completed: int) -> None:
        """Position after `steps_completed` global batches counted from epoch 0, the usual
        way to resume from a checkpoint's step count."""
        steps = _int(steps_completed, "steps_completed", 0)
        epoch, batch = divmod(steps, self.batches_per_epoch)
        self.set_position(epoch, batch * self.global_batch_size)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "samples_seen": self._samples_seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = {"epoch", "samples_seen"} - set(state)
        if missing:
            raise KeyError(f"sampler state is missing {sorted(missing)}")
        self.set_position(state["epoch"], state["samples_seen"])

    def epoch_order(self) -> list[int]:
        """The global order of the current epoch (shared by every rank)."""
        if self._order is None or self._order[0] != self._epoch:
            order = global_order(
                self.num_samples,
                seed=self.seed,
                epoch=self._epoch,
                num_canonical_nodes=self.num_canonical_nodes,
            )
            self._order = (self._epoch, order)
        return self._order[1]

    def __len__(self) -> int:
        remaining = self.batches_per_epoch - self._samples_seen // self.global_batch_size
        return remaining * self.per_rank_batch_size

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order()
        moves = self._moves
        g, p = self.global_batch_size, self.per_rank_batch_size
        for batch in range(self._samples_seen // g, self.batches_per_epoch):
            if self._moves != moves:
                return  # repositioned mid-iteration: this iterator is stale
            start = batch * g + self.rank * p
            self._samples_seen = (batch + 1) * g
            yield from order[start : start + p]
