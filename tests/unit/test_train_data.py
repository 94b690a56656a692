"""resolute.data.ElasticSampler: the global order depends on the seed, the epoch and
num_canonical_nodes, never on the world size, and resumes mid-epoch on another world size."""

from __future__ import annotations

from itertools import chain
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resolute.data import ElasticSampler, batches_per_epoch, global_order


def sampler(
    world_size: int = 1, rank: int = 0, *, n: int = 100, g: int = 8, **kw: Any
) -> ElasticSampler:
    options: dict[str, Any] = {"seed": 7, "num_canonical_nodes": 2} | kw
    return ElasticSampler(n, g, rank=rank, world_size=world_size, **options)


def rank_batches(s: ElasticSampler) -> list[list[int]]:
    indices = list(s)
    p = s.per_rank_batch_size
    return [indices[i : i + p] for i in range(0, len(indices), p)]


def global_batches(world_size: int, **kw: Any) -> list[list[int]]:
    """Each global batch as the concatenation, in rank order, of every rank's slice."""
    per_rank = [rank_batches(sampler(world_size, r, **kw)) for r in range(world_size)]
    return [list(chain(*slices)) for slices in zip(*per_rank, strict=True)]


def test_global_batches_are_the_same_on_1_2_and_4_ranks() -> None:
    single = global_batches(1, n=103, g=8, num_canonical_nodes=3)
    assert len(single) == 103 // 8
    for world_size in (2, 4):
        assert global_batches(world_size, n=103, g=8, num_canonical_nodes=3) == single


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    per_rank=st.integers(1, 6),
    nodes=st.integers(1, 9),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
)
def test_world_size_never_changes_the_batches(
    n: int, per_rank: int, nodes: int, seed: int, epoch: int
) -> None:
    g = 4 * per_rank
    if n < g:
        return
    kw: dict[str, Any] = {"n": n, "g": g, "seed": seed, "num_canonical_nodes": nodes}
    single = global_batches(1, epoch=epoch, **kw)
    assert global_batches(2, epoch=epoch, **kw) == single
    assert global_batches(4, epoch=epoch, **kw) == single
    # A permutation prefix: every global batch has distinct samples of the dataset.
    flat = list(chain(*single))
    assert len(flat) == len(set(flat)) == (n // g) * g
    assert all(0 <= i < n for i in flat)


def test_global_order_is_a_permutation_built_from_contiguous_partitions() -> None:
    order = global_order(10, seed=1, epoch=0, num_canonical_nodes=3)
    assert sorted(order) == list(range(10))
    # Partitions [0..3], [4..6], [7..9] interleaved round-robin: position k*3+p is partition p.
    partitions = [range(0, 4), range(4, 7), range(7, 10)]
    for position, index in enumerate(order[:9]):
        assert index in partitions[position % 3]
    assert order[9] in partitions[0]  # the longer first partition adds the last round


def test_more_canonical_nodes_than_samples_still_covers_every_sample() -> None:
    assert sorted(global_order(3, seed=0, epoch=0, num_canonical_nodes=8)) == [0, 1, 2]


def test_order_depends_on_seed_epoch_and_canonical_nodes() -> None:
    base = global_order(1000, seed=1, epoch=0, num_canonical_nodes=4)
    assert base == global_order(1000, seed=1, epoch=0, num_canonical_nodes=4)
    assert base != global_order(1000, seed=2, epoch=0, num_canonical_nodes=4)
    assert base != global_order(1000, seed=1, epoch=1, num_canonical_nodes=4)
    assert base != global_order(1000, seed=1, epoch=0, num_canonical_nodes=2)


def test_order_is_pinned() -> None:
    """The order must never change between releases (or Python versions): a run resumed
    after an upgrade would otherwise see different data."""
    pinned = [3, 7, 2, 11, 1, 9, 0, 6, 4, 10, 5, 8]
    assert global_order(12, seed=42, epoch=3, num_canonical_nodes=2) == pinned


def test_rank_slices_are_contiguous_parts_of_the_global_batch() -> None:
    order = global_order(64, seed=7, epoch=0, num_canonical_nodes=2)
    s = sampler(4, 2, n=64, g=16)
    assert rank_batches(s)[1] == order[16 + 2 * 4 : 16 + 3 * 4]


def test_iteration_advances_the_position_and_set_epoch_resets_it() -> None:
    s = sampler(2, 0, n=100, g=8)
    assert len(s) == 12 * 4
    it = iter(s)
    first = [next(it) for _ in range(4)]
    assert s.state_dict() == {"epoch": 0, "samples_seen": 8}
    assert len(s) == 11 * 4
    rest = list(it)
    assert len(first + rest) == 12 * 4
    assert s.state_dict() == {"epoch": 0, "samples_seen": 96}
    assert list(s) == [] and len(s) == 0  # the epoch is over until the next set_epoch
    s.set_epoch(1)
    assert s.state_dict() == {"epoch": 1, "samples_seen": 0}
    assert len(list(s)) == 12 * 4


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4), (1, 4), (4, 1)])
def test_resume_mid_epoch_on_another_world_size_continues_the_stream(
    before: int, after: int
) -> None:
    kw: dict[str, Any] = {"n": 200, "g": 8, "num_canonical_nodes": 4, "epoch": 2}
    whole = global_batches(1, **kw)
    # Train 5 global batches on `before` ranks, then checkpoint the chief's sampler state.
    first = sampler(before, 0, **kw)
    it = iter(first)
    for _ in range(5 * first.per_rank_batch_size):
        next(it)
    state = first.state_dict()
    assert state == {"epoch": 2, "samples_seen": 40}
    resumed: list[list[list[int]]] = []
    for rank in range(after):
        s = sampler(after, rank, **(kw | {"epoch": 0}))
        s.load_state_dict(state)
        resumed.append(rank_batches(s))
    assert [list(chain(*slices)) for slices in zip(*resumed, strict=True)] == whole[5:]


