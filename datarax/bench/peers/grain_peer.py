"""Grain, the way its documentation builds a training input pipeline.

`MapDataset.source(...).shuffle(seed).repeat()` (a fresh permutation every epoch), per-record
`RandomMap` transforms in numpy with the `np.random.Generator` Grain hands each record,
`.batch(B)`, then `to_iter_dataset` and, for transforms worth parallelising, `mp_prefetch` with
worker processes. One iterator runs for the whole measurement, as in a training loop; an
"epoch" is `ceil(N / B)` consecutive batches.

Settings chosen on this 2-core machine (measured, see docs/benchmarks_peers.md): cifar with 2
worker processes (`mp_prefetch`) beats threads, whose numpy work contends for the GIL;
tokens, with no per-record work, is fastest in-process with a thread prefetch buffer.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from datarax.bench.peers.common import CIFAR_PAD, PeerOptions, cifar_augment_numpy, require, time_epochs

NAME = "grain"
INSTALL = "pip install grain"


class ArraySource:
    """A Grain random-access data source over a dict of equal-length arrays."""

    def __init__(self, data: dict[str, np.ndarray]):
        self._data = data
        self._length = len(next(iter(data.values())))

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[index] for k, v in self._data.items()}


def cifar_random_map(element: dict, rng: np.random.Generator) -> dict:
    """The cifar work on one record, randomness from the Generator Grain gives this record."""
    u = rng.random(3)  # one draw for crop offsets and flip: Generator calls cost ~5 us each
    span = 2 * CIFAR_PAD + 1
    image = cifar_augment_numpy(element["image"], int(u[0] * span), int(u[1] * span), bool(u[2] < 0.5))
    return {"image": image, "label": element["label"]}


def _absl_flags_parsed() -> None:
    """Grain's worker processes read absl flags; outside an absl app they were never parsed."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _run(data: dict[str, np.ndarray], options: PeerOptions, transform: Any, workers: int) -> dict:
    grain = require("grain", NAME, INSTALL)
    n, batch = len(next(iter(data.values()))), options.batch_size
    dataset = grain.MapDataset.source(ArraySource(data)).shuffle(seed=options.seed).repeat()
    if transform is not None:
        dataset = dataset.random_map(transform, seed=options.seed)
    dataset = dataset.batch(batch)
    if workers > 0:
        _absl_flags_parsed()
        iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        iterable = iterable.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=4))
    else:
        iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4))
    iterator = iter(iterable)
    steps = math.ceil(n / batch)
    result = time_epochs(lambda: itertools.islice(iterator, steps), options.repeats)
    result["settings"] = (f"MapDataset.shuffle.repeat{'.random_map' if transform else ''}.batch, "
                          + (f"mp_prefetch(num_workers={workers})" if workers else "to_iter_dataset(threads=1)"))
    return result


def run_cifar(data: dict[str, np.ndarray], options: PeerOptions) -> dict:
    return _run(data, options, cifar_random_map, 2 if options.workers is None else options.workers)


def run_tokens(data: dict[str, np.ndarray], options: PeerOptions) -> dict:
    return _run(data, options, None, 0 if options.workers is None else options.workers)


WORKLOADS = {"cifar": run_cifar, "tokens": run_tokens}
