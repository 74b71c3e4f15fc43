"""Waveform operations on one 1-D signal (or any `(..., T)` array), as pure JAX functions.

Each function takes its magnitudes (gain, SNR, shift, offset) as arguments, so an operator can
pass fixed numbers, learnable parameters or values drawn from a record key. Continuous
magnitudes enter smoothly: a fractional time shift interpolates linearly between samples, so the
output is differentiable in the shift, and the noise scale for a target SNR is differentiable in
the SNR and in the signal.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from datarax.core.checks import check_positive_int

SHIFT_MODES = ("zero", "wrap")
ALIGNMENTS = ("center", "start")


def safe_sqrt(x: jax.Array) -> jax.Array:
    """`sqrt(x)` for `x >= 0`, with a zero (not infinite) gradient at `x == 0`; NaN stays NaN."""
    # `not x <= 0` rather than `x > 0`: a NaN fails every comparison, and the guard must not
    # turn a NaN input into a finite 0 (every stage lets NaN through, so bad data stays visible).
    taken = ~(x <= 0)
    return jnp.where(taken, jnp.sqrt(jnp.where(taken, x, 1.0)), 0.0)


def db_to_amplitude(db: jax.Array | float) -> jax.Array:
    """`10 ** (db / 20)`: the amplitude ratio of a gain in decibels."""
    return jnp.exp(db * (math.log(10.0) / 20.0))


def apply_gain(x: jax.Array, gain_db: jax.Array | float) -> jax.Array:
    """Scales `x` by a gain in decibels."""
    return x * db_to_amplitude(gain_db).astype(x.dtype)


def rms(x: jax.Array) -> jax.Array:
    """Root mean square over the last axis (zero, with a finite gradient, for silence)."""
    return safe_sqrt(jnp.mean(x * x, axis=-1))


def add_noise(x: jax.Array, noise: jax.Array, snr_db: jax.Array | float) -> jax.Array:
    """Adds `noise`, rescaled so that the signal-to-noise ratio is `snr_db` decibels.

    `10 * log10(mean(x**2) / mean(scaled_noise**2)) == snr_db` over the last axis. Silent
    `x` stays silent (the noise is scaled by the signal's power, which is zero).
    """
    if noise.shape != x.shape:
        raise ValueError(f"noise must have the signal's shape {x.shape}, got {noise.shape}")
    ratio = rms(x) / jnp.maximum(rms(noise), jnp.finfo(x.dtype).tiny)
    scale = ratio * db_to_amplitude(-snr_db)
    return x + jnp.expand_dims(scale, -1).astype(x.dtype) * noise


def time_shift(x: jax.Array, shift: jax.Array | float, mode: str = "zero") -> jax.Array:
    """Delays `x` by `shift` samples along the last axis: `y[n] = x[n - shift]`.

    A fractional shift interpolates linearly between the two nearest samples; an integer shift
    is exact (`np.roll` for `mode="wrap"`). Negative shifts advance the signal.

    Args:
        x: `(..., T)` signal.
        shift: delay in samples, any real number.
        mode: "zero" fills samples shifted in from outside with zeros; "wrap" rotates.
    """
    if mode not in SHIFT_MODES:
        raise ValueError(f"mode must be one of {SHIFT_MODES}, got {mode!r}")
    length = x.shape[-1]
    shift = jnp.asarray(shift, x.dtype)
    # Split the shift into integer and fractional parts before touching sample positions:
    # n - shift in floating point would lose the fraction's precision on long signals.
    whole = jnp.floor(shift)
    frac = shift - whole
    index = jnp.arange(length, dtype=jnp.int32) - whole.astype(jnp.int32)

    def sample(i):
        if mode == "wrap":
            return jnp.take(x, i % length, axis=-1)
        inside = (i >= 0) & (i < length)
        return jnp.where(inside, jnp.take(x, jnp.clip(i, 0, length - 1), axis=-1), 0.0)

    return (1.0 - frac) * sample(index) + frac * sample(index - 1)


def crop_or_pad(x: jax.Array, length: int, offset: jax.Array | int) -> jax.Array:
    """Crops or zero-pads the last axis of `x` to `length` samples.

    Args:
        x: `(..., T)` signal.
        length: output length (static).
        offset: if `T >= length`, the first sample kept (clipped to `[0, T - length]`); otherwise
            where the signal starts inside the zero-padded output (clipped to `[0, length - T]`).

    Returns:
        `(..., length)` array.
    """
    check_length(length)
    total = x.shape[-1]
    lead = (0,) * (x.ndim - 1)
    if total >= length:
        offset = jnp.clip(jnp.asarray(offset, jnp.int32), 0, total - length)
        return lax.dynamic_slice(x, lead + (offset,), x.shape[:-1] + (length,))
    offset = jnp.clip(jnp.asarray(offset, jnp.int32), 0, length - total)
    return lax.dynamic_update_slice(jnp.zeros(x.shape[:-1] + (length,), x.dtype), x, lead + (offset,))


def max_offset(total: int, length: int) -> int:
    """The largest meaningful `crop_or_pad` offset: `|total - length|`."""
    return abs(total - length)


def aligned_offset(total: int, length: int, align: str) -> int:
    """The deterministic `crop_or_pad` offset for "center" or "start" alignment."""
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}, got {align!r}")
    return max_offset(total, length) // 2 if align == "center" else 0


def check_length(length: int) -> None:
    check_positive_int(length, "length", unit="samples")
