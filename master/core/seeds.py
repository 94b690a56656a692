"""NumPy's legacy `RandomState` generator, as Determined's searcher uses it (`pkg/nprand`).

Trial hyperparameters and seeds must match what Determined (and NumPy) derive from the same
experiment seed, so this reproduces MT19937 seeded with `init_genrand` and RandomKit's
bounded-integer and double routines bit for bit.
"""

from __future__ import annotations

import random

MAX_EXPERIMENT_SEED = 2**31 - 1
"""The largest experiment seed Determined documents (`reproducibility.experiment_seed`)."""

_MASK32 = 0xFFFFFFFF
_STATE_WORDS = 624


class LegacyRandom:
    """A private MT19937 stream, seeded exactly like `numpy.random.RandomState(seed)`.

    Python's `random.Random` runs the same MT19937 core in C, so we compute NumPy's initial
    key ourselves and load it; `getrandbits(32)` then yields NumPy's raw 32-bit outputs.
    Each instance owns its generator: the global `random` state is never touched.
    """

    __slots__ = ("_gen",)

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MASK32:
            raise ValueError(f"seed must be an integer in [0, 2**32-1], got {seed!r}")
        key = [0] * _STATE_WORDS
        value = seed
        for pos in range(_STATE_WORDS):
            key[pos] = value
            value = (1812433253 * (value ^ (value >> 30)) + pos + 1) & _MASK32
        # A fixed seed first, so constructing never reads OS entropy; setstate replaces it.
        self._gen = random.Random(0)
        # Position 624 makes the first draw regenerate the whole block, as NumPy does.
        self._gen.setstate((3, (*key, _STATE_WORDS), None))

    def state(self) -> list[int]:
        """The generator's position: 624 key words then the index, for storing as JSON."""
        _, words, _ = self._gen.getstate()
        return list(words)

    @classmethod
    def from_state(cls, words: list[int]) -> LegacyRandom:
        """The generator at a position `state()` returned."""
        if len(words) != _STATE_WORDS + 1 or not all(
            isinstance(w, int) and 0 <= w <= _MASK32 for w in words[:-1]
        ):
            raise ValueError("not a stored MT19937 state (624 32-bit words and a position)")
        if not 0 <= words[-1] <= _STATE_WORDS:
            raise ValueError(f"MT19937 position {words[-1]} is outside 0..{_STATE_WORDS}")
        rng = cls(0)
        rng._gen.setstate((3, tuple(words), None))
        return rng

    def bits32(self) -> int:
        """One raw 32-bit output (RandomKit `rk_random`, Determined `Bits32`)."""
        return self._gen.getrandbits(32)

    def _bits64(self) -> int:
        high = self._gen.getrandbits(32)
        low = self._gen.getrandbits(32)
        return (high << 32) | low

    def int64n(self, n: int) -> int:
        """Uniform integer in [0, n), by masked rejection like NumPy's legacy `randint(0, n)`.

        n == 1 consumes no output, again like NumPy; ranges wider than 32 bits draw 64-bit
        values (high word first).
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 2**64:
            raise ValueError(f"n must be an integer in [1, 2**64], got {n!r}")
        limit = n - 1
        if limit == 0:
            return 0
        mask = (1 << limit.bit_length()) - 1
        if limit <= _MASK32:
            while True:
                value = self._gen.getrandbits(32) & mask
                if value <= limit:
                    return value
        while True:
            value = self._bits64() & mask
            if value <= limit:
                return value

    def randint(self, low: int, high: int) -> int:
        """Uniform integer in the half-open range [low, high)."""
        if high <= low:
            raise ValueError(f"randint needs high > low, got low={low!r} high={high!r}")
        return low + self.int64n(high - low)

    def unit_interval(self) -> float:
        """Uniform float in [0, 1) with 53 random bits, like NumPy's `random_sample`."""
        a = self._gen.getrandbits(32) >> 5
        b = self._gen.getrandbits(32) >> 6
        return (a * 67108864.0 + b) / 9007199254740992.0

    def uniform(self, low: float, high: float) -> float:
        """Uniform float in [low, high), like NumPy's legacy `uniform`."""
        return low + (high - low) * self.unit_interval()
