"""Bad input gets a clear error naming the argument, showing the value and saying the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorConfig, OperatorModule
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline.compiled import InconsistentOutputError
from datarax.pipeline.state import IteratorStateError
from datarax.sources import MemorySource, MemorySourceConfig


def source(n=10, **config):
    return MemorySource(MemorySourceConfig(**config), data={"x": np.zeros((n, 2), np.float32), "y": np.arange(n)})


def identity(element, key=None):
    return element


@pytest.mark.parametrize("data,exc,match", [
    ({}, ValueError, r"data must be a non-empty dict of arrays"),
    ([1, 2], ValueError, r"data must be a non-empty dict of arrays, got list"),
    ({"x": np.zeros((0, 3))}, ValueError, r"data is empty \(0 records in 'x'\)"),
    ({"a": np.zeros(5), "b": np.zeros(4)}, ValueError, r"'a' has 5 but 'b' has 4"),
    ({"s": np.array(["a", "b"])}, TypeError, r"field 's' has dtype <U1; only numeric and bool"),
    ({"o": np.array([{}, {}], dtype=object)}, TypeError, r"field 'o' has dtype object"),
    ({"x": np.float32(3)}, ValueError, r"field 'x' is a scalar"),
])
def test_memory_source_rejects_bad_data(data, exc, match):
    with pytest.raises(exc, match=match):
        MemorySource(MemorySourceConfig(), data=data)


@pytest.mark.parametrize("config,exc,match", [
    ({"seed": -1}, ValueError, r"MemorySourceConfig.seed must be in \[0, 2\*\*63 - 1\], got -1"),
    ({"seed": 2**64}, ValueError, r"got 18446744073709551616"),
    ({"shuffle": "yes"}, TypeError, r"shuffle must be True or False, got 'yes'"),
    ({"device_resident": 1}, TypeError, r"device_resident must be None, True or False, got 1"),
])
def test_memory_source_config_errors(config, exc, match):
    with pytest.raises(exc, match=match):
        MemorySourceConfig(**config)


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_batch_size_must_be_positive_int(batch_size):
    with pytest.raises(ValueError, match=rf"batch_size must be a positive int, got {batch_size!r}"):
        Pipeline(source=source(), stages=[], batch_size=batch_size)


def test_pipeline_argument_type_errors():
    with pytest.raises(TypeError, match=r"source must be a DataSourceModule such as MemorySource, got dict"):
        Pipeline(source={"x": np.zeros(3)}, batch_size=2)
    with pytest.raises(TypeError, match=r"stages\[0\] must be an operator .* got function"):
        Pipeline(source=source(), stages=[identity], batch_size=2)
    with pytest.raises(TypeError, match=r"stages must be a list of operators"):
        Pipeline(source=source(), stages=ElementOperator(fn=identity), batch_size=2)


def test_a_stochastic_operator_without_rngs_draws_from_seed_0_and_with_rngs_needs_its_stream():
    key = lambda op: jax.random.key_data(jax.random.wrap_key_data(op.key[...]))  # noqa: E731
    default = ElementOperator(ElementOperatorConfig(stochastic=True), fn=identity)
    seeded = ElementOperator(ElementOperatorConfig(stochastic=True), fn=identity, rngs=nnx.Rngs(0))
    other = ElementOperator(ElementOperatorConfig(stochastic=True), fn=identity, rngs=nnx.Rngs(1))
    assert (key(default) == key(seeded)).all() and not (key(default) == key(other)).all()
    with pytest.raises(ValueError, match=r"stream 'augmentations', but the rngs given has neither"):
        ElementOperator(ElementOperatorConfig(stochastic=True, stream_name="augmentations"), fn=identity,
                        rngs=nnx.Rngs(params=0))
    with pytest.raises(TypeError, match=r"takes no key argument; define it as fn\(element, key\)"):
        ElementOperator(ElementOperatorConfig(stochastic=True), fn=lambda element: element, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"stream_name must be a non-empty string or None, got ''"):
        ElementOperatorConfig(stochastic=True, stream_name="")
    # The named stream is used when present, the default stream otherwise (as in NNX).
    a = ElementOperator(ElementOperatorConfig(stochastic=True, stream_name="aug"), fn=identity, rngs=nnx.Rngs(aug=1))
    b = ElementOperator(ElementOperatorConfig(stochastic=True, stream_name="aug"), fn=identity, rngs=nnx.Rngs(1))
    assert a.key is not None and b.key is not None


def test_operator_returning_wrong_type_is_reported():
    bad = ElementOperator(fn=lambda element: element.data)
    with pytest.raises(TypeError, match=r"must return an Element, got dict.*return element.update_data"):
        Pipeline(source=source(), stages=[bad], batch_size=4)


class DropsRecords(OperatorModule):
    def __init__(self):
        self.config = OperatorConfig()

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        return elements.update_data({"x": elements.data["x"][:2]})


def test_operator_changing_the_batch_size_is_reported():
    with pytest.raises(InconsistentOutputError,
                       match=r"data\['x'\] has shape \(2, 2\), but the batch has 4 records"):
        Pipeline(source=source(), stages=[DropsRecords()], batch_size=4)


def test_element_update_data_needs_a_dict():
    with pytest.raises(TypeError, match=r"update_data takes a dict of fields, got Array"):
        Element({"x": jnp.zeros(2)}).update_data(jnp.zeros(2))


def _state(**changes):
    it = iter(Pipeline(source=source(shuffle=True, seed=1), batch_size=4))
    next(it)
    state = it.get_state()
    state.update(changes)
    return state


@pytest.mark.parametrize("state,match", [
    ("not a state", r"must be a dict from get_state\(\), got str"),
    ({"epoch": 0}, r"missing \['version', 'position', 'fingerprint', 'num_records', 'batch_size'\]"),
    (lambda: _state(version=99), r"version 99, this datarax reads version 1"),
    (lambda: _state(position=-3), r"position must be an int >= 0, got -3"),
    (lambda: _state(position=11), r"position 11 is past the end of the epoch \(10 records\)"),
    (lambda: _state(epoch="1"), r"epoch must be an int >= 0, got '1'"),
])
def test_corrupt_states_are_rejected(state, match):
    state = state() if callable(state) else state
    it = iter(Pipeline(source=source(shuffle=True, seed=1), batch_size=4))
    with pytest.raises(IteratorStateError, match=match):
        it.set_state(state)


def test_foreign_states_are_rejected():
    state = _state()
    cases = [
        (Pipeline(source=source(12, shuffle=True, seed=1), batch_size=4), r"over 10 records, this one has 12"),
        (Pipeline(source=source(shuffle=True, seed=1), batch_size=5), r"batch_size=4, this pipeline has batch_size=5"),
        (Pipeline(source=source(shuffle=True, seed=2), batch_size=4), r"fingerprint .* does not match"),
        (Pipeline(source=source(shuffle=True, seed=1), stages=[ElementOperator(fn=identity)], batch_size=4),
         r"different source, shuffle seed, sampler or stages"),
    ]
    for pipeline, match in cases:
        with pytest.raises(IteratorStateError, match=match):
            iter(pipeline).set_state(state)


def test_failed_restore_loses_nothing():
    pipeline = Pipeline(source=source(shuffle=True, seed=1), batch_size=4)
    it = iter(pipeline)
    first = next(it)
    before = it.get_state()
    with pytest.raises(IteratorStateError):
        it.set_state({"version": 1})
    assert it.get_state() == before
    reference = list(Pipeline(source=source(shuffle=True, seed=1), batch_size=4))
    np.testing.assert_array_equal(np.asarray(next(it)["y"]), np.asarray(reference[1]["y"]))
    np.testing.assert_array_equal(np.asarray(first["y"]), np.asarray(reference[0]["y"]))


def test_drop_remainder_with_fewer_records_than_a_batch_is_rejected():
    with pytest.raises(ValueError, match=r"drop_remainder=True with batch_size=16 but an epoch has only 10 records"):
        Pipeline(source=source(), batch_size=16, drop_remainder=True)


def test_a_user_function_reading_a_missing_field_lists_the_records_fields():
    def typo(element, key=None):
        return element.update_data({"x": element.data["imagee"]})

    source = MemorySource(MemorySourceConfig(), data={"x": np.zeros((4, 2), np.float32)})
    op = ElementOperator(ElementOperatorConfig(), fn=typo)
    with pytest.raises(KeyError, match=r"fn .*typo reads field 'imagee', but the record has fields \['x'\]"):
        Pipeline(source, [op], batch_size=2)


def test_a_key_used_by_a_deterministic_function_names_the_config_flag():
    def flip(element, key):
        return element.update_data({"x": element.data["x"] * jax.random.bernoulli(key, 0.5)})

    source = MemorySource(MemorySourceConfig(), data={"x": np.zeros((4, 2), np.float32)})
    op = ElementOperator(ElementOperatorConfig(stochastic=False), fn=flip)
    with pytest.raises(TypeError, match=r"used its key, but the operator is deterministic.*"
                                        r"ElementOperatorConfig\(stochastic=True\)"):
        Pipeline(source, [op], batch_size=2)
