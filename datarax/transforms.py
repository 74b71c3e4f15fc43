"""Short names for the operators, the way torchvision and augmax spell them.

Each name *is* the operator class (`T.RandomCrop is RandomCropOperator`), built as every operator
is, from its config or from its settings, so fingerprints, checkpoints and configs are those of
the config form. The principal settings come by position, as in torchvision (`RandomCrop(32)`,
`Resize(224)`, `Normalize(mean, std)`; each class's `positional` lists them), the rest by keyword:

    >>> from flax import nnx
    >>> from datarax import transforms as T
    >>> stages = [T.ToFloat(field="image"), T.RandomCrop(32, padding=4, rngs=nnx.Rngs(0)),
    ...           T.HorizontalFlip(rngs=nnx.Rngs(1)), T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))]

For a function of your own, `T.Map(fn=f)` applies `f(x)` to every array of a record (or to the
fields chosen with `fields=`); `T.Lambda(fn=g)` (torchvision's name for it; the class is
`ElementOperator`) applies `g(element)` or `g(element, key)` to the whole record, for a function
that reads several fields together or adds new ones:

    >>> double = T.Map(fn=lambda x: 2 * x, fields=("image",))
    >>> total = T.Lambda(fn=lambda el: el.update_data({"total": el.data["a"] + el.data["b"]}))
"""

from __future__ import annotations

from datarax.operators.audio import (
    AddNoiseOperator as AddNoise,
)
from datarax.operators.audio import (
    CropPadOperator as CropPad,
)
from datarax.operators.audio import (
    FrequencyMaskOperator as FrequencyMask,
)
from datarax.operators.audio import (
    GainOperator as Gain,
)
from datarax.operators.audio import (
    LogMelOperator as LogMel,
)
from datarax.operators.audio import (
    LoudnessOperator as Loudness,
)
from datarax.operators.audio import (
    MelSpectrogramOperator as MelSpectrogram,
)
from datarax.operators.audio import (
    MFCCOperator as MFCC,
)
from datarax.operators.audio import (
    PCENOperator as PCEN,
)
from datarax.operators.audio import (
    ResampleOperator as Resample,
)
from datarax.operators.audio import (
    STFTOperator as STFT,
)
from datarax.operators.audio import (
    TimeMaskOperator as TimeMask,
)
from datarax.operators.audio import (
    TimeShiftOperator as TimeShift,
)
from datarax.operators.dtype import ToFloatOperator as ToFloat
from datarax.operators.element import ElementOperator as Lambda
from datarax.operators.image import (
    AffineOperator as Affine,
)
from datarax.operators.image import (
    BrightnessOperator as Brightness,
)
from datarax.operators.image import (
    ContrastOperator as Contrast,
)
from datarax.operators.image import (
    CutMixOperator as CutMix,
)
from datarax.operators.image import (
    CutoutOperator as Cutout,
)
from datarax.operators.image import (
    GammaOperator as Gamma,
)
from datarax.operators.image import (
    GaussianBlurOperator as GaussianBlur,
)
from datarax.operators.image import (
    GaussianNoiseOperator as GaussianNoise,
)
from datarax.operators.image import (
    GrayscaleOperator as Grayscale,
)
from datarax.operators.image import (
    HorizontalFlipOperator as HorizontalFlip,
)
from datarax.operators.image import (
    HueOperator as Hue,
)
from datarax.operators.image import (
    MixUpOperator as MixUp,
)
from datarax.operators.image import (
    NormalizeOperator as Normalize,
)
from datarax.operators.image import (
    PatchDropoutOperator as PatchDropout,
)
from datarax.operators.image import (
    RandomCropOperator as RandomCrop,
)
from datarax.operators.image import (
    RandomResizedCropOperator as RandomResizedCrop,
)
from datarax.operators.image import (
    ResizeOperator as Resize,
)
from datarax.operators.image import (
    RotationOperator as Rotation,
)
from datarax.operators.image import (
    SaturationOperator as Saturation,
)
from datarax.operators.image import (
    SolarizeOperator as Solarize,
)
from datarax.operators.image import (
    StandardizeOperator as Standardize,
)
from datarax.operators.image import (
    TranslateOperator as Translate,
)
from datarax.operators.image import (
    VerticalFlipOperator as VerticalFlip,
)
from datarax.operators.map import MapOperator as Map

__all__ = [
    'AddNoise', 'Affine', 'Brightness', 'Contrast', 'CropPad', 'CutMix', 'Cutout', 'FrequencyMask',
    'Gain', 'Gamma', 'GaussianBlur', 'GaussianNoise', 'Grayscale', 'HorizontalFlip', 'Hue', 'Lambda', 'LogMel',
    'Loudness', 'MFCC', 'Map', 'MelSpectrogram', 'MixUp', 'Normalize', 'PCEN', 'PatchDropout', 'RandomCrop',
    'RandomResizedCrop', 'Resample', 'Resize', 'Rotation', 'STFT', 'Saturation', 'Solarize', 'Standardize',
    'TimeMask', 'TimeShift', 'ToFloat', 'Translate', 'VerticalFlip',
]
