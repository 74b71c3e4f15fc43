"""Differentiable image operators (float HWC images in [0, 1]) and batch mixing.

The maths lives in pure functions by family (`color`, `geometry`, `filters`); the operators wrap
them with a config, the record key stream and optional learnable magnitudes.
"""

from datarax.operators.image.base import ImageOperator as ImageOperator
from datarax.operators.image.base import ImageOperatorConfig as ImageOperatorConfig
from datarax.operators.image.color_ops import BrightnessConfig as BrightnessConfig
from datarax.operators.image.color_ops import BrightnessOperator as BrightnessOperator
from datarax.operators.image.color_ops import ContrastConfig as ContrastConfig
from datarax.operators.image.color_ops import ContrastOperator as ContrastOperator
from datarax.operators.image.color_ops import GammaConfig as GammaConfig
from datarax.operators.image.color_ops import GammaOperator as GammaOperator
from datarax.operators.image.color_ops import GrayscaleConfig as GrayscaleConfig
from datarax.operators.image.color_ops import GrayscaleOperator as GrayscaleOperator
from datarax.operators.image.color_ops import HueConfig as HueConfig
from datarax.operators.image.color_ops import HueOperator as HueOperator
from datarax.operators.image.color_ops import NormalizeConfig as NormalizeConfig
from datarax.operators.image.color_ops import NormalizeOperator as NormalizeOperator
from datarax.operators.image.color_ops import SaturationConfig as SaturationConfig
from datarax.operators.image.color_ops import SaturationOperator as SaturationOperator
from datarax.operators.image.color_ops import SolarizeConfig as SolarizeConfig
from datarax.operators.image.color_ops import SolarizeOperator as SolarizeOperator
from datarax.operators.image.color_ops import StandardizeConfig as StandardizeConfig
from datarax.operators.image.color_ops import StandardizeOperator as StandardizeOperator
from datarax.operators.image.filter_ops import CutoutConfig as CutoutConfig
from datarax.operators.image.filter_ops import CutoutOperator as CutoutOperator
from datarax.operators.image.filter_ops import GaussianBlurConfig as GaussianBlurConfig
from datarax.operators.image.filter_ops import GaussianBlurOperator as GaussianBlurOperator
from datarax.operators.image.filter_ops import GaussianNoiseConfig as GaussianNoiseConfig
from datarax.operators.image.filter_ops import GaussianNoiseOperator as GaussianNoiseOperator
from datarax.operators.image.filter_ops import PatchDropoutConfig as PatchDropoutConfig
from datarax.operators.image.filter_ops import PatchDropoutOperator as PatchDropoutOperator
from datarax.operators.image.geometry_ops import AffineConfig as AffineConfig
from datarax.operators.image.geometry_ops import AffineOperator as AffineOperator
from datarax.operators.image.geometry_ops import HorizontalFlipConfig as HorizontalFlipConfig
from datarax.operators.image.geometry_ops import HorizontalFlipOperator as HorizontalFlipOperator
from datarax.operators.image.geometry_ops import RandomCropConfig as RandomCropConfig
from datarax.operators.image.geometry_ops import RandomCropOperator as RandomCropOperator
from datarax.operators.image.geometry_ops import RandomResizedCropConfig as RandomResizedCropConfig
from datarax.operators.image.geometry_ops import RandomResizedCropOperator as RandomResizedCropOperator
from datarax.operators.image.geometry_ops import ResizeConfig as ResizeConfig
from datarax.operators.image.geometry_ops import ResizeOperator as ResizeOperator
from datarax.operators.image.geometry_ops import RotationConfig as RotationConfig
from datarax.operators.image.geometry_ops import RotationOperator as RotationOperator
from datarax.operators.image.geometry_ops import TranslateConfig as TranslateConfig
from datarax.operators.image.geometry_ops import TranslateOperator as TranslateOperator
from datarax.operators.image.geometry_ops import VerticalFlipConfig as VerticalFlipConfig
from datarax.operators.image.geometry_ops import VerticalFlipOperator as VerticalFlipOperator
from datarax.operators.image.mix import CutMixConfig as CutMixConfig
from datarax.operators.image.mix import CutMixOperator as CutMixOperator
from datarax.operators.image.mix import MixUpConfig as MixUpConfig
from datarax.operators.image.mix import MixUpOperator as MixUpOperator
