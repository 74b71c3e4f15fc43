"""The one construction convention: `X(config=None, *, <data>, rngs=None, **settings)` for every
source, host stage and operator (`datarax.core.construct.resolve_config`)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import datarax
from datarax.core.operator import OperatorModule
from datarax.core.source import DataSourceModule
from datarax.host.stage import HostStage
from datarax.samplers import default_sampler
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
    data.update({"TextSource": {"documents": ["a"]}, "Tokenize": {"tokenizer": "t.json"},
                 "PackedTextSource": {"source": "s", "tokenizer": "t.json"}}.get(name, {}))
    with pytest.raises(TypeError, match=f"{name} config must be an? {config_cls.__name__}"):
        cls(config=object(), **data)


def test_a_source_from_a_config_equals_one_from_settings():
    from datarax.sources import MemorySource, MemorySourceConfig

    data = {"x": np.arange(10)}
    a = MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data)
    b = MemorySource(shuffle=True, seed=3, data=data)
    assert a.config == b.config and a.structure() == b.structure()
    assert (default_sampler(a).indices(np.arange(10), 1) == default_sampler(b).indices(np.arange(10), 1)).all()
    with pytest.raises(TypeError, match="MemorySource got unknown settings \\['shufle'\\]"):
        MemorySource(shufle=True, data=data)


