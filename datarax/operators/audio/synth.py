"""DDSP-style synthesis (Engel et al. 2020): harmonic oscillators, filtered noise, reverb.

Pure functions first, then operators that read frame-rate control fields from a record and
write audio. Controls are given per frame (`n_frames = num_samples // hop_length`, frame `t`
starting at sample `t * hop_length`); everything is differentiable with respect to the controls,
so a decoder that predicts them can be trained through the synthesiser with a spectral loss.

* `harmonic_synth`: `sum_k a(n) * c_k(n) * sin(k * phi(n))` with `phi` the running phase of the
  fundamental `f0`, controls upsampled linearly to the sample rate, and harmonics at or above
  Nyquist silenced (the distribution `c` is renormalised over the audible ones).
* `filtered_noise`: white noise shaped frame by frame by a linear-phase FIR filter whose
  magnitude response is given in `n_bands` bands evenly spaced from 0 Hz to Nyquist
  (frequency sampling: irfft, centre, Hann window), applied by FFT convolution and overlap-add.
* `reverb`: convolution with an impulse response (FFT), cropped to the input length, plus the
  dry signal; `decaying_noise_ir` builds a parametric response `wet * noise * exp(-t / decay)`.

Example:
    >>> audio = harmonic_synth(f0, amplitude, distribution, sample_rate=16000, hop_length=64)
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator, check_field_name, describe, read_field
from datarax.operators.learnable import Magnitude


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


def _check_positive_int(config: object, name: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{type(config).__name__}.{name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class HarmonicSynthConfig(OperatorConfig):
    """Configuration of `HarmonicSynthOperator`.

    Attributes:
        sample_rate: output samples per second.
        hop_length: samples per control frame.
        f0_field / amplitude_field / distribution_field: the control fields read
            (`(n_frames,)`, `(n_frames,)`, `(n_frames, n_harmonics)` per record).
        out_field: the audio field written.
    """

    sample_rate: int = 16000
    hop_length: int = 64
    f0_field: str = "f0_hz"
    amplitude_field: str = "amplitude"
    distribution_field: str = "harmonic_distribution"
    out_field: str = "harmonic"

    def __post_init__(self):
        super().__post_init__()
        if self.stochastic:
            raise ValueError("HarmonicSynthConfig(stochastic=True): the oscillators draw nothing; leave it False")
        for name in ("sample_rate", "hop_length"):
            _check_positive_int(self, name)
        for name in ("f0_field", "amplitude_field", "distribution_field", "out_field"):
            check_field_name(self, name)


def _read(op: PerRecordOperator, element: Element, arg: str, ndim: int) -> jax.Array:
    """The field `op.config.<arg>` names, checked to have `ndim` axes per record."""
    x = read_field(op, element, arg)
    if getattr(x, "ndim", None) != ndim:
        raise ValueError(f"{type(op).__name__} expects field {getattr(op.config, arg)!r} to have {ndim} axes per "
                         f"record, got {describe(x)}")
    return x


class HarmonicSynthOperator(PerRecordOperator):
    """Writes `harmonic_synth` of the record's control fields to `out_field`."""

    def __init__(self, config: HarmonicSynthConfig | None = None, *, rngs: nnx.Rngs | None = None):
        config = HarmonicSynthConfig() if config is None else config
        if not isinstance(config, HarmonicSynthConfig):
            raise TypeError(f"HarmonicSynthOperator takes a HarmonicSynthConfig, got {describe(config)}")
        self._init_rng(config, rngs)

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        c = self.config
        audio = harmonic_synth(_read(self, element, "f0_field", 1), _read(self, element, "amplitude_field", 1),
                               _read(self, element, "distribution_field", 2),
                               sample_rate=c.sample_rate, hop_length=c.hop_length)
        return element.update_data({c.out_field: audio})


@dataclasses.dataclass(frozen=True)
class FilteredNoiseConfig(OperatorConfig):
    """Configuration of `FilteredNoiseOperator` (white noise drawn from the record key).

    Attributes:
        hop_length: samples per control frame.
        magnitudes_field: the `(n_frames, n_bands)` band magnitudes read.
        out_field: the audio field written.
    """

    stochastic: bool = True
    hop_length: int = 64
    magnitudes_field: str = "noise_magnitudes"
    out_field: str = "noise"

    def __post_init__(self):
        super().__post_init__()
        if not self.stochastic:
            raise ValueError("FilteredNoiseConfig(stochastic=False) has no noise to filter; leave stochastic=True")
        _check_positive_int(self, "hop_length")
        for name in ("magnitudes_field", "out_field"):
            check_field_name(self, name)


