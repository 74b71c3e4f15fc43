"""A keyed pseudo-random permutation of [0, N) in O(1) memory.

A balanced Feistel network over the smallest even number of bits that covers N is a bijection
on [0, 2^bits); cycle-walking (re-encrypting values that land at or above N) restricts it to a
bijection on [0, N). Everything is vectorised over an index array, so a batch of positions maps
to record ids in one call, and nothing of size N is ever allocated.

Up to 2^32 records the network works on 32-bit words, with the same arithmetic in numpy (host)
and in `jax.numpy` (inside the pipeline's compiled step): both give identical permutations.
Larger domains (up to 2^62) use 64-bit words, on the host only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from datarax.core.checks import check_seed
from datarax.core.noise import lowbias32

MAX_RECORDS = 2**62
WORD32_LIMIT = 2**32
ROUNDS = 6
_M64 = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def round_keys(seed: int, epoch: int, dtype=np.uint32) -> np.ndarray:
    """The round keys of the permutation for (seed, epoch)."""
    words = [seed & 0xFFFFFFFF, seed >> 32, epoch & 0xFFFFFFFF, epoch >> 32, 0xDA7A]
    return np.random.SeedSequence(words).generate_state(ROUNDS, dtype=dtype)


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(_M64[0])
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(_M64[1])
    return x ^ (x >> np.uint64(31))


def domain_bits(num_records: int) -> int:
    bits = max(2, int(num_records - 1).bit_length())
    return bits + bits % 2


def _encrypt(x, keys, half, mask, mix):
    left, right = x >> half, x & mask
    for k in keys:
        left, right = right, left ^ (mix(right ^ k) & mask)
    return (left << half) | right


def _decrypt(y, keys, half, mask, mix):
    left, right = y >> half, y & mask
    for k in reversed(keys):
        left, right = right ^ (mix(left ^ k) & mask), left
    return (left << half) | right


class FeistelPermutation:
    """The permutation of [0, num_records) keyed by (seed, epoch), evaluated in numpy.

    Example:
        >>> perm = FeistelPermutation(10, seed=0, epoch=0)
        >>> sorted(perm(np.arange(10)).tolist()) == list(range(10))
        True
    """

    def __init__(self, num_records: int, seed: int, epoch: int):
        if not 1 <= num_records <= MAX_RECORDS:
            raise ValueError(f"num_records must be in [1, 2**62], got {num_records}")
        self.num_records = int(num_records)
        bits = domain_bits(num_records)
        wide = num_records > WORD32_LIMIT
        self._dtype = np.uint64 if wide else np.uint32
        self._half = self._dtype(bits // 2)
        self._mask = self._dtype((1 << (bits // 2)) - 1)
        self._keys = list(round_keys(check_seed(seed), int(epoch), self._dtype))
        self._mix = _mix64 if wide else lowbias32

    def _walk(self, step, x: np.ndarray) -> np.ndarray:
        n = self.num_records
        y = step(x, self._keys, self._half, self._mask, self._mix)
        out = y >= n
        while out.any():
            y[out] = step(y[out], self._keys, self._half, self._mask, self._mix)
            out = y >= n
        return y

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Maps positions in [0, N) to record ids in [0, N) (int64, same shape)."""
        x = np.asarray(positions).astype(self._dtype)
        return self._walk(_encrypt, x.ravel()).reshape(x.shape).astype(np.int64)

    def inverse(self, record_ids: np.ndarray) -> np.ndarray:
        """The position of each record id in this epoch's order."""
        y = np.asarray(record_ids).astype(self._dtype)
        return self._walk(_decrypt, y.ravel()).reshape(y.shape).astype(np.int64)


def feistel_device(positions: jax.Array, keys: jax.Array, num_records: int) -> jax.Array:
    """The same permutation as `FeistelPermutation` (num_records <= 2^32) in jax.numpy.

    `keys` is `round_keys(seed, epoch)` (uint32[ROUNDS]), passed as an array so that a new epoch
    does not recompile. Returns int32 record ids.
    """
    if num_records > WORD32_LIMIT:
        raise ValueError(f"feistel_device supports up to 2**32 records, got {num_records}")
    bits = domain_bits(num_records)
    half, mask = jnp.uint32(bits // 2), jnp.uint32((1 << (bits // 2)) - 1)
    ks = [keys[i] for i in range(ROUNDS)]
    n = jnp.uint32(num_records - 1)  # compare with <= to stay in uint32 when N == 2^32

    def enc(x):
        return _encrypt(x, ks, half, mask, lowbias32)

    y = enc(positions.astype(jnp.uint32))
    y = jax.lax.while_loop(lambda v: jnp.any(v > n), lambda v: jnp.where(v > n, enc(v), v), y)
    return y.astype(jnp.int32)
