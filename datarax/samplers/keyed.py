"""Keyed host-side randomness: every numpy generator or permutation datarax draws on the host.

A draw is a pure function of its key, so an epoch can be replayed from a saved state. Two key
layouts exist, each pinned by saved states and tests (`tests/samplers/test_keyed.py`):

* `stream` given: numpy's counter-based Philox with key `(seed, stream)` and counter
  `(0, 0, epoch, index)`. Philox advances the lowest counter word as it draws, so the epoch and
  index sit in the two highest words: each `(epoch, index)` owns 2**128 draws before its stream
  could meet another's. `stream` keeps users apart: a host stage's position, or a constant word
  of its own (`INTERLEAVE_STREAM`).
* otherwise: numpy's default generator seeded by the `SeedSequence` `(seed, epoch, *words)`
  (the stream sources' shard order and block shuffles).

    >>> keyed_permutation(5, seed=0, epoch=1, stream=INTERLEAVE_STREAM).tolist()
    [1, 4, 2, 3, 0]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

_MASK64 = (1 << 64) - 1
INTERLEAVE_STREAM = 0xB0C4E7  # `BucketedPipeline`'s batch interleave
SHARD_ORDER_WORD = 0x5EED  # the stream sources' shard order, apart from their (shard, block) shuffles


def keyed_generator(seed: int, stream: int, epoch: int, index: int = 0) -> np.random.Generator:
    """The Philox generator keyed by `(seed, stream)` at counter `(0, 0, epoch, index)`."""
    bit_generator = np.random.Philox(key=[seed & _MASK64, stream & _MASK64],
                                     counter=[0, 0, epoch & _MASK64, index & _MASK64])
    return np.random.Generator(bit_generator)


_REKEYED = threading.local()


def rekeyed_generator(seed: int, stream: int, epoch: int, index: int = 0) -> np.random.Generator:
    """`keyed_generator`'s generator, drawing the same numbers, from one generator per thread re-keyed
    in place (about 5x cheaper to make, for per-record draws on a decoder's hot path). It is valid
    until the next call on the same thread: draw from it at once, never keep it."""
    words = (seed & _MASK64, stream & _MASK64, epoch & _MASK64, index & _MASK64)
    if max(words) >= 1 << 63:  # numpy reads such a list through float64 in `keyed_generator`: keep its numbers
        return keyed_generator(seed, stream, epoch, index)
    held = getattr(_REKEYED, "held", None)
    if held is None:
        bit_generator = np.random.Philox(key=[0, 0])
        held = _REKEYED.held = (bit_generator, np.random.Generator(bit_generator), np.zeros(4, np.uint64))
    bit_generator, generator, empty = held
    bit_generator.state = {
        "bit_generator": "Philox",
        "state": {"counter": np.array([0, 0, words[2], words[3]], np.uint64),
                  "key": np.array(words[:2], np.uint64)},
        "buffer": empty, "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}
    return generator


def keyed_permutation(n: int, seed: int, epoch: int, *, stream: int | None = None,
                      words: Sequence[int] = ()) -> np.ndarray:
    """A permutation of `range(n)` keyed by `seed`, `epoch` and either `stream` or `words`."""
    if stream is None:
        return np.random.default_rng([seed, epoch, *words]).permutation(n)
    if words:
        raise ValueError(f"keyed_permutation takes stream= or words=, not both; got stream={stream!r} and "
                         f"words={tuple(words)!r}: a Philox stream is keyed by (seed, stream) and the epoch alone")
    return keyed_generator(seed, stream, epoch).permutation(n)


def derive_seed(*words: int) -> int:
    """A 63-bit seed derived from several ints (for independent sub-permutations)."""
    hi, lo = np.random.SeedSequence([w & 0xFFFFFFFFFFFFFFFF for w in words]).generate_state(2, np.uint32)
    return (int(hi) << 31) ^ int(lo)
