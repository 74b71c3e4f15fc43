"""`tokens`: 200,000 x 128 int32 tokens, shuffled, no transform, batch 1024.

Floor: device-resident gather in one jitted function, fed a precomputed permutation per epoch.
The two sides are timed in alternating epochs.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.registry import BenchOptions
from benchmarks.timing import block, first_batch_seconds, gather_floor, interleaved_rates, row
from datarax import Pipeline
from datarax.sources import MemorySource, MemorySourceConfig

NUM_RECORDS = 200_000
SEQ = 128
BATCH = 1024


def make_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"tokens": np.random.default_rng(seed).integers(0, 32_000, (n, SEQ), dtype=np.int32)}


def run(options: BenchOptions) -> list[dict]:
    n = options.records(NUM_RECORDS)
    data = make_data(n)
    start = time.perf_counter()
    pipeline = Pipeline(source=MemorySource(MemorySourceConfig(shuffle=True, seed=0), data=data), batch_size=BATCH)
    build_s = time.perf_counter() - start
    first = first_batch_seconds(lambda: pipeline)
    for _ in pipeline:
        pass

    epoch_iter = gather_floor(data["tokens"], BATCH)
    floor_first = first_batch_seconds(lambda: epoch_iter(0))
    block(list(epoch_iter(0)))
    counter = iter(range(1, 10**6))
    rates = interleaved_rates({"datarax": lambda: pipeline, "floor": lambda: epoch_iter(next(counter))}, n,
                              options.repeats)
    return [row("tokens", rates["datarax"], rates["floor"], records=n, batch_size=BATCH,
                first_batch_s=round(build_s + first, 3), floor_first_batch_s=round(floor_first, 3))]
