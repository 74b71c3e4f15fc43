"""Image operators inside a Pipeline: per-record determinism and joint gradients with a model."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.operators.image import (
    BrightnessConfig,
    BrightnessOperator,
    CutoutConfig,
    CutoutOperator,
    GaussianNoiseConfig,
    GaussianNoiseOperator,
    HorizontalFlipConfig,
    HorizontalFlipOperator,
    RandomCropConfig,
    RandomCropOperator,
)
from datarax.sources import MemorySource, MemorySourceConfig

NUM_RECORDS = 23


def data():
    rng = np.random.default_rng(0)
    return {"image": rng.random((NUM_RECORDS, 8, 8, 3)).astype(np.float32),
            "id": np.arange(NUM_RECORDS, dtype=np.int32)}


def stages():
    return [RandomCropOperator(RandomCropConfig(size=8, padding=2, pad_mode="reflect"), rngs=nnx.Rngs(1)),
            HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(2)),
            BrightnessOperator(BrightnessConfig(max_delta=0.3), rngs=nnx.Rngs(3)),
            GaussianNoiseOperator(GaussianNoiseConfig(sigma=0.05), rngs=nnx.Rngs(4))]


def by_record(pipeline, epochs):
    """{(epoch, record id): image} over `epochs` epochs."""
    out = {}
    for epoch in range(epochs):
        for batch in pipeline:
            for i, record in enumerate(np.asarray(batch["id"])):
                out[(epoch, int(record))] = np.asarray(batch["image"][i])
    return out


def test_same_record_and_epoch_give_the_same_output_under_any_batch_size_and_order():
    first = by_record(Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=0), data=data()),
                               stages=stages(), batch_size=4), epochs=2)
    second = by_record(Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=1), data=data()),
                                stages=stages(), batch_size=7), epochs=1)
    assert len(first) == 2 * NUM_RECORDS and len(second) == NUM_RECORDS
    for record in range(NUM_RECORDS):
        # Different batch shapes may vectorise differently: equal up to float32 rounding.
        np.testing.assert_allclose(first[(0, record)], second[(0, record)], atol=1e-6)
        assert not np.allclose(first[(0, record)], first[(1, record)])


class Classifier(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(6 * 6 * 3, 4, rngs=rngs)

    def __call__(self, images):
        return self.linear(images.reshape(images.shape[0], -1))


def test_gradients_reach_the_model_and_every_learnable_magnitude_in_one_step():
    learned = [BrightnessOperator(BrightnessConfig(max_delta=0.3, learnable=True), rngs=nnx.Rngs(1)),
               CutoutOperator(CutoutConfig(size=0.3, fill=0.5, learnable=True), rngs=nnx.Rngs(4)),
               RandomCropOperator(RandomCropConfig(size=6), rngs=nnx.Rngs(5))]
    raw = data()
    pipeline = Pipeline(MemorySource(MemorySourceConfig(), data=raw), stages=learned, batch_size=8)
    model = Classifier(nnx.Rngs(0))
    labels = jnp.arange(8) % 4

    @nnx.jit
    def step(model, pipeline, batch):
        def loss(model, pipeline):
            out = pipeline.transform(batch, record_ids=batch["id"], epoch=0)
            return optax.softmax_cross_entropy_with_integer_labels(model(out["image"]), labels).mean()

        return nnx.grad(loss, argnums=(0, 1))(model, pipeline)

    model_grads, pipeline_grads = step(model, pipeline, {k: jnp.asarray(v[:8]) for k, v in raw.items()})
    assert all(np.all(np.isfinite(g)) and np.any(g != 0) for g in jax.tree.leaves(model_grads))
    magnitudes = jax.tree.leaves(pipeline_grads)
    assert len(magnitudes) == 2
    for grad in magnitudes:
        assert np.isfinite(float(grad)) and float(grad) != 0
