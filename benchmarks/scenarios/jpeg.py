"""`jpeg`: decode JPEG files, random-resized-crop to 128x128, flip, normalise; batch 64.

Data: 4,000 JPEGs (`--scale` scales the count) of 200-500 px, random crops and rescales of
scikit-image's photographs, in ten class folders, written once into a cache folder under the
system temp dir keyed by the count and seed.

* datarax: `ImageFolderSource` + `DecodeImage(128, crop="random_resized")` (Pillow with
  `draft`, on a thread per core, into one buffer per batch) + float, `HorizontalFlipOperator`
  and `NormalizeOperator` in the compiled program.
* floor: the same crops (the same per-record boxes) with no framework: Pillow with `draft` on a
  pool of `os.cpu_count()` threads writing into a preallocated batch, the next batch's decodes
  queued before this batch's numpy flip and normalise, then `jax.device_put`.

Peers (`python -m benchmarks jpeg --vs tfdata,torch,grain`, each in its own process): tf.data
with `tf.image.sample_distorted_bounding_box` + `tf.io.decode_and_crop_jpeg`; the torch
DataLoader with Pillow in a `Dataset` and `os.cpu_count()` workers; Grain with a Pillow
`random_map` on its reader threads (see `benchmarks.peers.common.JPEG_*`).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.peers.common import JPEG_MEAN, JPEG_RATIO, JPEG_SCALE, JPEG_SIZE, JPEG_STD
from benchmarks.registry import BenchOptions
from benchmarks.timing import block, first_batch_seconds, interleaved_rates, row
from datarax import Pipeline
from datarax.host import DecodeImage, record_generator
from datarax.host.image import random_resized_box
from datarax.operators import MapOperator, MapOperatorConfig
from datarax.operators.image import HorizontalFlipConfig, HorizontalFlipOperator, NormalizeConfig, NormalizeOperator
from datarax.sources import ImageFolderSource

NUM_RECORDS = 4000
BATCH = 64
CLASSES = 10
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "retina", "hubble_deep_field",
          "immunohistochemistry")
CACHE_VERSION = 1


def image_folder(n: int, seed: int = 0) -> str:
    """The cached folder of `n` JPEGs (written on first use; concurrent writers are safe)."""
    root = os.path.join(tempfile.gettempdir(), f"datarax-bench-jpeg-v{CACHE_VERSION}-n{n}-seed{seed}")
    if os.path.isfile(os.path.join(root, "DONE")):
        return root
    from PIL import Image
    from skimage import data as photos

    sources = [Image.fromarray(getattr(photos, name)()).convert("RGB") for name in PHOTOS]
    rng = np.random.default_rng(seed)
    staging = tempfile.mkdtemp(prefix="datarax-bench-jpeg-", dir=tempfile.gettempdir())
    for i in range(n):
        photo = sources[i % len(sources)]
        side = rng.uniform(0.4, 1.0)
        w, h = max(32, int(photo.width * side * rng.uniform(0.8, 1.0))), max(32, int(photo.height * side))
        left, top = int(rng.integers(0, photo.width - w + 1)), int(rng.integers(0, photo.height - h + 1))
        longer = int(rng.integers(200, 501))
        factor = longer / max(w, h)
        size = (max(16, round(w * factor)), max(16, round(h * factor)))
        image = photo.resize(size, Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        folder = os.path.join(staging, f"class{i % CLASSES:02d}")
        os.makedirs(folder, exist_ok=True)
        image.save(os.path.join(folder, f"{i:06d}.jpg"), quality=int(rng.integers(80, 96)))
    open(os.path.join(staging, "DONE"), "w").close()
    try:
        os.rename(staging, root)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return root


def make_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The peers' data: every file's path and label, in the source's record order."""
    source = ImageFolderSource(image_folder(n, seed))
    return {"path": np.array(source.paths), "label": np.asarray(source.labels)}


def to_float(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32) / 255.0


