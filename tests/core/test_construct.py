"""The one construction convention: `X(config=None, *args, <data>, rngs=None, **settings)` for every
source, host stage and operator, principal settings by position (`datarax.core.construct`)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import numpy as np
import pytest
from flax import nnx

import datarax
from datarax import transforms as T
from datarax.core.operator import OperatorModule
from datarax.core.source import DataSourceModule
from datarax.host import DecodeImage, DecodeImageConfig, HostMap, HostMapConfig
from datarax.host.stage import HostStage
from datarax.operators import ElementOperatorConfig, MapOperatorConfig
from datarax.operators.audio import (
    CropPadConfig,
    FrequencyMaskConfig,
    MelSpectrogramConfig,
    MFCCConfig,
    ResampleConfig,
    STFTConfig,
    TimeMaskConfig,
)
from datarax.operators.image import (
    AffineConfig,
    HorizontalFlipConfig,
    NormalizeConfig,
    RandomCropConfig,
    RandomResizedCropConfig,
    ResizeConfig,
    RotationConfig,
    SolarizeConfig,
    StandardizeConfig,
    VerticalFlipConfig,
)
from datarax.samplers import default_sampler
from datarax.sources import (
    ArrayRecordSource,
    ArrayRecordSourceConfig,
    FileFolderSource,
    FileFolderSourceConfig,
    ImageFolderSource,
    ImageFolderSourceConfig,
    MemorySource,
    MemorySourceConfig,
    StreamingDiskSource,
    TextSource,
    TextSourceConfig,
)
from datarax.sources.array_record import write_array_records
from datarax.sources.disk import save_npy_dataset
from datarax.sources.stream import StreamSourceModule

# Wrappers that hold other objects and have no settings of their own, each with its reason.
NO_CONFIG = {
    "ThreadedSource": "wraps a source; its thread count changes no record",
    "HostStageSource": "built by Pipeline from a source and its host stages",
    "SubsetSource": "a view of another source (sources/subset.py)",
    "SequentialOperator": "a list of operators, nothing to configure",
    "ContextStage": "a raw-pipeline adapter (pipeline/raw.py)",
    "StreamSourceModule": "abstract base",
}


def concrete_classes() -> list[type]:
    for info in pkgutil.walk_packages(datarax.__path__, "datarax."):
        if not info.name.startswith(("datarax.train", "datarax.cli")):
            importlib.import_module(info.name)

    def subclasses(base):
        for sub in base.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = {c for base in (DataSourceModule, StreamSourceModule, HostStage, OperatorModule) for c in subclasses(base)}
    return sorted((c for c in found if c.__module__.startswith("datarax.") and not inspect.isabstract(c)
                   and not c.__name__.startswith("_")), key=lambda c: (c.__module__, c.__name__))


def config_class(cls: type) -> type | None:
    if cls.__name__ in NO_CONFIG:
        return None
    annotation = getattr(cls, "config_class", None)
    if annotation is not None:
        return annotation
    hint = inspect.signature(cls.__init__).parameters["config"].annotation
    module = importlib.import_module(cls.__module__)
    return eval(hint.split("|")[0].strip(), vars(module))  # our own annotation text


CLASSES = concrete_classes()


def test_every_class_is_enumerated():
    names = {c.__name__ for c in CLASSES}
    assert {"MemorySource", "TextSource", "ImageFolderSource", "PackedTextSource", "DecodeImage", "DecodeAudio",
            "Tokenize", "RandomCropOperator", "ElementOperator", "RebatchNode", "MixUpOperator"} <= names
    assert len(CLASSES) > 50


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_signature_is_config_first_then_keywords(cls):
    if cls.__name__ in NO_CONFIG:
        return
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert params[0].name == "config" and params[0].default is None, cls
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD, cls
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params[1:]), cls
    positional = getattr(cls, "positional", ())
    if positional:  # each principal setting is a config field or a keyword of the constructor
        assert params[1].kind is inspect.Parameter.VAR_POSITIONAL, cls
        fields = {f.name for f in dataclasses.fields(config_class(cls))}
        keywords = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        assert set(positional) <= fields | keywords, cls


def required_settings(config: type) -> dict:
    """Settings that have no default, filled with values the configs accept."""
    values = {"size": 8, "root": "unused", "name": "mnist", "weights": (1.0,), "group_size": 2, "fields": ("x",),
              "sample_rate": 16000, "length": 64, "n_channels": 1, "orig_rate": 16000, "new_rate": 8000,
              "max_side": 64, "outputs": (("y", (), "<f4"),), "urls": ("memory://x/a.parquet",)}
    required = [f.name for f in dataclasses.fields(config)
                if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in values and n not in EXTRA.get(config.__name__, {})]
    if missing:
        pytest.fail(f"{config.__name__} needs {missing}: add them to this table")
    return {**{n: values[n] for n in required if n in values}, **EXTRA.get(config.__name__, {})}


# Settings whose defaults a config refuses on purpose (a value only the user can know).
EXTRA = {"ResampleConfig": {"target_rate": 8000}, "CutMixConfig": {"num_classes": 10},
         "MixUpConfig": {"num_classes": 10}, "SplitFieldConfig": {"fields": ("image",)}}


@pytest.mark.parametrize("cls", [c for c in CLASSES if c.__name__ not in NO_CONFIG], ids=lambda c: c.__name__)
def test_config_or_settings_give_the_same_config_and_both_is_an_error(cls):
    from datarax.core.construct import resolve_config

    config_cls = config_class(cls)
    settings = required_settings(config_cls)
    config = config_cls(**settings)
    name = cls.__name__
    exact = type(getattr(cls, "config_class", None)) is type
    assert resolve_config(config_cls, None, settings, name, exact=exact) == config
    assert resolve_config(config_cls, config, {}, name, exact=exact) is config
    with pytest.raises(TypeError, match=f"{name} takes a config or keyword fields, not both"):
        resolve_config(config_cls, config, {"anything": 1}, name)
    with pytest.raises(TypeError, match=f"{name} config must be an? {config_cls.__name__}, got dict"):
        resolve_config(config_cls, {"a": 1}, {}, name, exact=exact)
    # The constructor itself routes through the helper: a wrong config type fails before anything else.
    params = inspect.signature(cls.__init__).parameters.values()
    data = {p.name: "unused" for p in params if p.kind is p.KEYWORD_ONLY and p.default is inspect.Parameter.empty}
    data.update({"PackedTextSource": {"source": "s", "tokenizer": "t.json"}}.get(name, {}))
    with pytest.raises(TypeError, match=f"{name} config must be an? {config_cls.__name__}"):
        cls(config=NotAConfig(), **data)


@dataclasses.dataclass(frozen=True)
class NotAConfig:
    """A dataclass of nobody's: given by position it is a config, the wrong one."""

    a: int = 1