class FilteredNoiseOperator(PerRecordOperator):
    """Writes uniform white noise in [-1, 1) shaped by the record's band magnitudes (`filtered_noise`)."""

    def __init__(self, config: FilteredNoiseConfig | None = None, *, rngs: nnx.Rngs | None = None):
        config = FilteredNoiseConfig() if config is None else config
        if not isinstance(config, FilteredNoiseConfig):
            raise TypeError(f"FilteredNoiseOperator takes a FilteredNoiseConfig, got {describe(config)}")
        self._init_rng(config, rngs)

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        c = self.config
        magnitudes = _read(self, element, "magnitudes_field", 2)
        noise = jax.random.uniform(key, (magnitudes.shape[0] * c.hop_length,), magnitudes.dtype, -1.0, 1.0)
        return element.update_data({c.out_field: filtered_noise(noise, magnitudes, c.hop_length)})


@dataclasses.dataclass(frozen=True)
class ReverbConfig(OperatorConfig):
    """Configuration of `ReverbOperator`: a decaying-noise room response, optionally learnable.

    Attributes:
        sample_rate: samples per second of the audio.
        length_s: length of the impulse response in seconds.
        decay_s: decay time constant in seconds, in (0, length_s].
        wet: gain of the reverberated signal, in [0, 1].
        learnable: True (decay and wet), False, or a tuple naming one of them.
        field: the audio field read; out_field: the field written (None: `field`).
    """

    sample_rate: int = 16000
    length_s: float = 0.25
    decay_s: float = 0.05
    wet: float = 0.3
    learnable: bool | tuple[str, ...] = False
    field: str = "audio"
    out_field: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.stochastic:
            raise ValueError("ReverbConfig(stochastic=True): the response is drawn once at construction; leave it False")
        _check_positive_int(self, "sample_rate")
        if not (isinstance(self.length_s, (int, float)) and 0 < self.length_s <= 10):
            raise ValueError(f"ReverbConfig.length_s must be in (0, 10] seconds, got {self.length_s!r}")
        if not (isinstance(self.decay_s, (int, float)) and 0 < self.decay_s <= self.length_s):
            raise ValueError(f"ReverbConfig.decay_s must be in (0, length_s={self.length_s}], got {self.decay_s!r}")
        if not (isinstance(self.wet, (int, float)) and 0 <= self.wet <= 1):
            raise ValueError(f"ReverbConfig.wet must be in [0, 1], got {self.wet!r}")
        learnable = tuple(self.learnable) if isinstance(self.learnable, list) else self.learnable
        if not (isinstance(learnable, bool) or (isinstance(learnable, tuple)
                                                and set(learnable) <= {"decay_s", "wet"})):
            raise ValueError(f"ReverbConfig.learnable must be True, False or a tuple of 'decay_s'/'wet', "
                             f"got {self.learnable!r}")
        object.__setattr__(self, "learnable", learnable)
        check_field_name(self, "field")
        check_field_name(self, "out_field", allow_none=True)


class ReverbNoise(nnx.Variable):
    """The fixed noise of a reverb's impulse response (state, not a parameter)."""


class ReverbOperator(PerRecordOperator):
    """Adds `reverb(audio, wet * noise * exp(-t / decay))`; decay and wet are bounded magnitudes.

    The noise is drawn once from `rngs` (stream "params", or "default"), so every record goes
    through the same room.
    """

    def __init__(self, config: ReverbConfig | None = None, *, rngs: nnx.Rngs):
        config = ReverbConfig() if config is None else config
        if not isinstance(config, ReverbConfig):
            raise TypeError(f"ReverbOperator takes a ReverbConfig, got {describe(config)}")
        if not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"ReverbOperator needs rngs=nnx.Rngs(...) to draw its room noise, got {describe(rngs)}")
        self._init_rng(config, None)
        learn = {"decay_s", "wet"} if config.learnable is True else set(config.learnable or ())
        self.decay = Magnitude(config.decay_s, low=1e-3, high=config.length_s, learnable="decay_s" in learn,
                               name="ReverbConfig.decay_s")
        self.wet = Magnitude(config.wet, low=0.0, high=1.0, learnable="wet" in learn, name="ReverbConfig.wet")
        size = int(round(config.length_s * config.sample_rate))
        self.noise = ReverbNoise(jax.random.uniform(rngs.params(), (size,), minval=-1.0, maxval=1.0))

    def impulse_response(self) -> jax.Array:
        return decaying_noise_ir(self.noise[...], self.decay(), self.wet(), self.config.sample_rate)

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        c = self.config
        audio = _read(self, element, "field", 1)
        return element.update_data({c.out_field or c.field: reverb(audio, self.impulse_response())})
