"""datarax.samplers.keyed: each host-side draw pinned against the order the code gave before it
moved here (computed at fbb9ff7 from the call sites' own generators), so saved states still resume."""

from __future__ import annotations

import numpy as np
import pytest

from datarax.host.stage import record_generator
from datarax.pipeline.buckets import interleave_permutation
from datarax.samplers.keyed import (
    INTERLEAVE_STREAM,
    SHARD_ORDER_WORD,
    keyed_generator,
    keyed_permutation,
    rekeyed_generator,
)

# (site, the draw as the site makes it now, the literal the former code drew)
PINNED = [
    ("buckets interleave", lambda: interleave_permutation(7, 3, 12), [10, 11, 6, 5, 2, 3, 9, 0, 7, 1, 4, 8]),
    ("buckets interleave seed 0", lambda: interleave_permutation(0, 0, 10), [5, 6, 9, 4, 8, 3, 2, 1, 0, 7]),
    ("hf stream shard order", lambda: keyed_permutation(8, 11, 2, words=(SHARD_ORDER_WORD,)),
     [5, 0, 4, 3, 1, 7, 6, 2]),
    ("hf stream block rows", lambda: keyed_permutation(12, 11, 2, words=(5, 4)),
     [4, 8, 1, 7, 0, 6, 9, 10, 5, 11, 2, 3]),
    ("host stage record draws", lambda: record_generator(3, 1, 2, 17).integers(0, 1000, 6),
     [825, 20, 439, 82, 773, 104]),
    ("host stage record permutation", lambda: record_generator(3, 1, 2, 17).permutation(10),
     [8, 2, 0, 7, 1, 5, 3, 6, 4, 9]),
]


@pytest.mark.parametrize("site,draw,expected", PINNED, ids=[p[0] for p in PINNED])
def test_each_site_draws_its_former_order(site, draw, expected):
    assert np.asarray(draw()).tolist() == expected


@pytest.mark.parametrize("n,seed,epoch", [(1, 0, 0), (10, 7, 3), (257, 2**40, 9)])
def test_the_two_layouts_are_the_generators_they_name(n, seed, epoch):
    philox = np.random.Generator(np.random.Philox(key=[seed, INTERLEAVE_STREAM], counter=[0, 0, epoch, 0]))
    np.testing.assert_array_equal(keyed_permutation(n, seed, epoch, stream=INTERLEAVE_STREAM), philox.permutation(n))
    np.testing.assert_array_equal(keyed_permutation(n, seed, epoch, words=(1, 2)),
                                  np.random.default_rng([seed, epoch, 1, 2]).permutation(n))
    assert sorted(keyed_permutation(n, seed, epoch).tolist()) == list(range(n))
    assert keyed_generator(seed, 0, epoch, 1).random() != keyed_generator(seed, 0, epoch, 2).random()


def test_stream_and_words_together_is_an_error():
    with pytest.raises(ValueError, match=r"stream= or words=, not both; got stream=1 and words=\(2,\)"):
        keyed_permutation(3, 0, 0, stream=1, words=(2,))


@pytest.mark.parametrize("key", [(0, 0, 0, 0), (3, 1, 7, 123), (2**63 + 5, 2**40, 2**33, 2**62 - 1),
                                 (5, 2**63 - 1, 0, 1)])
def test_a_rekeyed_generator_draws_what_a_fresh_one_draws(key):
    """The decoders' hot path re-keys one generator per thread; the numbers are those of a new one,
    whatever it drew for the key before (a half-used buffer, a cached 32-bit half)."""
    rekeyed_generator(9, 9, 9, 9).integers(0, 2**32, dtype=np.uint32)  # leaves a spare 32-bit half behind
    rekeyed_generator(1, 2, 3, 4).uniform(size=3)  # leaves the buffer part-used
    got = rekeyed_generator(*key)
    a = (got.uniform(0.08, 1.0), got.integers(0, 1000), got.integers(0, 2**32, dtype=np.uint32), got.normal(size=5))
    fresh = keyed_generator(*key)
    b = (fresh.uniform(0.08, 1.0), fresh.integers(0, 1000), fresh.integers(0, 2**32, dtype=np.uint32),
         fresh.normal(size=5))
    assert a[:3] == b[:3]
    np.testing.assert_array_equal(a[3], b[3])
