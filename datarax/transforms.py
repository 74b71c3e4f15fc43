"""Operators in one call, the way torchvision and augmax spell them.

Every operator has a config form, `RandomCropOperator(RandomCropConfig(size=32, padding=4),
rngs=nnx.Rngs(0))`, which TOML files and `datarax.config` use. The names here build the same
objects from keywords, the operator's own settings also by position:

    >>> from flax import nnx
    >>> from datarax import transforms as T
    >>> stages = [T.ToFloat(field="image"), T.RandomCrop(32, padding=4, field="image", rngs=nnx.Rngs(0)),
    ...           T.HorizontalFlip(field="image", rngs=nnx.Rngs(1))]

Each name is a function whose signature lists the config's fields (the operator's settings first,
then the shared ones such as `field`, `out_field`, `learnable`, `stochastic`), any other
constructor argument (`fn=` for `Element` and `Map`) and `rngs`. It returns the operator class
itself (`T.RandomCrop(...)` is a `RandomCropOperator`), so fingerprints, checkpoints and configs
are those of the config form.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from datarax.core.operator import OperatorConfig
from datarax.operators import ElementOperator, ElementOperatorConfig, MapOperator, MapOperatorConfig
from datarax.operators import audio, image
from datarax.operators.dtype import ToFloatOperator

_SHARED = {f.name for f in dataclasses.fields(OperatorConfig)} | {"field", "out_field", "learnable"}


def shortcut(operator: type, config_class: type | None = None) -> Callable[..., Any]:
    """A keyword constructor for `operator`: `shortcut(X)(a, b=1, rngs=r) == X(XConfig(a, b=1), rngs=r)`."""
    config_class = config_class or getattr(operator, "config_class")
    fields = [f for f in dataclasses.fields(config_class) if f.init]
    own = [f.name for f in fields if f.name not in _SHARED]
    extra = [p for name, p in inspect.signature(operator.__init__).parameters.items()
             if name not in ("self", "config", "rngs") and p.kind is not p.VAR_KEYWORD]

    def default(f: dataclasses.Field) -> Any:
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return inspect.Parameter.empty

    # Required settings first (as Normalize(mean, std)), then the ones with defaults, in their order.
    ordered = sorted((f for f in fields if f.name in own), key=lambda f: default(f) is not inspect.Parameter.empty)
    parameters = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default(f))
                  for f in ordered]
    parameters += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default(f))
                   for f in fields if f.name not in own]
    parameters += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in extra]
    parameters.append(inspect.Parameter("rngs", inspect.Parameter.KEYWORD_ONLY, default=None))
    signature = inspect.Signature(parameters)
    config_names = {f.name for f in fields}

    def build(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}{signature}: {exc}") from None
        given = bound.arguments
        config = config_class(**{k: v for k, v in given.items() if k in config_names})
        others = {k: v for k, v in given.items() if k not in config_names}
        return operator(config, **others)

    name = operator.__name__.removesuffix("Operator")
    build.__name__ = build.__qualname__ = name
    build.__module__ = __name__
    build.__signature__ = signature
    build.__doc__ = (f"`{operator.__name__}({config_class.__name__}(...), rngs=rngs)` from keywords.\n\n"
                     f"See `{operator.__module__}.{operator.__name__}` and its config for each setting.")
    return build


ToFloat = shortcut(ToFloatOperator)
Element = shortcut(ElementOperator, ElementOperatorConfig)
Map = shortcut(MapOperator, MapOperatorConfig)

Brightness = shortcut(image.BrightnessOperator)
Contrast = shortcut(image.ContrastOperator)
Saturation = shortcut(image.SaturationOperator)
Hue = shortcut(image.HueOperator)
Gamma = shortcut(image.GammaOperator)
Grayscale = shortcut(image.GrayscaleOperator)
Solarize = shortcut(image.SolarizeOperator)
Normalize = shortcut(image.NormalizeOperator)
Standardize = shortcut(image.StandardizeOperator)
HorizontalFlip = shortcut(image.HorizontalFlipOperator)
VerticalFlip = shortcut(image.VerticalFlipOperator)
RandomCrop = shortcut(image.RandomCropOperator)
RandomResizedCrop = shortcut(image.RandomResizedCropOperator)
Resize = shortcut(image.ResizeOperator)
Rotation = shortcut(image.RotationOperator)
Affine = shortcut(image.AffineOperator)
Translate = shortcut(image.TranslateOperator)
GaussianNoise = shortcut(image.GaussianNoiseOperator)
GaussianBlur = shortcut(image.GaussianBlurOperator)
Cutout = shortcut(image.CutoutOperator)
PatchDropout = shortcut(image.PatchDropoutOperator)
MixUp = shortcut(image.MixUpOperator)
CutMix = shortcut(image.CutMixOperator)

Gain = shortcut(audio.GainOperator)
AddNoise = shortcut(audio.AddNoiseOperator)
TimeShift = shortcut(audio.TimeShiftOperator)
CropPad = shortcut(audio.CropPadOperator)
Resample = shortcut(audio.ResampleOperator)
STFT = shortcut(audio.STFTOperator)
MelSpectrogram = shortcut(audio.MelSpectrogramOperator)
LogMel = shortcut(audio.LogMelOperator)
MFCC = shortcut(audio.MFCCOperator)
Loudness = shortcut(audio.LoudnessOperator)
TimeMask = shortcut(audio.TimeMaskOperator)
FrequencyMask = shortcut(audio.FrequencyMaskOperator)
PCEN = shortcut(audio.PCENOperator)
