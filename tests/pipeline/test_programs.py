"""The process-wide program cache: a rebuilt pipeline reuses its programs, and only its own.

Reuse is counted in traces (Python in a stage runs only while JAX traces it), never in seconds.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax import transforms as T
from datarax.core.operator import OperatorConfig, PerRecordOperator
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline.programs import PROGRAMS, ProgramCache, Unshared, exact
from datarax.samplers.base import Sampler
from datarax.sharding import DataSharding
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.typing import Element

TRACES: collections.Counter = collections.Counter()


@dataclasses.dataclass(frozen=True)
class ScaleConfig(OperatorConfig):
    scale: Any = 2.0


class Scale(PerRecordOperator):
    """x -> x * scale (* gain, a learnable `nnx.Param`, when given); counts its traces."""

    def __init__(self, config: ScaleConfig = ScaleConfig(), gain: float | None = None, gain_shape: tuple = (),
                 tag: Any = None):
        self._init_rng(config, None)
        self.gain = None if gain is None else nnx.Param(jnp.full(gain_shape, gain, jnp.float32))
        self.tag = tag

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        TRACES["scale"] += 1
        x = element.data["x"] * self.config.scale
        return element.update_data({"x": x if self.gain is None else x * self.gain[...]})


def build(stages=None, n=20, batch_size=8, resident=True, shuffle=True, width=3, dtype=np.float32, seed=0,
          **kw) -> Pipeline:
    data = {"x": np.arange(n * width).reshape(n, width).astype(dtype)}
    source = MemorySource(MemorySourceConfig(shuffle=shuffle, seed=seed, device_resident=resident), data=data)
    stages = [Scale(gain=1.0)] if stages is None else stages
    return Pipeline(source, stages, batch_size=batch_size, **kw)


def first(pipeline: Pipeline) -> dict:
    return jax.device_get(next(iter(pipeline)))


def traces_of(make) -> int:
    """How many times building `make()` and taking its first batch traced a `Scale` stage."""
    before = TRACES["scale"]
    first(make())
    return TRACES["scale"] - before


def noisy(element: Element, key: jax.Array) -> Element:
    return element.update_data({"x": element.data["x"] + jax.random.normal(key, element.data["x"].shape)})


DIFFERENT = {
    "int and float": (1, 1.0),
    "int and bool": (1, True),
    "0.0 and -0.0": (0.0, -0.0),
    "numpy and Python scalar": (np.float32(0.5), 0.5),
    "numpy widths": (np.float32(1), np.float64(1)),
    "tuples of int and float": ((1, 2), (1.0, 2)),
    "configs of int and float": (ScaleConfig(scale=2), ScaleConfig(scale=2.0)),
    "dtypes": (np.dtype("float32"), np.dtype("bfloat16")),
    "two functions": (jnp.sin, jnp.cos),
}
EQUAL = {
    "ints": (3, 3),
    "nested tuples": ((1, (2.5, "x", None)), (1, (2.5, "x", None))),
    "configs": (ScaleConfig(scale=2.0), ScaleConfig(scale=2.0)),
    "NaN": (float("nan"), float("nan")),
    "one function": (noisy, noisy),
    "partials": (functools.partial(noisy, key=None), functools.partial(noisy, key=None)),
}
UNSHARED = {"list": [1], "dict": {"a": 1}, "array": np.zeros(2), "object": object(),
            "config holding a list": ScaleConfig(scale=[2.0])}


@pytest.mark.parametrize("a, b", DIFFERENT.values(), ids=DIFFERENT)
def test_exact_tells_apart_values_that_trace_differently(a, b):
    assert exact(a) != exact(b)


@pytest.mark.parametrize("a, b", EQUAL.values(), ids=EQUAL)
def test_exact_keys_equal_plain_data_alike(a, b):
    assert exact(a) == exact(b) and hash(exact(a)) == hash(exact(b))


@pytest.mark.parametrize("value", UNSHARED.values(), ids=UNSHARED)
def test_exact_refuses_values_that_could_change_after_keying(value):
    with pytest.raises(Unshared):
        exact(value)


@pytest.mark.parametrize("resident", [True, False], ids=["device-resident", "host-resident"])
def test_a_rebuilt_pipeline_traces_nothing(resident):
    first(build(resident=resident))  # compiles, unless another test built the same pipeline before
    assert traces_of(lambda: build(resident=resident)) == 0


def test_another_shuffle_seed_or_stage_key_traces_nothing():
    first(build())
    assert traces_of(lambda: build(seed=7)) == 0
    make = functools.partial(ElementOperator, ElementOperatorConfig(stochastic=True), fn=noisy)
    first(build([make(rngs=nnx.Rngs(0)), Scale()]))
    assert traces_of(lambda: build([make(rngs=nnx.Rngs(5)), Scale()], seed=3)) == 0


def test_a_copied_pipeline_traces_nothing():
    pipeline = build()
    first(pipeline)
    assert traces_of(lambda: nnx.clone(pipeline)) == 0


VARIANTS = {
    "batch size": dict(batch_size=4),
    "config value": dict(stages=[Scale(ScaleConfig(scale=3.0), gain=1.0)]),
    "config int for float": dict(stages=[Scale(ScaleConfig(scale=2), gain=1.0)]),
    "parameter shape": dict(stages=[Scale(gain=1.0, gain_shape=(3,))]),
    "record shape": dict(width=4),
    "sampler": dict(shuffle=False),
    "epoch length": dict(n=28),
    "sharding": dict(sharding=DataSharding.data_parallel(jax.devices()[:2])),
    "a stage holding an object": dict(stages=[Scale(gain=1.0, tag=object())]),
}


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS)
def test_a_pipeline_differing_in_a_keyed_aspect_traces_again(variant):
    first(build())
    assert traces_of(lambda: build(**variant)) > 0


def test_a_stage_holding_a_mutable_value_is_never_shared():
    before = PROGRAMS.unshared
    assert traces_of(lambda: build([Scale(gain=1.0, tag=object())])) > 0
    assert traces_of(lambda: build([Scale(gain=1.0, tag=object())])) > 0
    assert PROGRAMS.unshared > before


class Reversed(Sampler):
    """Records in reverse order, computed on the device, under `Sampler`'s bare `structure()`."""

    def __init__(self, num_records: int):
        self.num_records = num_records

    def __len__(self) -> int:
        return self.num_records

    def indices(self, positions, epoch):
        return self.num_records - 1 - np.asarray(positions, np.int64)

    def device_params(self, epoch):
        return ()

    def device_order(self, positions, params):
        return (self.num_records - 1 - positions).astype(jnp.int32)


