"""LegacyRandom reproduces numpy.random.RandomState (and so Determined's nprand) exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from master.core.seeds import MAX_EXPERIMENT_SEED, LegacyRandom

SEEDS = [0, 1, 42, 1234567, MAX_EXPERIMENT_SEED, 2**31, 2**32 - 1]


@pytest.mark.parametrize("seed", SEEDS)
def test_bits32_matches_numpy_raw_outputs(seed: int) -> None:
    # randint over the full 32-bit range returns MT19937's raw outputs unmasked. 2000 draws
    # cross the 624-word regeneration boundary several times.
    expected = np.random.RandomState(seed).randint(0, 2**32, size=2000, dtype=np.uint64)
    rng = LegacyRandom(seed)
    assert [rng.bits32() for _ in range(2000)] == [int(x) for x in expected]


@pytest.mark.parametrize("seed", SEEDS)
def test_trial_seed_draws_match_numpy_randint_2_pow_31(seed: int) -> None:
    expected = np.random.RandomState(seed).randint(0, 2**31, size=50)
    rng = LegacyRandom(seed)
    assert [rng.int64n(2**31) for _ in range(50)] == [int(x) for x in expected]


BOUNDS = [
    1,
    2,
    3,
    7,
    10,
    49,
    100,
    1000,
    2**16 + 1,
    2**31 - 1,
    2**31,
    2**31 + 1,
    2**32 - 1,
    2**32,
    2**32 + 1,
    2**33 + 5,
    10**12,
    10**18,
    2**63 - 1,
]


@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1])
def test_int64n_matches_numpy_for_many_bounds(seed: int) -> None:
    # Interleaving the bounds checks that each call consumes exactly as many outputs as NumPy.
    rs = np.random.RandomState(seed)
    rng = LegacyRandom(seed)
    for _ in range(5):
        for n in BOUNDS:
            assert rng.int64n(n) == int(rs.randint(0, n, dtype=np.int64)), n


def test_int64n_up_to_2_pow_64_matches_numpy_uint64() -> None:
    rs = np.random.RandomState(99)
    rng = LegacyRandom(99)
    for n in [2**63, 2**63 + 12345, 2**64 - 1, 2**64]:
        assert rng.int64n(n) == int(rs.randint(0, n, dtype=np.uint64))


def test_int64n_of_one_consumes_nothing() -> None:
    rng = LegacyRandom(5)
    assert rng.int64n(1) == 0
    assert rng.bits32() == int(np.random.RandomState(5).randint(0, 2**32, dtype=np.uint64))


@pytest.mark.parametrize(("low", "high"), [(0, 10), (-5, 5), (100, 101), (-(2**40), 2**40)])
def test_randint_matches_numpy(low: int, high: int) -> None:
    rs = np.random.RandomState(2024)
    rng = LegacyRandom(2024)
    expected = rs.randint(low, high, size=100, dtype=np.int64)
    assert [rng.randint(low, high) for _ in range(100)] == [int(x) for x in expected]


@pytest.mark.parametrize("seed", SEEDS)
def test_unit_interval_matches_random_sample(seed: int) -> None:
    expected = np.random.RandomState(seed).random_sample(500)
    rng = LegacyRandom(seed)
    assert [rng.unit_interval() for _ in range(500)] == [float(x) for x in expected]


@pytest.mark.parametrize(("low", "high"), [(0.0, 1.0), (-3.5, 2.25), (1e-6, 1e-3), (-4.0, -1.0)])
def test_uniform_matches_numpy(low: float, high: float) -> None:
    rs = np.random.RandomState(31337)
    rng = LegacyRandom(31337)
    expected = rs.uniform(low, high, size=200)
    assert [rng.uniform(low, high) for _ in range(200)] == [float(x) for x in expected]


def test_mixed_sequence_matches_numpy() -> None:
    rs = np.random.RandomState(8)
    rng = LegacyRandom(8)
    for _ in range(100):
        assert rng.uniform(2.0, 3.0) == rs.uniform(2.0, 3.0)
        assert rng.int64n(17) == rs.randint(0, 17)
        assert rng.bits32() == rs.randint(0, 2**32, dtype=np.uint64)
        assert rng.int64n(2**40) == rs.randint(0, 2**40, dtype=np.int64)


def test_does_not_touch_global_random_state() -> None:
    random.seed(123)
    expected = random.random()
    random.seed(123)
    rng = LegacyRandom(1)
    for _ in range(1000):
        rng.bits32()
    assert random.random() == expected


def test_same_seed_same_stream_different_seed_different_stream() -> None:
    a, b, c = LegacyRandom(11), LegacyRandom(11), LegacyRandom(12)
    stream_a = [a.bits32() for _ in range(10)]
    assert stream_a == [b.bits32() for _ in range(10)]
    assert stream_a != [c.bits32() for _ in range(10)]


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40, 1.0, "1", None, True])
def test_out_of_range_or_non_integer_seed_rejected(seed: object) -> None:
    with pytest.raises(ValueError, match="seed"):
        LegacyRandom(seed)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, -1, 2**64 + 1])
def test_int64n_rejects_empty_or_too_wide_range(n: int) -> None:
    with pytest.raises(ValueError):
        LegacyRandom(0).int64n(n)


def test_randint_rejects_empty_range() -> None:
    with pytest.raises(ValueError):
        LegacyRandom(0).randint(5, 5)


@given(st.integers(0, 2**32 - 1), st.integers(1, 2**64))
def test_int64n_stays_in_range(seed: int, n: int) -> None:
    rng = LegacyRandom(seed)
    for _ in range(5):
        assert 0 <= rng.int64n(n) < n


@given(st.integers(0, 2**32 - 1))
def test_unit_interval_stays_in_range(seed: int) -> None:
    rng = LegacyRandom(seed)
    for _ in range(5):
        assert 0.0 <= rng.unit_interval() < 1.0
