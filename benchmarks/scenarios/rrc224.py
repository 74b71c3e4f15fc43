"""`rrc224`: random-resized crops to 224x224 of 2,048 device-resident 256x256x3 uint8 images, batch 128.

Rows (`--scale` scales the record count; the batch is at most the count):

* `rrc224` datarax: `ToFloatOperator` (float32) + `RandomResizedCropOperator(224)`, beside its
  floor: the fastest hand-written jitted program found for the same work (the device-resident
  gather, per-record keys, the box drawn as the operator draws it, `geometry.resized_crop` under
  `vmap` or the batch products of `functional.batched`), one call per batch, fed a NumPy
  permutation per epoch, the last batch padded;
* `rrc224_bf16`: the same with bfloat16 images (`ToFloatConfig(dtype="bfloat16")`);
* `resize224`: `ToFloatOperator` + `ResizeOperator(224)`, beside its floor;
* `rrc224` and `rrc224_bf16` `limit`: a hand-written program that moves the same bytes (gathers
  the batch and converts a fixed 224x224 window to float: 25 MB read and 77 MB written a batch in
  float32), at one or 32 batches a program (`benchmarks.limits`); `resize224` moves the same
  bytes as `rrc224`. It does no resampling: it bounds what any formulation can reach.

`max_err` (the datarax side) and `floor_max_err`: the largest difference from a float64 numpy
reference of the same boxes on the first records, as a fraction of the images' value range (1).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import limits
from benchmarks.registry import BenchOptions
from benchmarks.timing import interleaved_rates, keyed_gather_floor, pipeline_vs_floor
from datarax import Pipeline
from datarax.core.element import Element
from datarax.core.layout import to_storage
from datarax.core.operator import BatchContext
from datarax.operators import ToFloatConfig, ToFloatOperator
from datarax.operators.image import RandomResizedCropOperator, ResizeOperator
from datarax.operators.image.functional import batched, geometry
from datarax.sources import MemorySource, MemorySourceConfig

NUM_RECORDS, SIDE, SIZE, BATCH = 2048, 256, 224, 128
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # the operator's defaults
QUALITY_RECORDS = 8
# (scenario, image dtype, operation)
VARIANTS = (("rrc224", "float32", "crop"), ("rrc224_bf16", "bfloat16", "crop"), ("resize224", "float32", "resize"))


def make_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"image": rng.integers(0, 256, (n, SIDE, SIDE, 3), dtype=np.uint8),
            "label": rng.integers(0, 1000, (n,), dtype=np.int32)}


def make_op(operation: str, seed: int = 0):
    if operation == "crop":
        return RandomResizedCropOperator(SIZE, scale=SCALE, ratio=RATIO, rngs=nnx.Rngs(seed))
    return ResizeOperator(SIZE)


def build_pipeline(data: dict, operation: str, dtype: str, batch: int, seed: int = 0) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data)
    stages = [ToFloatOperator(ToFloatConfig(field="image", dtype=dtype)), make_op(operation, seed)]
    return Pipeline(source=source, stages=stages, batch_size=batch)


def to_float(images: jax.Array, dtype: str) -> jax.Array:
    """`ToFloatOperator`'s maths on uint8 images."""
    return images.astype(dtype) / jnp.asarray(255, dtype)


def draw_boxes(keys: jax.Array) -> jax.Array:
    """`RandomResizedCropOperator.draw` written out: `(B, 4)` boxes (top, left, height, width)."""
    def one(key):
        unit = jax.random.uniform(key, (4,))
        area = (SCALE[0] + (SCALE[1] - SCALE[0]) * unit[0]) * SIDE * SIDE
        low, high = math.log(RATIO[0]), math.log(RATIO[1])
        ratio = jnp.exp(low + (high - low) * unit[1])
        height, width = jnp.minimum(jnp.sqrt(area / ratio), SIDE), jnp.minimum(jnp.sqrt(area * ratio), SIDE)
        return jnp.stack([unit[2] * (SIDE - height), unit[3] * (SIDE - width), height, width])

    return jax.vmap(one)(keys)


def whole_images(count: int) -> jax.Array:
    return jnp.tile(jnp.asarray([[0.0, 0.0, SIDE, SIDE]], jnp.float32), (count, 1))


def floor_candidates(operation: str, dtype: str) -> dict:
    """`name -> batch_fn(images, keys, epoch)`: hand-written programs for the scenario's work."""
    def per_record(images, keys, epoch):
        boxes = draw_boxes(keys) if operation == "crop" else whole_images(len(keys))
        return jax.vmap(lambda im, box: geometry.resized_crop(im, box, SIZE, SIZE))(to_float(images, dtype), boxes)

    def products(images, keys, epoch):
        x = to_float(images, dtype)
        if operation == "resize":
            return batched.resize(x, SIZE, SIZE)
        return batched.resized_crop(x, draw_boxes(keys), SIZE, SIZE)

    return {"per-record resized crop under vmap": per_record, "batch products (functional.batched)": products}


def np_weights(out_size: int, in_size: int, scale: float, start: float) -> np.ndarray:
    """`geometry.resample_weights` (antialiased) in float64 numpy."""
    centers = start + (np.arange(out_size) + 0.5) / scale - 0.5
    width = max(1.0 / scale, 1.0)
    weights = np.maximum(0.0, 1.0 - np.abs(np.arange(in_size)[None, :] - centers[:, None]) / width)
    total = weights.sum(1, keepdims=True)
    return weights / np.where(total > 0, total, 1.0)