def test_a_device_sampler_that_does_not_describe_its_settings_is_never_shared():
    assert traces_of(lambda: build(sampler=Reversed(20))) > 0
    assert traces_of(lambda: build(sampler=Reversed(20))) > 0
    np.testing.assert_array_equal(first(build(sampler=Reversed(20)))["x"][0], np.arange(57, 60) * 2.0)


def test_a_config_of_int_and_one_of_float_each_get_their_dtype():
    ints = build([Scale(ScaleConfig(scale=2))], dtype=np.int32, shuffle=False)
    floats = build([Scale(ScaleConfig(scale=2.0))], dtype=np.int32, shuffle=False)
    x = np.arange(24, dtype=np.int32).reshape(8, 3)
    for pipeline, want in ((ints, x * 2), (floats, (x * 2.0).astype(np.float32))):
        got = first(pipeline)["x"]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_a_user_function_is_keyed_by_identity():
    def op(fn):
        return [ElementOperator(ElementOperatorConfig(stochastic=True), fn=fn, rngs=nnx.Rngs(0)), Scale()]

    first(build(op(noisy)))
    assert traces_of(lambda: build(op(noisy))) == 0
    assert traces_of(lambda: build(op(lambda el, key: noisy(el, key)))) > 0


def uncached(make, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(PROGRAMS, "maxsize", 0)
        m.setattr(PROGRAMS, "_entries", collections.OrderedDict())
        return make()


def test_pipelines_sharing_programs_each_compute_with_their_own_values(monkeypatch):
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    first(build([Scale(gain=1.0)], shuffle=False))
    before = TRACES["scale"]
    for gain in (2.0, 3.0):
        pipeline = build([Scale(gain=gain)], shuffle=False)
        reference = uncached(lambda gain=gain: build([Scale(gain=gain)], shuffle=False), monkeypatch)
        got = first(pipeline)["x"]
        np.testing.assert_array_equal(got, first(reference)["x"])
        np.testing.assert_array_equal(got, x * np.float32(2.0) * np.float32(gain))
    assert TRACES["scale"] > before  # the references traced their own programs ...
    assert traces_of(lambda: build([Scale(gain=4.0)], shuffle=False)) == 0  # ... the shared ones were kept


def test_training_one_pipelines_stage_leaves_the_other_alone():
    trained, other = build([Scale(gain=1.0)], shuffle=False), build([Scale(gain=1.0)], shuffle=False)
    assert trained.compiled.run is other.compiled.run
    trained.stages[0].gain[...] = jnp.float32(5.0)  # as an optimizer's in-place update does
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    np.testing.assert_array_equal(first(trained)["x"], x * 2 * 5)
    np.testing.assert_array_equal(first(other)["x"], x * 2)


def test_a_dropped_pipeline_is_collected():
    pipeline = build([Scale(gain=1.0)])
    it = iter(pipeline)
    next(it)
    stage, source = pipeline.stages[0], pipeline.source
    refs = [weakref.ref(x) for x in (pipeline, stage, stage.gain.get_raw_value(), source, source.device_arrays()["x"])]
    del stage, source
    del pipeline, it
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs)
    assert traces_of(lambda: build([Scale(gain=1.0)])) == 0  # its programs stay for the next one


