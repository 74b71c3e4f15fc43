"""`python -m benchmarks.dispatch_sweep [--repeats N]`: microseconds per batch over `dispatch_ahead`.

The `overhead` scenario's tokens pipeline (16,384 x 128 int32, shuffled, batch 8) at
`dispatch_ahead` 0, 1, 2 and 4, each feeding a small jitted step (a 128x256 matmul and a mean)
either blocked on every step (`synced`, as a loop that logs its loss does) or not (`unsynced`).
The depths are timed in alternating epochs. This is the measurement behind the default
(docs/benchmarks.md, "Per-batch overhead").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import interleaved_rates
from datarax import Pipeline
from datarax.sources import MemorySource, MemorySourceConfig

DEPTHS = (0, 1, 2, 4)
RECORDS, SEQ, BATCH = 16_384, 128, 8


def sweep(repeats: int, records: int = RECORDS) -> dict[str, dict[int, float]]:
    """`{"synced": {depth: us per batch}, "unsynced": {...}}`."""
    data = {"tokens": np.random.default_rng(0).integers(0, 32_000, (records, SEQ), dtype=np.int32)}
    weights = jax.device_put(np.random.default_rng(1).standard_normal((SEQ, 256), np.float32) / 1e4)
    consume = jax.jit(lambda w, batch: jnp.mean(batch["tokens"].astype(jnp.float32) @ w))
    pipelines = {d: Pipeline(MemorySource(MemorySourceConfig(shuffle=True), data=data), batch_size=BATCH,
                             dispatch_ahead=d) for d in DEPTHS}

    def synced(batches):
        for batch in batches:
            loss = consume(weights, batch)
            loss.block_until_ready()
            yield loss

    def unsynced(batches):
        for batch in batches:
            yield consume(weights, batch)

    out = {}
    for name, mode in (("synced", synced), ("unsynced", unsynced)):
        for pipeline in pipelines.values():  # warm-up epochs (compile)
            for _ in mode(pipeline):
                pass
        rates = interleaved_rates({d: (lambda d=d: mode(pipelines[d])) for d in DEPTHS}, records, repeats)
        out[name] = {d: round(1e6 * BATCH / rates[d]["el_s"], 1) for d in DEPTHS}
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dispatch_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed epochs per depth (the median is reported)")
    args = parser.parse_args(argv)
    results = sweep(args.repeats)
    for name, by_depth in results.items():
        print(f"{name:>8}: " + ", ".join(f"dispatch_ahead={d}: {us} us/batch" for d, us in by_depth.items()))
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