def reference(images: np.ndarray, boxes: np.ndarray, size: int = SIZE) -> np.ndarray:
    """The resized crops of `boxes` in float64 numpy."""
    images, boxes = np.asarray(images, np.float64), np.asarray(boxes, np.float64)
    return np.stack([np.einsum("ah,hwc,bw->abc", np_weights(size, im.shape[0], size / h, top), im,
                               np_weights(size, im.shape[1], size / w, left), optimize=True)
                     for im, (top, left, h, w) in zip(images, boxes)])


def max_error(out: jax.Array, images: jax.Array, boxes: jax.Array) -> float:
    """The largest difference from `reference`, as a fraction of the value range (1)."""
    return float(np.max(np.abs(np.asarray(out, np.float64) - reference(np.asarray(images, np.float64), boxes))))


def datarax_error(operation: str, dtype: str, images: np.ndarray) -> float:
    op = make_op(operation)
    x = to_float(jnp.asarray(images), dtype)
    ctx = BatchContext.for_batch(len(x))
    out = nnx.jit(lambda op, x, ctx: op(Element({"image": x}), ctx).data["image"])(op, x, ctx)
    boxes = op.draw_batch(ctx, x.shape[1:])["box"] if operation == "crop" else whole_images(len(x))
    return max_error(out, x, boxes)


def floor_error(batch_fn, operation: str, dtype: str, images: np.ndarray) -> float:
    keys = limits.keyed(0)(jnp.arange(len(images), dtype=jnp.int32), 0)
    out = jax.jit(batch_fn)(jnp.asarray(images), keys, jnp.int32(0))
    boxes = draw_boxes(keys) if operation == "crop" else whole_images(len(images))
    return max_error(out, to_float(jnp.asarray(images), dtype), boxes)


def fastest_floor(candidates: dict, data: dict, batch: int) -> str:
    """The candidate with the highest rate over one timed epoch each (after a warm-up epoch)."""
    n = len(data["label"])
    arrays = {k: jax.device_put(v) for k, v in data.items()}
    sides = {}
    for name, batch_fn in candidates.items():
        epoch_iter = keyed_gather_floor(None, n, batch, batch_fn=batch_fn)
        jax.block_until_ready(list(epoch_iter(arrays, 0)))
        sides[name] = lambda epoch_iter=epoch_iter: epoch_iter(arrays, 1)
    rates = interleaved_rates(sides, n, 1)
    return max(rates, key=lambda name: rates[name]["el_s"])


def limit_candidates(data: dict, dtype: str) -> dict:
    """`name -> (per_batch(arrays, idx, epoch), arrays)`: the batch gathered and a fixed window converted."""
    labels = jax.device_put(data["label"])

    def window(arrays, idx, epoch):
        images = jnp.take(arrays["image"], idx, axis=0).reshape(-1, SIDE, SIDE, 3)
        return {"image": to_float(images[:, :SIZE, :SIZE], dtype), "label": jnp.take(arrays["label"], idx)}

    stored = to_storage(data["image"])
    out = {"fixed window + convert": (window, {"image": jax.device_put(data["image"]), "label": labels})}
    if stored.shape != data["image"].shape:
        out["fixed window + convert, lane-dense records"] = (window, {"image": jax.device_put(stored),
                                                                      "label": labels})
    return out


def check_window(batch: int, dtype: str):
    idx = np.arange(batch, dtype=np.int32)

    def check(per_batch, arrays):
        out = jax.jit(per_batch)(arrays, idx, np.int32(0))["image"]
        if out.shape != (batch, SIZE, SIZE, 3) or out.dtype != jnp.dtype(dtype):
            raise AssertionError(f"a limit candidate writes {out.shape} {out.dtype}, not the scenario's output")

    return check


def run(options: BenchOptions) -> list[dict]:
    data = make_data(options.records(NUM_RECORDS))
    n = len(data["label"])
    batch = min(BATCH, n)
    sample = data["image"][:QUALITY_RECORDS]
    limit_rows = {}
    for scenario, dtype in (("rrc224", "float32"), ("rrc224_bf16", "bfloat16")):
        limit_rows[dtype] = limits.limit_row(scenario, limit_candidates(data, dtype), check_window(batch, dtype), n,
                                             batch, options.repeats)
    rows = []
    for scenario, dtype, operation in VARIANTS:
        candidates = floor_candidates(operation, dtype)
        name = fastest_floor(candidates, data, batch)
        floor = keyed_gather_floor(None, n, batch, batch_fn=candidates[name])
        main = pipeline_vs_floor(scenario, lambda: build_pipeline(data, operation, dtype, batch), data, floor,
                                 options.repeats, batch_size=batch)
        limit = limit_rows[dtype]
        main.update(max_err=datarax_error(operation, dtype, sample),
                    floor_max_err=floor_error(candidates[name], operation, dtype, sample))
        main["settings"] = (f"{main['datarax_el_s'] / limit['el_s']:.3f}x the {limit['scenario']} limit row; "
                            f"max error vs float64: datarax {main['max_err']:.2g}, floor {main['floor_max_err']:.2g} "
                            f"of the value range; floor: {name} (the faster of {len(candidates)})")
        rows.append(main)
        if scenario == limit["scenario"]:
            limit.update(ratio_to_datarax=round(limit["el_s"] / main["datarax_el_s"], 3),
                         ratio_to_floor=round(limit["el_s"] / main["floor_el_s"], 3))
            rows.append(limit)
    return rows
