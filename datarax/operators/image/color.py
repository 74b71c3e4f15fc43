"""Colour operators: brightness, contrast, saturation, hue, gamma, grayscale, solarize, normalise.

Random strengths are drawn per record from the record key and scaled by the operator's
magnitudes, so they are differentiable in those magnitudes (see `datarax.operators.learnable`).
With `stochastic=False` an operator applies its magnitude as a fixed adjustment (for example
`BrightnessConfig(max_delta=0.2, stochastic=False)` always brightens by a factor 1.2).

Example:
    >>> op = BrightnessOperator(BrightnessConfig(max_delta=0.3, learnable=True), rngs=nnx.Rngs(0))
    >>> batch = op(Element({"image": images}), BatchContext.for_batch(len(images)))
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from datarax.core.checks import check_number, check_numbers, field, set_field
from datarax.operators.field import check_magnitudes
from datarax.operators.image.base import ImageOperator, ImageOperatorConfig, coin, signed_or_fixed
from datarax.operators.image.functional import color


@dataclasses.dataclass(frozen=True)
class EnhanceConfig(ImageOperatorConfig):
    """Shared by brightness, contrast and saturation: factor `1 + U(-max_delta, max_delta)`.

    Attributes:
        max_delta: largest change of the enhancement factor, in [0, 1] (the learnable bound).
    """

    stochastic: bool = True
    max_delta: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, EnhanceOperator.bounds)


@dataclasses.dataclass(frozen=True)
class BrightnessConfig(EnhanceConfig):
    """Configuration of `BrightnessOperator` (see `EnhanceConfig`)."""


@dataclasses.dataclass(frozen=True)
class ContrastConfig(EnhanceConfig):
    """Configuration of `ContrastOperator` (see `EnhanceConfig`)."""


@dataclasses.dataclass(frozen=True)
class SaturationConfig(EnhanceConfig):
    """Configuration of `SaturationOperator` (see `EnhanceConfig`)."""


class EnhanceOperator(ImageOperator):
    """Abstract base of brightness, contrast and saturation: they draw one enhancement factor."""

    bounds = {"max_delta": (0.0, 1.0)}
    spreads = ("max_delta",)

    def draw(self, key, shape):
        return {"factor": 1.0 + signed_or_fixed(key, self.magnitude("max_delta"))}


class BrightnessOperator(EnhanceOperator):
    """Scales intensities by a factor (PIL `ImageEnhance.Brightness`)."""

    config_class = BrightnessConfig

    def apply(self, image, params):
        return color.adjust_brightness(image, params["factor"])


class ContrastOperator(EnhanceOperator):
    """Blends with the mean luma by a factor (PIL `ImageEnhance.Contrast`)."""

    config_class = ContrastConfig

    def apply(self, image, params):
        return color.adjust_contrast(image, params["factor"])


class SaturationOperator(EnhanceOperator):
    """Blends an RGB image with its grayscale version by a factor (PIL `ImageEnhance.Color`)."""

    config_class = SaturationConfig
    channels = 3

    def apply(self, image, params):
        return color.adjust_saturation(image, params["factor"])


@dataclasses.dataclass(frozen=True)
class HueConfig(ImageOperatorConfig):
    """Configuration of `HueOperator`.

    Attributes:
        max_delta: largest hue rotation in turns, in [0, 0.5] (0.5 is half a turn).
    """

    stochastic: bool = True
    max_delta: float = 0.05

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, HueOperator.bounds)


class HueOperator(ImageOperator):
    """Rotates the hue of an RGB image by `U(-max_delta, max_delta)` turns (HSV round trip)."""

    config_class = HueConfig
    bounds = {"max_delta": (0.0, 0.5)}
    spreads = ("max_delta",)
    channels = 3

    def draw(self, key, shape):
        return {"shift": signed_or_fixed(key, self.magnitude("max_delta"))}

    def apply(self, image, params):
        return color.adjust_hue(image, params["shift"])


@dataclasses.dataclass(frozen=True)
class GammaConfig(ImageOperatorConfig):
    """Configuration of `GammaOperator`: gamma = `exp(U(-max_log_gamma, max_log_gamma))`.

    Attributes:
        max_log_gamma: largest |log gamma|, in [0, 2].
        gain: constant multiplier applied after the power.
    """

    stochastic: bool = True
    max_log_gamma: float = 0.2
    gain: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, GammaOperator.bounds)
        check_number(*field(self, "gain"), 0.0, 10.0, open_low=True)


class GammaOperator(ImageOperator):
    """`gain * image ** gamma` with a log-uniform random gamma (scikit-image `adjust_gamma`)."""

    config_class = GammaConfig
    bounds = {"max_log_gamma": (0.0, 2.0)}
    spreads = ("max_log_gamma",)

    def draw(self, key, shape):
        return {"gamma": jnp.exp(signed_or_fixed(key, self.magnitude("max_log_gamma")))}

    def apply(self, image, params):
        return color.adjust_gamma(image, params["gamma"], self.config.gain)


@dataclasses.dataclass(frozen=True)
class GrayscaleConfig(ImageOperatorConfig):
    """Configuration of `GrayscaleOperator`.

    Attributes:
        p: probability of converting a record when stochastic (always when not).
        keep_channels: repeat the luma over 3 channels (True) or return one channel.
    """

    p: float = 1.0
    keep_channels: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_number(*field(self, "p"), 0.0, 1.0)
        if not self.keep_channels and self.stochastic:
            raise ValueError("GrayscaleConfig(keep_channels=False) changes the channel count, so it cannot be "
                             "applied to only some records; use keep_channels=True with stochastic=True")


class GrayscaleOperator(ImageOperator):
    """Converts RGB to luma (PIL `convert("L")`), for a random fraction `p` of records when stochastic."""

    config_class = GrayscaleConfig
    channels = 3

    def draw(self, key, shape):
        return {"apply": coin(key, self.config.p)}

    def apply(self, image, params):
        gray = color.to_grayscale(image, self.config.keep_channels)
        return gray if not self.config.keep_channels else jnp.where(params["apply"], gray, image)


@dataclasses.dataclass(frozen=True)
class SolarizeConfig(ImageOperatorConfig):
    """Configuration of `SolarizeOperator`.

    Attributes:
        threshold: pixels at or above it are inverted; in [0, 1].
        p: probability of solarizing a record when stochastic (always when not).
        softness: width of a sigmoid step replacing the hard threshold; must be > 0 for a
            learnable threshold (a hard step has no gradient).
    """

    threshold: float = 0.5
    p: float = 0.5
    softness: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, SolarizeOperator.bounds)
        check_number(*field(self, "p"), 0.0, 1.0)
        check_number(*field(self, "softness"), 0.0, 1.0)
        if self.learnable and self.softness == 0:
            raise ValueError("SolarizeConfig(learnable=...) needs softness > 0 (e.g. softness=0.02): a hard "
                             "threshold has zero gradient everywhere")


class SolarizeOperator(ImageOperator):
    """Inverts pixels at or above a threshold (PIL `ImageOps.solarize`)."""

    config_class = SolarizeConfig
    positional = ("threshold",)
    bounds = {"threshold": (0.0, 1.0)}

    def draw(self, key, shape):
        return {"apply": coin(key, self.config.p), "threshold": self.magnitude("threshold")}

    def apply(self, image, params):
        out = color.solarize(image, params["threshold"], self.config.softness)
        return jnp.where(params["apply"], out, image)


@dataclasses.dataclass(frozen=True)
class NormalizeConfig(ImageOperatorConfig):
    """Configuration of `NormalizeOperator`: `(image - mean) / std` per channel.

    Attributes:
        mean: per-channel means (a tuple, one value per channel).
        std: per-channel standard deviations, all > 0.
    """

    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)

    def __post_init__(self):
        super().__post_init__()
        for name in ("mean", "std"):
            set_field(self, name, check_numbers(*field(self, name), "a tuple of numbers (one per channel)"))
        if len(self.mean) != len(self.std) or min(self.std) <= 0:
            raise ValueError(f"NormalizeConfig needs mean and std of the same length with std > 0, got "
                             f"mean={self.mean}, std={self.std}")


class NormalizeOperator(ImageOperator):
    """Subtracts a per-channel mean and divides by a per-channel std (not clipped)."""

    config_class = NormalizeConfig
    positional = ("mean", "std")

    def draw(self, key, shape):
        if len(self.config.mean) not in (1, shape[-1]):
            raise ValueError(f"NormalizeConfig has {len(self.config.mean)} channel statistics but the image has "
                             f"{shape[-1]} channels (shape {tuple(shape)}); give one mean/std per channel")
        return {}

    def apply(self, image, params):
        return color.normalize(image, self.config.mean, self.config.std)


@dataclasses.dataclass(frozen=True)
class StandardizeConfig(ImageOperatorConfig):
    """Configuration of `StandardizeOperator` (per-image zero mean, unit variance)."""


class StandardizeOperator(ImageOperator):
    """Per-image standardisation, as `tf.image.per_image_standardization`."""

    config_class = StandardizeConfig

    def apply(self, image, params):
        return color.standardize(image)
