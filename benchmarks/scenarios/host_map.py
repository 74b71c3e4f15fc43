"""`host_map`: a GIL-bound pure-Python per-record function in a `HostMap`, processes vs threads.

Data: 2,000 records of 4,096 int32 (`--scale` scales the count) in a host-resident
`MemorySource`, batch 64. The function walks each record's values in a Python loop (a rolling
hash and a running maximum), the kind of per-record Python a custom decoder or parser runs.

* datarax: `HostMap(fn=fn, executor="processes", num_workers=2)` (worker processes writing into
  shared memory);
* floor: the same stage with `executor="threads", num_workers=2`.

Epochs alternate between the sides; `ratio` is processes / threads. Both give bitwise equal
batches (checked on the first batch before timing).
"""

from __future__ import annotations

import numpy as np

from benchmarks.registry import BenchOptions
from benchmarks.timing import first_batch_seconds, interleaved_rates, row
from datarax import Pipeline
from datarax.host import HostMap
from datarax.sources import MemorySource, MemorySourceConfig

NUM_RECORDS = 2000
LENGTH = 4096
BATCH = 64
WORKERS = 2
OUTPUTS = {"summary": ((3,), np.int64)}


def python_summary(record: dict, rng: None) -> dict:
    """A rolling hash, a running maximum and a count, in plain Python (holds the GIL throughout)."""
    digest, peak, rises, last = 0, -(2**31), 0, 0
    for value in record["x"].tolist():
        digest = (digest * 1_000_003 + value) & 0xFFFFFFFF
        peak = value if value > peak else peak
        rises += value > last
        last = value
    return {"summary": np.array([digest, peak, rises], np.int64)}


def build(data: dict, executor: str) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=0, device_resident=False), data=data)
    stage = HostMap(fn=python_summary, outputs=OUTPUTS, fields=("x",), executor=executor, num_workers=WORKERS)
    return Pipeline(source, [stage], batch_size=BATCH)


def run(options: BenchOptions) -> list[dict]:
    n = options.records(NUM_RECORDS)
    data = {"x": np.random.default_rng(0).integers(0, 2**20, (n, LENGTH)).astype(np.int32)}
    sides = {"processes": build(data, "processes"), "threads": build(data, "threads")}
    firsts = {name: first_batch_seconds(lambda p=p: p) for name, p in sides.items()}
    first = [next(iter(p)) for p in sides.values()]
    if not np.array_equal(np.asarray(first[0]["summary"]), np.asarray(first[1]["summary"])):
        raise AssertionError("host_map: processes and threads disagree on the first batch")
    for pipeline in sides.values():
        for _ in pipeline:  # a warm-up epoch
            pass
    rates = interleaved_rates({name: (lambda p=p: p) for name, p in sides.items()}, n, options.repeats)
    for pipeline in sides.values():
        pipeline.source.close()
    return [row("host_map", rates["processes"], rates["threads"], records=n, sides="datarax=processes floor=threads",
                workers=WORKERS, record_length=LENGTH, batch_size=BATCH,
                first_batch_s={k: round(v, 3) for k, v in firsts.items()})]
