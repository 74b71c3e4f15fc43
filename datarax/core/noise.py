"""Bulk random draws for augmentation noise: a keyed counter hash instead of threefry per value.

Word `i` of a record's draw is a `lowbias32` counter hash of `i` and the record key, so draws are
cheap, depend only on the key and shape, and are meant for augmentation noise, not cryptography
or Monte Carlo estimates. See docs/concepts.md, "Bulk noise draws".
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

LOWBIAS32_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)


def lowbias32(x: Any) -> Any:
    """Wellons' `lowbias32`: a bijective 32-bit avalanche mixer of `uint32` words.

    Works on numpy and `jax.numpy` arrays alike (the multipliers take the array's own uint32
    type), with identical results, so host and device code can share one mixer.
    """
    word = x.dtype.type
    x = x ^ (x >> word(16))
    x = x * word(LOWBIAS32_MULTIPLIERS[0])
    x = x ^ (x >> word(15))
    x = x * word(LOWBIAS32_MULTIPLIERS[1])
    return x ^ (x >> word(16))


def _key_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two 32-bit words of a (typed or raw uint32) key; longer keys are folded into two."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    words = jnp.ravel(key).astype(jnp.uint32)
    if words.shape[0] == 0:
        raise ValueError(f"key must hold at least one 32-bit word, got shape {key.shape}")
    k0, k1 = words[0], words[-1] if words.shape[0] > 1 else lowbias32(words[0] ^ jnp.uint32(0x9E3779B9))
    for word in words[1:-1]:  # rbg keys carry 4 words: fold the middle ones in
        k0 = lowbias32(k0 ^ word)
    return k0, k1


def hashed_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """`uint32` words of `shape` from one key: the counter hash above (at most 2^32 words)."""
    size = math.prod(shape)
    if size > 2**32:
        raise ValueError(f"hashed_bits draws at most 2**32 words per key, got shape {shape}; split the key")
    k0, k1 = _key_words(key)
    counter = jnp.arange(size, dtype=jnp.uint32)
    return lowbias32(lowbias32(lowbias32(counter ^ k0) + k1) ^ k0).reshape(shape)


def standard_normal(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """Standard normal draws: the inverse normal CDF of 23-bit uniforms `(k + 0.5) / 2^23`.

    Every step is exact in float32 (so no uniform rounds to 0 or 1). The resolution (3e-7 of a
    standard deviation near 0) and the truncation of the tails at 5.3 standard deviations
    (probability 1.2e-7 per draw) are far below anything augmentation noise can show.
    """
    return normal_from_bits(hashed_bits(key, shape), dtype)


def normal_from_bits(bits: jax.Array, dtype=jnp.float32) -> jax.Array:
    """The map from `uint32` words to standard normals used by `standard_normal`."""
    unit = ((bits >> 9).astype(jnp.float32) + 0.5) * (1.0 / 8388608.0)
    return (jax.lax.erf_inv(2.0 * unit - 1.0) * math.sqrt(2.0)).astype(dtype)
