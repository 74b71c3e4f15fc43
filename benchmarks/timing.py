"""Timing helpers shared by benchmark scenarios: medians over repeats, blocking on results."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def block(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def epoch_rate(run_epoch: Callable[[], Iterable[Any]], num_records: int, repeats: int) -> dict:
    """Times `repeats` full epochs (each result blocked on at the end) and returns el/s stats.

    `run_epoch()` returns an iterable of batches; the clock stops after the last one is ready.
    """
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        block(last_batch(run_epoch()))
        rates.append(num_records / (time.perf_counter() - start))
    return {"el_s": statistics.median(rates), "el_s_runs": [round(r, 1) for r in rates]}


def first_batch_seconds(make_iterator: Callable[[], Iterable[Any]]) -> float:
    start = time.perf_counter()
    block(next(iter(make_iterator())))
    return time.perf_counter() - start


def last_batch(batches: Iterable[Any]) -> Any:
    """Runs through `batches`, keeping only the last (None when there is none)."""
    last = None
    for last in batches:
        pass
    return last


def build_to_first_batch(build: Callable[[], Any]) -> tuple[float, Any]:
    """`(seconds, pipeline)`: from calling `build()` (a pipeline's construction) to its first batch
    being ready. The batch's iterator is closed; iterating the pipeline again starts its next epoch."""
    start = time.perf_counter()
    pipeline = build()
    iterator = iter(pipeline)
    block(next(iterator))
    seconds = time.perf_counter() - start
    iterator.close()
    return seconds, pipeline


def rebuild_seconds(build: Callable[[], Any]) -> float:
    """`build_to_first_batch` of one more pipeline, closed after: what a user who builds the same
    pipeline again (each epoch, evaluation or notebook cell) waits once the first one compiled."""
    seconds, pipeline = build_to_first_batch(build)
    pipeline.close()
    return seconds


def row(scenario: str, datarax: dict, floor: dict, **extra: Any) -> dict:
    """One result line: datarax and its floor side by side, with their ratio."""
    out = {"scenario": scenario, "datarax_el_s": round(datarax["el_s"], 1), "floor_el_s": round(floor["el_s"], 1),
           "ratio": round(datarax["el_s"] / floor["el_s"], 3)}
    out.update({"datarax_runs": datarax["el_s_runs"], "floor_runs": floor["el_s_runs"]})
    out.update(extra)
    out["backend"] = jax.default_backend()
    return out


def permuted_batches(n: int, batch: int, seed: int, epoch: int):
    """`(indices, num_valid)` of each batch of a NumPy permutation of `n` records for `epoch`; the
    last short batch is padded by repeating its last index (a floor's one compiled shape)."""
    perm = np.random.default_rng((seed, epoch)).permutation(n).astype(np.int32)
    for start in range(0, n, batch):
        idx = perm[start:start + batch]
        yield (idx if len(idx) == batch else np.pad(idx, (0, batch - len(idx)), mode="edge")), len(idx)


def trimmed(out: Any, valid: int, batch: int) -> Any:
    """A batch's output with only its `valid` rows (every leaf sliced when the batch was padded)."""
    return out if valid == batch else jax.tree.map(lambda x: x[:valid], out)


def keyed_gather_floor(per_record: Callable[[Any, Any], Any] | None, n: int, batch: int, seed: int = 0,
                       batch_fn: Callable[[Any, Any, Any], Any] | None = None):
    """The hand-written floor for an image scenario over device-resident `{"image", "label"}` data.

    One jitted function per batch does the gather, derives each record's key as
    `fold_in(fold_in(key(seed), epoch), record)` and applies `per_record(image, key)` under vmap
    (or `batch_fn(images, keys, epoch)`, for a floor that structures the batch itself; give
    exactly one); it is fed a NumPy permutation per epoch, and the last short batch is padded and
    sliced (no recompile), which is exactly the work a datarax pipeline for the scenario must do.
    Returns `epoch_iter(arrays, epoch)`, an iterator over that epoch's batches.
    """
    if (per_record is None) == (batch_fn is None):
        raise ValueError("keyed_gather_floor takes exactly one of per_record and batch_fn")
    key = jax.random.key(seed)

    @jax.jit
    def step(images, labels, idx, epoch):
        base = jax.random.fold_in(key, epoch)
        keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(idx)
        gathered = jnp.take(images, idx, axis=0)
        image = jax.vmap(per_record)(gathered, keys) if batch_fn is None else batch_fn(gathered, keys, epoch)
        return {"image": image,
                "label": jnp.take(labels, idx, axis=0)}

    def epoch_iter(arrays, epoch):
        for idx, valid in permuted_batches(n, batch, seed, epoch):
            yield trimmed(step(arrays["image"], arrays["label"], idx, epoch), valid, batch)

    return epoch_iter


def gather_floor(tokens: np.ndarray, batch: int, seed: int = 0):
    """The floor of an untransformed shuffled pipeline over one device-resident array: one
    jitted `jnp.take` per batch, fed a NumPy permutation per epoch, the last short batch padded
    and sliced. Returns `epoch_iter(epoch)`, an iterator over that epoch's `{"tokens": ...}` batches."""
    n = len(tokens)
    on_device = jax.device_put(tokens)
    step = jax.jit(lambda t, idx: {"tokens": jnp.take(t, idx, axis=0)})

    def epoch_iter(epoch):
        for idx, valid in permuted_batches(n, batch, seed, epoch):
            yield trimmed(step(on_device, idx), valid, batch)

    return epoch_iter


def interleaved_rates(sides: dict[str, Callable[[], Iterable[Any]]], num_records: int, repeats: int
                      ) -> dict[str, dict]:
    """Times one epoch of each side in turn, `repeats` times; `epoch_rate`-style stats per side.

    Alternating keeps a slow spell of a shared machine from landing on one side only.
    """
    runs: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, run_epoch in sides.items():
            runs[name].append(epoch_rate(run_epoch, num_records, 1)["el_s"])
    return {name: {"el_s": statistics.median(rates), "el_s_runs": [round(r, 1) for r in rates]}
            for name, rates in runs.items()}


def pipeline_vs_floor(scenario: str, build_pipeline: Callable[[], Any], data: dict, epoch_iter, repeats: int,
                      **extra: Any) -> dict:
    """Times a freshly built pipeline against its `keyed_gather_floor`, epochs interleaved; one `row`.

    The pipeline's first batch includes building it (construction + compile), `first_batch_s`;
    `rebuild_first_batch_s` is the same for a second pipeline built after it with the same stages.
    Each side runs a warm-up epoch first.
    """
    n = len(next(iter(data.values())))
    first, pipeline = build_to_first_batch(build_pipeline)
    block(last_batch(pipeline))  # the rest of the warm-up epoch, finished before the rebuild is timed
    rebuild = rebuild_seconds(build_pipeline)

    arrays = {k: jax.device_put(v) for k, v in data.items()}
    floor_first = first_batch_seconds(lambda: epoch_iter(arrays, 0))
    block(list(epoch_iter(arrays, 0)))
    counter = iter(range(1, 10**6))
    rates = interleaved_rates({"datarax": lambda: pipeline, "floor": lambda: epoch_iter(arrays, next(counter))},
                              n, repeats)
    return row(scenario, rates["datarax"], rates["floor"], records=n, first_batch_s=round(first, 3),
               rebuild_first_batch_s=round(rebuild, 3), floor_first_batch_s=round(floor_first, 3), **extra)
