"""SpecAugment time and frequency masking operators (Park et al. 2019).

Each record gets `num_masks` masks of width `U(0, max_width)` at uniform positions, drawn from its
key. The mask edges are fractional (see `masking`), so `max_width` can be learnable: its gradient
comes through the two partly covered edge bins of each mask.

Example:
    >>> masks = TimeMaskOperator(TimeMaskConfig(field="log_mel", max_width=20.0, num_masks=2),
    ...                          rngs=nnx.Rngs(0))
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from datarax.core.checks import check_int, check_number, field, is_number, require_stochastic
from datarax.operators.audio.base import AudioOperator, AudioOperatorConfig
from datarax.operators.audio.functional import masking


@dataclasses.dataclass(frozen=True)
class MaskConfig(AudioOperatorConfig):
    """Settings shared by `TimeMaskConfig` and `FrequencyMaskConfig`.

    Attributes:
        field: the spectrogram field, laid out `(..., freq, time)`.
        max_width: the largest mask width in frames (time) or bins (frequency).
        width_limit: the upper bound of a learnable `max_width` (and of `max_width` itself).
        num_masks: masks per record.
        mask_value: the value masked bins take, a number or "mean" for the record's mean.
    """

    field: str = "log_mel"
    stochastic: bool = True
    max_width: float = 10.0
    width_limit: float = 100.0
    num_masks: int = 1
    mask_value: float | str = 0.0

    def __post_init__(self):
        super().__post_init__()
        require_stochastic(self)
        check_number(*field(self, "width_limit"), 0.0, 1e6, open_low=True)
        check_number(*field(self, "max_width"), 0.0, self.width_limit)
        check_int(*field(self, "num_masks"), 1)
        value = self.mask_value
        if value != "mean" and not is_number(value):
            raise ValueError(f"{type(self).__name__}.mask_value must be a finite number or 'mean' (the record's "
                             f"mean), got {value!r}")


@dataclasses.dataclass(frozen=True)
class TimeMaskConfig(MaskConfig):
    """Configuration of `TimeMaskOperator` (see `MaskConfig`)."""


@dataclasses.dataclass(frozen=True)
class FrequencyMaskConfig(MaskConfig):
    """Configuration of `FrequencyMaskOperator` (see `MaskConfig`)."""

    max_width: float = 8.0


class _MaskOperator(AudioOperator):
    min_ndim = 2
    axis = -1

    def active_bounds(self, config):
        return {"max_width": (0.0, config.width_limit)}

    def draw(self, key, shape):
        start, width = masking.draw_masks(key, shape[self.axis], self.magnitude("max_width"), self.config.num_masks)
        return {"start": start, "width": width}

    def apply(self, x, params):
        value = jnp.mean(x) if self.config.mask_value == "mean" else self.config.mask_value
        return masking.apply_masks(x, params["start"].astype(x.dtype), params["width"].astype(x.dtype),
                                   self.axis, value)


class TimeMaskOperator(_MaskOperator):
    """Masks random spans of frames of a `(..., freq, time)` spectrogram."""

    config_class = TimeMaskConfig
    positional = ("max_width",)
    axis = -1


class FrequencyMaskOperator(_MaskOperator):
    """Masks random bands of bins of a `(..., freq, time)` spectrogram."""

    config_class = FrequencyMaskConfig
    positional = ("max_width",)
    axis = -2