def test_a_source_from_a_config_equals_one_from_settings():
    data = {"x": np.arange(10)}
    a = MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data)
    b = MemorySource(shuffle=True, seed=3, data=data)
    assert a.config == b.config and a.structure() == b.structure()
    assert (default_sampler(a).indices(np.arange(10), 1) == default_sampler(b).indices(np.arange(10), 1)).all()
    with pytest.raises(TypeError, match="MemorySource got unknown settings \\['shufle'\\]"):
        MemorySource(shufle=True, data=data)




def small_folder(root) -> str:
    """Two class folders of one 4x4 PNG each."""
    from PIL import Image

    for name in ("cat", "dog"):
        (root / name).mkdir()
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(root / name / "a.png")
    return str(root)


# (class, positional values, keywords, the config they describe): torchvision's first calls.
POSITIONAL = [
    (T.RandomCrop, (32,), {"padding": 4}, RandomCropConfig(size=32, padding=4)),
    (T.RandomCrop, ((24, 32),), {"pad_mode": "reflect", "padding": 2},
     RandomCropConfig(size=(24, 32), padding=2, pad_mode="reflect")),
    (T.Resize, (224,), {}, ResizeConfig(size=224)),
    (T.RandomResizedCrop, (224,), {"scale": (0.5, 1.0)}, RandomResizedCropConfig(size=224, scale=(0.5, 1.0))),
    (T.Normalize, ((0.5,) * 3, (0.2,) * 3), {}, NormalizeConfig(mean=(0.5,) * 3, std=(0.2,) * 3)),
    (T.Rotation, (10.0,), {"fill": 0.5}, RotationConfig(degrees=10.0, fill=0.5)),
    (T.Affine, (10.0,), {"translate": 0.1}, AffineConfig(degrees=10.0, translate=0.1)),
    (T.HorizontalFlip, (0.3,), {}, HorizontalFlipConfig(p=0.3)),
    (T.VerticalFlip, (0.3,), {"field": "x"}, VerticalFlipConfig(p=0.3, field="x")),
    (T.Solarize, (0.4,), {}, SolarizeConfig(threshold=0.4)),
    (T.CropPad, (16000,), {}, CropPadConfig(length=16000)),
    (T.Resample, (16000, 8000), {}, ResampleConfig(orig_rate=16000, target_rate=8000)),
    (T.TimeMask, (5.0,), {}, TimeMaskConfig(max_width=5.0)),
    (T.FrequencyMask, (5.0,), {"num_masks": 2}, FrequencyMaskConfig(max_width=5.0, num_masks=2)),
    (T.STFT, (256,), {}, STFTConfig(n_fft=256)),
    (T.MelSpectrogram, (22050,), {}, MelSpectrogramConfig(sample_rate=22050)),
    (T.MFCC, (22050,), {"n_mfcc": 13}, MFCCConfig(sample_rate=22050, n_mfcc=13)),
    (DecodeImage, (224,), {"crop": "random_resized"}, DecodeImageConfig(size=224, crop="random_resized")),
]


