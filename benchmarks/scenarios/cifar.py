"""`cifar`: 50,000 x 32x32x3 uint8, shuffled, random crop (reflect-pad 4) + flip + normalise, batch 256.

Floor: one hand-written jitted function doing the device-resident gather and the same
per-record transform (data passed as an argument, last batch padded), fed a precomputed
permutation per epoch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax import Pipeline
from benchmarks.registry import BenchOptions
from benchmarks.timing import keyed_gather_floor, pipeline_vs_floor
from datarax.core.element import Element
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig

NUM_RECORDS = 50_000
BATCH = 256
MEAN = jnp.array([0.4914, 0.4822, 0.4465])
STD = jnp.array([0.2470, 0.2435, 0.2616])


def make_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "label": rng.integers(0, 10, (n,), dtype=np.int32)}


def augment_image(image: jax.Array, key: jax.Array) -> jax.Array:
    """Random crop after reflect-padding by 4, random horizontal flip, normalise."""
    k_crop, k_flip = jax.random.split(key)
    padded = jnp.pad(image.astype(jnp.float32) / 255.0, ((4, 4), (4, 4), (0, 0)), mode="reflect")
    dy, dx = jax.random.randint(k_crop, (2,), 0, 9)
    crop = jax.lax.dynamic_slice(padded, (dy, dx, 0), (32, 32, 3))
    crop = jnp.where(jax.random.bernoulli(k_flip), crop[:, ::-1], crop)
    return (crop - MEAN) / STD


def augment(element: Element, key: jax.Array) -> Element:
    return element.update_data({"image": augment_image(element.data["image"], key)})


def build_pipeline(data: dict, seed: int = 0) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data)
    op = ElementOperator(ElementOperatorConfig(stochastic=True), fn=augment, rngs=nnx.Rngs(seed))
    return Pipeline(source=source, stages=[op], batch_size=BATCH)


def run(options: BenchOptions) -> list[dict]:
    data = make_data(options.records(NUM_RECORDS))
    floor = keyed_gather_floor(augment_image, len(data["label"]), BATCH)
    return [pipeline_vs_floor("cifar", lambda: build_pipeline(data), data, floor, options.repeats, batch_size=BATCH)]
