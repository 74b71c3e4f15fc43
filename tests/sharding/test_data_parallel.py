"""Data-parallel training with `datarax.train.Trainer`: 8 fake CPU devices end where 1 device ends.

The sharded run feeds global batches split over a `data` mesh axis, with the parameters
replicated on that mesh; XLA partitions the jitted train step and all-reduces the gradients.
The reference run is the same model, optimizer and pipeline on one device, unsharded. The final
short batch of each epoch is kept: the sharded run sees it padded to the full batch with a mask
and weights the loss by it, the unsharded one sees it short.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sharding import DataSharding
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer

NUM_RECORDS, BATCH, STEPS = 60, 16, 8  # 4 steps per epoch, the last with 12 records


def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_RECORDS, 5)).astype(np.float32)
    return {"x": x, "y": (x @ rng.normal(size=(5, 1)) + 0.1).astype(np.float32)}


def jitter(element, key):
    return element.update_data({"x": element.data["x"] + 0.1 * jax.random.normal(key, element.data["x"].shape)})


def pipeline(sharding: DataSharding | None) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data())
    op = ElementOperator(ElementOperatorConfig(stochastic=True), fn=jitter, rngs=nnx.Rngs(1))
    return Pipeline(source, [op], batch_size=BATCH, sharding=sharding)


def masked_mse(model, batch):
    err = jnp.sum((model(batch["x"]) - batch["y"]) ** 2, axis=-1)
    weight = batch["mask"].astype(err.dtype) if "mask" in batch else jnp.ones_like(err)
    return jnp.sum(err * weight) / jnp.sum(weight)


def train(sharding: DataSharding | None):
    model = nnx.Sequential(nnx.Linear(5, 16, rngs=nnx.Rngs(0)), nnx.tanh, nnx.Linear(16, 1, rngs=nnx.Rngs(1)))
    if sharding is not None:
        nnx.update(model, jax.device_put(nnx.state(model), NamedSharding(sharding.mesh, P())))
    trainer = Trainer(model, optax.adam(0.05), pipeline(sharding), masked_mse)
    result = trainer.fit(num_steps=STEPS)
    return result, nnx.state(model, nnx.Param)


def test_eight_devices_train_to_the_same_parameters_as_one():
    sharding = DataSharding.data_parallel()
    assert sharding.num_shards == 8
    one_result, one = train(None)
    many_result, many = train(sharding)
    assert one_result.step == many_result.step == STEPS
    leaves_one, leaves_many = jax.tree.leaves(one), jax.tree.leaves(many)
    assert len(leaves_one) == len(leaves_many) == 4
    for a, b in zip(leaves_one, leaves_many):
        assert len(b.sharding.device_set) == 8  # the step ran over the mesh
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(many_result.metrics["loss"], one_result.metrics["loss"], rtol=1e-4)
    assert not np.allclose(np.asarray(leaves_one[0]), np.asarray(nnx.Linear(5, 16, rngs=nnx.Rngs(0)).kernel[...]))
