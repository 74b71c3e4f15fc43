"""DDSP-style synthesiser operators (Engel et al. 2020): harmonic oscillators, filtered noise, reverb.

They read frame-rate control fields from a record and write audio, with the maths of
`datarax.operators.audio.functional.synth`; everything is differentiable with respect to the
controls, so a decoder that predicts them can be trained through the synthesiser.

Example:
    >>> synth = HarmonicSynthOperator(HarmonicSynthConfig(sample_rate=16000, hop_length=64))
    >>> batch = synth(Element({"f0_hz": f0, "amplitude": amp, "harmonic_distribution": dist}), ctx)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from datarax.core.checks import (
    check_field_name,
    check_number,
    check_positive_int,
    describe_value,
    field,
    is_number,
    require_deterministic,
    require_stochastic,
)
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator, read_field
from datarax.operators.audio.functional.synth import decaying_noise_ir, filtered_noise, harmonic_synth, reverb
from datarax.operators.learnable import Magnitude


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
        require_deterministic(self, "the oscillators draw nothing")
        for name in ("sample_rate", "hop_length"):
            check_positive_int(*field(self, name))
        for name in ("f0_field", "amplitude_field", "distribution_field", "out_field"):
            check_field_name(*field(self, name))


def _read(op: PerRecordOperator, element: Element, arg: str, ndim: int) -> jax.Array:
    """The field `op.config.<arg>` names, checked to have `ndim` axes per record."""
    x = read_field(op, element, arg)
    if getattr(x, "ndim", None) != ndim:
        raise ValueError(f"{type(op).__name__} expects field {getattr(op.config, arg)!r} to have {ndim} axes per "
                         f"record, got {describe_value(x)}")
    return x


class HarmonicSynthOperator(PerRecordOperator):
    """Writes `harmonic_synth` of the record's control fields to `out_field`."""

    def __init__(self, config: HarmonicSynthConfig | None = None, *, rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(HarmonicSynthConfig, config, settings, "HarmonicSynthOperator")
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
        require_stochastic(self, "has no noise to filter")
        check_positive_int(*field(self, "hop_length"))
        for name in ("magnitudes_field", "out_field"):
            check_field_name(*field(self, name))


class FilteredNoiseOperator(PerRecordOperator):
    """Writes uniform white noise in [-1, 1) shaped by the record's band magnitudes (`filtered_noise`)."""

    def __init__(self, config: FilteredNoiseConfig | None = None, *, rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(FilteredNoiseConfig, config, settings, "FilteredNoiseOperator")
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
        require_deterministic(self, "the response is drawn once at construction")
        check_positive_int(*field(self, "sample_rate"))
        check_number(*field(self, "length_s"), 0, 10, open_low=True)
        if not (is_number(self.decay_s) and 0 < self.decay_s <= self.length_s):
            raise ValueError(f"ReverbConfig.decay_s must be in (0, length_s={self.length_s}], got {self.decay_s!r}")
        check_number(*field(self, "wet"), 0, 1)
        learnable = tuple(self.learnable) if isinstance(self.learnable, list) else self.learnable
        if not (isinstance(learnable, bool) or (isinstance(learnable, tuple)
                                                and set(learnable) <= {"decay_s", "wet"})):
            raise ValueError(f"ReverbConfig.learnable must be True, False or a tuple of 'decay_s'/'wet', "
                             f"got {self.learnable!r}")
        object.__setattr__(self, "learnable", learnable)
        check_field_name(*field(self, "field"))
        check_field_name(*field(self, "out_field"), allow_none=True)


class ReverbNoise(nnx.Variable):
    """The fixed noise of a reverb's impulse response (state, not a parameter)."""


class ReverbOperator(PerRecordOperator):
    """Adds `reverb(audio, wet * noise * exp(-t / decay))`; decay and wet are bounded magnitudes.

    The noise is drawn once from `rngs` (stream "params", or "default"), so every record goes
    through the same room.
    """

    def __init__(self, config: ReverbConfig | None = None, *, rngs: nnx.Rngs, **settings: Any):
        config = resolve_config(ReverbConfig, config, settings, "ReverbOperator")
        if not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"ReverbOperator needs rngs=nnx.Rngs(...) to draw its room noise, "
                            f"got {describe_value(rngs)}")
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
