"""Noise, blur and occlusion maths on one image (HWC): pure, jittable, differentiable.

`gaussian_blur` matches `scipy.ndimage.gaussian_filter` / `skimage.filters.gaussian` with
`mode="reflect"` for a given kernel radius. The kernel radius is a static shape, so a learnable
sigma uses the radius of its upper bound and only the weights move. `box_coverage` is the exact
fraction of each pixel covered by an axis-aligned box, so occlusion masks are differentiable in
the box's size and position, and equal the hard 0/1 mask when the box edges fall on pixel edges.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from datarax.operators.precision import WEIGHTED_SUM, precision_for


def gaussian_noise(image: jax.Array, noise: jax.Array, sigma: jax.Array | float, clip: bool = True) -> jax.Array:
    """`image + sigma * noise`, optionally clipped to [0, 1]; `noise` is a standard normal draw
    (`datarax.core.noise.standard_normal(key, image.shape)`, keyed by the record)."""
    out = image + sigma * noise
    return jnp.clip(out, 0.0, 1.0) if clip else out


def gaussian_kernel(sigma: jax.Array | float, radius: int, dtype=None) -> jax.Array:
    """Normalised 1-D Gaussian weights at offsets `-radius..radius`."""
    offsets = jnp.arange(-radius, radius + 1, dtype=dtype if dtype is not None else jnp.result_type(float))
    # A floor on sigma keeps the weights (and their gradient) finite as sigma approaches 0.
    sigma = jnp.maximum(sigma, 1e-3)
    weights = jnp.exp(-0.5 * (offsets / sigma) ** 2)
    return weights / jnp.sum(weights)


def _filter_axis(image: jax.Array, kernel: jax.Array, axis: int) -> jax.Array:
    radius = (kernel.shape[0] - 1) // 2
    widths = [(0, 0)] * image.ndim
    widths[axis] = (radius, radius)
    # numpy's "symmetric" (edge pixel repeated) is scipy.ndimage's "reflect".
    padded = jnp.pad(image, widths, mode="symmetric")
    size = image.shape[axis]
    taps = [jax.lax.slice_in_dim(padded, k, k + size, axis=axis) for k in range(kernel.shape[0])]
    return jnp.tensordot(kernel, jnp.stack(taps), axes=1, precision=precision_for(WEIGHTED_SUM, image.dtype))


def gaussian_blur(image: jax.Array, sigma: jax.Array | float, radius: int) -> jax.Array:
    """Separable Gaussian blur over height and width with a kernel of `2 * radius + 1` taps."""
    if radius == 0:
        return image
    if radius >= min(image.shape[:2]):
        raise ValueError(f"gaussian_blur radius {radius} must be smaller than the image height and width "
                         f"{image.shape[:2]}; lower the maximum sigma or truncate")
    kernel = gaussian_kernel(sigma, radius, image.dtype)
    return _filter_axis(_filter_axis(image, kernel, 0), kernel, 1)


def box_coverage(length: int, start: jax.Array, stop: jax.Array) -> jax.Array:
    """Fraction of each pixel `[i, i + 1)` of an axis of `length` pixels covered by `[start, stop]`."""
    edges = jnp.arange(length, dtype=jnp.result_type(start, stop))
    return jnp.clip(jnp.minimum(edges + 1, stop) - jnp.maximum(edges, start), 0.0, 1.0)


def box_mask(shape: tuple[int, int], center: jax.Array, size: jax.Array) -> jax.Array:
    """Coverage (H, W) of the box with `center = (cy, cx)` and `size = (h, w)` in pixel-edge units.

    The image spans `[0, H] x [0, W]`; pixel (i, j) covers `[i, i+1) x [j, j+1)`.
    """
    rows = box_coverage(shape[0], center[0] - size[0] / 2, center[0] + size[0] / 2)
    cols = box_coverage(shape[1], center[1] - size[1] / 2, center[1] + size[1] / 2)
    return rows[:, None] * cols[None, :]


def occlude(image: jax.Array, mask: jax.Array, fill: float | jax.Array = 0.0) -> jax.Array:
    """Replaces the masked part (mask in [0, 1], shape (H, W)) of an image by `fill`."""
    mask = mask[..., None].astype(image.dtype)
    return image * (1 - mask) + jnp.asarray(fill, image.dtype) * mask


def cutout(image: jax.Array, centers: jax.Array, size: jax.Array | float, fill: float = 0.0) -> jax.Array:
    """Fills square holes of side `size` pixels centred at `centers` (shape (n, 2), rows (cy, cx))."""
    sides = jnp.stack([size, size])
    masks = jax.vmap(lambda c: box_mask(image.shape[:2], c, sides))(centers)
    # Holes may overlap: a pixel is kept in proportion to what every hole leaves of it.
    keep = jnp.prod(1 - masks, axis=0)
    return occlude(image, 1 - keep, fill)


def patch_grid_mask(shape: tuple[int, int], patch_size: int, dropped: jax.Array) -> jax.Array:
    """Expands a (rows, cols) boolean grid of dropped patches to a pixel mask of `shape`."""
    rows, cols = math.ceil(shape[0] / patch_size), math.ceil(shape[1] / patch_size)
    if dropped.shape != (rows, cols):
        raise ValueError(f"dropped must have shape {(rows, cols)} for an image of {shape} and patch_size "
                         f"{patch_size}, got {dropped.shape}")
    grid = jnp.repeat(jnp.repeat(dropped, patch_size, axis=0), patch_size, axis=1)
    return grid[:shape[0], :shape[1]]
