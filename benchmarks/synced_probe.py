"""The `overhead_synced` loop outside the benchmark: datarax's tokens pipeline and a bare jitted gather,
each feeding a jitted consumer blocked on every batch; medians of 9 alternating epochs, in us a batch.

    python benchmarks/synced_probe.py LABEL

Run it from the tree to measure with that tree first on PYTHONPATH (benchmarks/ab_trees.sh does the
same for `python -m benchmarks`), alternating trees to compare them.
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from datarax import Pipeline
from datarax.sources import MemorySource, MemorySourceConfig

RECORDS, BATCH = 50_000, 256


def main(label: str) -> None:
    data = {"tokens": np.random.default_rng(0).integers(0, 32_000, (RECORDS, 128), dtype=np.int32)}
    weights = jax.device_put(np.random.default_rng(1).standard_normal((128, 256), np.float32) / 1e4)
    consume = jax.jit(lambda w, batch: jnp.mean(batch["tokens"].astype(jnp.float32) @ w))
    pipeline = Pipeline(source=MemorySource(MemorySourceConfig(shuffle=True, seed=0), data=data), batch_size=BATCH)
    order = jnp.asarray(np.random.default_rng(0).permutation(RECORDS).astype(np.int32))
    stored = jnp.asarray(data["tokens"])
    gather = jax.jit(lambda a, i, s: {"tokens": a[jax.lax.dynamic_slice(i, (s * BATCH,), (BATCH,))]})

    def datarax_epoch() -> int:
        count = 0
        for batch in pipeline:
            consume(weights, batch).block_until_ready()
            count += 1
        return count

    def floor_epoch() -> int:
        for step in range(RECORDS // BATCH):
            consume(weights, gather(stored, order, step)).block_until_ready()
        return RECORDS // BATCH

    sides = {"datarax": datarax_epoch, "floor": floor_epoch}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for epoch in sides.values():  # compile
        epoch()
    for _ in range(9):
        for name, epoch in sides.items():
            start = time.perf_counter()
            batches = epoch()
            times[name].append((time.perf_counter() - start) / batches * 1e6)
    ours, floor = statistics.median(times["datarax"]), statistics.median(times["floor"])
    print(f"{label} datarax med {ours:.1f}  floor med {floor:.1f}  diff {ours - floor:.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this tree")
