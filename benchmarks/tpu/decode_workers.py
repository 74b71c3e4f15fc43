"""`DecodeImage(executor="processes")` at several worker counts beside `decode_limit[processes]`.

    python benchmarks/tpu/decode_workers.py [--scale 1.0] [--repeats 2] [--workers 13,12,11,10]

The `jpeg` scenario's files and pipeline; epochs interleaved; one JSON line per side with its
records/s, its ratio to the limit and (for datarax) the reader's milliseconds a batch per part.
On a host whose cores all decode, the pipeline's own threads (the reader, the main thread) share
the cores with the workers: this shows whether fewer workers than cores decode more.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import record  # noqa: E402
from benchmarks.scenarios.jpeg import NUM_RECORDS, ProcessLimit, build_pipeline, image_folder, reader_ms  # noqa: E402
from benchmarks.timing import block, interleaved_rates  # noqa: E402
from datarax.host.image import DecodeImage  # noqa: E402
from datarax.sources import ImageFolderSource  # noqa: E402


def main() -> None:
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", default=",".join(str(max(1, cores - k)) for k in range(4)))
    parser.add_argument("--chunks", default="1", help="blocks of a batch per worker, e.g. 1,2,4 "
                        "(`DecodeImage.chunks_per_worker`), each a side of the first worker count's pipeline")
    args = parser.parse_args()
    emit = record.Recorder(record.command_line("python benchmarks/tpu/decode_workers.py", sys.argv[1:])).emit
    n = max(64, int(NUM_RECORDS * args.scale))
    root = image_folder(n)
    pipelines = {int(w): build_pipeline(root, executor="processes", num_threads=int(w))
                 for w in dict.fromkeys(args.workers.split(","))}
    limit = ProcessLimit(list(ImageFolderSource(root=root).paths))
    block(list(limit.epoch(0)))
    for pipeline in pipelines.values():  # warm-up epochs: workers started, programs compiled
        for _ in pipeline:
            pass
    counter = iter(range(1, 10**6))
    chunks = [int(c) for c in args.chunks.split(",")]

    def chunked(pipeline, per):
        DecodeImage.chunks_per_worker = per
        return pipeline

    first = next(iter(pipelines))
    sides = {"decode_limit[processes]": lambda: limit.epoch(next(counter)),
             **{f"datarax[processes, {w} workers]": (lambda p=p: chunked(p, chunks[0])) for w, p in pipelines.items()},
             **{f"datarax[processes, {first} workers, {c} chunks each]": (lambda c=c: chunked(pipelines[first], c))
                for c in chunks[1:]}}
    rates = interleaved_rates(sides, n, args.repeats)
    bound = rates["decode_limit[processes]"]["el_s"]
    for name, rate in rates.items():
        line = {"side": name, "el_s": round(rate["el_s"], 1), "vs_limit": round(rate["el_s"] / bound, 3),
                "el_s_runs": rate["el_s_runs"], "cores": cores, "records": n}
        workers = name.split(", ")[1].split(" ")[0] if name.startswith("datarax") else None
        if workers is not None:
            line["reader_ms"] = reader_ms(pipelines[int(workers)])
        emit(**line)
    limit.close()
    for pipeline in pipelines.values():
        pipeline.close()


if __name__ == "__main__":
    main()
