"""`DecodeImage(executor="processes")` with its chunks sent through one shared queue or one pipe a
worker (`WorkerPool.transport`), rounds interleaved, beside `decode_limit[processes]`.

    python benchmarks/tpu/decode_transport.py [--rounds 3] [--epochs 2]

Each round and transport builds the `jpeg` scenario's pipeline afresh (its own worker pool: the
transport is fixed when a pool starts), runs one epoch to warm up, then times `--epochs` epochs.
One JSON line per (round, side) and a median line per side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import record  # noqa: E402
from benchmarks.scenarios.jpeg import NUM_RECORDS, ProcessLimit, build_pipeline, image_folder  # noqa: E402
from datarax.control.processes import WorkerPool  # noqa: E402
from datarax.sources import ImageFolderSource  # noqa: E402


def epoch_rate(batches, n: int) -> float:
    t = time.perf_counter()
    for batch in batches:
        pass
    image = batch["image"] if isinstance(batch, dict) else None
    if image is not None and hasattr(image, "block_until_ready"):
        image.block_until_ready()
    return n / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    emit = record.Recorder(record.command_line("python benchmarks/tpu/decode_transport.py", sys.argv[1:])).emit
    n = max(64, int(NUM_RECORDS * args.scale))
    root = image_folder(n)
    limit = ProcessLimit(list(ImageFolderSource(root=root).paths))
    for _ in limit.epoch(0):
        pass
    rates: dict[str, list[float]] = {}
    epoch = 1
    for r in range(args.rounds):
        for transport in ("queue", "pipes"):
            WorkerPool.transport = transport
            pipeline = build_pipeline(root)
            epoch_rate(pipeline, n)  # warm-up: workers started, programs compiled
            for _ in range(args.epochs):
                side = f"datarax[processes, {transport}]"
                rate = epoch_rate(pipeline, n)
                rates.setdefault(side, []).append(rate)
                emit(side=side, round=r, records_per_s=round(rate, 1))
            pipeline.close()
            for _ in range(args.epochs):
                rate = epoch_rate(limit.epoch(epoch), n)
                epoch += 1
                rates.setdefault("decode_limit[processes]", []).append(rate)
                emit(side="decode_limit[processes]", round=r, records_per_s=round(rate, 1))
    limit.close()
    bound = statistics.median(rates["decode_limit[processes]"])
    for side, runs in rates.items():
        emit(side=side, median_records_per_s=round(statistics.median(runs), 1),
             vs_limit=round(statistics.median(runs) / bound, 3), runs=[round(x, 1) for x in runs], records=n)


if __name__ == "__main__":
    main()
