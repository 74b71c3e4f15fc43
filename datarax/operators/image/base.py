"""Image operators: float HWC images in [0, 1] in one data field.

`ImageOperator` is a `FieldOperator` (see `datarax.operators.field`: `draw` the record's
parameters, `apply` the maths of `datarax.operators.image.functional`) that reads its field as
one float HWC image per record. The helpers below turn a record key into the draws the image
operators share.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from datarax.core.checks import check_number, describe_value, field
from datarax.core.element import Element
from datarax.core.operator import read_field
from datarax.operators.field import FieldOperator, FieldOperatorConfig
from datarax.operators.learnable import signed_uniform

# A fill value (what warps read outside the image, what holes get) is any sane pixel value.
FILL_LIMIT = 1e6


def check_fill(config: ImageOperatorConfig) -> None:
    """Checks `config.fill`, the value written where an operator has no image to read."""
    check_number(*field(config, "fill"), -FILL_LIMIT, FILL_LIMIT)


@dataclasses.dataclass(frozen=True)
class ImageOperatorConfig(FieldOperatorConfig):
    """Configuration shared by image operators.

    Attributes:
        field: the data field holding the image (float, HWC, values in [0, 1]).
    """

    field: str = "image"


class ImageOperator(FieldOperator):
    """Abstract base of the image operators.

    Subclasses set `config_class`, `bounds` (magnitude name -> `(low, high)`) and, for colour
    operators, `channels`, and implement `draw` and `apply`.
    """

    config_class: ClassVar[type[ImageOperatorConfig]]
    channels: ClassVar[int | None] = None

    def read(self, element: Element) -> jax.Array:
        """The element's image field, checked to be a float HWC image."""
        name = type(self).__name__
        field = self.config.field
        image = read_field(self, element)
        if not isinstance(image, jax.Array) or image.ndim != 3:
            raise ValueError(f"{name} expects field {field!r} to be one HWC image per record, got "
                             f"{describe_value(image)}; add a channel axis to grayscale images (x[..., None])")
        if not jnp.issubdtype(image.dtype, jnp.floating):
            raise TypeError(f"{name} expects a float image in [0, 1] in field {field!r}, got dtype {image.dtype}; "
                            "convert first, e.g. ElementOperator(fn=lambda el: el.update_data("
                            "{'image': el.data['image'] / 255.0}))")
        if self.channels is not None and image.shape[-1] != self.channels:
            raise ValueError(f"{name} needs {self.channels}-channel (RGB) images, got shape {tuple(image.shape)} "
                             f"in field {field!r}")
        return image


def uniforms(key: jax.Array | None, num: int) -> jax.Array | None:
    """`num` uniforms in [0, 1) from a record key (None for a deterministic operator).

    Operators draw all their randomness in one call: each random-number call site adds to the
    compile time of the pipeline's program.
    """
    return None if key is None else jax.random.uniform(key, (num,), dtype=jnp.result_type(float))


def signed(unit: jax.Array | None, magnitude: jax.Array | float) -> jax.Array | float:
    """Maps a uniform in [0, 1) to `[-magnitude, magnitude)`; the magnitude itself when `unit` is None."""
    return magnitude if unit is None else magnitude * (2.0 * unit - 1.0)


def signed_or_fixed(key: jax.Array | None, magnitude: jax.Array | float) -> jax.Array | float:
    """A draw in `[-magnitude, magnitude)` from `key`; the magnitude itself when `key` is None."""
    return magnitude if key is None else signed_uniform(key, magnitude)


def coin(key: jax.Array | None, p: float) -> jax.Array:
    """True with probability `p` from `key`; always True for a deterministic operator."""
    return jnp.asarray(True) if key is None else jax.random.bernoulli(key, p)
