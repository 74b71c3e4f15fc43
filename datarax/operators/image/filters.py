"""Noise, blur and occlusion operators: Gaussian noise, Gaussian blur, cutout, patch dropout.

Example:
    >>> noise = GaussianNoiseOperator(GaussianNoiseConfig(sigma=0.05, learnable=True), rngs=nnx.Rngs(0))
    >>> holes = CutoutOperator(CutoutConfig(size=0.25, num_holes=2), rngs=nnx.Rngs(1))
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from datarax.core.checks import check_int, check_number, field, require_stochastic
from datarax.core.noise import standard_normal
from datarax.operators.field import check_magnitudes
from datarax.operators.image.base import ImageOperator, ImageOperatorConfig, check_fill
from datarax.operators.image.functional import filters
from datarax.operators.learnable import uniform


@dataclasses.dataclass(frozen=True)
class GaussianNoiseConfig(ImageOperatorConfig):
    """Configuration of `GaussianNoiseOperator`.

    Attributes:
        sigma: standard deviation of the added noise, in [0, 1].
        clip: clip the result to [0, 1].
    """

    stochastic: bool = True
    sigma: float = 0.05
    clip: bool = True

    def __post_init__(self):
        super().__post_init__()
        require_stochastic(self)
        check_magnitudes(self, GaussianNoiseOperator.bounds)


class GaussianNoiseOperator(ImageOperator):
    """Adds `sigma * N(0, 1)` noise per pixel; the standard normal draw is fixed by the record key,
    so the output is differentiable in `sigma`. The draw is `datarax.core.noise.standard_normal`
    (a counter hash keyed by the record key, through the inverse normal CDF), much cheaper
    than `jax.random.normal` on a CPU."""

    config_class = GaussianNoiseConfig
    bounds = {"sigma": (0.0, 1.0)}
    spreads = ("sigma",)

    def draw(self, key, shape):
        return {"noise": standard_normal(key, shape, jnp.result_type(float)),
                "sigma": self.magnitude("sigma")}

    def apply(self, image, params):
        return filters.gaussian_noise(image, params["noise"].astype(image.dtype), params["sigma"], self.config.clip)


@dataclasses.dataclass(frozen=True)
class GaussianBlurConfig(ImageOperatorConfig):
    """Configuration of `GaussianBlurOperator`.

    Attributes:
        sigma: the blur's standard deviation in pixels, or the top of its random range
            `U(min_sigma, sigma)` when stochastic; in (0, 4].
        min_sigma: the bottom of the random range.
        kernel_size: odd number of taps per axis; fixed, so a learnable sigma only moves the weights.
    """

    stochastic: bool = True
    sigma: float = 1.0
    min_sigma: float = 0.1
    kernel_size: int = 5

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, GaussianBlurOperator.bounds, open_low=("sigma",))
        check_number(*field(self, "min_sigma"), *GaussianBlurOperator.bounds["sigma"], open_low=True)
        check_int(*field(self, "kernel_size"), 1)
        if self.kernel_size % 2 == 0:
            raise ValueError(f"GaussianBlurConfig.kernel_size must be odd (the kernel is centred), "
                             f"got {self.kernel_size}")


class GaussianBlurOperator(ImageOperator):
    """Separable Gaussian blur with reflected borders (scikit-image `filters.gaussian`)."""

    config_class = GaussianBlurConfig
    bounds = {"sigma": (0.0, 4.0)}

    def draw(self, key, shape):
        sigma = self.magnitude("sigma")
        if key is not None:
            sigma = uniform(key, self.config.min_sigma, sigma)
        return {"sigma": sigma}

    def apply(self, image, params):
        return filters.gaussian_blur(image, params["sigma"], self.config.kernel_size // 2)


@dataclasses.dataclass(frozen=True)
class CutoutConfig(ImageOperatorConfig):
    """Configuration of `CutoutOperator`.

    Attributes:
        size: side of each square hole as a fraction of the image's shorter side, in [0, 1].
        num_holes: holes per image (centres drawn independently, anywhere in the image).
        fill: the value written into the holes.
    """

    stochastic: bool = True
    size: float = 0.25
    num_holes: int = 1
    fill: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        require_stochastic(self)
        check_magnitudes(self, CutoutOperator.bounds)
        check_int(*field(self, "num_holes"), 1)
        check_fill(self)


class CutoutOperator(ImageOperator):
    """Fills square holes at random centres (DeVries & Taylor's cutout, holes clipped at the border).

    Pixels a hole edge cuts are filled in proportion to the area covered, which makes the
    output differentiable in `size`.
    """

    config_class = CutoutConfig
    bounds = {"size": (0.0, 1.0)}

    def draw(self, key, shape):
        unit = uniform(key, 0.0, 1.0, (self.config.num_holes, 2))
        centers = unit * jnp.asarray(shape[:2], unit.dtype)
        return {"centers": centers, "size": self.magnitude("size") * min(shape[:2])}

    def apply(self, image, params):
        return filters.cutout(image, params["centers"], params["size"], self.config.fill)


@dataclasses.dataclass(frozen=True)
class PatchDropoutConfig(ImageOperatorConfig):
    """Configuration of `PatchDropoutOperator`.

    Attributes:
        patch_size: side of the square patches the image is tiled into (edge patches may be smaller).
        p: probability that a patch is dropped.
        fill: the value written into dropped patches.
    """

    stochastic: bool = True
    patch_size: int = 4
    p: float = 0.1
    fill: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        require_stochastic(self)
        check_int(*field(self, "patch_size"), 1)
        check_number(*field(self, "p"), 0.0, 1.0)
        check_fill(self)


class PatchDropoutOperator(ImageOperator):
    """Tiles the image into patches and fills each with probability `p` (not learnable: a coin flip)."""

    config_class = PatchDropoutConfig

    def draw(self, key, shape):
        size = self.config.patch_size
        grid = (math.ceil(shape[0] / size), math.ceil(shape[1] / size))
        return {"dropped": jax.random.bernoulli(key, self.config.p, grid)}

    def apply(self, image, params):
        mask = filters.patch_grid_mask(image.shape[:2], self.config.patch_size, params["dropped"])
        return filters.occlude(image, mask, self.config.fill)
