"""The shared shape of audio operators: a config naming the field, and draw/transform hooks.

An audio operator is split in two so tests and users can look at what it drew:

- `draw(key, shape)` turns the record key (None when not stochastic) and the input's shape into
  the record's parameters (gain, SNR, shift, offset, mask positions), using the operator's
  magnitudes;
- `transform(x, params)` is the pure maths from the family module (`waveform`, `resample`,
  `spectral`, `mel`, `masking`, `pcen`, `loudness`).

`apply_element` reads `element.data[config.field]` (a float waveform `(..., T)` or spectrogram
`(..., F, T)`), checks it, and writes the result to `config.out_field` (the input field itself
for augmentations; a new field such as "log_mel" for feature extractors). Magnitudes listed in
the operator's `bounds` become `Magnitude` modules, learnable when the config's `learnable`
names them (see `datarax.operators.learnable`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator, check_field_name, describe, read_field
from datarax.operators.learnable import (Learnable, Magnitude, bounded, check_learnable_field, inverse_bounded,
                                         learnable_names)


@dataclasses.dataclass(frozen=True)
class AudioOperatorConfig(OperatorConfig):
    """Configuration shared by audio operators.

    Attributes:
        field: the data field the operator reads (a float waveform or spectrogram per record).
        out_field: the field it writes; None writes back to `field`.
        learnable: True to make every continuous magnitude of the operator a bounded
            `nnx.Param`, False for none, or a tuple naming some of them.
    """

    field: str = "audio"
    out_field: str | None = None
    learnable: Learnable = False

    def __post_init__(self):
        super().__post_init__()
        owner = type(self).__name__
        check_field_name(self, "field")
        check_field_name(self, "out_field", allow_none=True)
        object.__setattr__(self, "learnable", check_learnable_field(self.learnable, owner))


def check_number(config: object, name: str, low: float, high: float, *, open_low: bool = False,
                 allow_none: bool = False) -> float | None:
    """Validates that `config.<name>` is a finite number in `[low, high]` (or `(low, high]`)."""
    value = getattr(config, name)
    if value is None and allow_none:
        return None
    owner = type(config).__name__
    interval = f"{'(' if open_low else '['}{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{owner}.{name} must be a number in {interval}"
                        f"{' or None' if allow_none else ''}, got {value!r}")
    if value > high or value < low or (open_low and value == low):
        raise ValueError(f"{owner}.{name} must be in {interval}, got {value!r}; pick a value in that range")
    return float(value)


def check_int(config: object, name: str, low: int = 1, *, allow_none: bool = False) -> int | None:
    """Validates that `config.<name>` is an int >= `low` (or None when allowed)."""
    value = getattr(config, name)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{type(config).__name__}.{name} must be an int >= {low}"
                         f"{' or None' if allow_none else ''}, got {value!r}")
    return value


def check_choice(config: object, name: str, choices: tuple) -> Any:
    """Validates that `config.<name>` is one of `choices`."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{type(config).__name__}.{name} must be one of {choices}, got {value!r}")
    return value


def require_stochastic(config: OperatorConfig) -> None:
    """For operators that only make sense with randomness (noise, masks)."""
    if not config.stochastic:
        raise ValueError(f"{type(config).__name__}(stochastic=False) has nothing to do: this operator only "
                         "exists to draw random parameters per record; leave stochastic=True")


class ChannelMagnitude(nnx.Module):
    """A per-channel magnitude in `[low, high]`: one fixed float, or a learnable `(n,)` logit vector.

    When learnable every channel starts at `value` and is read as `bounded(raw, low, high)`.
    """

    def __init__(self, value: float, n: int, *, low: float, high: float, learnable: bool, name: str):
        self.learnable = learnable
        if learnable:
            self.low, self.high = low, high
            self.raw = nnx.Param(jnp.full((n,), inverse_bounded(value, low, high, name=name), dtype=float))
        else:
            self.fixed = float(value)

    def __call__(self) -> jax.Array | float:
        return bounded(self.raw[...], self.low, self.high) if self.learnable else self.fixed


