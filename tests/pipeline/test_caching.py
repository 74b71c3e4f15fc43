import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.operator import OperatorConfig, PerRecordOperator
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline.caching import CachingIterator
from datarax.pipeline.dag import DagProgram
from datarax.pipeline.state import IteratorStateError
from datarax.sources import MemorySource, MemorySourceConfig

N, B = 22, 8
CALLS = []


def expensive(element):
    jax.debug.callback(lambda: CALLS.append(1))
    return element.update_data({"x": jnp.tanh(element.data["x"]) * 3.0})


def jitter(element, key):
    return element.update_data({"x": element.data["x"] + jax.random.normal(key, element.data["x"].shape)})


def shift(element):
    return element.update_data({"x": element.data["x"] + 1.0})


def build(resident=True, drop_remainder=False, stochastic=True):
    data = {"x": np.linspace(-2, 2, N * 3, dtype=np.float32).reshape(N, 3), "id": np.arange(N, dtype=np.int32)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=7, device_resident=resident), data=data)
    last = (ElementOperator(ElementOperatorConfig(stochastic=True), fn=jitter, rngs=nnx.Rngs(1)) if stochastic
            else ElementOperator(fn=shift))
    stages = [ElementOperator(fn=expensive), last]
    return Pipeline(source, stages=stages, batch_size=B, drop_remainder=drop_remainder)


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        np.testing.assert_array_equal(x["id"], y["id"])  # the same records, in the same order
        # The prefix and the rest compile as separate programs, which may round an ulp differently.
        np.testing.assert_allclose(x["x"], y["x"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("resident,drop_remainder", [(True, False), (False, True)])
def test_cached_batches_equal_uncached_and_prefix_runs_once(resident, drop_remainder):
    want = list(build(resident, drop_remainder).epochs(3))
    CALLS.clear()
    it = CachingIterator(build(resident, drop_remainder), num_cached_stages=1, num_epochs=3)
    first = next(it)
    jax.effects_barrier()  # a debug callback may run after the call returns (it does on a TPU)
    filled = len(CALLS)
    got = [first] + list(it)
    jax.effects_barrier()
    assert filled > 0 and len(CALLS) == filled  # later batches and epochs read the cache
    assert_same(got, want)
    # XLA:TPU's float32 tanh is an approximation (seen on a v5e: 3.4e-5 off numpy's, here 1e-4 after the
    # scale by 3); the CPU's is good to an ulp or two.
    tolerance = {"rtol": 1e-6} if jax.default_backend() == "cpu" else {"rtol": 1e-4, "atol": 1e-5}
    np.testing.assert_allclose(it.cache["x"], np.tanh(np.linspace(-2, 2, N * 3).reshape(N, 3)) * 3.0, **tolerance)


def test_state_is_interchangeable_with_the_plain_iterator():
    plain = build(stochastic=False).epochs(2)
    cached = CachingIterator(build(stochastic=False), num_cached_stages=1, num_epochs=2)
    for _ in range(4):
        next(cached)
        next(plain)
    cached_state, plain_state = cached.get_state(), plain.get_state()
    assert cached_state == plain_state
    rest = list(plain)
    next(cached)
    cached.set_state(plain_state)  # rewind the caching iterator with the plain one's state
    assert_same(list(cached), rest)
    plain.set_state(cached_state)  # and the plain one with the caching one's
    assert_same(list(plain), rest)


def test_caching_iterator_advances_the_pipeline_epoch_counter():
    pipeline = build(stochastic=False)
    it = CachingIterator(pipeline, num_cached_stages=1, num_epochs=2)
    assert it.get_state()["epoch"] == 0 and it.cache is None
    assert iter(pipeline).get_state()["epoch"] == 2  # like pipeline.epochs(2)


class Scale(PerRecordOperator):
    def __init__(self, value):
        self._init_rng(OperatorConfig(), None)
        self.scale = nnx.Param(jnp.float32(value))

    def apply_element(self, element, key):
        return element.update_data({"x": element.data["x"] * self.scale[...]})


def test_refresh_rebuilds_after_parameters_change():
    data = {"x": np.arange(6, dtype=np.float32).reshape(6, 1)}
    pipeline = Pipeline(MemorySource(data=data), stages=[Scale(2.0)], batch_size=4)
    it = CachingIterator(pipeline, num_cached_stages=1, num_epochs=2)
    np.testing.assert_array_equal(next(it)["x"], data["x"][:4] * 2)
    pipeline.program.stages[0].scale[...] = 10.0
    np.testing.assert_array_equal(next(it)["x"], data["x"][4:] * 2)  # stale until refreshed
    it.refresh()
    np.testing.assert_array_equal(it.cache["x"], data["x"] * 10)
    np.testing.assert_array_equal(next(it)["x"], data["x"][:4] * 10)


ERRORS = [
    (lambda: CachingIterator(build(), num_cached_stages=2), ValueError,
     r"stage 1 \(ElementOperator\(ElementOperatorConfig\(stochastic=True.*is stochastic, so its output cannot be "
     r"cached.*\(num_cached_stages=1\)"),
    (lambda: CachingIterator(build(), num_cached_stages=0), ValueError,
     r"num_cached_stages must be an int in \[1, 2\] \(the pipeline has 2 stages\), got 0"),
    (lambda: CachingIterator(build(), num_cached_stages=1, num_epochs=0), ValueError,
     r"num_epochs must be a positive int or None"),
    (lambda: CachingIterator("pipeline", num_cached_stages=1), TypeError, r"CachingIterator needs a datarax Pipeline"),
    (lambda: CachingIterator(Pipeline(MemorySource(data={"x": np.zeros((4, 1), np.float32)}), batch_size=2,
                                      program=DagProgram({"a": ElementOperator(fn=lambda e: e)}, {"a": []}, "a")),
                             num_cached_stages=1),
     TypeError, r"caches a prefix of a linear pipeline's stages, but this pipeline's program is a DagProgram"),
]


@pytest.mark.parametrize("make,error,message", ERRORS)
def test_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_state_errors():
    it = CachingIterator(build(), num_cached_stages=1, num_epochs=1)
    foreign = build(drop_remainder=True).epochs(1).get_state()
    with pytest.raises(IteratorStateError, match="fingerprint"):
        it.set_state(foreign)
    late = dict(it.get_state(), epoch=5)
    with pytest.raises(ValueError, match=r"iterator state epoch 5 is past this iterator's last epoch 0"):
        it.set_state(late)
