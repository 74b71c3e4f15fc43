"""NaN in, NaN out: every operator a configuration can name lets a NaN input through.

A NaN in a batch is a bug upstream (a bad file, a division by zero in a user function); an
operator that turns it into a finite value hides it from the loss and from every check after.
Found by adversarial use: `GammaOperator` (and the STFT magnitude) guarded a log or a square
root with `x > 0`, which is False for NaN, so NaN pixels came out as 0.

The operators are discovered as `datarax.config.registry` discovers them, so a new operator
without a case here fails `test_every_operator_has_a_case`. Each case feeds an all-NaN input and
says which outputs must be NaN: "all" (every value) or "some" (the operator writes constants
over part of its input by design, e.g. a cutout's zeros; the reason is given).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import transforms as T
from datarax.config.registry import discover
from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.audio.features import LoudnessOperator, MFCCOperator
from datarax.operators.audio.pcen import PCENOperator
from datarax.operators.audio.synth import FilteredNoiseOperator, HarmonicSynthOperator, ReverbOperator
from datarax.operators.nodes.rebatch import RebatchNode
from datarax.operators.nodes.split_field import SplitField
from datarax.operators.strategies import (
    BranchOperator,
    EnsembleOperator,
    ParallelOperator,
    ProbabilisticOperator,
    SelectorOperator,
    SequentialOperator,
    WeightedParallelOperator,
)

B = 4
RATE = 8000


def rngs() -> nnx.Rngs:
    return nnx.Rngs(0)


def nans(*shape: int) -> jnp.ndarray:
    return jnp.full((B, *shape), jnp.nan, jnp.float32)


def image() -> dict:
    return {"image": nans(8, 8, 3), "label": jnp.arange(B, dtype=jnp.int32)}


def audio() -> dict:
    return {"audio": nans(1024)}


def spectrogram(name: str) -> dict:
    return {name: nans(16, 20)}


def two() -> list:
    """Two children for the composition strategies."""
    return [T.Brightness(rngs=rngs()), T.Contrast(rngs=rngs())]


def image_case(op, expect: str = "all") -> tuple:
    return op, image, ("image",), expect


def audio_case(op, fields=("audio",)) -> tuple:
    return op, audio, fields, "all"


# name -> (build, input, fields that must hold NaN, "all" or "some")
CASES = {
    **{name: image_case(lambda name=name: getattr(T, name)(rngs=rngs())) for name in (
        "Brightness", "Contrast", "Saturation", "Hue", "Gamma", "Grayscale", "Solarize", "Standardize",
        "HorizontalFlip", "VerticalFlip", "Rotation", "Affine", "Translate", "GaussianNoise", "GaussianBlur")},
    # zeros written over random patches: the rest of the image stays NaN
    "Cutout": image_case(lambda: T.Cutout(rngs=rngs()), "some"),
    "PatchDropout": image_case(lambda: T.PatchDropout(rngs=rngs()), "some"),
    "Normalize": image_case(lambda: T.Normalize(mean=(0.5,) * 3, std=(0.2,) * 3)),
    "RandomCrop": image_case(lambda: T.RandomCrop(size=6, rngs=rngs())),
    "RandomResizedCrop": image_case(lambda: T.RandomResizedCrop(size=6, rngs=rngs())),
    "Resize": image_case(lambda: T.Resize(size=6)),
    "MixUp": image_case(lambda: T.MixUp(num_classes=B, rngs=rngs())),
    "CutMix": image_case(lambda: T.CutMix(num_classes=B, rngs=rngs())),
    "ToFloat": image_case(lambda: T.ToFloat()),
    "Map": image_case(lambda: T.Map(fn=lambda x: 2 * x)),
    "Element": image_case(lambda: T.Lambda(fn=lambda el: el)),
    "Gain": audio_case(lambda: T.Gain(rngs=rngs())),
    "AddNoise": audio_case(lambda: T.AddNoise(rngs=rngs())),
    # the samples shifted in are zeros (mode="zero"); the rest stay NaN
    "TimeShift": (lambda: T.TimeShift(rngs=rngs()), audio, ("audio",), "some"),
    "CropPad": audio_case(lambda: T.CropPad(length=512, rngs=rngs())),
    "Resample": audio_case(lambda: T.Resample(orig_rate=RATE, target_rate=2 * RATE)),
    "Reverb": audio_case(lambda: ReverbOperator(sample_rate=RATE, rngs=rngs())),
    "STFT": audio_case(lambda: T.STFT(n_fft=256), ("spectrogram",)),
    "MelSpectrogram": audio_case(lambda: T.MelSpectrogram(sample_rate=RATE, n_fft=256, n_mels=16), ("mel",)),
    "LogMel": audio_case(lambda: T.LogMel(sample_rate=RATE, n_fft=256, n_mels=16), ("log_mel",)),
    "MFCC": audio_case(lambda: MFCCOperator(sample_rate=RATE, n_fft=256, n_mels=32), ("mfcc",)),
    "Loudness": audio_case(lambda: LoudnessOperator(sample_rate=RATE, n_fft=256), ("loudness",)),
    "PCEN": (lambda: PCENOperator(n_channels=16), lambda: spectrogram("mel"), ("pcen",), "all"),
    "TimeMask": (lambda: T.TimeMask(rngs=rngs()), lambda: spectrogram("log_mel"), ("log_mel",), "all"),
    "FrequencyMask": (lambda: T.FrequencyMask(rngs=rngs()), lambda: spectrogram("log_mel"), ("log_mel",), "all"),
    "HarmonicSynth": (lambda: HarmonicSynthOperator(),
                      lambda: {"f0_hz": nans(8), "amplitude": nans(8), "harmonic_distribution": nans(8, 3)},
                      ("harmonic",), "all"),
    "FilteredNoise": (lambda: FilteredNoiseOperator(rngs=rngs()), lambda: {"noise_magnitudes": nans(8, 5)},
                      ("noise",), "all"),
    "Branch": image_case(lambda: BranchOperator(router=lambda el: jnp.int32(0), branches=two())),
    "Ensemble": image_case(lambda: EnsembleOperator(operators=two())),
    "Parallel": image_case(lambda: ParallelOperator(operators=two())),
    "Probabilistic": image_case(lambda: ProbabilisticOperator(operator=T.Brightness(rngs=rngs()), rngs=rngs())),
    "Selector": image_case(lambda: SelectorOperator(operators=two(), rngs=rngs())),
    "Sequential": image_case(lambda: SequentialOperator(operators=two())),
    "WeightedParallel": image_case(lambda: WeightedParallelOperator(operators=two())),
    "Rebatch": image_case(lambda: RebatchNode(group_size=2)),
    "SplitField": image_case(lambda: SplitField(fields=("image",), operator=T.Brightness(rngs=rngs()))),
}


def operator_names() -> set[str]:
    entries, _, failed = discover("operator")
    assert not failed, f"operator modules that did not import: {failed}"
    return {type_name(entry.cls) for entry in entries.values()}


def type_name(cls: type) -> str:
    for suffix in ("Operator", "Node"):
        if cls.__name__.endswith(suffix):
            return cls.__name__[: -len(suffix)]
    return cls.__name__


def test_every_operator_has_a_case():
    missing = sorted(operator_names() - set(CASES))
    assert not missing, f"operators without a NaN case here: {missing}; add one to CASES"
    assert not set(CASES) - operator_names()


@pytest.mark.parametrize("name", sorted(CASES))
def test_nan_inputs_give_nan_outputs(name):
    build, inputs, fields, expect = CASES[name]
    op = build()
    # jitted, as a pipeline runs it (op by op, each primitive would compile on its own)
    out = nnx.jit(lambda op, data: op(Element(data), BatchContext.for_batch(B)).data)(op, inputs())
    for field in fields:
        nan = np.isnan(np.asarray(out[field]))
        if expect == "all":
            assert nan.all(), f"{name}: {np.count_nonzero(~nan)} of {nan.size} values of {field!r} are not NaN"
        else:
            assert nan.any(), f"{name}: no value of {field!r} is NaN"
