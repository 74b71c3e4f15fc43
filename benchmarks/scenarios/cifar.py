"""`cifar`: 50,000 x 32x32x3 uint8, shuffled, random crop (reflect-pad 4) + flip + normalise, batch 256.

Rows:

* `cifar` `datarax`: the augmentation as a user's per-record function (`ElementOperator`);
* `cifar` `floor`: one hand-written jitted function doing the device-resident gather and the
  same per-record transform (data passed as an argument, last batch padded), fed a precomputed
  permutation per epoch;
* `cifar_builtin` `datarax`: the same work with datarax's own operators (`ToFloatOperator`,
  `RandomCropOperator(size=32, padding=4, pad_mode="reflect")`, `HorizontalFlipOperator`,
  `NormalizeOperator`), beside the same floor;
* `cifar_builtin` `limit`: the fastest hand-written program found for the floor's exact output
  (`benchmarks.limits`: 32 batches per program; per-record code, or selection matrices on
  lane-dense data);
* on an accelerator, host-side peers feeding it as their users do (`benchmarks.peers.runner.host_rows`):
  a plain NumPy loader on every host core, Grain at its default and with a worker process per
  core, and tf.data when TensorFlow is installed, each batch `device_put` to the chip.

Each `datarax` row has `first_batch_s`, construction of a fresh pipeline to its first batch
(compiles included), and `rebuild_first_batch_s`, the same for a second pipeline of the same
stages built after the first (its programs come from the process-wide cache).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import limits
from benchmarks.peers.runner import holds_accelerator, host_rows
from benchmarks.registry import BenchOptions
from benchmarks.timing import keyed_gather_floor, pipeline_vs_floor
from datarax import Pipeline
from datarax.core.element import Element
from datarax.operators import ElementOperator, ElementOperatorConfig, ToFloatConfig, ToFloatOperator
from datarax.operators.image import (
    HorizontalFlipConfig,
    HorizontalFlipOperator,
    NormalizeConfig,
    NormalizeOperator,
    RandomCropConfig,
    RandomCropOperator,
)
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


def build_builtin_pipeline(data: dict, seed: int = 0, drop_remainder: bool = False) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data)
    stages = [ToFloatOperator(ToFloatConfig(field="image")),
              RandomCropOperator(RandomCropConfig(size=32, padding=4, pad_mode="reflect"), rngs=nnx.Rngs(seed)),
              HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(seed + 1)),
              NormalizeOperator(NormalizeConfig(mean=tuple(MEAN.tolist()), std=tuple(STD.tolist())))]
    return Pipeline(source=source, stages=stages, batch_size=BATCH, drop_remainder=drop_remainder)


def draws(keys: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`augment_image`'s crop offsets and flips, for a batch of record keys."""
    def one(key):
        k_crop, k_flip = jax.random.split(key)
        dy, dx = jax.random.randint(k_crop, (2,), 0, 9)
        return dy, dx, jax.random.bernoulli(k_flip)

    return jax.vmap(one)(keys)


def limit_candidates(data: dict, seed: int = 0) -> dict:
    """`name -> (per_batch(arrays, idx, epoch), arrays)` computing the floor's exact output."""
    keys = limits.keyed(seed)
    labels = jax.device_put(data["label"])
    records = jax.device_put(data["image"])
    dense = jax.device_put(data["image"].reshape(len(data["image"]), -1))

    def per_record(arrays, idx, epoch):
        images = jax.vmap(augment_image)(jnp.take(arrays["image"], idx, axis=0), keys(idx, epoch))
        return {"image": images, "label": jnp.take(arrays["label"], idx)}

    def selection(arrays, idx, epoch):
        images = jnp.take(arrays["image"], idx, axis=0).reshape(-1, 32, 32, 3).astype(jnp.float32) / 255.0
        dy, dx, flip = draws(keys(idx, epoch))
        out = limits.selection_crop_flip(images, dy, dx, flip, pad=4)
        return {"image": (out - MEAN) / STD, "label": jnp.take(arrays["label"], idx)}

    return {"per-record code": (per_record, {"image": records, "label": labels}),
            "selection matrices on lane-dense data": (selection, {"image": dense, "label": labels})}


def check_against_floor(data: dict, seed: int = 0):
    idx = np.random.default_rng(seed).permutation(len(data["label"]))[:BATCH].astype(np.int32)
    keys = limits.keyed(seed)(jnp.asarray(idx), 0)
    want = np.asarray(jax.jit(jax.vmap(augment_image))(jnp.asarray(data["image"][idx]), keys))

    def check(per_batch, arrays):
        got = np.asarray(jax.jit(per_batch)(arrays, idx, np.int32(0))["image"])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5,
                                   err_msg="a limit candidate's output is not the floor's")

    return check


HOST_PEERS = (("numpy", "numpy (host)", None), ("grain", "grain (host)", None),
              ("grain", "grain (host, a worker per core)", os.cpu_count()), ("tfdata", "tf.data (host)", None))


def run(options: BenchOptions) -> list[dict]:
    data = make_data(options.records(NUM_RECORDS))
    n = len(data["label"])
    floor = keyed_gather_floor(augment_image, n, BATCH)
    user = pipeline_vs_floor("cifar", lambda: build_pipeline(data), data, floor, options.repeats, batch_size=BATCH)
    builtin = pipeline_vs_floor("cifar_builtin", lambda: build_builtin_pipeline(data), data, floor, options.repeats,
                                batch_size=BATCH)
    limit = limits.limit_row("cifar_builtin", limit_candidates(data), check_against_floor(data), n, BATCH,
                             options.repeats)
    limit.update(ratio_to_datarax=round(limit["el_s"] / builtin["datarax_el_s"], 3),
                 ratio_to_floor=round(limit["el_s"] / builtin["floor_el_s"], 3))
    builtin["settings"] = f"built-in operators; {builtin['datarax_el_s'] / limit['el_s']:.3f}x the limit row"
    hosts = host_rows("cifar", data, builtin, options.repeats, HOST_PEERS, BATCH) if holds_accelerator() else []
    for row in hosts:
        row["scenario"] = "cifar_builtin"
    return [user, builtin, limit, *hosts]
