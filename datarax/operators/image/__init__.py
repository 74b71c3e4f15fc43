"""Differentiable image operators (float HWC images in [0, 1]) and batch mixing.

The operators live in modules by family (`color`, `geometry`, `filters`, `mix`); each wraps
the pure maths of `functional` with a config, the record key stream and optional learnable
magnitudes.
"""

from datarax.operators.image import functional as functional
from datarax.operators.image.base import ImageOperator as ImageOperator
from datarax.operators.image.base import ImageOperatorConfig as ImageOperatorConfig
from datarax.operators.image.color import BrightnessConfig as BrightnessConfig
from datarax.operators.image.color import BrightnessOperator as BrightnessOperator
from datarax.operators.image.color import ContrastConfig as ContrastConfig
from datarax.operators.image.color import ContrastOperator as ContrastOperator
from datarax.operators.image.color import GammaConfig as GammaConfig
from datarax.operators.image.color import GammaOperator as GammaOperator
from datarax.operators.image.color import GrayscaleConfig as GrayscaleConfig
from datarax.operators.image.color import GrayscaleOperator as GrayscaleOperator
from datarax.operators.image.color import HueConfig as HueConfig
from datarax.operators.image.color import HueOperator as HueOperator
from datarax.operators.image.color import NormalizeConfig as NormalizeConfig
from datarax.operators.image.color import NormalizeOperator as NormalizeOperator
from datarax.operators.image.color import SaturationConfig as SaturationConfig
from datarax.operators.image.color import SaturationOperator as SaturationOperator
from datarax.operators.image.color import SolarizeConfig as SolarizeConfig
from datarax.operators.image.color import SolarizeOperator as SolarizeOperator
from datarax.operators.image.color import StandardizeConfig as StandardizeConfig
from datarax.operators.image.color import StandardizeOperator as StandardizeOperator
from datarax.operators.image.filters import CutoutConfig as CutoutConfig
from datarax.operators.image.filters import CutoutOperator as CutoutOperator
from datarax.operators.image.filters import GaussianBlurConfig as GaussianBlurConfig
from datarax.operators.image.filters import GaussianBlurOperator as GaussianBlurOperator
from datarax.operators.image.filters import GaussianNoiseConfig as GaussianNoiseConfig
from datarax.operators.image.filters import GaussianNoiseOperator as GaussianNoiseOperator
from datarax.operators.image.filters import PatchDropoutConfig as PatchDropoutConfig
from datarax.operators.image.filters import PatchDropoutOperator as PatchDropoutOperator
from datarax.operators.image.geometry import AffineConfig as AffineConfig
from datarax.operators.image.geometry import AffineOperator as AffineOperator
from datarax.operators.image.geometry import HorizontalFlipConfig as HorizontalFlipConfig
from datarax.operators.image.geometry import HorizontalFlipOperator as HorizontalFlipOperator
from datarax.operators.image.geometry import RandomCropConfig as RandomCropConfig
from datarax.operators.image.geometry import RandomCropOperator as RandomCropOperator
from datarax.operators.image.geometry import RandomResizedCropConfig as RandomResizedCropConfig
from datarax.operators.image.geometry import RandomResizedCropOperator as RandomResizedCropOperator
from datarax.operators.image.geometry import ResizeConfig as ResizeConfig
from datarax.operators.image.geometry import ResizeOperator as ResizeOperator
from datarax.operators.image.geometry import RotationConfig as RotationConfig
from datarax.operators.image.geometry import RotationOperator as RotationOperator
from datarax.operators.image.geometry import TranslateConfig as TranslateConfig
from datarax.operators.image.geometry import TranslateOperator as TranslateOperator
from datarax.operators.image.geometry import VerticalFlipConfig as VerticalFlipConfig
from datarax.operators.image.geometry import VerticalFlipOperator as VerticalFlipOperator
from datarax.operators.image.mix import CutMixConfig as CutMixConfig
from datarax.operators.image.mix import CutMixOperator as CutMixOperator
from datarax.operators.image.mix import MixUpConfig as MixUpConfig
from datarax.operators.image.mix import MixUpOperator as MixUpOperator
