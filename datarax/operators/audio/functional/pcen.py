"""Per-channel energy normalisation (PCEN, Wang et al. 2017) as a pure function.

Every parameter may be a scalar or a per-channel vector `(C,)` and is differentiable; see
docs/operators.md, "Definitions", for the formula and the smoother's initial state.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax


def smoothing_coefficient(time_constant: float, sample_rate: float, hop_length: int) -> float:
    """librosa's smoother coefficient `s` for a time constant in seconds.

    It is the positive root of `t**2 * s**2 + s - 1 = 0`, with `t = time_constant * sample_rate
    / hop_length` the time constant in frames (`s ~ 1 / t` for long time constants).
    """
    for name, value in (("time_constant", time_constant), ("sample_rate", sample_rate), ("hop_length", hop_length)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    t = time_constant * sample_rate / float(hop_length)
    return (math.sqrt(1.0 + 4.0 * t * t) - 1.0) / (2.0 * t * t)


def smooth(energy: jax.Array, s: jax.Array | float, initial: jax.Array | float | None = None) -> jax.Array:
    """The IIR smoother `M[t] = (1 - s) * M[t-1] + s * E[t]` along the last (time) axis.

    Args:
        energy: `(..., C, T)` non-negative energies.
        s: smoothing coefficient in (0, 1], a scalar or per-channel `(C,)`.
        initial: `M[..., -1]`; None to start from the first frame.
    """
    # A per-channel (C,) coefficient broadcasts against each time slice (..., C).
    s = jnp.asarray(s, energy.dtype)
    state = energy[..., 0] if initial is None else jnp.broadcast_to(jnp.asarray(initial, energy.dtype),
                                                                    energy.shape[:-1])

    def step(previous, frame):
        current = (1.0 - s) * previous + s * frame
        return current, current

    _, smoothed = lax.scan(step, state, jnp.moveaxis(energy, -1, 0))
    return jnp.moveaxis(smoothed, 0, -1)


def pcen(energy: jax.Array, alpha: jax.Array | float = 0.98, delta: jax.Array | float = 2.0,
         r: jax.Array | float = 0.5, s: jax.Array | float = 0.025, eps: float = 1e-6,
         initial: jax.Array | float | None = None) -> jax.Array:
    """PCEN of an energy spectrogram `(..., C, T)` (channels before time, as in librosa).

    Args:
        energy: non-negative energies, for example a mel spectrogram.
        alpha: gain-normalisation exponent (librosa `gain`), in [0, 1].
        delta: bias added before compression (librosa `bias`), > 0.
        r: compression exponent (librosa `power`), in (0, 1].
        s: smoother coefficient (librosa `b`), in (0, 1]; see `smoothing_coefficient`.
        eps: floor that keeps the gain finite on silence.
        initial: smoother state before the first frame; None starts from the first frame.

    Each of `alpha`, `delta`, `r`, `s` is a scalar or a per-channel vector of length C.

    Returns:
        The PCEN-normalised spectrogram, same shape as `energy`.
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    smoothed = smooth(energy, s, initial)
    alpha, delta, r = (per_channel(v, energy.dtype) for v in (alpha, delta, r))
    gain = jnp.exp(-alpha * (math.log(eps) + jnp.log1p(smoothed / eps)))
    return delta ** r * jnp.expm1(r * jnp.log1p(energy * gain / delta))


def per_channel(value: jax.Array | float, dtype: jnp.dtype) -> jax.Array:
    """A scalar stays a scalar; a `(C,)` vector becomes `(C, 1)` to broadcast over time."""
    value = jnp.asarray(value, dtype)
    return value[:, None] if value.ndim == 1 else value