@pytest.mark.parametrize("cls, args, keywords, config", POSITIONAL, ids=lambda v: getattr(v, "__name__", ""))
def test_principal_settings_by_position_give_the_keyword_and_config_forms(cls, args, keywords, config):
    extra = {"rngs": nnx.Rngs(0)} if issubclass(cls, OperatorModule) else {}
    by_position = cls(*args, **keywords, **extra)
    by_keyword = cls(**dict(zip(cls.positional, args)), **keywords, **extra)
    by_config = cls(config, **extra)
    assert by_position.config == by_keyword.config == by_config.config == config
    assert by_position.structure() == by_config.structure()


def test_folder_sources_take_their_root_by_position(tmp_path):
    root = small_folder(tmp_path)
    for cls, config_cls in ((ImageFolderSource, ImageFolderSourceConfig), (FileFolderSource, FileFolderSourceConfig)):
        by_position = cls(root, shuffle=True, seed=1)
        assert by_position.config == cls(root=root, shuffle=True, seed=1).config == \
            config_cls(root=root, shuffle=True, seed=1)
        assert by_position.structure() == cls(config_cls(root=root, shuffle=True, seed=1)).structure()
        assert by_position.paths == cls(config_cls(root=root)).paths


def test_required_data_by_position_gives_the_same_source(tmp_path):
    data = {"x": np.arange(10), "y": np.ones((10, 2))}
    files = write_array_records(tmp_path / "rec", data, num_shards=2)
    save_npy_dataset(tmp_path / "npy", data)
    built = [
        (MemorySource(data, shuffle=True, seed=3), MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data)),
        (TextSource(["a b", "c"], seed=2), TextSource(TextSourceConfig(seed=2), documents=["a b", "c"])),
        (ArrayRecordSource(files, seed=1), ArrayRecordSource(ArrayRecordSourceConfig(seed=1), paths=files)),
        (StreamingDiskSource(str(tmp_path / "npy")), StreamingDiskSource(paths=str(tmp_path / "npy"))),
        (MemorySource(MemorySourceConfig(seed=4), data), MemorySource(seed=4, data=data)),
    ]
    for by_position, by_keyword in built:
        assert by_position.config == by_keyword.config and by_position.structure() == by_keyword.structure()
        rows = np.array([1, 0])
        assert all(np.array_equal(a, b) for a, b in zip(by_position.get_batch(rows).values(),
                                                          by_keyword.get_batch(rows).values()))


def double(element, key=None):
    return element.update_data({"x": element.data["x"] * 2})


def test_a_function_by_position_is_the_stages_function():
    assert T.Map(np.negative, fields=("x",)).structure() == \
        T.Map(MapOperatorConfig(fields=("x",)), fn=np.negative).structure()
    assert T.Lambda(double).structure() == T.Lambda(ElementOperatorConfig(), fn=double).structure()
    outputs = {"y": ((), np.float32)}
    by_position = HostMap(np.negative, outputs=outputs)
    assert by_position.config == HostMap(HostMapConfig(outputs=outputs), fn=np.negative).config
    assert by_position.fn is np.negative


