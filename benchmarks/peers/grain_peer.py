"""Grain, the way its documentation builds a training input pipeline.

`MapDataset.source(...).shuffle(seed).repeat()` (a fresh permutation every epoch), per-record
`RandomMap` transforms in numpy with the `np.random.Generator` Grain hands each record,
`.batch(B)`, then `to_iter_dataset()`. One iterator runs for the whole measurement, as in a training loop; an
"epoch" is `ceil(N / B)` consecutive batches.

Settings chosen on this 2-core machine (measured, see docs/benchmarks.md (Peers)): Grain's default
`ReadOptions` (a pool of 16 reader threads) in-process beat `mp_prefetch` with 1 or 2 worker
processes for both scenarios: the per-record work is short, and worker processes add pickling of
every batch plus a copy of the dataset per worker. `PeerOptions.workers` switches to `mp_prefetch`.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from benchmarks.peers.common import (
    CIFAR_PAD,
    Loader,
    PeerOptions,
    augment_chain_numpy,
    cifar_augment_numpy,
    jpeg_pillow,
    jpeg_turbo,
    pillow_crop_resize,
    require,
    turbo_crop_resize,
)

NAME = "grain"
INSTALL = "pip install grain"
LABELS = {"jpeg_variant": "grain[simplejpeg]"}  # the framework column of a variant's row
MODULE = "grain"


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


def augment_chain_random_map(element: dict, rng: np.random.Generator) -> dict:
    """The augment_chain work on one record (numpy and scipy.ndimage), randomness from Grain."""
    image = element["image"]
    noise = rng.standard_normal(image.shape, dtype=np.float32)
    return {"image": augment_chain_numpy(image, rng.random(6), noise), "label": element["label"]}


def jpeg_random_map(element: dict, rng: np.random.Generator) -> dict:
    """The jpeg work on one file with Pillow (Grain runs it on its reader threads)."""
    return {"image": jpeg_pillow(str(element["path"]), rng), "label": element["label"]}


def _absl_flags_parsed() -> None:
    """Grain's worker processes read absl flags; outside an absl app they were never parsed."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _loader(data: dict[str, np.ndarray], options: PeerOptions, transform: Any) -> Loader:
    grain = require(MODULE, NAME, INSTALL)
    n, batch = len(next(iter(data.values()))), options.batch_size
    dataset = grain.MapDataset.source(ArraySource(data)).shuffle(seed=options.seed).repeat()
    if transform is not None:
        dataset = dataset.random_map(transform, seed=options.seed)
    iterable = dataset.batch(batch).to_iter_dataset()
    workers = options.workers or 0
    if workers > 0:
        _absl_flags_parsed()
        iterable = iterable.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    iterator = iter(iterable)
    steps = math.ceil(n / batch)
    settings = (f"MapDataset.shuffle.repeat{'.random_map' if transform else ''}.batch.to_iter_dataset()"
                + (f".mp_prefetch(num_workers={workers})" if workers else " (default ReadOptions: 16 threads)"))
    return Loader(lambda: itertools.islice(iterator, steps), settings, close=getattr(iterator, "close", lambda: None))


def cifar(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    return _loader(data, options, cifar_random_map)


def tokens(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    return _loader(data, options, None)


def augment_chain(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    return _loader(data, options, augment_chain_random_map)


def jpeg(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    loader = _loader(data, options, jpeg_random_map)
    loader.quality = pillow_crop_resize
    return loader


def jpeg_variant_random_map(element: dict, rng: np.random.Generator) -> dict:
    """The jpeg work with the fastest decoder a Grain user can plug in (`jpeg_turbo`)."""
    return {"image": jpeg_turbo(str(element["path"]), rng), "label": element["label"]}


def jpeg_variant(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    require("simplejpeg", NAME, "pip install simplejpeg opencv-python-headless")
    loader = _loader(data, options, jpeg_variant_random_map)
    loader.settings += ", random_map: simplejpeg at DCT scale + cv2.resize(INTER_LINEAR)"
    loader.quality = turbo_crop_resize
    return loader


WORKLOADS = {"cifar": cifar, "tokens": tokens, "augment_chain": augment_chain, "jpeg": jpeg,
             "jpeg_variant": jpeg_variant}
