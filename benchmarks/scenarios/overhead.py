"""`overhead`: the per-batch host cost of the iterator, on programs too short to hide it.

Two rows, both device-resident, shuffled, batch 8, so the device work per batch is tiny and the
time per batch is almost all host work (Python, dispatch):

* `overhead_tokens`: 65,536 x 128 int32 tokens, no stages. Floor: a bare jitted gather called
  with the same inputs (the device-resident tokens and each batch's indices from a precomputed
  permutation).
* `overhead_chain4`: 16,384 x 32x32x3 float32 images through a 4-stage chain (random crop with
  reflect padding 4, horizontal flip, brightness 0.2, contrast 0.2), built from the
  `datarax.operators.image` classes. Floor: one hand-written jitted function doing the gather,
  a key per record and the same maths (`keyed_gather_floor`).

* `overhead_synced`: the tokens pipeline feeding a consumer that waits on every step, as a loop
  that logs its loss each step does: a small jitted step (a 128x256 matmul of the batch and a
  mean) whose result is blocked on before the next `next()`. datarax runs with its default
  `dispatch_ahead` and, in the note, with `dispatch_ahead=0`; the floor is the bare jitted gather
  feeding the same step. This is the measurement behind the default.

Each row's note gives microseconds per batch for datarax and the floor and their difference
(datarax's overhead beyond the floor). The sides are timed in alternating epochs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.registry import BenchOptions
from benchmarks.timing import block, gather_floor, interleaved_rates, keyed_gather_floor, pipeline_vs_floor, row
from datarax import Pipeline
from datarax.batching import DISPATCH_AHEAD
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
from datarax.operators.image.functional import color, geometry
from datarax.sources import MemorySource, MemorySourceConfig

BATCH = 8
TOKENS = (65_536, 128)
IMAGES = (16_384, 32)
PAD, MAX_DELTA = 4, 0.2


def tokens_row(options: BenchOptions) -> dict:
    n = options.records(TOKENS[0])
    data = {"tokens": np.random.default_rng(0).integers(0, 32_000, (n, TOKENS[1]), dtype=np.int32)}
    pipeline = Pipeline(source=MemorySource(MemorySourceConfig(shuffle=True, seed=0), data=data), batch_size=BATCH)
    for _ in pipeline:  # warm-up epoch (compiles)
        pass
    epoch_iter = gather_floor(data["tokens"], BATCH)
    block(list(epoch_iter(0)))
    counter = iter(range(1, 10**6))
    rates = interleaved_rates({"datarax": lambda: pipeline, "floor": lambda: epoch_iter(next(counter))}, n,
                              options.repeats)
    return with_overhead(row("overhead_tokens", rates["datarax"], rates["floor"], records=n, batch_size=BATCH))


def chain_record(image: jax.Array, key: jax.Array) -> jax.Array:
    """The four stages for one record, written by hand."""
    side = image.shape[0]
    k_crop, k_rest = jax.random.split(key)
    offsets = jax.random.randint(k_crop, (2,), 0, 2 * PAD + 1)
    unit = jax.random.uniform(k_rest, (3,))
    image = geometry.crop(geometry.pad(image, PAD, "reflect"), offsets[0], offsets[1], side, side)
    image = jnp.where(unit[0] < 0.5, geometry.hflip(image), image)
    image = color.adjust_brightness(image, 1.0 + MAX_DELTA * (2 * unit[1] - 1))
    return color.adjust_contrast(image, 1.0 + MAX_DELTA * (2 * unit[2] - 1))


def build_chain(data: dict, seed: int = 0) -> Pipeline:
    side = data["image"].shape[1]
    stages = [RandomCropOperator(RandomCropConfig(size=side, padding=PAD, pad_mode="reflect"), rngs=nnx.Rngs(seed)),
              HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(seed + 1)),
              BrightnessOperator(BrightnessConfig(max_delta=MAX_DELTA), rngs=nnx.Rngs(seed + 2)),
              ContrastOperator(ContrastConfig(max_delta=MAX_DELTA), rngs=nnx.Rngs(seed + 3))]
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data)
    return Pipeline(source=source, stages=stages, batch_size=BATCH)


def chain_row(options: BenchOptions) -> dict:
    n, side = options.records(IMAGES[0]), IMAGES[1]
    rng = np.random.default_rng(0)
    data = {"image": rng.random((n, side, side, 3), dtype=np.float32),
            "label": rng.integers(0, 10, (n,), dtype=np.int32)}
    floor = keyed_gather_floor(chain_record, n, BATCH)
    return with_overhead(pipeline_vs_floor("overhead_chain4", lambda: build_chain(data), data, floor, options.repeats,
                                           batch_size=BATCH))


def with_overhead(result: dict) -> dict:
    """Adds microseconds per batch for each side and datarax's overhead beyond the floor."""
    ours, floor = (1e6 * BATCH / result[k] for k in ("datarax_el_s", "floor_el_s"))
    result.update(datarax_us_per_batch=round(ours, 2), floor_us_per_batch=round(floor, 2),
                  overhead_us_per_batch=round(ours - floor, 2),
                  settings=f"{ours:.1f} us/batch vs floor {floor:.1f} us ({ours - floor:+.1f} us, "
                           f"{ours / floor:.2f}x)")
    return result


def synced_row(options: BenchOptions) -> dict:
    n = options.records(TOKENS[0] // 4)
    data = {"tokens": np.random.default_rng(0).integers(0, 32_000, (n, TOKENS[1]), dtype=np.int32)}
    weights = jax.device_put(np.random.default_rng(1).standard_normal((TOKENS[1], 256), np.float32) / 1e4)
    consume = jax.jit(lambda w, batch: jnp.mean(batch["tokens"].astype(jnp.float32) @ w))
    pipelines = {ahead: Pipeline(source=MemorySource(MemorySourceConfig(shuffle=True, seed=0), data=data),
                                 batch_size=BATCH, dispatch_ahead=ahead)
                 for ahead in sorted({0, DISPATCH_AHEAD})}
    floor_epoch = gather_floor(data["tokens"], BATCH)

    def synced(batches):
        for batch in batches:
            loss = consume(weights, batch)
            loss.block_until_ready()  # what float(loss) in a logging loop does
            yield loss

    for pipeline in pipelines.values():
        for _ in synced(pipeline):  # warm-up epochs (compile)
            pass
    block(list(synced(floor_epoch(0))))
    counter = iter(range(1, 10**6))
    sides = {"datarax": lambda: synced(pipelines[DISPATCH_AHEAD]), "ahead0": lambda: synced(pipelines[0]),
             "floor": lambda: synced(floor_epoch(next(counter)))}
    rates = interleaved_rates(sides, n, options.repeats)
    result = with_overhead(row("overhead_synced", rates["datarax"], rates["floor"], records=n, batch_size=BATCH,
                               dispatch_ahead=DISPATCH_AHEAD))
    ahead0 = 1e6 * BATCH / rates["ahead0"]["el_s"]
    result.update(ahead0_us_per_batch=round(ahead0, 2), ahead0_runs=rates["ahead0"]["el_s_runs"])
    result["settings"] += f"; dispatch_ahead=0: {ahead0:.1f} us/batch"
    return result


def run(options: BenchOptions) -> list[dict]:
    return [tokens_row(options), chain_row(options), synced_row(options)]
