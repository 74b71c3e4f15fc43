"""A plain NumPy loader, as a user without a data framework feeds a device: whole-batch numpy
augmentation on a pool of host threads (one per core), batches computed ahead, then `device_put`.

Per batch: a fresh permutation every epoch, crop offsets and flips drawn for the batch from one
`np.random.Generator` keyed by (seed, epoch, batch), the reflect padding and crop done by one
fancy index into the uint8 batch (the same index tables as `cifar_augment_numpy`), then float
conversion and normalisation in place. numpy releases the GIL inside its array loops, so the
threads overlap on a many-core host.
"""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np

from benchmarks.peers.common import CIFAR_MEAN, CIFAR_PAD, CIFAR_STD, Loader, PeerOptions, reflect_index

NAME = "numpy"
INSTALL = "pip install numpy"
MODULE = "numpy"
LABELS: dict[str, str] = {}


def cifar_batch(images: np.ndarray, labels: np.ndarray, ids: np.ndarray, rng: np.random.Generator) -> dict:
    """The cifar work on a batch: reflect-pad 4 + random crop + random flip + normalise, in numpy."""
    count, height, width = len(ids), images.shape[1], images.shape[2]
    span = 2 * CIFAR_PAD + 1
    dy, dx = rng.integers(0, span, count), rng.integers(0, span, count)
    flip = rng.random(count) < 0.5
    rows = reflect_index(height, CIFAR_PAD)[dy[:, None] + np.arange(height)]            # (B, H)
    cols = np.where(flip[:, None], np.arange(width)[::-1], np.arange(width))
    cols = reflect_index(width, CIFAR_PAD)[dx[:, None] + cols]                           # (B, W)
    out = images[ids[:, None, None], rows[:, :, None], cols[:, None, :]].astype(np.float32)
    out *= np.float32(1 / 255) / CIFAR_STD
    out -= CIFAR_MEAN / CIFAR_STD
    return {"image": out, "label": labels[ids]}


def cifar(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    images, labels = data["image"], data["label"]
    n, batch = len(labels), options.batch_size
    threads = options.workers or os.cpu_count() or 1
    pool = concurrent.futures.ThreadPoolExecutor(threads)
    epochs = iter(range(10**9))

    def epoch():
        e = next(epochs)
        order = np.random.default_rng((options.seed, e)).permutation(n)
        jobs = [(order[s:s + batch], np.random.default_rng((options.seed, e, s))) for s in range(0, n, batch)]
        # map() submits every batch at once: the pool works ahead while earlier batches are consumed.
        yield from pool.map(lambda job: cifar_batch(images, labels, *job), jobs)

    return Loader(epoch, f"numpy whole-batch augmentation on {threads} threads, batches ahead",
                  close=lambda: pool.shutdown(wait=False, cancel_futures=True))


WORKLOADS = {"cifar": cifar}
