"""raw_loader: untransformed batches whose context makes pipeline.transform equal normal iteration."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.image import BrightnessConfig, BrightnessOperator
from datarax.sharding import DataSharding
from datarax.sources import MemorySource, MemorySourceConfig


def build(resident=True, n=50, batch_size=16, drop=False):
    rng = np.random.default_rng(0)
    data = {"image": rng.random((n, 4, 4, 3)).astype(np.float32), "label": np.arange(n, dtype=np.int32)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=3, device_resident=resident), data=data)
    shift = ElementOperator(ElementOperatorConfig(stochastic=True), rngs=nnx.Rngs(1),
                            fn=lambda el, key: el.update_data({"image": el.data["image"] + jax.random.uniform(key)}))
    bright = BrightnessOperator(BrightnessConfig(max_delta=0.3, learnable=True), rngs=nnx.Rngs(2))
    return Pipeline(source, [shift, bright], batch_size=batch_size, drop_remainder=drop)


@pytest.mark.parametrize("resident", [True, False], ids=["device", "host"])
@pytest.mark.parametrize("drop", [False, True])
def test_transforming_raw_batches_gives_the_pipelines_own_batches(resident, drop):
    pipeline = build(resident, drop=drop)
    expected = [b for _ in range(2) for b in pipeline]  # two epochs
    loader = build(resident, drop=drop).raw_loader()
    raws = list(loader.epochs(2))
    assert len(raws) == len(expected) == (6 if drop else 8)
    transform = jax.jit(lambda raw, ids, epoch: pipeline.transform(raw, record_ids=ids, epoch=epoch))
    for i, (raw, want) in enumerate(zip(raws, expected)):
        raw = dict(raw)
        ids, epoch = raw.pop("record_ids"), raw.pop("epoch")
        assert int(epoch[0]) == (0 if i < len(raws) // 2 else 1) and np.all(np.asarray(epoch) == epoch[0])
        # The raw batch is the source's records, untransformed, in the sampler's order.
        np.testing.assert_array_equal(np.asarray(raw["label"]), np.asarray(ids))
        np.testing.assert_array_equal(np.asarray(ids), np.asarray(want["label"]))
        got = transform(raw, ids, epoch[0])
        np.testing.assert_allclose(np.asarray(got["image"]), np.asarray(want["image"]), rtol=1e-6, atol=1e-6)


def test_the_loader_resumes_exactly():
    loader = build().raw_loader()
    it = loader.epochs(2)
    for _ in range(5):
        next(it)
    state = it.get_state()
    rest = [np.asarray(b["record_ids"]) for b in it]
    it2 = build().raw_loader().epochs(2)
    it2.set_state(state)
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["record_ids"]) for b in it2]), np.concatenate(rest))


def test_gradients_reach_the_stage_parameters_through_raw_batches():
    pipeline = build()
    raw = dict(next(iter(pipeline.raw_loader())))
    ids, epoch = raw.pop("record_ids"), raw.pop("epoch")

    def loss(pipe):
        return jnp.mean(pipe.transform(raw, record_ids=ids, epoch=epoch[0])["image"] ** 2)

    grads = nnx.grad(loss)(pipeline)
    leaves = jax.tree.leaves(nnx.state(grads, nnx.Param))
    assert leaves and all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert any(float(jnp.abs(g).sum()) > 0 for g in leaves)


def test_raw_loader_errors():
    with pytest.raises(ValueError, match=r"raw_loader\(\) gives unsharded batches .* built with sharding=\.\.\."):
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
        Pipeline(build().source, batch_size=4, sharding=DataSharding(mesh, "data")).raw_loader()
    with pytest.raises(ValueError, match=r"the source already has a field 'label', the name ContextStage writes to"):
        next(iter(build().raw_loader(ids_key="label")))
    with pytest.raises(ValueError, match=r"ids_key and epoch_key must differ, both are 'x'"):
        build().raw_loader(ids_key="x", epoch_key="x")
    with pytest.raises(TypeError, match=r"ContextStage epoch_key must be a non-empty str, got 3"):
        build().raw_loader(epoch_key=3)
