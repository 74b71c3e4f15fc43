"""`cifar_builtin`'s pipeline at `batches_per_dispatch` 1, 2, 4, 8 and 16, epochs interleaved.

    python benchmarks/tpu/dispatch_k.py

Prints JSON lines (each side's first epoch, then its records/s) and appends them to the results
(`benchmarks.record`).
"""
import sys
import time

import jax
from flax import nnx

from benchmarks import record
from benchmarks.scenarios.cifar import BATCH, make_data
from benchmarks.timing import interleaved_rates
from datarax import Pipeline
from datarax.operators import ToFloatConfig, ToFloatOperator
from datarax.operators.image import (
    HorizontalFlipConfig,
    HorizontalFlipOperator,
    NormalizeConfig,
    NormalizeOperator,
    RandomCropConfig,
    RandomCropOperator,
)
from datarax.sources import MemorySource, MemorySourceConfig

data = make_data(50_000)
emit = record.Recorder(record.command_line("python benchmarks/tpu/dispatch_k.py", sys.argv[1:])).emit


def build(k):
    stages = [ToFloatOperator(ToFloatConfig(field="image")),
              RandomCropOperator(RandomCropConfig(size=32, padding=4, pad_mode="reflect"), rngs=nnx.Rngs(0)),
              HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(1)),
              NormalizeOperator(NormalizeConfig(mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616)))]
    return Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=0), data=data), stages, batch_size=BATCH,
                    batches_per_dispatch=k)


sides = {}
for k in (1, 2, 4, 8, 16):
    p = build(k)
    t = time.perf_counter()
    jax.block_until_ready(list(p))
    emit(probe="batches_per_dispatch_first_epoch", k=k, first_epoch_s=round(time.perf_counter() - t, 2))
    sides[f"k{k}"] = lambda p=p: p
rates = interleaved_rates(sides, 50_000, 3)
for name, r in rates.items():
    emit(probe="batches_per_dispatch", side=name, **r)
