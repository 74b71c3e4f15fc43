"""Batch mixing maths: pairing records within a batch, MixUp and CutMix of one pair.

`partners` pairs each record with the next one in a per-record score order, so nobody is paired
with itself and the pairing does not depend on the records' order in the batch. `mixup` and
`cutmix` mix one image with its partner; CutMix's box edges are continuous and border pixels are
mixed by the area they cover, so both are differentiable in the mixing weight.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from datarax.operators.image.functional.filters import box_mask


def partners(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """Pairs each valid row with the next valid row in increasing `scores` order (cyclically).

    Invalid rows (mask False) are paired with themselves.
    """
    size = scores.shape[0]
    index = jnp.arange(size)
    order = jnp.argsort(jnp.where(mask, scores, 2.0 + index))
    valid = jnp.sum(mask)
    following = jnp.where(index < valid, (index + 1) % jnp.maximum(valid, 1), index)
    return jnp.zeros((size,), jnp.int32).at[order].set(order[following].astype(jnp.int32))


def mixup(image: jax.Array, other: jax.Array, lam: jax.Array) -> jax.Array:
    """`lam * image + (1 - lam) * other`, written so mixing a record with itself is exact."""
    return other + lam * (image - other)


def cutmix(image: jax.Array, other: jax.Array, center: jax.Array, lam: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Pastes the box of `other` centred at `center = (cy, cx)` with area fraction `1 - lam` (before
    clipping at the border); returns the image and the share of it still from `image`."""
    # The floor keeps the gradient finite when lam rounds to 1 (sqrt'(0) is infinite).
    side = jnp.sqrt(jnp.maximum(1 - lam, 1e-12))
    size = side * jnp.asarray(image.shape[:2], side.dtype)
    mask = box_mask(image.shape[:2], center, size)[..., None].astype(image.dtype)
    return image + mask * (other - image), 1 - jnp.mean(mask)