def test_a_dropped_pipelines_own_function_and_what_it_closed_over_are_collected():
    def scaled_by(table):  # closed over: JAX bakes it into the programs as a constant
        return lambda element, key: element.update_data({"x": element.data["x"] * table})

    table = jnp.full((3,), 2.0)
    scaled = scaled_by(table)
    pipeline = build([ElementOperator(ElementOperatorConfig(stochastic=True), fn=scaled, rngs=nnx.Rngs(0)), Scale()])
    first(pipeline)
    refs = [weakref.ref(scaled), weakref.ref(table)]
    entries = len(PROGRAMS)
    del pipeline, scaled, table
    gc.collect()
    assert [ref() for ref in refs] == [None, None]
    assert len(PROGRAMS) < entries  # its entries went with its function: no key could equal theirs again


def cifar_like(seed: int = 0, **kw) -> Pipeline:
    data = {"image": np.random.default_rng(0).integers(0, 256, (40, 8, 8, 3), dtype=np.uint8),
            "label": np.arange(40, dtype=np.int32)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data)
    stages = [T.ToFloat(), T.RandomCrop(size=8, padding=2, rngs=nnx.Rngs(seed)),
              T.HorizontalFlip(rngs=nnx.Rngs(seed + 1)), T.Normalize(mean=(0.5,) * 3, std=(0.25,) * 3)]
    return Pipeline(source, stages, batch_size=16, **kw)


@pytest.mark.parametrize("per_dispatch", [1, 2])
def test_batches_are_bitwise_those_of_an_uncached_pipeline(per_dispatch, monkeypatch):
    list(cifar_like(batches_per_dispatch=per_dispatch))
    shared = [jax.device_get(b) for b in cifar_like(seed=3, batches_per_dispatch=per_dispatch)]
    alone = [jax.device_get(b) for b in uncached(lambda: cifar_like(seed=3, batches_per_dispatch=per_dispatch),
                                                 monkeypatch)]
    assert len(shared) == len(alone) == 3
    for a, b in zip(shared, alone):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_the_cache_drops_the_least_recently_used_entry_past_its_size():
    cache, built = ProgramCache(2), []

    def get(key):
        return cache.get(lambda: key, lambda: built.append(key) or key)

    for key in ("a", "b", "a", "c", "b", "a"):
        get(key)
    # "b" was the least recently used when "c" came, then "a" when "b" came back.
    assert built == ["a", "b", "c", "b", "a"] and len(cache) == 2
