"""`planned_record_keys`: one batched key derivation for a program's stochastic stages gives every
stage bitwise the keys it derives on its own, and a stage run with another context is unaffected."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.core.operator import BatchContext, StageKey, planned_record_keys, record_keys
from datarax.operators.image import (
    BrightnessConfig,
    BrightnessOperator,
    ContrastConfig,
    ContrastOperator,
    HorizontalFlipConfig,
    HorizontalFlipOperator,
    RandomCropConfig,
    RandomCropOperator,
)
from datarax.pipeline.chain import Chain
from datarax.sources import MemorySource, MemorySourceConfig


def reference_keys(stage_key: StageKey, record_ids, epoch) -> np.ndarray:
    """fold_in(fold_in(stage_key, epoch), record_id), one record at a time."""
    base = jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(stage_key.get_value())), epoch)
    return np.stack([np.asarray(jax.random.key_data(jax.random.fold_in(base, int(r)))) for r in record_ids])


def stages():
    return [RandomCropOperator(RandomCropConfig(size=8, padding=2), rngs=nnx.Rngs(0)),
            HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(1)),
            BrightnessOperator(BrightnessConfig(max_delta=0.3), rngs=nnx.Rngs(2)),
            ContrastOperator(ContrastConfig(max_delta=0.3), rngs=nnx.Rngs(3))]


def test_planned_keys_are_each_stages_own_keys_bitwise():
    chain = Chain(stages())
    ids = jnp.asarray([5, 0, 17, 3, 2**31 - 1], jnp.int32)
    for epoch in (0, 1, 2**31 - 1):
        ctx = BatchContext(ids, jnp.int32(epoch), jnp.ones(5, bool))
        with planned_record_keys(chain, ctx):
            planned = [np.asarray(jax.random.key_data(record_keys(s.key, ctx))) for s in chain.stages]
        other = BatchContext(ids[:2], jnp.int32(epoch), jnp.ones(2, bool))
        with planned_record_keys(chain, ctx):  # another context: the stage derives its own keys
            own = np.asarray(jax.random.key_data(record_keys(chain.stages[0].key, other)))
        for stage, keys in zip(chain.stages, planned):
            np.testing.assert_array_equal(keys, reference_keys(stage.key, np.asarray(ids), epoch))
        np.testing.assert_array_equal(own, reference_keys(chain.stages[0].key, np.asarray(ids[:2]), epoch))


def test_a_pipeline_gives_the_batches_of_its_stages_applied_one_by_one():
    images = np.random.default_rng(0).random((20, 8, 8, 3), dtype=np.float32)
    pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=4), data={"image": images}), stages(),
                        batch_size=6)
    it = pipeline.epochs(2)
    for step, batch in enumerate(it):
        epoch, position = (0, 6 * step) if step < 4 else (1, 6 * (step - 4))
        ids = pipeline.sampler.indices(np.minimum(np.arange(position, position + 6), 19), epoch)
        ctx = BatchContext(jnp.asarray(ids, jnp.int32), jnp.int32(epoch), jnp.ones(6, bool))
        element = Element({"image": jnp.asarray(images[ids])}, {})
        for stage in pipeline.stages:  # eagerly, each stage deriving its own keys
            element = stage.apply_batch(element, ctx)
        valid = len(batch["image"])
        # Two differently compiled programs (one fused, one stage by stage) may round a float
        # differently; different keys would move whole crops and flips, far beyond this.
        np.testing.assert_allclose(np.asarray(batch["image"]), np.asarray(element.data["image"])[:valid],
                                   rtol=1e-5, atol=1e-6)
