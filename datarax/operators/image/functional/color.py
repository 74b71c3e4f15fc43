"""Colour maths on one float image (HWC, values in [0, 1]): pure, jittable, differentiable.

Definitions follow PIL's `ImageEnhance` (brightness, contrast, saturation blend the image with a
degenerate image by a factor) and scikit-image's HSV and gamma conversions, which the tests use
as references. Every function works for float32 and float64 and under `jax.vmap`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from datarax.operators.precision import WEIGHTED_SUM, precision_for

# ITU-R 601-2 luma, as PIL's convert("L") uses.
LUMA_WEIGHTS = (0.299, 0.587, 0.114)


def _clip(image: jax.Array) -> jax.Array:
    return jnp.clip(image, 0.0, 1.0)


def rgb_to_grayscale(image: jax.Array) -> jax.Array:
    """Luma of an RGB image (H, W, 3) -> (H, W, 1)."""
    return jnp.tensordot(image, jnp.asarray(LUMA_WEIGHTS, image.dtype), axes=([-1], [0]),
                         precision=precision_for(WEIGHTED_SUM, image.dtype))[..., None]


def blend(image: jax.Array, degenerate: jax.Array, factor: jax.Array | float) -> jax.Array:
    """`degenerate + factor * (image - degenerate)`, clipped to [0, 1] (PIL's ImageEnhance)."""
    return _clip(degenerate + factor * (image - degenerate))


def adjust_brightness(image: jax.Array, factor: jax.Array | float) -> jax.Array:
    """Scales intensities by `factor` (blend with black); 1 leaves the image unchanged."""
    return blend(image, jnp.zeros_like(image), factor)


def adjust_contrast(image: jax.Array, factor: jax.Array | float) -> jax.Array:
    """Blends with the image's mean luma; 0 gives a flat grey image, 1 the original.

    Single-channel images use their mean intensity.
    """
    gray = rgb_to_grayscale(image) if image.shape[-1] == 3 else image
    return blend(image, jnp.mean(gray), factor)


def adjust_saturation(image: jax.Array, factor: jax.Array | float) -> jax.Array:
    """Blends an RGB image with its grayscale version; 0 gives grey, 1 the original."""
    return blend(image, rgb_to_grayscale(image), factor)


def rgb_to_hsv(image: jax.Array) -> jax.Array:
    """RGB (H, W, 3) in [0, 1] -> HSV with hue in [0, 1) (scikit-image's convention)."""
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    value = jnp.max(image, axis=-1)
    delta = value - jnp.min(image, axis=-1)
    # A chroma (or value) below the dtype's epsilon counts as none: hue is undefined there, and the
    # backward pass of x / delta holds 1 / delta**2, which overflows for the tiny unequal channels
    # a blur leaves next to black (e.g. 1e-21, 5e-22, 2e-22), so 0 * inf in the untaken branches
    # would turn every upstream gradient into NaN. Guarded denominators keep both finite.
    tiny = jnp.finfo(image.dtype).eps
    has_chroma = delta > tiny
    safe_delta = jnp.where(has_chroma, delta, 1.0)
    lit = value > tiny
    saturation = jnp.where(lit, delta / jnp.where(lit, value, 1.0), 0.0)
    hue = jnp.where(value == r, (g - b) / safe_delta,
                    jnp.where(value == g, 2.0 + (b - r) / safe_delta, 4.0 + (r - g) / safe_delta))
    hue = jnp.where(has_chroma, (hue / 6.0) % 1.0, 0.0)
    return jnp.stack([hue, saturation, value], axis=-1)


def hsv_to_rgb(image: jax.Array) -> jax.Array:
    """HSV with hue in [0, 1) -> RGB, the inverse of `rgb_to_hsv`.

    Written as the smooth-in-hue form `v - v*s*clip(min(k, 4-k), 0, 1)` with
    `k = (n + 6h) mod 6`, which equals the usual six-sector formula and is differentiable in h.
    """
    h, s, v = image[..., 0:1], image[..., 1:2], image[..., 2:3]
    n = jnp.asarray([5.0, 3.0, 1.0], image.dtype)
    k = (n + 6.0 * h) % 6.0
    return v - v * s * jnp.clip(jnp.minimum(k, 4.0 - k), 0.0, 1.0)


def adjust_hue(image: jax.Array, shift: jax.Array | float) -> jax.Array:
    """Rotates the hue of an RGB image by `shift` turns (0.5 = 180 degrees)."""
    hsv = rgb_to_hsv(image)
    hue = (hsv[..., 0:1] + shift) % 1.0
    return _clip(hsv_to_rgb(jnp.concatenate([hue, hsv[..., 1:]], axis=-1)))


def adjust_gamma(image: jax.Array, gamma: jax.Array | float, gain: float = 1.0) -> jax.Array:
    """`gain * image ** gamma`, clipped to [0, 1] (scikit-image's `adjust_gamma` on floats)."""
    # exp(gamma * log x) with a guarded log: x ** gamma has an infinite or NaN gradient at x = 0.
    # The guard is `not x <= 0`, true for NaN too, so a NaN pixel stays NaN (as in every stage).
    taken = ~(image <= 0)
    powered = jnp.where(taken, jnp.exp(gamma * jnp.log(jnp.where(taken, image, 1.0))), 0.0)
    return _clip(gain * powered)


def normalize(image: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
    """`(image - mean) / std` per channel."""
    return (image - jnp.asarray(mean, image.dtype)) / jnp.asarray(std, image.dtype)


def standardize(image: jax.Array) -> jax.Array:
    """Zero mean, unit variance per image; the std is floored at `1/sqrt(size)` so flat images stay finite.

    The same definition as `tf.image.per_image_standardization`.
    """
    mean = jnp.mean(image)
    # The floor is applied to the variance, not the std: sqrt's derivative is infinite at a zero
    # variance (a flat image), and max() would multiply it by 0 into a NaN gradient.
    variance = jnp.mean(jnp.square(image - mean))
    std = jnp.sqrt(jnp.maximum(variance, 1.0 / jnp.asarray(image.size, image.dtype)))
    return (image - mean) / std


def solarize(image: jax.Array, threshold: jax.Array | float, softness: float = 0.0) -> jax.Array:
    """Inverts pixels at or above `threshold` (PIL's `ImageOps.solarize`).

    With `softness > 0` the hard step becomes `sigmoid((x - threshold) / softness)`, so the
    output is differentiable in `threshold`; `softness=0` is the exact hard version.
    """
    if softness > 0:
        weight = jax.nn.sigmoid((image - threshold) / softness)
    else:
        weight = (image >= threshold).astype(image.dtype)
    return image + weight * (1.0 - 2.0 * image)


def to_grayscale(image: jax.Array, keep_channels: bool = True) -> jax.Array:
    """The luma of an RGB image, repeated over 3 channels when `keep_channels`."""
    gray = rgb_to_grayscale(image)
    return jnp.broadcast_to(gray, image.shape) if keep_channels else gray
