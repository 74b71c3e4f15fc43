"""How busy `DecodeImage(executor="processes")`'s workers can be under two schedules, simulated.

    python benchmarks/tpu/schedule_sim.py [--workers 2,13] [--cv 0.38] [--batch 64] [--batches 400]

Per-record costs are drawn from a gamma distribution with mean 1 and coefficient of variation
`cv` (0.38: measured per record over 1,024 of the `jpeg` scenario's files on the 2-core machine,
2026-12-06). Each batch is cut into one contiguous block of rows per worker. `blocks` is the
schedule before commit ea1890b: worker i takes block i, and a batch starts only when the one
before it is done. `queue` is the schedule after it: the blocks of up to two batches in flight go
through one queue, the next free worker takes the next block, and batch b + 2 is queued when
batch b is done. Prints the share of the workers' time spent working (1.0: never idle).
"""

from __future__ import annotations

import argparse
import heapq

import numpy as np


def blocks_of(costs: np.ndarray, batch: int, workers: int) -> list[list[float]]:
    edges = np.linspace(0, batch, min(workers, batch) + 1).astype(int)
    return [[float(costs[b * batch + lo:b * batch + hi].sum()) for lo, hi in zip(edges[:-1], edges[1:])]
            for b in range(len(costs) // batch)]


def busy_blocks(batches: list[list[float]], workers: int) -> float:
    """One block per worker, a barrier between batches."""
    elapsed = sum(max(blocks) for blocks in batches)
    return sum(map(sum, batches)) / (workers * elapsed)


def busy_queue(batches: list[list[float]], workers: int, in_flight: int = 2) -> float:
    """The blocks of `in_flight` batches in one queue; batch b + in_flight is queued when b is done."""
    free = [0.0] * workers  # when each worker is next free
    queued = [0.0] * len(batches)  # when each batch's blocks were queued
    done = [0.0] * len(batches)
    for b, blocks in enumerate(batches):
        if b >= in_flight:
            queued[b] = max(done[:b - in_flight + 1])
        for cost in blocks:
            start = max(heapq.heappop(free), queued[b])
            heapq.heappush(free, start + cost)
            done[b] = max(done[b], start + cost)
    return sum(map(sum, batches)) / (workers * max(done))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="2,13")
    parser.add_argument("--cv", type=float, default=0.38)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=400)
    args = parser.parse_args()
    costs = np.random.default_rng(0).gamma(1 / args.cv**2, args.cv**2, args.batch * args.batches)
    for workers in map(int, args.workers.split(",")):
        batches = blocks_of(costs, args.batch, workers)
        blocks, queue = busy_blocks(batches, workers), busy_queue(batches, workers)
        print(f"{workers} workers: blocks {blocks:.3f}, queue {queue:.3f}")


if __name__ == "__main__":
    main()
