"""`dag`: the README's two-branch DAG (flip augment + normalise, merged by averaging) on cifar data.

50,000 x 32x32x3 uint8, shuffled, batch 256: `augment` (random horizontal flip per record) and
`normalize` (/255) each consume the source batch, and a plain `Merge` module averages them.

Floor: one hand-written jitted function doing the device-resident gather, the per-record keyed
flip, the normalisation and the average (data passed as an argument, last batch padded), fed a
precomputed permutation per epoch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.registry import BenchOptions
from benchmarks.scenarios.cifar import make_data
from benchmarks.timing import keyed_gather_floor, pipeline_vs_floor
from datarax import Pipeline
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


def floor_record(image: jax.Array, record_key: jax.Array) -> jax.Array:
    """The DAG's work for one record, written by hand: keyed flip of the raw image, averaged with /255."""
    flip = jax.random.bernoulli(jax.random.split(record_key)[0], 0.5)
    flipped = jnp.where(flip, image[:, ::-1], image)
    return (flipped + image / 255.0) / 2


def run(options: BenchOptions) -> list[dict]:
    data = make_data(options.records(NUM_RECORDS))
    floor = keyed_gather_floor(floor_record, len(data["label"]), BATCH)
    return [pipeline_vs_floor("dag", lambda: build_pipeline(data), data, floor, options.repeats, batch_size=BATCH)]
