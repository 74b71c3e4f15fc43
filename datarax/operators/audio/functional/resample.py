"""Polyphase resampling by a rational factor, matching `scipy.signal.resample_poly`.

The output has `ceil(T * up / down)` samples and is linear in the input; see docs/operators.md,
"Definitions".
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from datarax.core.checks import check_positive_int

KAISER_BETA = 5.0


def rational_factors(orig_rate: int, target_rate: int) -> tuple[int, int]:
    """`(up, down)`: the resampling ratio `target_rate / orig_rate` in lowest terms."""
    for name, value in (("orig_rate", orig_rate), ("target_rate", target_rate)):
        check_positive_int(value, name, unit="Hz")
    g = math.gcd(int(orig_rate), int(target_rate))
    return int(target_rate) // g, int(orig_rate) // g


def lowpass_filter(up: int, down: int) -> np.ndarray:
    """scipy's default `resample_poly` filter: Kaiser-windowed sinc, scaled by `up`."""
    half_len = 10 * max(up, down)
    cutoff = 1.0 / max(up, down)
    n = np.arange(2 * half_len + 1) - half_len
    h = cutoff * np.sinc(cutoff * n) * np.kaiser(2 * half_len + 1, KAISER_BETA)
    return h / h.sum() * up


def polyphase_bank(up: int, down: int) -> tuple[np.ndarray, int]:
    """The filter split into `up` phases: `bank[e, t] = h[2 * half_len - e - up * t]` (0 outside)."""
    h = lowpass_filter(up, down)
    half_len = (len(h) - 1) // 2
    taps = 2 * half_len // up + 1
    index = 2 * half_len - np.arange(up)[:, None] - up * np.arange(taps)[None, :]
    bank = np.where(index >= 0, h[np.clip(index, 0, None)], 0.0)
    return bank, half_len


def output_length(num_samples: int, up: int, down: int) -> int:
    """`ceil(num_samples * up / down)`, the length `resample_poly` returns."""
    return -(-num_samples * up // down)


def resample(x: jax.Array, orig_rate: int, target_rate: int) -> jax.Array:
    """Resamples the last axis of `x` from `orig_rate` to `target_rate` Hz.

    Args:
        x: `(..., T)` signal.
        orig_rate: the signal's sampling rate in Hz (an int).
        target_rate: the wanted sampling rate in Hz (an int).

    Returns:
        `(..., ceil(T * up / down))` array, equal (to rounding) to
        `scipy.signal.resample_poly(x, up, down, axis=-1)`.
    """
    up, down = rational_factors(orig_rate, target_rate)
    if up == down:
        return x
    bank, half_len = polyphase_bank(up, down)
    total = x.shape[-1]
    i = jnp.arange(output_length(total, up, down), dtype=jnp.int32)
    # Split i * down into (i // up, i % up) parts so the integers stay small for long signals.
    rem = (i % up) * down - half_len
    phase = (-rem) % up
    first = (i // up) * down + (rem + phase) // up
    m = first[:, None] + jnp.arange(bank.shape[1], dtype=jnp.int32)[None, :]
    weights = jnp.asarray(bank, x.dtype)[phase]
    inside = (m >= 0) & (m < total)
    samples = jnp.take(x, jnp.clip(m, 0, total - 1), axis=-1)
    return jnp.sum(jnp.where(inside, weights, 0.0) * samples, axis=-1)
