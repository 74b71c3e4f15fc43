"""Small shared set-ups for the trainer tests (imported by the tests in this folder).

A linear classifier on 4-d points with a learnable-noise stage; `RECORD_METRICS` identify the records a step saw.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator
from datarax.sources import MemorySource, MemorySourceConfig


class Jitter(PerRecordOperator):
    """Adds noise of learnable strength sigmoid(p) to x: stochastic and differentiable."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.p = nnx.Param(jnp.asarray(0.0))
        self._init_rng(OperatorConfig(stochastic=True), rngs)

    def apply_element(self, element: Element, key: jax.Array) -> Element:
        x = element.data["x"]
        return element.update_data({"x": x + jax.nn.sigmoid(self.p[...]) * jax.random.normal(key, x.shape)})


def points(num: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, num).astype(np.int32)
    x = (rng.normal(size=(num, 4)) + np.eye(3, 4)[y] * 2).astype(np.float32)
    return {"x": x, "y": y, "rid": np.arange(num, dtype=np.int32)}


def loss_fn(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), logits


METRICS = {"accuracy": lambda batch, logits: (logits.argmax(-1) == batch["y"]).mean()}
# Which records (and which augmentation of them) a step trained on, as exact scalars.
RECORD_METRICS = {
    "rid_sum": lambda batch, _: batch["rid"].sum().astype(np.float32),
    "rid_sq": lambda batch, _: (batch["rid"] * batch["rid"]).sum().astype(np.float32),
    "x_sum": lambda batch, _: batch["x"].sum(),
}


@dataclasses.dataclass
class Setup:
    model: nnx.Module
    pipeline: Pipeline
    eval_pipeline: Pipeline


def make_setup(*, batch_size: int = 8, num_records: int = 64, seed: int = 0, source=None,
               drop_remainder: bool = True) -> Setup:
    source = source if source is not None else MemorySource(MemorySourceConfig(shuffle=True, seed=seed + 5),
                                                            data=points(num_records, seed))
    pipeline = Pipeline(source, [Jitter(rngs=nnx.Rngs(seed + 1))], batch_size=batch_size,
                        drop_remainder=drop_remainder)
    eval_pipeline = Pipeline(MemorySource(data=points(20, seed + 9)), batch_size=8)
    return Setup(nnx.Linear(4, 3, rngs=nnx.Rngs(seed)), pipeline, eval_pipeline)


def _host(x) -> np.ndarray:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def leaves(module) -> list[np.ndarray]:
    return [_host(x) for x in jax.tree.leaves(nnx.to_pure_dict(nnx.state(module)))]


def assert_bitwise_equal(a, b) -> None:
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)