def build_pipeline(root: str, seed: int = 0) -> Pipeline:
    stages = [DecodeImage(JPEG_SIZE, crop="random_resized", scale=JPEG_SCALE, ratio=JPEG_RATIO, seed=seed),
              MapOperator(MapOperatorConfig(fields=("image",)), fn=to_float),
              HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(seed)),
              NormalizeOperator(NormalizeConfig(mean=JPEG_MEAN, std=JPEG_STD))]
    return Pipeline(ImageFolderSource(root, shuffle=True, seed=seed), stages, batch_size=BATCH)


class Floor:
    """The decode floor: Pillow with draft on a thread per core, numpy flip and normalise, no framework."""

    def __init__(self, paths: list[str], labels: np.ndarray, seed: int = 0):
        from PIL import Image

        self.image, self.paths, self.labels, self.seed = Image, paths, labels, seed
        self.pool = concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1)
        self.scale = np.float32(1 / 255) / np.asarray(JPEG_STD, np.float32)
        self.offset = np.asarray(JPEG_MEAN, np.float32) / np.asarray(JPEG_STD, np.float32)

    def decode(self, path: str, record: int, epoch: int, out: np.ndarray) -> None:
        image = self.image.open(path)
        width, height = image.size
        top, left, h, w = random_resized_box(height, width, JPEG_SCALE, JPEG_RATIO,
                                             record_generator(self.seed, 0, epoch, record))
        factor = min(w, h) / JPEG_SIZE
        reduce = next(s for s in (8, 4, 2, 1) if s <= factor or s == 1)
        if reduce > 1:
            image.draft(None, (width // reduce, height // reduce))
        box = (left / reduce, top / reduce, (left + w) / reduce, (top + h) / reduce)
        image = image.convert("RGB").resize((JPEG_SIZE, JPEG_SIZE), self.image.Resampling.BILINEAR, box=box)
        out[...] = np.asarray(image)

    def submit(self, ids: np.ndarray, epoch: int):
        out = np.empty((len(ids), JPEG_SIZE, JPEG_SIZE, 3), np.uint8)
        futures = [self.pool.submit(self.decode, self.paths[r], r, epoch, out[i]) for i, r in enumerate(ids.tolist())]
        return ids, out, futures

    def finish(self, ids: np.ndarray, out: np.ndarray, futures, epoch: int) -> dict:
        for f in futures:
            f.result()
        flips = np.random.default_rng((self.seed, epoch, int(ids[0]))).random(len(ids)) < 0.5
        out[flips] = out[flips, :, ::-1]
        image = out.astype(np.float32)
        image *= self.scale
        image -= self.offset
        return jax.device_put({"image": image, "label": self.labels[ids]})

    def epoch(self, epoch: int):
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self.paths))
        batches = [order[i:i + BATCH] for i in range(0, len(order), BATCH)]
        pending = self.submit(batches[0], epoch)
        for nxt in batches[1:] + [None]:
            queued = None if nxt is None else self.submit(nxt, epoch)  # decode ahead while this batch finishes
            yield self.finish(*pending, epoch)
            pending = queued


def run(options: BenchOptions) -> list[dict]:
    n = options.records(NUM_RECORDS)
    root = image_folder(n)
    start = time.perf_counter()
    pipeline = build_pipeline(root)
    build_s = time.perf_counter() - start
    first = first_batch_seconds(lambda: pipeline)
    for _ in pipeline:  # the rest of the warm-up epoch
        pass
    source = ImageFolderSource(root)
    floor = Floor(list(source.paths), np.asarray(source.labels))
    floor_first = first_batch_seconds(lambda: floor.epoch(0))
    block(list(floor.epoch(0)))
    counter = iter(range(1, 10**6))
    rates = interleaved_rates({"datarax": lambda: pipeline, "floor": lambda: floor.epoch(next(counter))}, n,
                              options.repeats)
    floor.pool.shutdown()
    return [row("jpeg", rates["datarax"], rates["floor"], records=n, first_batch_s=round(build_s + first, 3),
                floor_first_batch_s=round(floor_first, 3), batch_size=BATCH, threads=os.cpu_count())]
