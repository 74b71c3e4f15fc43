"""`dag`: the README's two-branch DAG (flip augment + normalise, merged by averaging) on cifar data.

50,000 x 32x32x3 uint8, shuffled, batch 256: `augment` (random horizontal flip per record) and
`normalize` (/255) each consume the source batch, and a plain `Merge` module averages them.

Floor: one hand-written jitted function doing the device-resident gather, the per-record keyed
flip, the normalisation and the average (data passed as an argument, last batch padded), fed a
precomputed permutation per epoch.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax import Pipeline
from datarax.bench.registry import BenchOptions
from datarax.bench.scenarios.cifar import make_data
from datarax.bench.timing import block, epoch_rate, first_batch_seconds, row
from datarax.core.element import Element
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig

NUM_RECORDS = 50_000
BATCH = 256


def normalize(element: Element, key: jax.Array | None = None) -> Element:
    return element.update_data({"image": element.data["image"] / 255.0})


def augment(element: Element, key: jax.Array) -> Element:
    key1, _ = jax.random.split(key)
    flip = jax.random.bernoulli(key1, 0.5)
    new_image = jax.lax.cond(flip, lambda img: jnp.flip(img, axis=1), lambda img: img, element.data["image"])
    return element.update_data({"image": new_image})


class Merge(nnx.Module):
    def __call__(self, augmented, clean):
        return {"image": (augmented["image"] + clean["image"]) / 2, "label": clean["label"]}


def build_pipeline(data: dict, seed: int = 0) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data)
    normalizer = ElementOperator(ElementOperatorConfig(stochastic=False), fn=normalize)
    augmenter = ElementOperator(ElementOperatorConfig(stochastic=True), fn=augment, rngs=nnx.Rngs(seed))
    return Pipeline.from_dag(
        source=source, nodes={"augment": augmenter, "normalize": normalizer, "merge": Merge()},
        edges={"augment": [], "normalize": [], "merge": ["augment", "normalize"]}, sink="merge",
        batch_size=BATCH)


def build_floor(n: int, seed: int = 0):
    key = jax.random.key(seed)

    def one(image, record_key):
        flip = jax.random.bernoulli(jax.random.split(record_key)[0], 0.5)
        flipped = jnp.where(flip, image[:, ::-1], image)
        return (flipped + image / 255.0) / 2

    @jax.jit
    def step(images, labels, idx, epoch):
        base = jax.random.fold_in(key, epoch)
        keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(idx)
        return {"image": jax.vmap(one)(jnp.take(images, idx, axis=0), keys), "label": jnp.take(labels, idx, axis=0)}

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
    return [row("dag", ours, floor, records=n, batch_size=BATCH,
                first_batch_s=round(build_s + first, 3), floor_first_batch_s=round(floor_first, 3))]
