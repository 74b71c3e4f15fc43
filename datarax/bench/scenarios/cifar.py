"""`cifar`: 50,000 x 32x32x3 uint8, shuffled, random crop (reflect-pad 4) + flip + normalise, batch 256.

Floor: one hand-written jitted function doing the device-resident gather and the same
per-record transform (data passed as an argument, last batch padded), fed a precomputed
permutation per epoch.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax import Pipeline
from datarax.bench.registry import BenchOptions
from datarax.bench.timing import block, epoch_rate, first_batch_seconds, row
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


def build_floor(n: int, seed: int = 0):
    key = jax.random.key(seed)

    @jax.jit
    def step(images, labels, idx, epoch):
        base = jax.random.fold_in(key, epoch)
        keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(idx)
        return {"image": jax.vmap(augment_image)(jnp.take(images, idx, axis=0), keys),
                "label": jnp.take(labels, idx, axis=0)}

    def epoch_iter(arrays, epoch):
        perm = np.random.default_rng((seed, epoch)).permutation(n).astype(np.int32)
        for start in range(0, n, BATCH):
            idx = perm[start:start + BATCH]
            valid = len(idx)
            if valid < BATCH:
                idx = np.pad(idx, (0, BATCH - valid), mode="edge")
            out = step(arrays["image"], arrays["label"], idx, epoch)
            yield out if valid == BATCH else jax.tree.map(lambda x: x[:valid], out)

    return epoch_iter


def run(options: BenchOptions) -> list[dict]:
    n = options.records(NUM_RECORDS)
    data = make_data(n)

    start = time.perf_counter()
    pipeline = build_pipeline(data)
    build_s = time.perf_counter() - start
    first = first_batch_seconds(lambda: pipeline)
    for _ in pipeline:  # the rest of the warm-up epoch
        pass
    ours = epoch_rate(lambda: pipeline, n, options.repeats)

    arrays = {k: jax.device_put(v) for k, v in data.items()}
    epoch_iter = build_floor(n)
    floor_first = first_batch_seconds(lambda: epoch_iter(arrays, 0))
    block(list(epoch_iter(arrays, 0)))
    counter = iter(range(1, 10**6))
    floor = epoch_rate(lambda: epoch_iter(arrays, next(counter)), n, options.repeats)
    return [row("cifar", ours, floor, records=n, batch_size=BATCH,
                first_batch_s=round(build_s + first, 3), floor_first_batch_s=round(floor_first, 3))]
