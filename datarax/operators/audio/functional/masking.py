"""SpecAugment masking (Park et al. 2019) with a differentiable mask width.

Integer `start` and `width` give SpecAugment's hard mask exactly; real ones mask the two edge
bins partly, so a learnable maximum width gets a gradient. See docs/operators.md, "Definitions".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def coverage(length: int, start: jax.Array | float, width: jax.Array | float, dtype=jnp.float32) -> jax.Array:
    """The fraction of each of `length` unit bins covered by `[start, start + width)`."""
    i = jnp.arange(length, dtype=dtype)
    return jnp.clip(jnp.minimum(start + width, i + 1.0) - jnp.maximum(start, i), 0.0, 1.0)


def draw_masks(key: jax.Array, length: int, max_width: jax.Array | float, num_masks: int = 1,
               dtype=None) -> tuple[jax.Array, jax.Array]:
    """Reparameterised random masks on an axis of `length` bins: `(start, width)`, each `(num_masks,)`."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    u = jax.random.uniform(key, (num_masks, 2), dtype=dtype)
    width = jnp.minimum(u[:, 0] * max_width, float(length))
    return u[:, 1] * (length - width), width


def apply_masks(x: jax.Array, start: jax.Array | float, width: jax.Array | float, axis: int,
                mask_value: jax.Array | float = 0.0) -> jax.Array:
    """Masks `[start[k], start[k] + width[k])` of `axis` for each k (docs/operators.md, "Definitions").

    Masks are combined multiplicatively on the kept fraction, `keep = prod_k(1 - m_k)`, so
    overlapping masks stay a valid mask (weights in [0, 1]) and integer hard masks give their union.
    """
    axis = axis % x.ndim
    length = x.shape[axis]
    start, width = jnp.atleast_1d(start), jnp.atleast_1d(width)
    keep = jnp.ones((length,), x.dtype)
    for k in range(start.shape[0]):
        keep = keep * (1.0 - coverage(length, start[k], width[k], x.dtype))
    keep = jnp.reshape(keep, (-1,) + (1,) * (x.ndim - 1 - axis))
    return x * keep + mask_value * (1.0 - keep)
