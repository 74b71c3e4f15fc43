"""The shared shape of image operators: a config naming the field, and draw/transform hooks.

An image operator is split in two so tests and users can look at what it drew:

- `draw(key, shape)` turns the record key (None when not stochastic) and the image shape into
  the record's parameters (angles, factors, offsets), using the operator's magnitudes;
- `transform(image, params)` is the pure maths from the family module (`color`, `geometry`,
  `filters`).

`apply_element` reads `element.data[config.field]`, checks it is a float HWC image, and writes
the result back. Magnitudes listed in the class's `bounds` become `Magnitude` modules, learnable
when the config's `learnable` names them (see `datarax.operators.learnable`).
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
from datarax.core.fusion import separately
from datarax.core.operator import (BatchContext, OperatorConfig, PerRecordOperator, check_field_name, describe,
                                    read_field, record_keys)
from datarax.operators.learnable import Learnable, check_learnable_field, magnitudes, signed_uniform

PAD_MODES = ("constant", "edge", "reflect", "symmetric")


@dataclasses.dataclass(frozen=True)
class ImageOperatorConfig(OperatorConfig):
    """Configuration shared by image operators.

    Attributes:
        field: the data field holding the image (float, HWC, values in [0, 1]).
        learnable: True to make every continuous magnitude of the operator a bounded
            `nnx.Param`, False for none, or a tuple naming some of them.
    """

    field: str = "image"
    learnable: Learnable = False

    def __post_init__(self):
        super().__post_init__()
        check_field_name(self, "field")
        object.__setattr__(self, "learnable", check_learnable_field(self.learnable, type(self).__name__))


def check_number(config: object, name: str, low: float, high: float, *, open_low: bool = False) -> float:
    """Validates that `config.<name>` is a finite number in `[low, high]` (or `(low, high]`)."""
    value = getattr(config, name)
    owner = type(config).__name__
    interval = f"{'(' if open_low else '['}{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{owner}.{name} must be a number in {interval}, got {value!r}")
    if value > high or value < low or (open_low and value == low):
        raise ValueError(f"{owner}.{name} must be in {interval}, got {value!r}; pick a value in that range")
    return float(value)


def check_size(config: object, name: str) -> tuple[int, int]:
    """Validates and normalises `config.<name>`: an int or (height, width) of positive ints."""
    value = getattr(config, name)
    size = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(size, list):
        size = tuple(size)
    if (not isinstance(size, tuple) or len(size) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)):
        raise ValueError(f"{type(config).__name__}.{name} must be a positive int or a (height, width) pair "
                         f"of positive ints, got {value!r}")
    object.__setattr__(config, name, size)
    return size


def check_range(config: object, name: str, low: float, high: float) -> tuple[float, float]:
    """Validates `config.<name>`: a pair `(a, b)` with `low < a <= b <= high`."""
    value = getattr(config, name)
    pair = tuple(value) if isinstance(value, (tuple, list)) else None
    if (pair is None or len(pair) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in pair)
            or not low < pair[0] <= pair[1] <= high):
        raise ValueError(f"{type(config).__name__}.{name} must be a pair (a, b) with {low} < a <= b <= {high}, "
                         f"got {value!r}")
    object.__setattr__(config, name, (float(pair[0]), float(pair[1])))
    return pair


def require_stochastic(config: OperatorConfig) -> None:
    """For operators that only make sense with randomness (noise, random crops, cutout)."""
    if not config.stochastic:
        raise ValueError(f"{type(config).__name__}(stochastic=False) has nothing to do: this operator only "
                         "exists to draw random parameters per record; leave stochastic=True")


class ImageOperator(PerRecordOperator):
    """Abstract base of the image operators (see the module docstring).

    Subclasses set `config_class`, `bounds` (magnitude name -> `(low, high)`) and, for colour
    operators, `channels`, and implement `draw` and `transform`.
    """

    config_class: ClassVar[type[ImageOperatorConfig]]
    bounds: ClassVar[dict[str, tuple[float, float]]] = {}
    channels: ClassVar[int | None] = None
    # Bilinear warps: computed as their own XLA computation on CPU (see `datarax.core.fusion`).
    separate_on_cpu: ClassVar[bool] = False

    def __init__(self, config: ImageOperatorConfig | None = None, *, rngs: nnx.Rngs | None = None):
        config = self.config_class() if config is None else config
        if type(config) is not self.config_class:
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, got {describe(config)}")
        if config.learnable is True and not self.bounds:
            raise ValueError(f"{self.config_class.__name__}(learnable=True): {type(self).__name__} has no continuous "
                             "magnitude to learn (its randomness is discrete); leave learnable=False")
        self._init_rng(config, rngs)
        self.magnitudes = magnitudes(config, self.bounds, owner=self.config_class.__name__)

    def magnitude(self, name: str) -> jax.Array | float:
        """The current value of magnitude `name` (a traced scalar when learnable)."""
        return self.magnitudes[name]()

    @abc.abstractmethod
    def draw(self, key: jax.Array | None, shape: tuple[int, ...]) -> dict[str, Any]:
        """The parameters for one record of image shape `shape`; `key` is None when not stochastic."""

    @abc.abstractmethod
    def transform(self, image: jax.Array, params: dict[str, Any]) -> jax.Array:
        """Applies the operator to one image with drawn `params`."""

    def draw_batch(self, ctx: BatchContext, shape: tuple[int, ...]) -> dict[str, Any]:
        """The parameters a stochastic operator draws for every record of a batch (leading axis B).

        For inspecting what an operator does; `apply_batch` draws exactly these.
        """
        if self.key is None:
            raise ValueError(f"{type(self).__name__} is not stochastic: call draw(None, shape) for its fixed "
                             "parameters")
        return jax.vmap(lambda key: self.draw(key, tuple(shape)))(record_keys(self.key, ctx))

    def read_image(self, element: Element) -> jax.Array:
        """The element's image field, checked to be a float HWC image."""
        name = type(self).__name__
        field = self.config.field
        image = read_field(self, element)
        if not isinstance(image, jax.Array) or image.ndim != 3:
            raise ValueError(f"{name} expects field {field!r} to be one HWC image per record, got "
                             f"{describe(image)}; add a channel axis to grayscale images (x[..., None])")
        if not jnp.issubdtype(image.dtype, jnp.floating):
            raise TypeError(f"{name} expects a float image in [0, 1] in field {field!r}, got dtype {image.dtype}; "
                            "convert first, e.g. ElementOperator(fn=lambda el: el.update_data("
                            "{'image': el.data['image'] / 255.0}))")
        if self.channels is not None and image.shape[-1] != self.channels:
            raise ValueError(f"{name} needs {self.channels}-channel (RGB) images, got shape {tuple(image.shape)} "
                             f"in field {field!r}")
        return image

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        if not self.separate_on_cpu:
            return super().apply_batch(elements, ctx)
        return separately(super().apply_batch, ctx.epoch >= 0, elements, ctx)

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        image = self.read_image(element)
        out = self.transform(image, self.draw(key, image.shape))
        return element.update_data({self.config.field: out.astype(image.dtype)})


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
