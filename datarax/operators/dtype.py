"""ToFloatOperator: integer data (uint8 images, int16 PCM audio) to floats in a known range.

Every image operator takes float images in [0, 1] and every audio operator float waveforms;
sources and decoders deliver integers (`DecodeImage` gives uint8 RGB). This is the documented
step between them: an integer field is divided by its dtype's largest value (255 for uint8,
32767 for int16, 65535 for uint16), or by `scale` when given; a float field is only cast.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import check_choice, check_field_name, check_number, field
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator, read_field

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclasses.dataclass(frozen=True)
class ToFloatConfig(OperatorConfig):
    """Configuration of `ToFloatOperator`.

    Attributes:
        field: the field to convert.
        out_field: where to write the result; None writes back to `field`.
        scale: divide by this instead of the integer dtype's largest value (e.g. 32768.0 for PCM
            read as int16 into [-1, 1)); None for the dtype's maximum.
        dtype: the float dtype to produce.
    """

    field: str = "image"
    out_field: str | None = None
    scale: float | None = None
    dtype: str = "float32"

    def __post_init__(self):
        super().__post_init__()
        check_field_name(*field(self, "field"))
        check_field_name(*field(self, "out_field"), allow_none=True)
        check_number(*field(self, "scale"), 0.0, open_low=True, allow_none=True)
        check_choice(*field(self, "dtype"), FLOAT_DTYPES)
        if self.stochastic:
            raise ValueError("ToFloatConfig(stochastic=True): a dtype conversion draws nothing; leave stochastic=False")


class ToFloatOperator(PerRecordOperator):
    """Converts a field to floats: integers divided by their dtype's maximum (or `scale`).

    Example:
        >>> stages = [ToFloatOperator(ToFloatConfig(field="image")), BrightnessOperator(...)]
    """

    config_class = ToFloatConfig

    def __init__(self, config: ToFloatConfig | None = None, *, rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(ToFloatConfig, config, settings, "ToFloatOperator")
        self._init_rng(config, rngs)

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        x = read_field(self, element)
        dtype = jnp.dtype(self.config.dtype)
        if self.config.scale is not None:
            out = x.astype(dtype) / jnp.asarray(self.config.scale, dtype)
        elif jnp.issubdtype(x.dtype, jnp.integer):
            out = x.astype(dtype) / jnp.asarray(jnp.iinfo(x.dtype).max, dtype)
        else:
            out = x.astype(dtype)
        return element.update_data({self.config.out_field or self.config.field: out})

    def structure(self) -> str:
        return f"ToFloatOperator({self.config!r})"
