"""Waveform operators: gain, additive noise at an SNR, time shift, crop/pad, resample.

Random magnitudes are a centre plus a reparameterised spread: with `stochastic=True` a record
gets `centre + U(-max_delta, max_delta)` (drawn from its key), with `stochastic=False` exactly
the centre. Centres and spreads are the operator's magnitudes, each learnable within bounds.

Example:
    >>> gain = GainOperator(GainConfig(gain_db=-3.0, max_delta_db=6.0, learnable=True), rngs=nnx.Rngs(0))
    >>> noise = AddNoiseOperator(AddNoiseConfig(snr_db=20.0), rngs=nnx.Rngs(1))
    >>> batch = noise(gain(Element({"audio": waves}), ctx), ctx)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from datarax.core.checks import check_choice, check_int, field, require_deterministic, require_stochastic
from datarax.operators.audio.base import AudioOperator, AudioOperatorConfig, split
from datarax.operators.audio.functional import resample as resample_lib
from datarax.operators.audio.functional import waveform
from datarax.operators.field import check_magnitudes
from datarax.operators.learnable import signed_uniform


def centre_plus_spread(key: jax.Array | None, centre: jax.Array | float, spread: jax.Array | float | None):
    """`centre + U(-spread, spread)` from `key`; the centre alone for a deterministic operator."""
    return centre if key is None else centre + signed_uniform(key, spread)


@dataclasses.dataclass(frozen=True)
class GainConfig(AudioOperatorConfig):
    """Configuration of `GainOperator`: gain = `gain_db + U(-max_delta_db, max_delta_db)` dB.

    Attributes:
        gain_db: the centre gain in dB, in [-60, 60].
        max_delta_db: the random spread in dB, in [0, 60]; used when stochastic.
    """

    stochastic: bool = True
    gain_db: float = 0.0
    max_delta_db: float = 6.0

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, GainOperator.bounds)


class GainOperator(AudioOperator):
    """Multiplies a waveform by `10 ** (gain_db / 20)`."""

    config_class = GainConfig
    bounds = {"gain_db": (-60.0, 60.0), "max_delta_db": (0.0, 60.0)}
    spreads = ("max_delta_db",)

    def active_bounds(self, config):
        return dict(self.bounds) if config.stochastic else {"gain_db": self.bounds["gain_db"]}

    def draw(self, key, shape):
        spread = self.magnitude("max_delta_db") if key is not None else None
        return {"gain_db": centre_plus_spread(key, self.magnitude("gain_db"), spread)}

    def apply(self, x, params):
        return waveform.apply_gain(x, params["gain_db"])


@dataclasses.dataclass(frozen=True)
class AddNoiseConfig(AudioOperatorConfig):
    """Configuration of `AddNoiseOperator`: white Gaussian noise at SNR `snr_db + U(-max_delta_db, max_delta_db)`.

    Attributes:
        snr_db: the centre signal-to-noise ratio in dB, in [-20, 80].
        max_delta_db: the random spread of the SNR in dB, in [0, 40].
    """

    stochastic: bool = True
    snr_db: float = 20.0
    max_delta_db: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        require_stochastic(self)
        check_magnitudes(self, AddNoiseOperator.bounds)


class AddNoiseOperator(AudioOperator):
    """Adds white Gaussian noise scaled to a target SNR over the record (see `waveform.add_noise`)."""

    config_class = AddNoiseConfig
    bounds = {"snr_db": (-20.0, 80.0), "max_delta_db": (0.0, 40.0)}
    spreads = ("max_delta_db",)

    def draw(self, key, shape):
        noise_key, snr_key = split(key, 2)
        snr = centre_plus_spread(snr_key, self.magnitude("snr_db"), self.magnitude("max_delta_db"))
        return {"snr_db": snr, "noise": jax.random.normal(noise_key, shape, dtype=jnp.result_type(float))}

    def apply(self, x, params):
        return waveform.add_noise(x, params["noise"].astype(x.dtype), params["snr_db"])


@dataclasses.dataclass(frozen=True)
class TimeShiftConfig(AudioOperatorConfig):
    """Configuration of `TimeShiftOperator`: delay = `(shift + U(-max_delta, max_delta)) * T` samples.

    Shifts are fractions of the record length T, so their bounds do not depend on the data.

    Attributes:
        shift: the centre delay as a fraction of the length, in [-1, 1] (negative advances).
        max_delta: the random spread as a fraction of the length, in [0, 1].
        mode: "zero" fills with silence, "wrap" rotates the signal.
    """

    stochastic: bool = True
    shift: float = 0.0
    max_delta: float = 0.1
    mode: str = "zero"

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, TimeShiftOperator.bounds)
        check_choice(*field(self, "mode"), waveform.SHIFT_MODES)


class TimeShiftOperator(AudioOperator):
    """Delays a waveform by a real number of samples (linear interpolation for fractions)."""

    config_class = TimeShiftConfig
    bounds = {"shift": (-1.0, 1.0), "max_delta": (0.0, 1.0)}
    spreads = ("max_delta",)

    def active_bounds(self, config):
        return dict(self.bounds) if config.stochastic else {"shift": self.bounds["shift"]}

    def draw(self, key, shape):
        spread = self.magnitude("max_delta") if key is not None else None
        return {"shift": centre_plus_spread(key, self.magnitude("shift"), spread) * shape[-1]}

    def apply(self, x, params):
        return waveform.time_shift(x, params["shift"], self.config.mode)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CropPadConfig(AudioOperatorConfig):
    """Configuration of `CropPadOperator`.

    Attributes:
        length: the output length in samples.
        align: where a deterministic crop/pad puts the signal: "center" or "start".
    """

    length: int
    stochastic: bool = True
    align: str = "center"

    def __post_init__(self):
        super().__post_init__()
        check_int(*field(self, "length"), 1)
        check_choice(*field(self, "align"), waveform.ALIGNMENTS)


class CropPadOperator(AudioOperator):
    """Crops a longer waveform, or zero-pads a shorter one, to `length` samples.

    When stochastic the crop window (or the signal's place in the padded output) is uniform
    over all positions; otherwise it follows `align`. The offset is discrete, so there is no
    learnable magnitude; the output is differentiable in the waveform.
    """

    config_class = CropPadConfig
    positional = ("length",)

    def draw(self, key, shape):
        total, length = shape[-1], self.config.length
        if key is None:
            return {"offset": waveform.aligned_offset(total, length, self.config.align)}
        return {"offset": jax.random.randint(key, (), 0, waveform.max_offset(total, length) + 1)}

    def apply(self, x, params):
        return waveform.crop_or_pad(x, self.config.length, params["offset"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResampleConfig(AudioOperatorConfig):
    """Configuration of `ResampleOperator`.

    Attributes:
        orig_rate: the waveform's sampling rate in Hz.
        target_rate: the wanted sampling rate in Hz.
    """

    orig_rate: int
    target_rate: int

    def __post_init__(self):
        super().__post_init__()
        require_deterministic(self, "resampling draws nothing")
        resample_lib.rational_factors(self.orig_rate, self.target_rate)


class ResampleOperator(AudioOperator):
    """Polyphase resampling to `target_rate` (agrees with `scipy.signal.resample_poly`)."""

    config_class = ResampleConfig
    positional = ("orig_rate", "target_rate")

    def apply(self, x, params):
        return resample_lib.resample(x, self.config.orig_rate, self.config.target_rate)