# (call, the whole message): extra or repeated positional values, each refused with the keyword call.
REFUSED = [
    (lambda: T.RandomCrop(32, 4, "reflect", 0, "image", rngs=nnx.Rngs(0)),
     "RandomCropOperator takes only size by position; pass the rest as keywords: "
     "RandomCropOperator(size=32, padding=4, pad_mode='reflect', fill=0, field='image')"),
    (lambda: T.Normalize((0.5,), (0.2,), "x"),
     "NormalizeOperator takes only mean and std by position; pass the rest as keywords: "
     "NormalizeOperator(mean=(0.5,), std=(0.2,), field='x')"),
    (lambda: T.HorizontalFlip(0.5, "image", rngs=nnx.Rngs(0)),
     "HorizontalFlipOperator takes only p by position; pass the rest as keywords: "
     "HorizontalFlipOperator(p=0.5, field='image')"),
    (lambda: T.MixUp(0.2, num_classes=10),
     "MixUpOperator config must be a MixUpConfig, got float 0.2; MixUpOperator takes no settings by position; "
     "pass them as keywords: MixUpOperator(alpha=0.2, num_classes=10)"),
    (lambda: T.Standardize(StandardizeConfig(), "x"),
     "StandardizeOperator takes no settings by position; pass them as keywords: StandardizeOperator(field='x')"),
    (lambda: T.Standardize(*"abcdefg"),
     "StandardizeOperator config must be a StandardizeConfig, got str 'a'; StandardizeOperator takes no settings "
     "by position; pass them as keywords: StandardizeOperator(field='a', out_field='b', learnable='c', "
     "parameterisation='d', stochastic='e', stream_name='f') (1 more value(s) than StandardizeConfig has settings)"),
    (lambda: DecodeImage(224, "shorter_side", crop="center"),
     "DecodeImage takes only size by position; pass the rest as keywords: "
     "DecodeImage(size=224, resize='shorter_side', crop='center')"),
    (lambda: MemorySource({"x": np.arange(3)}, True),
     "MemorySource takes only data by position; pass the rest as keywords: "
     "MemorySource(data=..., device_resident=True)"),
    (lambda: T.RandomCrop(32, size=32, rngs=nnx.Rngs(0)),
     "RandomCropOperator got multiple values for size: int 32 by position and int 32 as size=; pass it once"),
    (lambda: MemorySource({"x": np.arange(3)}, data={"x": np.arange(3)}),
     "MemorySource got multiple values for data"),
    (lambda: T.Map(fields=("x",)), "MapOperator needs fn: pass MapOperator(fn)"),
    (lambda: T.RandomCrop(RandomCropConfig(), 32, rngs=nnx.Rngs(0)),
     "RandomCropOperator takes a config or keyword fields, not both"),
]


@pytest.mark.parametrize("call, message", REFUSED)
def test_other_positional_values_are_refused_with_the_keyword_call(call, message):
    with pytest.raises(TypeError) as caught:
        call()
    assert str(caught.value).startswith(message)


def test_the_config_and_settings_refusal_spells_the_keyword_call_in_python():
    with pytest.raises(TypeError) as caught:
        DecodeImage(DecodeImageConfig(size=8), ratio=(1.0, 1.0), crop="center")
    assert str(caught.value).startswith("DecodeImage takes a config or keyword fields, not both; got "
                                        "config=DecodeImageConfig(size=(8, 8)")
    assert str(caught.value).endswith("pass DecodeImage(DecodeImageConfig(...)) or DecodeImage(crop=..., ratio=...)")


@pytest.mark.parametrize("config_cls", sorted({config_class(c) for c in CLASSES if c.__name__ not in NO_CONFIG},
                                              key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_settings_order_is_every_field_the_class_own_first(config_cls):
    from datarax.core.construct import settings_order

    order = settings_order(config_cls)
    fields = [f.name for f in dataclasses.fields(config_cls) if f.init]
    assert sorted(order) == sorted(fields)
    own = [n for n in fields if n in inspect.get_annotations(config_cls)
           and all(n not in {f.name for f in dataclasses.fields(b)} for b in config_cls.__bases__
                   if dataclasses.is_dataclass(b))]
    assert order[:len(own)] == own


def test_settings_order_reads_a_crop_as_torchvision_does():
    from datarax.core.construct import settings_order

    assert settings_order(RandomCropConfig)[:5] == ["size", "padding", "pad_mode", "fill", "field"]
