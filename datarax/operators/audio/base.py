"""Audio operators: float waveforms `(..., T)` or spectrograms `(..., F, T)` in one data field.

`AudioOperator` is a `FieldOperator` (see `datarax.operators.field`: `draw` the record's
parameters, `apply` the maths of `datarax.operators.audio.functional`) that reads its field as
a float array of at least `min_ndim` axes. Feature extractors write a new field (`out_field`,
e.g. "log_mel"), so the waveform stays available to later stages.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from datarax.core.checks import describe_value
from datarax.core.element import Element
from datarax.core.operator import read_field
from datarax.operators.field import FieldOperator, FieldOperatorConfig


@dataclasses.dataclass(frozen=True)
class AudioOperatorConfig(FieldOperatorConfig):
    """Configuration shared by audio operators.

    Attributes:
        field: the data field the operator reads (a float waveform or spectrogram per record).
    """

    field: str = "audio"


class AudioOperator(FieldOperator):
    """Abstract base of the audio operators.

    Subclasses set `config_class`, `min_ndim` (1 for waveforms, 2 for spectrograms) and, when
    they have continuous magnitudes, `bounds` or `channel_bounds` (per-channel magnitudes; the
    config then has an `n_channels` field), and implement `draw` and `apply`.
    """

    config_class: ClassVar[type[AudioOperatorConfig]]
    min_ndim: ClassVar[int] = 1

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
            raise ValueError(f"{name} expects field {field!r} to hold one {kind} per record, got {describe_value(x)}; "
                             f"{fix}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} expects a float array in field {field!r}, got dtype {x.dtype}; convert "
                            "first, e.g. int16 PCM: ElementOperator(fn=lambda el: el.update_data("
                            "{'audio': el.data['audio'] / 32768.0}))")
        return x


def split(key: jax.Array | None, num: int) -> tuple[jax.Array | None, ...]:
    """Splits a record key into `num` keys (all None for a deterministic operator)."""
    return (None,) * num if key is None else tuple(jax.random.split(key, num))
