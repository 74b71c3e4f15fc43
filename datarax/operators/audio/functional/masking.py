"""SpecAugment masking (Park et al. 2019) with a differentiable mask width.

A mask covers the continuous interval `[start, start + width)` of an axis. Bin `i` spans
`[i, i + 1)`, and its mask weight is the fraction of the bin the interval covers:

    m[i] = clip(min(start + width, i + 1) - max(start, i), 0, 1)

and the masked value is `x * (1 - m) + mask_value * m`. For integer `start` and `width` this is
exactly SpecAugment's hard mask `x[start:start + width] = mask_value`; for real ones only the two
edge bins are partly masked, so the output is a continuous, piecewise-linear function of `start`
and `width` and a learnable maximum width receives a gradient.

Random masks are reparameterised: `width = u1 * max_width` and `start = u2 * (n - width)` with
`u1, u2 ~ U[0, 1)` drawn from the record key, so the mask always lies inside the axis.
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
    """Masks `[start[k], start[k] + width[k])` of `axis` for each k (see the module docstring).

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