def test_set_step_counts_global_batches_across_epochs() -> None:
    s = sampler(1, 0, n=100, g=8)  # 12 batches per epoch
    s.set_step(30)
    assert s.state_dict() == {"epoch": 2, "samples_seen": 48}
    s.set_step(24)
    assert s.state_dict() == {"epoch": 2, "samples_seen": 0}


def test_repositioning_ends_a_running_iterator() -> None:
    s = sampler(1, 0, n=100, g=8)
    it = iter(s)
    next(it)
    s.set_epoch(3)
    assert len(list(it)) == 7  # it finishes the slice it was in (no short batch), no more
    assert s.state_dict() == {"epoch": 3, "samples_seen": 0}


def test_batches_per_epoch_drops_the_incomplete_batch() -> None:
    assert batches_per_epoch(100, 8) == 12
    assert batches_per_epoch(96, 8) == 12
    assert sampler(n=100, g=8).batches_per_epoch == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"global_batch_size": 10, "world_size": 4}, "global_batch_size (10) must be divisible"),
        ({"num_canonical_nodes": 0}, "num_canonical_nodes must be >= 1"),
        ({"world_size": 0}, "world_size must be >= 1"),
        ({"rank": 2, "world_size": 2}, "rank must be < world_size"),
        ({"rank": -1}, "rank must be >= 0"),
        ({"num_samples": 4}, "num_samples (4) is smaller than global_batch_size (8)"),
        ({"global_batch_size": 0}, "global_batch_size must be >= 1"),
        ({"epoch": -1}, "epoch must be >= 0"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "num_samples": 100,
        "global_batch_size": 8,
        "rank": 0,
        "world_size": 1,
        "seed": 0,
        "num_canonical_nodes": 1,
    } | kwargs
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ElasticSampler(**args)


def test_bad_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="seed must be an int"):
        ElasticSampler(100, 8, rank=0, world_size=1, seed="7", num_canonical_nodes=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="world_size must be an int, got a bool"):
        ElasticSampler(100, 8, rank=0, world_size=True, seed=7, num_canonical_nodes=1)


def test_bad_positions_are_refused() -> None:
    s = sampler(n=100, g=8)
    with pytest.raises(ValueError, match="multiple of global_batch_size"):
        s.set_position(0, 12)
    with pytest.raises(ValueError, match="past the end of the epoch"):
        s.set_position(0, 104)
    with pytest.raises(KeyError, match="samples_seen"):
        s.load_state_dict({"epoch": 1})
