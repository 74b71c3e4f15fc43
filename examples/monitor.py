"""Seeing why the accelerator waits: PipelineMonitor on a fast and on a starved training loop.

Run: python examples/monitor.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax import Pipeline
from datarax.monitoring import ConsoleWriter, PipelineMonitor
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig


class SlowReads(MemorySource):
    """A host source whose reads take 20 ms a batch, like a slow disk or a decode-heavy format."""

    def get_batch(self, indices, out=None):
        time.sleep(0.02)
        return super().get_batch(indices, out=out)


def build(source_class):
    data = {"image": np.random.default_rng(0).integers(0, 256, (4096, 32, 32, 3), np.uint8),
            "label": np.arange(4096, dtype=np.int32) % 10}
    source = source_class(MemorySourceConfig(shuffle=True, seed=0, device_resident=False), data=data)
    flip = ElementOperator(ElementOperatorConfig(stochastic=True), rngs=nnx.Rngs(0),
                           fn=lambda el, key: el.update_data({"image": jnp.where(
                               jax.random.bernoulli(key), el.data["image"][:, ::-1], el.data["image"]) / 255.0}))
    return Pipeline(source, [flip], batch_size=128)


@jax.jit
def train_step(w, batch):
    """Stands in for a model: ~1 ms of matrix work per batch on a CPU."""
    x = batch["image"].reshape(batch["image"].shape[0], -1)
    return w - 1e-6 * (x.T @ (x @ w))


for name, source_class in (("fast source", MemorySource), ("slow source", SlowReads)):
    monitor = PipelineMonitor(reporters=[ConsoleWriter()])
    w = jnp.zeros((32 * 32 * 3, 16))
    for batch in monitor.wrap(build(source_class).epochs(3)):
        w = train_step(w, batch)
        monitor.step_done(w)  # a watcher thread records when the step finished: exposed device idle
    monitor.close()
    print(f"{name}:")
    monitor.report()
