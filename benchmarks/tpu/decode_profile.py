"""Where a JPEG epoch's time goes: the pipeline at its defaults beside `decode_limit[processes]`.

    python benchmarks/tpu/decode_profile.py [--scale 1.0] [--epochs 2]

The `jpeg` scenario's files and pipeline. For each side, one JSON line per timed epoch: records/s,
the CPU seconds of the main process and of the worker processes over the epoch, and the workers'
busy share (their CPU seconds over wall time x workers): a side whose workers are busy well under
1.0 is held back by its main process or its hand-offs, not by decoding. Also the construction to
first batch of a pipeline built while the first is alive (`rebuild_first_batch_s`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil  # noqa: E402

from benchmarks.scenarios.jpeg import NUM_RECORDS, ProcessLimit, build_pipeline, image_folder, reader_ms  # noqa: E402
from benchmarks.timing import block  # noqa: E402
from datarax.sources import ImageFolderSource  # noqa: E402


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU seconds, its live children's)."""
    me = psutil.Process()
    own = me.cpu_times()
    children = 0.0
    for child in me.children(recursive=True):
        try:
            t = child.cpu_times()
            children += t.user + t.system
        except psutil.Error:
            pass
    return own.user + own.system, children


def profile(name: str, epoch, n: int, workers: int) -> dict:
    main0, kids0 = cpu_seconds()
    start = time.perf_counter()
    block(list(epoch()))
    wall = time.perf_counter() - start
    main1, kids1 = cpu_seconds()
    return {"side": name, "el_s": round(n / wall, 1), "wall_s": round(wall, 3), "main_cpu_s": round(main1 - main0, 3),
            "workers_cpu_s": round(kids1 - kids0, 3), "workers_busy": round((kids1 - kids0) / (wall * workers), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    n = max(64, int(NUM_RECORDS * args.scale))
    root = image_folder(n)
    workers = os.cpu_count() or 1
    start = time.perf_counter()
    pipeline = build_pipeline(root)
    next(iter(pipeline))
    first = time.perf_counter() - start
    start = time.perf_counter()
    again = build_pipeline(root)
    next(iter(again))
    rebuild = time.perf_counter() - start
    stage = pipeline.source.stages[0]
    print(json.dumps({"executor": str(stage.executor), "first_batch_s": round(first, 3),
                      "rebuild_first_batch_s": round(rebuild, 3)}), flush=True)
    again.close()
    limit = ProcessLimit(list(ImageFolderSource(root=root).paths))
    deeper = ProcessLimit(list(ImageFolderSource(root=root).paths), ahead=4)
    block(list(limit.epoch(0)))
    block(list(deeper.epoch(0)))
    for _ in pipeline:  # the warm-up epoch's rest
        pass
    for e in range(args.epochs):
        print(json.dumps(profile("datarax", lambda: pipeline, n, workers)), flush=True)
        print(json.dumps(profile("decode_limit[processes]", lambda e=e: limit.epoch(e + 1), n, workers)), flush=True)
        print(json.dumps(profile("decode_limit[processes, 4 ahead]", lambda e=e: deeper.epoch(e + 1), n, workers)),
              flush=True)
    print(json.dumps({"reader_ms_per_batch": reader_ms(pipeline)}), flush=True)
    pipeline.close()
    limit.close()
    deeper.close()


if __name__ == "__main__":
    main()
