"""The counter-hash noise generator: statistical checks against SciPy, determinism, edge values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from on_cpu import float64_on_cpu
from scipy import stats

from datarax.core import noise
from datarax.core.operator import BatchContext, StageKey, record_keys

N = 1 << 18


def bits_of(key, n=N) -> np.ndarray:
    return np.asarray(jax.jit(noise.hashed_bits, static_argnums=1)(key, (n,)), np.uint64)


# Raw keys that differ in one low bit are the hardest case for a counter hash.
KEYS = {"threefry": jax.random.key(0), "raw_00": jnp.array([0, 0], jnp.uint32),
        "raw_01": jnp.array([0, 1], jnp.uint32), "raw_10": jnp.array([1, 0], jnp.uint32),
        "rbg": jax.random.key(3, impl="rbg")}


@pytest.mark.parametrize("name", sorted(KEYS))
def test_words_are_uniform_and_every_bit_is_balanced(name):
    words = bits_of(KEYS[name])
    # Chi-square over the 256 values of each byte.
    for shift in (0, 8, 16, 24):
        counts = np.bincount(((words >> shift) & 0xFF).astype(np.int64), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-4, (name, shift)
    # Each of the 32 bits is set half the time (5 standard deviations).
    ones = np.array([((words >> b) & 1).sum() for b in range(32)])
    assert np.all(np.abs(ones - N / 2) < 5 * np.sqrt(N / 4)), ones


@pytest.mark.parametrize("lag", [1, 2, 3, 64, 1024])
def test_successive_values_are_uncorrelated(lag):
    u = bits_of(KEYS["raw_00"]).astype(np.float64) / 2**32
    r = np.corrcoef(u[:-lag], u[lag:])[0, 1]
    assert abs(r) < 5 / np.sqrt(N), r


def test_streams_of_neighbouring_keys_are_uncorrelated():
    """Neighbouring records (the pipeline's own keys) and raw keys one bit apart."""
    ctx = BatchContext(jnp.arange(4, dtype=jnp.int32), jnp.asarray(0, jnp.int32), jnp.ones(4, bool))
    record = list(record_keys(StageKey(jax.random.key_data(jax.random.key(5))), ctx))
    raw = [KEYS["raw_00"], KEYS["raw_01"], KEYS["raw_10"], jnp.array([0x80000000, 0], jnp.uint32)]
    for keys in (record, raw):
        streams = [bits_of(k).astype(np.float64) / 2**32 for k in keys]
        for i in range(len(streams)):
            for j in range(i + 1, len(streams)):
                r = np.corrcoef(streams[i], streams[j])[0, 1]
                assert abs(r) < 5 / np.sqrt(N), (i, j, r)
                # The words of the two streams agree at about chance rate (2^-32 per word).
                assert np.mean(streams[i] == streams[j]) < 1e-4


def test_one_key_bit_flips_half_the_output_bits():
    a = bits_of(KEYS["raw_00"], 4096)
    for key in ([1, 0], [0, 1], [0, 1 << 31], [1 << 31, 0]):
        b = bits_of(jnp.array(key, jnp.uint32), 4096)
        flipped = np.unpackbits((a ^ b).astype(">u4").view(np.uint8)).mean()
        assert abs(flipped - 0.5) < 0.01, (key, flipped)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_standard_normal_passes_a_ks_test_and_has_normal_moments(dtype):
    with float64_on_cpu(dtype == jnp.float64):
        z = np.asarray(noise.standard_normal(jax.random.key(11), (N,), dtype))
    assert z.dtype == np.dtype(dtype)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5 / np.sqrt(N) and abs(z.std() - 1) < 0.01
    assert abs(stats.skew(z)) < 0.05 and abs(stats.kurtosis(z)) < 0.1


def test_extreme_words_map_to_finite_symmetric_tails():
    words = jnp.array([0, 511, 512, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], jnp.uint32)
    z = np.asarray(noise.normal_from_bits(words))
    assert np.all(np.isfinite(z))
    assert z[0] == z[1] == -z[-1] and 5.2 < -z[0] < 5.4  # 23-bit uniforms: tails at ~5.3 sd
    assert z[2] > z[1] and z[3] == -z[4] and abs(z[3]) < 1e-6
    for dtype in (jnp.float16, jnp.bfloat16):
        assert np.all(np.isfinite(np.asarray(noise.normal_from_bits(words, dtype), np.float32)))


def test_draws_stay_within_the_23_bit_tails_and_are_nearly_all_distinct():
    draws = np.asarray(jax.jit(lambda k: noise.standard_normal(k, (50001,)))(jax.random.key(0)), np.float64)
    assert np.abs(draws).max() <= stats.norm.ppf(1 - 0.5 / 2**23) + 1e-4
    # 50001 draws from 2^23 equally likely levels: almost all distinct (expected repeats ~150).
    assert len(np.unique(draws)) > 50001 - 400


def test_draws_depend_only_on_the_key_and_shape():
    keys = jax.random.split(jax.random.key(9), 5)
    batched = jax.jit(jax.vmap(lambda k: noise.standard_normal(k, (7, 3))))(keys)
    for i in range(5):
        np.testing.assert_array_equal(batched[i], noise.standard_normal(keys[i], (7, 3)))
    # A shape's words are the first words of a longer draw: records stay the same under reshaping.
    np.testing.assert_array_equal(noise.hashed_bits(keys[0], (21,)), noise.hashed_bits(keys[0], (7, 3)).ravel())


def test_too_many_words_for_one_key_is_an_error():
    with pytest.raises(ValueError, match=r"at most 2\*\*32 words per key, got shape \(65536, 65537\); split"):
        jax.eval_shape(lambda k: noise.hashed_bits(k, (65536, 65537)), jax.random.key(0))
