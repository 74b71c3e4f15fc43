"""Geometry maths on one image (HWC): flips, crops, resizing and affine warps.

Coordinates are pixel indices: pixel (row i, column j) has its centre at x = j, y = i. Affine
warps take the *inverse* map (output pixel -> source position) as a 2x3 matrix and sample the
source bilinearly, with out-of-image neighbours reading `fill`, as scikit-image's
`warp(order=1, mode="constant")` does. The sampling weights are linear in the source position,
so warps are differentiable in the matrix (angle, scale, shear, shift). Resizing multiplies by
separable triangle-kernel weight matrices (antialiased when shrinking), which matches PIL's
bilinear resize, box included, and is differentiable in the box.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from datarax.operators.precision import COORDINATES, WEIGHTED_SUM, precision_for

PAD_MODES = ("constant", "edge", "reflect", "symmetric")


def hflip(image: jax.Array) -> jax.Array:
    """Mirrors left-right."""
    return image[:, ::-1]


def vflip(image: jax.Array) -> jax.Array:
    """Mirrors top-bottom."""
    return image[::-1]


def pad(image: jax.Array, padding: int, mode: str = "constant", fill: float = 0.0) -> jax.Array:
    """Pads height and width by `padding` on each side (`mode` as in `numpy.pad`)."""
    widths = ((padding, padding), (padding, padding), (0, 0))
    if mode == "constant":
        return jnp.pad(image, widths, mode="constant", constant_values=fill)
    return jnp.pad(image, widths, mode=mode)


def crop(image: jax.Array, top: jax.Array | int, left: jax.Array | int, height: int, width: int) -> jax.Array:
    """The `height` x `width` window at (`top`, `left`); offsets may be traced integers."""
    return jax.lax.dynamic_slice(image, (top, left, 0), (height, width, image.shape[-1]))


def resample_weights(out_size: int, in_size: int, scale: jax.Array, start: jax.Array,
                     antialias: bool = True) -> jax.Array:
    """(out_size, in_size) bilinear weights mapping `[start, start + out_size / scale]` onto the output.

    Output pixel i samples the input at `start + (i + 0.5) / scale - 0.5` with a triangle kernel,
    widened by `1 / scale` when shrinking with `antialias` (PIL's filter); each row is normalised
    over the taps inside the input, which is how PIL and JAX treat the borders.
    """
    centers = start + (jnp.arange(out_size, dtype=scale.dtype) + 0.5) / scale - 0.5
    width = jnp.maximum(1.0 / scale, 1.0) if antialias else jnp.ones_like(scale)
    taps = jnp.arange(in_size, dtype=scale.dtype)
    weights = jnp.maximum(0.0, 1.0 - jnp.abs(taps[None, :] - centers[:, None]) / width)
    total = jnp.sum(weights, axis=1, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)


def resized_crop(image: jax.Array, box: jax.Array, height: int, width: int, antialias: bool = True) -> jax.Array:
    """Resizes the region `box = (top, left, box_height, box_width)` (floats) to `height` x `width`.

    Equals PIL's `resize((width, height), BILINEAR, box=(left, top, left + w, top + h))`, and is
    differentiable in `box`. Positions and weights are computed in at least float32 (a bfloat16
    position is a pixel off at 256).
    """
    box = jnp.asarray(box, position_dtype(image.dtype))
    rows = resample_weights(height, image.shape[0], height / box[2], box[0], antialias).astype(image.dtype)
    cols = resample_weights(width, image.shape[1], width / box[3], box[1], antialias).astype(image.dtype)
    return jnp.einsum("ah,hwc,bw->abc", rows, image, cols, precision=precision_for(WEIGHTED_SUM, image.dtype))


def position_dtype(dtype) -> jnp.dtype:
    """The dtype positions and resampling weights are computed in for images of `dtype`."""
    return jnp.result_type(dtype, jnp.float32)


def resize(image: jax.Array, height: int, width: int, antialias: bool = True) -> jax.Array:
    """Bilinear resize to `height` x `width` (PIL's `Image.resize(..., BILINEAR)`)."""
    box = jnp.asarray([0.0, 0.0, image.shape[0], image.shape[1]], position_dtype(image.dtype))
    return resized_crop(image, box, height, width, antialias)


def affine_matrix(angle: jax.Array | float, center: tuple[float, float], *, scale: jax.Array | float = 1.0,
                  shear: jax.Array | float = 0.0, translate: tuple = (0.0, 0.0)) -> jax.Array:
    """The inverse map (2x3) of an affine warp about `center = (cx, cy)`, angles in degrees.

    The forward map moves content by `T(center + translate) R(-angle) Sh(shear) S(scale) T(-center)`:
    a positive `angle` turns the picture counter-clockwise, as in PIL and scikit-image; `shear`
    slants along x. The returned matrix is that map's inverse, written in closed form.
    """
    theta = jnp.deg2rad(angle)
    phi = jnp.deg2rad(shear)
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    # Forward linear part A = R(-angle) @ [[1, tan(shear)], [0, 1]] @ scale * I.
    tan = jnp.tan(phi)
    a, b = cos * scale, (cos * tan + sin) * scale
    c, d = -sin * scale, (-sin * tan + cos) * scale
    det = a * d - b * c
    inv = jnp.stack([jnp.stack([d, -b]), jnp.stack([-c, a])]) / det
    cx, cy = center
    shifted = jnp.stack([cx + translate[0], cy + translate[1]])
    centre = jnp.stack([jnp.asarray(cx, inv.dtype), jnp.asarray(cy, inv.dtype)])
    offset = centre - jnp.matmul(inv, shifted, precision=precision_for(COORDINATES, inv.dtype))
    return jnp.concatenate([inv, offset[:, None]], axis=1)


def warp_affine(image: jax.Array, inverse: jax.Array, fill: float = 0.0) -> jax.Array:
    """Samples `image` at `inverse @ [x, y, 1]` for every output pixel, bilinearly."""
    height, width = image.shape[:2]
    ys, xs = jnp.meshgrid(jnp.arange(height, dtype=inverse.dtype), jnp.arange(width, dtype=inverse.dtype),
                          indexing="ij")
    src_x = inverse[0, 0] * xs + inverse[0, 1] * ys + inverse[0, 2]
    src_y = inverse[1, 0] * xs + inverse[1, 1] * ys + inverse[1, 2]
    return sample_bilinear(image, src_y, src_x, fill)


def sample_bilinear(image: jax.Array, src_y: jax.Array, src_x: jax.Array, fill: float = 0.0) -> jax.Array:
    """Bilinear samples of `image` at float positions; neighbours outside the image read `fill`."""
    height, width = image.shape[:2]
    y0 = jnp.floor(src_y)
    x0 = jnp.floor(src_x)
    wy = (src_y - y0)[..., None].astype(image.dtype)
    wx = (src_x - x0)[..., None].astype(image.dtype)
    y0 = y0.astype(jnp.int32)
    x0 = x0.astype(jnp.int32)

    def tap(yy, xx):
        inside = ((yy >= 0) & (yy < height) & (xx >= 0) & (xx < width))[..., None]
        value = image[jnp.clip(yy, 0, height - 1), jnp.clip(xx, 0, width - 1)]
        return jnp.where(inside, value, jnp.asarray(fill, image.dtype))

    top = (1 - wx) * tap(y0, x0) + wx * tap(y0, x0 + 1)
    bottom = (1 - wx) * tap(y0 + 1, x0) + wx * tap(y0 + 1, x0 + 1)
    return (1 - wy) * top + wy * bottom


def image_center(image: jax.Array) -> tuple[float, float]:
    """The centre (cx, cy) of an image in pixel-index coordinates."""
    height, width = image.shape[:2]
    return (width - 1) / 2.0, (height - 1) / 2.0


def rotate(image: jax.Array, angle: jax.Array | float, fill: float = 0.0) -> jax.Array:
    """Rotates counter-clockwise by `angle` degrees about the centre (skimage's `rotate(order=1)`)."""
    return warp_affine(image, affine_matrix(angle, image_center(image)), fill)


def translate(image: jax.Array, dx: jax.Array | float, dy: jax.Array | float, fill: float = 0.0) -> jax.Array:
    """Shifts content right by `dx` and down by `dy` pixels (fractions interpolate bilinearly)."""
    return warp_affine(image, affine_matrix(0.0, image_center(image), translate=(dx, dy)), fill)
