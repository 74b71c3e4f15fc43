"""DDSP-style synthesis maths (Engel et al. 2020): harmonic oscillators, filtered noise, reverb.

Controls are per frame (`n_frames = num_samples // hop_length`) and everything is differentiable
with respect to them; see docs/operators.md, "Definitions".

Example:
    >>> audio = harmonic_synth(f0, amplitude, distribution, sample_rate=16000, hop_length=64)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def upsample(controls: jax.Array, hop_length: int) -> jax.Array:
    """Frame-rate controls `(n_frames, ...)` to sample rate `(n_frames * hop_length, ...)`, linearly.

    Sample `n` reads position `n / hop_length` between frames; the last frame is held. Written
    with broadcasting rather than a gather, so its gradient is a sum, not a scatter.
    """
    following = jnp.concatenate([controls[1:], controls[-1:]], axis=0)
    shape = (1, hop_length) + (1,) * (controls.ndim - 1)
    frac = (np.arange(hop_length, dtype=np.float32) / hop_length).reshape(shape)
    out = controls[:, None] * (1.0 - frac) + following[:, None] * frac
    return out.reshape((controls.shape[0] * hop_length,) + controls.shape[1:])


def harmonic_synth(f0_hz: jax.Array, amplitude: jax.Array, distribution: jax.Array, *, sample_rate: float,
                   hop_length: int, initial_phase: jax.Array | float = 0.0) -> jax.Array:
    """A bank of harmonic oscillators.

    Args:
        f0_hz: `(n_frames,)` fundamental frequency in Hz.
        amplitude: `(n_frames,)` overall amplitude (>= 0).
        distribution: `(n_frames, n_harmonics)` non-negative weights of harmonics 1..K; they are
            renormalised to sum to one over the harmonics below Nyquist.
        sample_rate: samples per second.
        hop_length: samples per frame.
        initial_phase: phase of the fundamental at sample 0, in radians.

    Returns:
        `(n_frames * hop_length,)` audio.
    """
    if f0_hz.ndim != 1 or amplitude.shape != f0_hz.shape or distribution.ndim != 2 \
            or distribution.shape[0] != f0_hz.shape[0]:
        raise ValueError(f"harmonic_synth needs f0_hz (n_frames,), amplitude (n_frames,) and distribution "
                         f"(n_frames, n_harmonics), got {f0_hz.shape}, {amplitude.shape}, {distribution.shape}")
    harmonics = jnp.arange(1, distribution.shape[1] + 1, dtype=f0_hz.dtype)
    audible = (f0_hz[:, None] * harmonics) < sample_rate / 2
    weights = jnp.where(audible, distribution, 0.0)
    weights = weights / jnp.maximum(weights.sum(-1, keepdims=True), 1e-7)
    f0 = upsample(f0_hz, hop_length)
    amps = upsample(amplitude[:, None] * weights, hop_length)
    phase = initial_phase + 2 * math.pi * jnp.cumsum(f0) / sample_rate
    # Wrapping the fundamental's phase keeps sin(k * phase) accurate in float32 over long notes.
    phase = jnp.mod(phase, 2 * math.pi)
    return jnp.sum(amps * jnp.sin(phase[:, None] * harmonics), axis=-1)


def noise_filter_ir(magnitudes: jax.Array) -> jax.Array:
    """Linear-phase impulse responses `(n_frames, 2 * (n_bands - 1))` for band magnitudes `(n_frames, n_bands)`."""
    ir = jnp.fft.irfft(magnitudes.astype(jnp.complex64), axis=-1)
    size = ir.shape[-1]
    ir = jnp.roll(ir, size // 2, axis=-1)
    return ir * np.hanning(size + 1)[:size].astype(np.float32)


def overlap_add(frames: jax.Array, hop_length: int) -> jax.Array:
    """Sums frames `(n_frames, frame_length)` placed `hop_length` apart; length `(n_frames - 1) * hop + frame_length`.

    Each frame is cut into `m = ceil(frame_length / hop)` blocks of one hop; block `j` of frame
    `t` lands on output block `t + j`, so the sum is `m` shifted adds (no scatter).
    """
    n_frames, frame_length = frames.shape
    blocks = -(-frame_length // hop_length)
    padded = jnp.pad(frames, ((0, 0), (0, blocks * hop_length - frame_length)))
    pieces = padded.reshape(n_frames, blocks, hop_length)
    out = sum(jnp.pad(pieces[:, j], ((j, blocks - 1 - j), (0, 0))) for j in range(blocks))
    return out.reshape(-1)[:(n_frames - 1) * hop_length + frame_length]


def filtered_noise(noise: jax.Array, magnitudes: jax.Array, hop_length: int) -> jax.Array:
    """White `noise` `(n_frames * hop_length,)` shaped by per-frame band `magnitudes` `(n_frames, n_bands)`.

    Each block of `hop_length` samples is convolved with its frame's filter; the tails overlap
    into the next blocks. The filter's delay (half its length) is removed, so the output is
    aligned with the input and has its length.
    """
    n_frames = magnitudes.shape[0]
    if noise.shape != (n_frames * hop_length,):
        raise ValueError(f"noise must have n_frames * hop_length = {n_frames * hop_length} samples, got {noise.shape}")
    ir = noise_filter_ir(magnitudes)
    ir_size = ir.shape[-1]
    fft_size = 1 << (hop_length + ir_size - 2).bit_length()
    blocks = noise.reshape(n_frames, hop_length)
    convolved = jnp.fft.irfft(jnp.fft.rfft(blocks, fft_size) * jnp.fft.rfft(ir, fft_size), fft_size)
    out = overlap_add(convolved[:, :hop_length + ir_size - 1], hop_length)
    start = ir_size // 2
    return out[start:start + n_frames * hop_length]


def reverb(audio: jax.Array, ir: jax.Array) -> jax.Array:
    """`audio + (audio * ir)` (causal convolution by FFT), cropped to the input length."""
    size = 1 << (audio.shape[-1] + ir.shape[-1] - 2).bit_length()
    wet = jnp.fft.irfft(jnp.fft.rfft(audio, size) * jnp.fft.rfft(ir, size), size)[..., :audio.shape[-1]]
    return audio + wet


def decaying_noise_ir(noise: jax.Array, decay_s: jax.Array | float, wet: jax.Array | float,
                      sample_rate: float) -> jax.Array:
    """`wet * noise * exp(-t / decay_s)`: a parametric room response (differentiable in decay and wet)."""
    t = np.arange(noise.shape[-1], dtype=np.float32) / sample_rate
    return wet * noise * jnp.exp(-t / decay_s)
