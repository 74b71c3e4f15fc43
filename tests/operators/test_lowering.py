"""`datarax.operators.lowering.slices_as_selections`: a user's per-record `dynamic_slice` as
selection products, checked against `lax.dynamic_slice` itself (the reference) on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.operators import ElementOperator, ElementOperatorConfig, MapOperator, MapOperatorConfig, lowering
from datarax.operators.lowering import slices_as_selections
from datarax.sources import MemorySource, MemorySourceConfig


def primitive_names(fn, *args) -> list[str]:
    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn.primitive.name
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", None)
                if inner is not None:
                    yield from walk(getattr(inner, "jaxpr", inner))

    return list(walk(jax.make_jaxpr(fn)(*args).jaxpr))


def values(dtype, shape, rng):
    if jnp.issubdtype(dtype, jnp.integer):
        info = np.iinfo(dtype)
        return jnp.asarray(rng.integers(info.min, int(info.max) + 1, shape), dtype)
    return jnp.asarray(rng.normal(size=shape) * 100, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.uint8, jnp.int8, jnp.int16, jnp.uint16])
@pytest.mark.parametrize("shape,sizes", [((40, 40, 3), (32, 32, 3)), ((17,), (5,)), ((6, 9, 4), (6, 2, 3)),
                                         ((3, 300), (1, 299))])
def test_equals_dynamic_slice_for_every_start_including_clamped_ones(dtype, shape, sizes):
    rng = np.random.default_rng(0)
    batch = 24
    x = values(dtype, (batch, *shape), rng)
    # starts from below 0 to past the last valid one: dynamic_slice wraps negative ones and clamps
    starts = [jnp.asarray(rng.integers(-n - 2, n + 2, batch), jnp.int32) for n, size in zip(shape, sizes)]

    def crop(x, *s):
        return jax.lax.dynamic_slice(x, s, sizes)

    want = jax.vmap(crop)(x, *starts)
    got = jax.jit(jax.vmap(slices_as_selections(crop)))(x, *starts)
    assert "dot_general" in primitive_names(jax.vmap(slices_as_selections(crop)), x, *starts)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_nan_and_infinities_stay_where_they_were_and_spread_nowhere():
    x = jnp.arange(10 * 12, dtype=jnp.float32).reshape(10, 12)
    x = x.at[2, 3].set(jnp.nan).at[5, 7].set(jnp.inf).at[8, 1].set(-jnp.inf).at[0, 0].set(-0.0)
    def window(x, a, b):
        return jax.lax.dynamic_slice(x, (a, b), (4, 4))

    sliced, selected = jax.jit(window), jax.jit(slices_as_selections(window))  # one program each, every start
    for dy in range(0, 7):
        for dx in range(0, 9):
            want = sliced(x, dy, dx)
            got = selected(x, dy, dx)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # NaN == NaN here, infinities signed


def test_gradients_equal_the_slices():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(8, 20, 20, 2)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(8, 12, 12, 2)), jnp.float32)
    starts = jnp.asarray(rng.integers(0, 9, (8, 2)), jnp.int32)

    def loss(fn):
        def total(x):
            crop = jax.vmap(lambda x, s: fn(lambda x, s: jax.lax.dynamic_slice(x, (s[0], s[1], 0), (12, 12, 2)))(x, s)
                            )(x, starts)
            return jnp.sum(jnp.sin(crop) * weights)
        return jax.jit(jax.grad(total))(x)  # jitted, as a training step takes it

    np.testing.assert_array_equal(np.asarray(loss(slices_as_selections)), np.asarray(loss(lambda f: f)))


@pytest.mark.parametrize("case", ["int32 values", "an axis longer than MAX_SELECTED_AXIS", "constant starts"])
def test_slices_it_cannot_or_need_not_select_run_as_written(case):
    n = lowering.MAX_SELECTED_AXIS + 1 if case == "an axis longer than MAX_SELECTED_AXIS" else 40
    x = jnp.zeros((4, n), jnp.int32 if case == "int32 values" else jnp.float32)
    starts = jnp.arange(4, dtype=jnp.int32)
    if case == "constant starts":
        fn = slices_as_selections(lambda x, s: jax.lax.dynamic_slice(x, (0,), (8,)))
    else:
        fn = slices_as_selections(lambda x, s: jax.lax.dynamic_slice(x, (s,), (8,)))
    names = primitive_names(jax.vmap(fn), x, starts)
    assert "dot_general" not in names
    assert {"dynamic_slice", "gather", "slice"} & set(names)


def crop_in_a_jitted_helper(element, key):
    @jax.jit
    def crop(image, offset):
        return jax.lax.dynamic_slice(image, (offset, offset, 0), (6, 6, 1))

    offset = jax.random.randint(key, (), 0, 3)
    return element.update_data({"image": crop(element.data["image"], offset) * 2.0})


def flip_and_crop(x, key):
    dy, dx = jax.random.randint(key, (2,), 0, 5)
    return jnp.where(jax.random.bernoulli(key), jax.lax.dynamic_slice(x, (dy, dx, 0), (6, 6, 1))[:, ::-1],
                     jax.lax.dynamic_slice(x, (dy, dx, 0), (6, 6, 1)))


def pipelines(kind: str) -> Pipeline:
    data = {"image": np.random.default_rng(2).integers(0, 255, (37, 10, 10, 1)).astype(np.float32),
            "label": np.arange(37, dtype=np.int32)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data)
    if kind == "element":
        stage = ElementOperator(ElementOperatorConfig(stochastic=True), fn=crop_in_a_jitted_helper, rngs=nnx.Rngs(4))
    else:
        stage = MapOperator(MapOperatorConfig(fields=("image",), stochastic=True), fn=flip_and_crop, rngs=nnx.Rngs(4))
    return Pipeline(source, [stage], batch_size=8)


@pytest.mark.parametrize("kind", ["element", "map"])
def test_user_operators_give_the_same_batches_and_no_gather_in_the_batched_formulation(kind, use_formulation):
    use_formulation("per_record")
    per_record = [jax.device_get(b) for b in pipelines(kind).epochs(2)]
    use_formulation("batched")
    pipeline = pipelines(kind)
    batched = [jax.device_get(b) for b in pipeline.epochs(2)]
    assert len(batched) == len(per_record) == 10
    for got, want in zip(batched, per_record):
        for field in want:
            np.testing.assert_array_equal(got[field], want[field])
    stage = pipeline.stages[0]
    batch = Element({"image": jnp.zeros((8, 10, 10, 1)), "label": jnp.zeros(8, jnp.int32)})
    keys = jax.random.split(jax.random.key(0), 8)
    names = primitive_names(jax.vmap(stage.per_record()), batch, keys)
    assert "gather" not in names and "dot_general" in names


def test_a_user_functions_field_error_reads_the_same_in_the_batched_formulation(use_formulation):
    use_formulation("batched")
    op = ElementOperator(ElementOperatorConfig(), fn=lambda element: element.update_data({"y": element.data["z"]}))
    with pytest.raises(KeyError, match=r"reads field 'z', but the record has fields \['x'\]"):
        jax.vmap(op.per_record())(Element({"x": jnp.zeros((2, 3))}), None)
