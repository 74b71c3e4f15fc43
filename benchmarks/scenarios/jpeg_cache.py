"""`jpeg_cache`: the `jpeg` scenario's epochs read from a decode-once cache vs from the JPEG files.

Data: the `jpeg` scenario's folder of 4,000 JPEGs of 200-500 px (`--scale` scales the count).
Both sides run the same stages (`DecodeImage(size=128, crop="random_resized", scale=(0.08, 1),
ratio=(3/4, 4/3))` + float + flip + ImageNet normalisation, batch 64) in a datarax `Pipeline`:

* datarax (cached): `materialize(ImageFolderSource(...), max_side=MAX_SIDE, format=FORMAT)` once,
  then epochs over the `MaterializedSource`;
* floor (uncached): epochs over the `ImageFolderSource` itself.

Epochs alternate between the sides (`interleaved_rates`); `materialize_s` is the one-off cost
of writing the cache (rewritten fresh every run), `cache_bytes` its size on disk and
`source_bytes` the JPEG files'. `ratio` is cached / uncached.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from flax import nnx

from benchmarks.peers.common import JPEG_MEAN, JPEG_RATIO, JPEG_SCALE, JPEG_SIZE, JPEG_STD
from benchmarks.registry import BenchOptions
from benchmarks.scenarios.jpeg import BATCH, NUM_RECORDS, image_folder, to_float
from benchmarks.timing import first_batch_seconds, interleaved_rates, row
from datarax import Pipeline
from datarax.host import DecodeImage, materialize
from datarax.operators import MapOperator, MapOperatorConfig
from datarax.operators.image import HorizontalFlipConfig, HorizontalFlipOperator, NormalizeConfig, NormalizeOperator
from datarax.sources import ImageFolderSource

MAX_SIDE = 160
FORMAT = "raw"


def build(source, seed: int = 0) -> Pipeline:
    stages = [DecodeImage(size=JPEG_SIZE, crop="random_resized", scale=JPEG_SCALE, ratio=JPEG_RATIO, seed=seed),
              MapOperator(MapOperatorConfig(fields=("image",)), fn=to_float),
              HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(seed)),
              NormalizeOperator(NormalizeConfig(mean=JPEG_MEAN, std=JPEG_STD))]
    return Pipeline(source, stages, batch_size=BATCH)


def run(options: BenchOptions, max_side: int = MAX_SIDE, fmt: str = FORMAT) -> list[dict]:
    n = options.records(NUM_RECORDS)
    source = ImageFolderSource(root=image_folder(n), shuffle=True, seed=0)
    directory = os.path.join(tempfile.gettempdir(), f"datarax-bench-jpeg-cache-n{n}-{max_side}-{fmt}")
    shutil.rmtree(directory, ignore_errors=True)
    start = time.perf_counter()
    cache = materialize(source, directory, max_side=max_side, format=fmt)
    materialize_s = time.perf_counter() - start
    sides = {"cached": build(cache), "uncached": build(source)}
    firsts = {}
    for name, pipeline in sides.items():
        firsts[name] = first_batch_seconds(lambda p=pipeline: p)
        for _ in pipeline:  # the rest of the warm-up epoch
            pass
    rates = interleaved_rates({name: (lambda p=p: p) for name, p in sides.items()}, n, options.repeats)
    manifest = cache.manifest
    for pipeline in sides.values():
        pipeline.source.close()
    return [row("jpeg_cache", rates["cached"], rates["uncached"], records=n, sides="datarax=cached floor=uncached",
                materialize_s=round(materialize_s, 3), max_side=max_side, format=fmt,
                cache_bytes=sum(s["bytes"] for s in manifest["shards"]),
                source_bytes=sum(os.path.getsize(p) for p in source.paths),
                first_batch_s={k: round(v, 3) for k, v in firsts.items()}, batch_size=BATCH, threads=os.cpu_count())]
