"""Geometry operators: flips, crops, resizing, rotation, translation and general affine warps.

Warps sample bilinearly, so they are differentiable in their angle, scale, shear and shift;
with `stochastic=False` a warp applies its magnitudes as fixed values (for example
`RotationConfig(degrees=10, stochastic=False)` always turns by 10 degrees).

Example:
    >>> crop = RandomCropOperator(RandomCropConfig(size=32, padding=4, pad_mode="reflect"), rngs=nnx.Rngs(0))
    >>> flip = HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(1))
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from datarax.core.checks import (
    check_choice,
    check_int,
    check_number,
    check_range,
    check_size,
    field,
    require_stochastic,
    set_field,
)
from datarax.operators.field import check_magnitudes
from datarax.operators.image.base import (
    ImageOperator,
    ImageOperatorConfig,
    check_fill,
    coin,
    signed,
    signed_or_fixed,
    uniforms,
)
from datarax.operators.image.functional import batched, geometry


@dataclasses.dataclass(frozen=True)
class FlipConfig(ImageOperatorConfig):
    """Shared by the flips.

    Attributes:
        p: probability of flipping a record when stochastic (always when not).
    """

    stochastic: bool = True
    p: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        check_number(*field(self, "p"), 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class HorizontalFlipConfig(FlipConfig):
    """Configuration of `HorizontalFlipOperator` (see `FlipConfig`)."""


@dataclasses.dataclass(frozen=True)
class VerticalFlipConfig(FlipConfig):
    """Configuration of `VerticalFlipOperator` (see `FlipConfig`)."""


class HorizontalFlipOperator(ImageOperator):
    """Mirrors left-right with probability `p`."""

    config_class = HorizontalFlipConfig
    positional = ("p",)

    def draw(self, key, shape):
        return {"apply": coin(key, self.config.p)}

    def apply(self, image, params):
        return jnp.where(params["apply"], geometry.hflip(image), image)

    def apply_many(self, images, params):
        return batched.flip(images, params["apply"], axis=2)


class VerticalFlipOperator(ImageOperator):
    """Mirrors top-bottom with probability `p`."""

    config_class = VerticalFlipConfig
    positional = ("p",)

    def draw(self, key, shape):
        return {"apply": coin(key, self.config.p)}

    def apply(self, image, params):
        return jnp.where(params["apply"], geometry.vflip(image), image)

    def apply_many(self, images, params):
        return batched.flip(images, params["apply"], axis=1)


@dataclasses.dataclass(frozen=True)
class RandomCropConfig(ImageOperatorConfig):
    """Configuration of `RandomCropOperator`.

    Attributes:
        size: output (height, width), or one int for a square.
        padding: pixels added on every side before cropping.
        pad_mode: "constant" (with `fill`), "edge", "reflect" or "symmetric", as in `numpy.pad`.
        fill: the constant padding value.
    """

    stochastic: bool = True
    size: int | tuple[int, int] = 32
    padding: int = 0
    pad_mode: str = "constant"
    fill: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        set_field(self, "size", check_size(*field(self, "size")))
        check_int(*field(self, "padding"), 0)
        check_choice(*field(self, "pad_mode"), geometry.PAD_MODES)
        check_fill(self)


class RandomCropOperator(ImageOperator):
    """Pads, then crops a window at a random offset (the centred window when not stochastic)."""

    config_class = RandomCropConfig
    positional = ("size",)

    def draw(self, key, shape):
        height, width = self.config.size
        pad = self.config.padding
        room_y, room_x = shape[0] + 2 * pad - height, shape[1] + 2 * pad - width
        if room_y < 0 or room_x < 0:
            raise ValueError(f"RandomCropConfig.size {self.config.size} is larger than the padded image "
                             f"({shape[0] + 2 * pad}, {shape[1] + 2 * pad}); lower size or raise padding")
        if key is None:
            return {"top": room_y // 2, "left": room_x // 2}
        offsets = jax.random.randint(key, (2,), 0, jnp.asarray([room_y + 1, room_x + 1]))
        return {"top": offsets[0], "left": offsets[1]}

    def apply(self, image, params):
        padded = geometry.pad(image, self.config.padding, self.config.pad_mode, self.config.fill)
        return geometry.crop(padded, params["top"], params["left"], *self.config.size)

    def apply_many(self, images, params):
        return batched.crop(images, params["top"], params["left"], *self.config.size, padding=self.config.padding,
                            mode=self.config.pad_mode, fill=self.config.fill)


@dataclasses.dataclass(frozen=True)
class RandomResizedCropConfig(ImageOperatorConfig):
    """Configuration of `RandomResizedCropOperator`.

    Attributes:
        size: output (height, width), or one int for a square.
        scale: range of the box area as a fraction of the image area; `scale[0]` is the
            learnable magnitude `min_scale`.
        ratio: range of the box aspect ratio (width / height), drawn log-uniformly.
        antialias: smooth when shrinking (as PIL does).
    """

    stochastic: bool = True
    size: int | tuple[int, int] = 32
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    antialias: bool = True

    def __post_init__(self):
        super().__post_init__()
        require_stochastic(self)
        set_field(self, "size", check_size(*field(self, "size")))
        set_field(self, "scale", check_range(*field(self, "scale"), *RandomResizedCropOperator.bounds["min_scale"]))
        set_field(self, "ratio", check_range(*field(self, "ratio"), 0.0, float("inf")))

    @property
    def min_scale(self) -> float:
        return self.scale[0]


class RandomResizedCropOperator(ImageOperator):
    """Crops a random box (area and aspect ratio drawn from ranges) and resizes it bilinearly.

    The box is continuous (not rounded to pixels) and resampled with PIL's bilinear filter, so
    the output is differentiable in the box and hence in `min_scale`. A box wider or taller
    than the image is clamped to it.
    """

    config_class = RandomResizedCropConfig
    positional = ("size",)
    bounds = {"min_scale": (0.0, 1.0)}

    def draw(self, key, shape):
        unit = uniforms(key, 4)
        min_scale, max_scale = self.magnitude("min_scale"), self.config.scale[1]
        area = (min_scale + (max_scale - min_scale) * unit[0]) * shape[0] * shape[1]
        low, high = math.log(self.config.ratio[0]), math.log(self.config.ratio[1])
        ratio = jnp.exp(low + (high - low) * unit[1])
        box_h = jnp.minimum(jnp.sqrt(area / ratio), shape[0])
        box_w = jnp.minimum(jnp.sqrt(area * ratio), shape[1])
        top = unit[2] * (shape[0] - box_h)
        left = unit[3] * (shape[1] - box_w)
        return {"box": jnp.stack([top, left, box_h, box_w])}

    def apply(self, image, params):
        return geometry.resized_crop(image, params["box"], *self.config.size, antialias=self.config.antialias)

    def apply_many(self, images, params):
        return batched.resized_crop(images, params["box"], *self.config.size, antialias=self.config.antialias)


@dataclasses.dataclass(frozen=True)
class ResizeConfig(ImageOperatorConfig):
    """Configuration of `ResizeOperator`.

    Attributes:
        size: output (height, width), or one int for a square.
        antialias: smooth when shrinking (as PIL does).
    """

    size: int | tuple[int, int] = 32
    antialias: bool = True

    def __post_init__(self):
        super().__post_init__()
        set_field(self, "size", check_size(*field(self, "size")))


class ResizeOperator(ImageOperator):
    """Bilinear resize to a fixed size (PIL `resize(..., BILINEAR)`)."""

    config_class = ResizeConfig
    positional = ("size",)

    def apply(self, image, params):
        return geometry.resize(image, *self.config.size, antialias=self.config.antialias)

    def apply_many(self, images, params):
        return batched.resize(images, *self.config.size, antialias=self.config.antialias)


def warp_many(op, images, params, inverse_of):
    """A warp operator's batch: `batched.warp_affine` with each record's `inverse_of(params, center)`,
    or `op.apply` vmapped for images too large for its products."""
    if not batched.warps_in_batch(images.shape[1:]):
        return jax.vmap(op.apply)(images, params)
    center = geometry.image_center(images[0])
    inverse = jax.vmap(lambda p: inverse_of(p, center))(params)
    return batched.warp_affine(images, inverse, op.config.fill)


@dataclasses.dataclass(frozen=True)
class AffineConfig(ImageOperatorConfig):
    """Configuration of `AffineOperator`; each magnitude is the half-width of a uniform draw.

    Attributes:
        degrees: rotation angle range in degrees, in [0, 180].
        translate: shift range as a fraction of width (x) and height (y), in [0, 1].
        scale: zoom range: the factor is `1 + U(-scale, scale)`, scale in [0, 0.9].
        shear: x-shear angle range in degrees, in [0, 60].
        fill: value read outside the source image.
    """

    stochastic: bool = True
    degrees: float = 0.0
    translate: float = 0.0
    scale: float = 0.0
    shear: float = 0.0
    fill: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, AffineOperator.bounds)
        check_fill(self)


class AffineOperator(ImageOperator):
    """A random rotation, shift, zoom and shear about the centre, sampled bilinearly."""

    config_class = AffineConfig
    positional = ("degrees",)
    separate_on_cpu = True
    bounds = {"degrees": (0.0, 180.0), "translate": (0.0, 1.0), "scale": (0.0, 0.9), "shear": (0.0, 60.0)}
    spreads = ("degrees", "translate", "scale", "shear")

    def draw(self, key, shape):
        unit = uniforms(key, 5)
        angle, dx, dy, scale, shear = (None,) * 5 if unit is None else unit
        shift = self.magnitude("translate")
        return {"angle": signed(angle, self.magnitude("degrees")),
                "dx": signed(dx, shift) * shape[1], "dy": signed(dy, shift) * shape[0],
                "scale": 1.0 + signed(scale, self.magnitude("scale")),
                "shear": signed(shear, self.magnitude("shear"))}

    def apply(self, image, params):
        inverse = geometry.affine_matrix(params["angle"], geometry.image_center(image), scale=params["scale"],
                                         shear=params["shear"], translate=(params["dx"], params["dy"]))
        return geometry.warp_affine(image, inverse, self.config.fill)

    def apply_many(self, images, params):
        return warp_many(self, images, params, lambda p, center: geometry.affine_matrix(
            p["angle"], center, scale=p["scale"], shear=p["shear"], translate=(p["dx"], p["dy"])))


@dataclasses.dataclass(frozen=True)
class RotationConfig(ImageOperatorConfig):
    """Configuration of `RotationOperator`.

    Attributes:
        degrees: the angle is `U(-degrees, degrees)`, counter-clockwise; in [0, 180].
        fill: value read outside the source image.
    """

    stochastic: bool = True
    degrees: float = 15.0
    fill: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, RotationOperator.bounds)
        check_fill(self)


class RotationOperator(ImageOperator):
    """Rotates about the centre by a random angle (scikit-image `rotate(order=1)`)."""

    config_class = RotationConfig
    positional = ("degrees",)
    separate_on_cpu = True
    bounds = {"degrees": (0.0, 180.0)}
    spreads = ("degrees",)

    def draw(self, key, shape):
        return {"angle": signed_or_fixed(key, self.magnitude("degrees"))}

    def apply(self, image, params):
        return geometry.rotate(image, params["angle"], self.config.fill)

    def apply_many(self, images, params):
        return warp_many(self, images, params, lambda p, center: geometry.affine_matrix(p["angle"], center))


@dataclasses.dataclass(frozen=True)
class TranslateConfig(ImageOperatorConfig):
    """Configuration of `TranslateOperator`.

    Attributes:
        translate: shift range as a fraction of width (x) and height (y), in [0, 1].
        fill: value read outside the source image.
    """

    stochastic: bool = True
    translate: float = 0.1
    fill: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, TranslateOperator.bounds)
        check_fill(self)


class TranslateOperator(ImageOperator):
    """Shifts content by a random (sub-pixel) offset, sampled bilinearly."""

    config_class = TranslateConfig
    separate_on_cpu = True
    bounds = {"translate": (0.0, 1.0)}
    spreads = ("translate",)

    def draw(self, key, shape):
        unit = uniforms(key, 2)
        dx, dy = (None, None) if unit is None else unit
        shift = self.magnitude("translate")
        return {"dx": signed(dx, shift) * shape[1], "dy": signed(dy, shift) * shape[0]}

    def apply(self, image, params):
        return geometry.translate(image, params["dx"], params["dy"], self.config.fill)

    def apply_many(self, images, params):
        return batched.translate(images, params["dx"], params["dy"], self.config.fill)
