"""Short names for the operators, the way torchvision and augmax spell them.

Each name *is* the operator class (`T.RandomCrop is RandomCropOperator`), built as every operator
is, from its config or from its settings as keywords, so fingerprints, checkpoints and configs are
those of the config form:

    >>> from flax import nnx
    >>> from datarax import transforms as T
    >>> stages = [T.ToFloat(field="image"), T.RandomCrop(size=32, padding=4, field="image", rngs=nnx.Rngs(0)),
    ...           T.HorizontalFlip(field="image", rngs=nnx.Rngs(1))]
"""

from __future__ import annotations

from datarax.operators.audio import (
    AddNoiseOperator as AddNoise, CropPadOperator as CropPad, FrequencyMaskOperator as FrequencyMask,
    GainOperator as Gain, LogMelOperator as LogMel, LoudnessOperator as Loudness,
    MelSpectrogramOperator as MelSpectrogram, MFCCOperator as MFCC, PCENOperator as PCEN,
    ResampleOperator as Resample, STFTOperator as STFT, TimeMaskOperator as TimeMask,
    TimeShiftOperator as TimeShift,
)
from datarax.operators.dtype import ToFloatOperator as ToFloat
from datarax.operators.element import ElementOperator as Element
from datarax.operators.image import (
    AffineOperator as Affine, BrightnessOperator as Brightness, ContrastOperator as Contrast,
    CutMixOperator as CutMix, CutoutOperator as Cutout, GammaOperator as Gamma,
    GaussianBlurOperator as GaussianBlur, GaussianNoiseOperator as GaussianNoise,
    GrayscaleOperator as Grayscale, HorizontalFlipOperator as HorizontalFlip, HueOperator as Hue,
    MixUpOperator as MixUp, NormalizeOperator as Normalize, PatchDropoutOperator as PatchDropout,
    RandomCropOperator as RandomCrop, RandomResizedCropOperator as RandomResizedCrop,
    ResizeOperator as Resize, RotationOperator as Rotation, SaturationOperator as Saturation,
    SolarizeOperator as Solarize, StandardizeOperator as Standardize, TranslateOperator as Translate,
    VerticalFlipOperator as VerticalFlip,
)
from datarax.operators.map import MapOperator as Map

__all__ = [
    'AddNoise', 'Affine', 'Brightness', 'Contrast', 'CropPad', 'CutMix', 'Cutout', 'Element', 'FrequencyMask',
    'Gain', 'Gamma', 'GaussianBlur', 'GaussianNoise', 'Grayscale', 'HorizontalFlip', 'Hue', 'LogMel', 'Loudness',
    'MFCC', 'Map', 'MelSpectrogram', 'MixUp', 'Normalize', 'PCEN', 'PatchDropout', 'RandomCrop',
    'RandomResizedCrop', 'Resample', 'Resize', 'Rotation', 'STFT', 'Saturation', 'Solarize', 'Standardize',
    'TimeMask', 'TimeShift', 'ToFloat', 'Translate', 'VerticalFlip',
]
