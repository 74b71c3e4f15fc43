"""`hf_parquet`: a local parquet dataset (50,000 x 32x32x3 uint8 image + int32 label), shuffled, batch 256.

Both sides read the same `datasets.Dataset` (loaded from 4 parquet files into HF's memory-mapped
Arrow cache) in the same shuffled order (datarax's Feistel permutation of each epoch), and every
batch ends as `jax.Array`s on the default device.

* datarax: `Pipeline(HFSource(mode="lazy"))`: rows taken from the Arrow table per batch and
  turned into arrays without a Python object per row. (`mode="eager"`, reported beside it,
  converts the table once and gathers on the device.)
* datasets (the peer): `ds.select(order).with_format("numpy").iter(batch_size=256)`, HF's own
  batched numpy reading over the same order.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import jax
import numpy as np

from benchmarks.registry import BenchOptions
from benchmarks.timing import epoch_rate, first_batch_seconds, row
from datarax import Pipeline
from datarax.samplers.simple import ShuffleSampler
from datarax.sources.hf import HFSource, HFSourceConfig, load_files

NUM_RECORDS = 50_000
BATCH = 256
FILES = 4


def write_parquet(root: str, n: int, seed: int = 0) -> list[str]:
    import datasets

    rng = np.random.default_rng(seed)
    features = datasets.Features({"image": datasets.Array3D((32, 32, 3), "uint8"), "label": datasets.Value("int32")})
    paths = []
    for i, part in enumerate(np.array_split(np.arange(n), FILES)):
        table = {"image": rng.integers(0, 256, (len(part), 32, 32, 3), dtype=np.uint8),
                 "label": rng.integers(0, 10, len(part), dtype=np.int32)}
        paths.append(os.path.join(root, f"train-{i:05d}.parquet"))
        datasets.Dataset.from_dict(table, features=features).to_parquet(paths[-1])
    return paths


def hf_rate(ds, n: int, repeats: int, seed: int = 0) -> dict:
    sampler = ShuffleSampler(n, seed=seed)
    numpy_ds = ds.with_format("numpy")
    rates = []
    for epoch in range(repeats + 1):  # the first epoch warms up
        order = sampler.indices(np.arange(n), epoch)
        start = time.perf_counter()
        last = None
        for batch in numpy_ds.select(order).iter(batch_size=BATCH):
            last = jax.device_put(batch)
        jax.block_until_ready(last)
        if epoch:
            rates.append(n / (time.perf_counter() - start))
    return {"el_s": statistics.median(rates), "el_s_runs": [round(r, 1) for r in rates]}


def datarax_rate(ds, n: int, repeats: int, mode: str) -> tuple[dict, float]:
    start = time.perf_counter()
    pipeline = Pipeline(HFSource(HFSourceConfig(shuffle=True, seed=0, mode=mode), dataset=ds), batch_size=BATCH)
    first = time.perf_counter() - start + first_batch_seconds(lambda: pipeline)
    for _ in pipeline:  # the rest of the warm-up epoch
        pass
    return epoch_rate(lambda: pipeline, n, repeats), first


def run(options: BenchOptions) -> list[dict]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only
    n = options.records(NUM_RECORDS)
    with tempfile.TemporaryDirectory(prefix="datarax-hf-parquet-") as root:
        ds = load_files(write_parquet(root, n), cache_dir=os.path.join(root, "cache"))
        lazy, lazy_first = datarax_rate(ds, n, options.repeats, "lazy")
        eager, eager_first = datarax_rate(ds, n, options.repeats, "eager")
        peer = hf_rate(ds, n, options.repeats)
    return [row("hf_parquet", lazy, peer, records=n, batch_size=BATCH, files=FILES, peer="datasets .iter(batch_size)",
                datarax_mode="lazy", first_batch_s=round(lazy_first, 3), eager_el_s=round(eager["el_s"], 1),
                eager_ratio=round(eager["el_s"] / peer["el_s"], 3), eager_first_batch_s=round(eager_first, 3))]
