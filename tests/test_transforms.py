"""datarax.transforms: short names for the operator classes, whose keyword and positional forms equal the
config form."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax import transforms as T
from datarax.core.operator import OperatorModule
from datarax.operators.image import RandomCropOperator
from datarax.sources import MemorySource, MemorySourceConfig

NAMES = sorted(n for n, v in vars(T).items() if isinstance(v, type) and issubclass(v, OperatorModule))
# Short names that are not the class name less "Operator": `T.Element` would read as the record type
# (`datarax.typing.Element`), so the user-function operator takes torchvision's name.
CLASS_NAMES = {"Lambda": "ElementOperator"}


# Settings that have no default (the config form needs them too).
REQUIRED = {"CropPad": {"length": 100}, "LogMel": {"sample_rate": 16000}, "Loudness": {"sample_rate": 16000},
            "MFCC": {"sample_rate": 16000}, "MelSpectrogram": {"sample_rate": 16000}, "PCEN": {"n_channels": 8},
            "Resample": {"orig_rate": 16000, "target_rate": 8000}, "MixUp": {"num_classes": 10},
            "CutMix": {"num_classes": 10}}


def test_every_field_operator_has_a_name():
    from datarax.config import registry

    entries = registry.discover("operator")[0]
    field_operators = {e.cls.__name__.removesuffix("Operator") for e in entries.values()
                       if e.cls.__module__.startswith(("datarax.operators.image", "datarax.operators.audio"))
                       and e.cls.__module__ != "datarax.operators.audio.synth"}
    assert field_operators <= set(NAMES)
    assert {"ToFloat", "Lambda", "Map"} <= set(NAMES)


@pytest.mark.parametrize("name", [n for n in NAMES if n not in ("Lambda", "Map")])
def test_the_keyword_form_builds_the_config_form(name):
    build = getattr(T, name)
    made = build(**REQUIRED.get(name, {}), rngs=nnx.Rngs(3))
    config_form = type(made)(type(made.config)(**REQUIRED.get(name, {})), rngs=nnx.Rngs(3))
    assert made.config == config_form.config
    assert made.structure() == config_form.structure()
    if getattr(made, "key", None) is not None:
        np.testing.assert_array_equal(np.asarray(made.key[...]), np.asarray(config_form.key[...]))
    # The principal settings by position: the config's own values given back that way build it again.
    args = [getattr(made.config, n) for n in build.positional]
    keywords = {k: v for k, v in REQUIRED.get(name, {}).items() if k not in build.positional}
    assert build(*args, **keywords, rngs=nnx.Rngs(3)).config == config_form.config


def test_names_are_the_classes_and_errors_name_the_settings():
    assert T.RandomCrop is RandomCropOperator
    assert all(getattr(T, n).__name__ == CLASS_NAMES.get(n, n + "Operator") for n in NAMES)
    assert "Element" not in vars(T)  # the record type's name, `datarax.typing.Element`
    crop = T.RandomCrop(size=32, padding=4, field="image", rngs=nnx.Rngs(0))
    assert (crop.config.size, crop.config.padding, crop.config.field) == ((32, 32), 4, "image")
    assert crop.config == T.RandomCrop(size=32, padding=4, field="image", rngs=nnx.Rngs(0)).config
    with pytest.raises(TypeError, match=r"RandomCropOperator got unknown settings \['paddin'\]; .*'padding'"):
        T.RandomCrop(size=32, paddin=4)
    assert T.RandomCrop(32, padding=4, field="image", rngs=nnx.Rngs(0)).config == crop.config
    with pytest.raises(TypeError, match=r"RandomCropOperator takes only size by position; pass the rest as "
                                        r"keywords: RandomCropOperator\(size=32, padding=4\)"):
        T.RandomCrop(32, 4, rngs=nnx.Rngs(0))


def test_map_applies_to_each_array_and_lambda_to_the_whole_record():
    data = {"a": np.arange(6.0).reshape(3, 2), "b": np.arange(3.0)}
    stages = [T.Map(fn=lambda x: 2 * x, fields=("a",)),
              T.Lambda(fn=lambda el: el.update_data({"total": el.data["a"].sum() + el.data["b"]}))]
    batch = next(iter(Pipeline(MemorySource(MemorySourceConfig(), data=data), stages, batch_size=3)))
    np.testing.assert_allclose(np.asarray(batch["a"]), 2 * data["a"])
    np.testing.assert_allclose(np.asarray(batch["b"]), data["b"])
    np.testing.assert_allclose(np.asarray(batch["total"]), 2 * data["a"].sum(axis=1) + data["b"])


def test_to_float_scales_integers_by_their_dtype_and_casts_floats():
    data = {"image": np.array([[[[0, 128, 255]]]], np.uint8), "pcm": np.array([[-32768, 0, 16384]], np.int16),
            "x": np.array([[0.5, 2.0]], np.float64)}
    source = MemorySource(MemorySourceConfig(), data=data)
    stages = [T.ToFloat(field="image"), T.ToFloat(field="pcm", scale=32768.0), T.ToFloat(field="x")]
    batch = next(iter(Pipeline(source, stages, batch_size=1)))
    np.testing.assert_allclose(np.asarray(batch["image"]), np.array([[[[0, 128, 255]]]]) / 255.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(batch["pcm"]), np.array([[-1.0, 0.0, 0.5]]), rtol=1e-6)
    assert batch["image"].dtype == jax.numpy.float32 and batch["x"].dtype == jax.numpy.float32
    with pytest.raises(ValueError, match="draws nothing"):
        T.ToFloat(stochastic=True)


