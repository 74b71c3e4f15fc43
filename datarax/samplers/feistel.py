"""A keyed pseudo-random permutation of [0, N) in O(1) memory.

A balanced Feistel network over the smallest even number of bits that covers N is a bijection
on [0, 2^bits); cycle-walking (re-encrypting values that land at or above N) restricts it to a
bijection on [0, N). Everything is vectorised over an index array in numpy uint64, so a batch of
positions maps to record ids in one call, and nothing of size N is ever allocated.
"""

from __future__ import annotations

import numpy as np

MAX_RECORDS = 2**62
MAX_SEED = 2**63 - 1
_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def validate_seed(seed: object, name: str = "seed") -> int:
    """Checks that `seed` is an int in [0, 2**63 - 1] and returns it."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int in [0, 2**63 - 1], got {seed!r} ({type(seed).__name__})")
    seed = int(seed)
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must be in [0, 2**63 - 1], got {seed}; pick a non-negative seed below 2**63")
    return seed


def round_keys(seed: int, epoch: int) -> np.ndarray:
    """The round keys of the permutation for (seed, epoch): uint64[_ROUNDS]."""
    words = [seed & 0xFFFFFFFF, seed >> 32, epoch & 0xFFFFFFFF, epoch >> 32, 0xDA7A]
    return np.random.SeedSequence(words).generate_state(_ROUNDS, dtype=np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser: a strong 64-bit mixer, identical on every platform.
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


class FeistelPermutation:
    """The permutation of [0, num_records) keyed by (seed, epoch).

    Example:
        >>> perm = FeistelPermutation(10, seed=0, epoch=0)
        >>> sorted(perm(np.arange(10)).tolist()) == list(range(10))
        True
    """

    def __init__(self, num_records: int, seed: int, epoch: int):
        if not 1 <= num_records <= MAX_RECORDS:
            raise ValueError(f"num_records must be in [1, 2**62], got {num_records}")
        self.num_records = int(num_records)
        bits = max(2, int(num_records - 1).bit_length())
        bits += bits % 2
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        self._keys = list(round_keys(validate_seed(seed), int(epoch)))

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ (_mix(right ^ k) & self._mask)
        return (left << self._half) | right

    def _decrypt(self, y: np.ndarray) -> np.ndarray:
        left, right = y >> self._half, y & self._mask
        for k in reversed(self._keys):
            left, right = right ^ (_mix(left ^ k) & self._mask), left
        return (left << self._half) | right

    def _walk(self, step, x: np.ndarray) -> np.ndarray:
        n = np.uint64(self.num_records)
        y = step(x)
        out = y >= n
        while out.any():
            y[out] = step(y[out])
            out = y >= n
        return y

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Maps positions in [0, N) to record ids in [0, N) (int64, same shape)."""
        x = np.asarray(positions, dtype=np.uint64)
        return self._walk(self._encrypt, x.ravel()).reshape(x.shape).astype(np.int64)

    def inverse(self, record_ids: np.ndarray) -> np.ndarray:
        """The position of each record id in this epoch's order."""
        y = np.asarray(record_ids, dtype=np.uint64)
        return self._walk(self._decrypt, y.ravel()).reshape(y.shape).astype(np.int64)