class AudioOperator(PerRecordOperator):
    """Abstract base of the audio operators (see the module docstring).

    Subclasses set `config_class`, `min_ndim` (1 for waveforms, 2 for spectrograms) and, when
    they have continuous magnitudes, `bounds` (scalar magnitude name -> `(low, high)`) or
    `channel_bounds` (per-channel magnitudes; the config then has an `n_channels` field), and
    implement `draw` and `transform`.
    """

    config_class: ClassVar[type[AudioOperatorConfig]]
    bounds: ClassVar[dict[str, tuple[float, float]]] = {}
    channel_bounds: ClassVar[dict[str, tuple[float, float]]] = {}
    min_ndim: ClassVar[int] = 1

    def __init__(self, config: AudioOperatorConfig | None = None, *, rngs: nnx.Rngs | None = None):
        config = self.config_class() if config is None else config
        if type(config) is not self.config_class:
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, got {describe(config)}")
        owner = self.config_class.__name__
        bounds = self.active_bounds(config)
        available = list(bounds) + list(self.channel_bounds)
        if not available and config.learnable not in (False, ()):
            raise ValueError(f"{owner}.learnable={config.learnable!r}, but {type(self).__name__} has no "
                             "learnable magnitudes here; leave learnable=False")
        chosen = learnable_names(config.learnable, available, owner=owner)
        self._init_rng(config, rngs)
        self.magnitudes = nnx.Dict({
            name: Magnitude(getattr(config, name), low=low, high=high, learnable=name in chosen, name=f"{owner}.{name}")
            for name, (low, high) in bounds.items()
        })
        self.channel_magnitudes = nnx.Dict({
            name: ChannelMagnitude(getattr(config, name), config.n_channels, low=low, high=high,
                                   learnable=name in chosen, name=f"{owner}.{name}")
            for name, (low, high) in self.channel_bounds.items()
        })

    def active_bounds(self, config: AudioOperatorConfig) -> dict[str, tuple[float, float]]:
        """The scalar magnitudes this configuration uses (a spread is unused when not stochastic)."""
        return dict(self.bounds)

    def magnitude(self, name: str) -> jax.Array | float:
        """The current value of magnitude `name`: a traced scalar or `(n_channels,)` when learnable."""
        if name in self.channel_magnitudes:
            return self.channel_magnitudes[name]()
        return self.magnitudes[name]()

    @abc.abstractmethod
    def draw(self, key: jax.Array | None, shape: tuple[int, ...]) -> dict[str, Any]:
        """The parameters for one record whose input has `shape`; `key` is None when not stochastic."""

    @abc.abstractmethod
    def transform(self, x: jax.Array, params: dict[str, Any]) -> jax.Array:
        """Applies the operator to one record's input with drawn `params`."""

    def read(self, element: Element) -> jax.Array:
        """The element's input field, checked to be a float array of at least `min_ndim` axes."""
        name = type(self).__name__
        field = self.config.field
        x = read_field(self, element)
        if self.min_ndim == 1:
            kind, fix = "waveform (..., time)", "store each record's samples as a (time,) array"
        else:
            kind, fix = "spectrogram (..., freq, time)", "compute one first, e.g. with LogMelOperator"
        if not isinstance(x, jax.Array) or x.ndim < self.min_ndim:
            raise ValueError(f"{name} expects field {field!r} to hold one {kind} per record, got {describe(x)}; "
                             f"{fix}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} expects a float array in field {field!r}, got dtype {x.dtype}; convert "
                            "first, e.g. int16 PCM: ElementOperator(fn=lambda el: el.update_data("
                            "{'audio': el.data['audio'] / 32768.0}))")
        return x

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        x = self.read(element)
        out = self.transform(x, self.draw(key, x.shape))
        return element.update_data({self.config.out_field or self.config.field: out.astype(x.dtype)})


def split(key: jax.Array | None, num: int) -> tuple[jax.Array | None, ...]:
    """Splits a record key into `num` keys (all None for a deterministic operator)."""
    return (None,) * num if key is None else tuple(jax.random.split(key, num))
