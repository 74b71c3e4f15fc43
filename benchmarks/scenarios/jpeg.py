"""`jpeg`: decode JPEG files, random-resized-crop to 128x128, flip, normalise; batch 64.

Data: 4,000 JPEGs (`--scale` scales the count) of 200-500 px, random crops and rescales of
scikit-image's photographs, in ten class folders, written once into a cache folder under the
system temp dir keyed by the count and seed.

Rows, all timed in this process with their epochs interleaved:

* `datarax`: `ImageFolderSource` + `DecodeImage(size=128, crop="random_resized")` at its defaults
  (libjpeg-turbo at DCT scale + one bilinear warp of the box when `simplejpeg` and OpenCV are
  installed, else Pillow; `executor="auto"`, which is a worker process per core that reads and
  decodes the files wherever they can start), then float, `HorizontalFlipOperator` and
  `NormalizeOperator` in the compiled program.
* `floor`: the same per-record work (the same boxes, the same decoder) with no framework: a pool
  of `os.cpu_count()` threads writing into a preallocated batch, the next batch's decodes queued
  before this batch's numpy flip and normalise, then `jax.device_put`.
* `datarax[pillow]`: the pipeline with `DecodeImage(backend="pillow")` (Pillow `draft` + resize).
* `decode_limit`: the hardware's limit for this data: each file read and decoded by
  libjpeg-turbo at the DCT scale its box allows, on all cores, nothing else (no resize, no flip,
  no normalisation, no device copy).
* `floor[full_scale]`: the floor with every file decoded at full size (no DCT scaling): what
  decoding only what the crop needs is worth.
* `datarax[threads]`: the pipeline with `DecodeImage(executor="threads")`: the reader reads the
  files and a thread per core decodes them.
* `decode_limit[processes]`: `decode_limit` in `os.cpu_count()` worker processes that read and
  decode the files (each batch split across a process pool), for hosts where one process's file
  reads do not run in parallel (a gVisor sandbox: docs/tpu.md).
* `decode_limit[1 thread]`: `decode_limit` on one thread, the rate the two limits are given as
  a multiple of (how decoding scales with the host's cores).
* `ceiling[processes]`: `DecodeImage`'s own per-record work (read, box, decode, warp into the
  128x128 row) in `os.cpu_count()` worker processes, each given its share of the epoch at once: no
  batches, no waiting on one another, no copies, nothing else in the process: what no loader doing
  this same work can beat on this host (the `datarax` row is that work inside a pipeline; a loader
  doing less, e.g. decoding only the crop's window, is not bound by it).

The `datarax` row's `first_batch_s` is construction of a fresh pipeline to its first batch
(compiles included), its `rebuild_first_batch_s` the same for a second pipeline of the same stages
built after the first (its programs come from the process-wide cache; its files are listed and its
decoding threads started again).

`psnr_db` (median; `psnr_p10_db`, 10th percentile) compares each side's uint8 crops with an
accurate reference of the same boxes (full decode, the box, Lanczos), on the first 256 files.

Peers (`python -m benchmarks jpeg --vs tfdata,torch,grain`, each in its own process), each at
its users' default and with one variant: tf.data `sample_distorted_bounding_box` +
`decode_and_crop_jpeg` + `tf.image.resize` at its default (antialias=False) and antialiased;
the torch DataLoader with Pillow in a `Dataset`, and with `torchvision.io.decode_jpeg` +
`transforms.v2.RandomResizedCrop`; Grain with a Pillow `random_map`, and with simplejpeg at DCT
scale + `cv2.resize` (see `benchmarks.peers.common`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.peers.common import JPEG_MEAN, JPEG_RATIO, JPEG_SCALE, JPEG_SIZE, JPEG_STD, jpeg_psnr
from benchmarks.peers.runner import Recipe
from benchmarks.registry import BenchOptions
from benchmarks.timing import (
    block,
    build_to_first_batch,
    first_batch_seconds,
    interleaved_rates,
    last_batch,
    rebuild_seconds,
    row,
)
from datarax import Pipeline
from datarax.host import DecodeImage
from datarax.host.image import random_resized_box
from datarax.host.jpeg import TurboDecoder
from datarax.host.stage import record_generator
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
    source = ImageFolderSource(root=image_folder(n, seed))
    return {"path": np.array(source.paths), "label": np.asarray(source.labels)}


def to_float(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32) / 255.0


def build_pipeline(root: str, seed: int = 0, backend: str = "auto", executor: str = "auto",
                   num_threads: int | None = None) -> Pipeline:
    stages = [DecodeImage(size=JPEG_SIZE, crop="random_resized", scale=JPEG_SCALE, ratio=JPEG_RATIO, seed=seed,
                          backend=backend, executor=executor, num_threads=num_threads),
              MapOperator(MapOperatorConfig(fields=("image",)), fn=to_float),
              HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(seed)),
              NormalizeOperator(NormalizeConfig(mean=JPEG_MEAN, std=JPEG_STD))]
    return Pipeline(ImageFolderSource(root=root, shuffle=True, seed=seed), stages, batch_size=BATCH)


def dct_scale(box_h: int, box_w: int) -> int:
    """The largest of 8, 4, 2, 1 that keeps the box at least the output size (DecodeImage's rule)."""
    factor = min(box_h, box_w) / JPEG_SIZE
    return next(s for s in (8, 4, 2, 1) if s <= factor or s == 1)


class Floor:
    """The work with no framework: per-record decode on a thread per core into a preallocated
    batch, numpy flip and normalise, `jax.device_put`; the next batch's decodes queued first.

    `full_scale` decodes every file at full size; `decode_only` stops after the decode at the
    box's DCT scale (`decode_limit`: no resize, flip, normalisation or device copy); `threads`
    (default: one per core) is 1 for `decode_limit[1 thread]`, the rate the others scale from.
    """

    def __init__(self, paths: list[str], labels: np.ndarray, seed: int = 0, *, full_scale: bool = False,
                 decode_only: bool = False, threads: int | None = None):
        self.paths, self.labels, self.seed = paths, labels, seed
        self.full_scale, self.decode_only = full_scale, decode_only
        self.turbo = TurboDecoder()
        self.pool = concurrent.futures.ThreadPoolExecutor(threads or os.cpu_count() or 1)
        self.scale = np.float32(1 / 255) / np.asarray(JPEG_STD, np.float32)
        self.offset = np.asarray(JPEG_MEAN, np.float32) / np.asarray(JPEG_STD, np.float32)

    def decode(self, path: str, record: int, epoch: int, out: np.ndarray) -> None:
        data, header, (top, left, h, w) = read_boxed(self.turbo, path, self.seed, epoch, record)
        if self.decode_only:
            decode_at_dct_scale(self.turbo, data, header, h, w)
            return
        if self.full_scale:
            image = self.turbo.simplejpeg.decode_jpeg(data)
            out[...] = self.turbo.cv2.resize(image[top:top + h, left:left + w], (JPEG_SIZE, JPEG_SIZE),
                                             interpolation=self.turbo.cv2.INTER_LINEAR)
            return
        self.turbo.decode_into(data, header, (left, top, left + w, top + h), out)

    def submit(self, ids: np.ndarray, epoch: int):
        out = np.empty((len(ids), JPEG_SIZE, JPEG_SIZE, 3), np.uint8)
        futures = [self.pool.submit(self.decode, self.paths[r], r, epoch, out[i]) for i, r in enumerate(ids.tolist())]
        return ids, out, futures

    def finish(self, ids: np.ndarray, out: np.ndarray, futures, epoch: int) -> dict | None:
        for f in futures:
            f.result()
        if self.decode_only:
            return None
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

    def close(self) -> None:
        self.pool.shutdown()


def boxed(turbo: TurboDecoder, data: bytes, seed: int, epoch: int, record: int) -> tuple:
    """`(header, (top, left, h, w))`: a file's header and its record's random-resized box (the
    draws `DecodeImage` makes for seed 0; tested)."""
    header = turbo.header(data)
    return header, random_resized_box(header[0], header[1], JPEG_SCALE, JPEG_RATIO,
                                      record_generator(seed, 0, epoch, record))


def read_boxed(turbo: TurboDecoder, path: str, seed: int, epoch: int, record: int) -> tuple:
    """`(bytes, header, box)`: a file read, with `boxed`'s header and box."""
    with open(path, "rb") as f:
        data = f.read()
    return (data, *boxed(turbo, data, seed, epoch, record))


def decode_at_dct_scale(turbo: TurboDecoder, data: bytes, header, box_h: int, box_w: int) -> None:
    scale = dct_scale(box_h, box_w)
    turbo.simplejpeg.decode_jpeg(data, min_height=-(-header[0] // scale), min_width=-(-header[1] // scale))


def limit_decode(turbo: TurboDecoder, data: bytes, seed: int, epoch: int, record: int) -> None:
    """`decode_limit`'s work on one file's bytes: header, the record's box, decode at its DCT scale."""
    header, (_, _, h, w) = boxed(turbo, data, seed, epoch, record)
    decode_at_dct_scale(turbo, data, header, h, w)


_WORKER_TURBO: list[TurboDecoder] = []


def worker_turbo() -> TurboDecoder:
    """This worker process's decoder, made on its first chunk; OpenCV on one thread, one core a
    worker, as in DecodeImage's own workers."""
    if not _WORKER_TURBO:
        _WORKER_TURBO.append(TurboDecoder())
        _WORKER_TURBO[0].cv2.setNumThreads(1)
    return _WORKER_TURBO[0]


def decode_only_chunk(task: tuple[list[str], list[int], int, int]) -> int:
    """`decode_limit[processes]`'s work in one worker: read, header, box and DCT-scale decode."""
    turbo = worker_turbo()
    paths, records, epoch, seed = task
    for path, record in zip(paths, records):
        with open(path, "rb") as f:
            limit_decode(turbo, f.read(), seed, epoch, record)
    return len(paths)


def record_chunk(task: tuple[list[str], list[int], int, int]) -> int:
    """`ceiling[processes]`'s work in one worker: each record read, boxed and decoded into a row
    exactly as `DecodeImage` does (the floor's own step), one after another."""
    turbo = worker_turbo()
    paths, records, epoch, seed = task
    out = np.empty((JPEG_SIZE, JPEG_SIZE, 3), np.uint8)
    for path, record in zip(paths, records):
        data, header, (top, left, h, w) = read_boxed(turbo, path, seed, epoch, record)
        turbo.decode_into(data, header, (left, top, left + w, top + h), out)
    return len(paths)


class ProcessLimit:
    """`decode_limit` in `os.cpu_count()` worker processes: each batch's files split across them,
    the next batch queued before this one is waited for."""

    def __init__(self, paths: list[str], seed: int = 0, ahead: int = 1):
        self.paths, self.seed, self.workers, self.ahead = paths, seed, os.cpu_count() or 1, ahead
        self.pool = concurrent.futures.ProcessPoolExecutor(self.workers,
                                                           mp_context=multiprocessing.get_context("forkserver"))

    def submit(self, ids: np.ndarray, epoch: int) -> list:
        chunks = np.array_split(ids, min(self.workers, len(ids)))
        return [self.pool.submit(decode_only_chunk, ([self.paths[r] for r in c.tolist()], c.tolist(), epoch,
                                                     self.seed)) for c in chunks]

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(len(self.paths))

    def epoch(self, epoch: int):
        order = self.order(epoch)
        batches = [order[i:i + BATCH] for i in range(0, len(order), BATCH)]
        # `ahead` batches queued behind the one waited for
        pending = [self.submit(b, epoch) for b in batches[:self.ahead]]
        for nxt in batches[self.ahead:] + [None] * self.ahead:
            if nxt is not None:
                pending.append(self.submit(nxt, epoch))
            for f in pending.pop(0):
                f.result()
            yield None

    def close(self) -> None:
        self.pool.shutdown()


class ProcessCeiling(ProcessLimit):
    """`ceiling[processes]`: each worker process given its share of the epoch's records at once."""

    def epoch(self, epoch: int):
        order = self.order(epoch)
        shares = [s for s in np.array_split(order, self.workers) if len(s)]
        futures = [self.pool.submit(record_chunk, ([self.paths[r] for r in s.tolist()], s.tolist(), epoch, self.seed))
                   for s in shares]
        for f in futures:
            f.result()
        for _ in range(0, len(order), BATCH):
            yield None


def peer_recipe(options: BenchOptions) -> list[Recipe]:
    """Each peer at its users' default (`jpeg`) and one variant (`jpeg_variant`), beside `jpeg`."""
    n = options.records(NUM_RECORDS)
    return [Recipe(workload, f"{__name__}:make_data", n, BATCH, row="jpeg") for workload in ("jpeg", "jpeg_variant")]


@contextlib.contextmanager
def opencv_threads(cv2, threads: int):
    """OpenCV's thread count set to `threads` in the block (it is process-wide), restored after."""
    before = cv2.getNumThreads()
    cv2.setNumThreads(threads)
    try:
        yield
    finally:
        cv2.setNumThreads(before)


def work_ratio(paths: list[str], count: int = 256, rounds: int = 3) -> float:
    """How much longer `DecodeImage`'s own work on a record (decode at the DCT scale, crop, resize
    into the output) takes than `decode_limit`'s (the decode alone), on one thread, from memory:
    the median of `rounds` passes over the first `count` files. OpenCV runs on one thread here, as
    in each worker process of `DecodeImage(executor="processes")` (left to itself it would spread
    each small warp over every core). At equal parallelism and no overhead, `datarax` (in processes)
    reaches `1 / work_ratio` of `decode_limit[processes]`."""
    stage = DecodeImage(size=JPEG_SIZE, crop="random_resized", scale=JPEG_SCALE, ratio=JPEG_RATIO, backend="turbo")
    turbo, blobs, out = TurboDecoder(), [], np.empty((JPEG_SIZE, JPEG_SIZE, 3), np.uint8)
    for path in paths[:count]:
        with open(path, "rb") as f:
            blobs.append(f.read())

    def full(record: int, data: bytes) -> None:
        stage.decode_into(data, record_generator(0, 0, 0, record), out)

    def only(record: int, data: bytes) -> None:
        limit_decode(turbo, data, 0, 0, record)

    seconds = {full: [], only: []}
    with opencv_threads(turbo.cv2, 1):
        for _ in range(rounds):
            for fn in seconds:
                start = time.perf_counter()
                for record, data in enumerate(blobs):
                    fn(record, data)
                seconds[fn].append(time.perf_counter() - start)
    stage.close()
    return statistics.median(seconds[full]) / statistics.median(seconds[only])


def decode_image_psnr(paths: list[str], backend: str) -> dict[str, float]:
    """`jpeg_psnr` of `DecodeImage`'s crop of the given boxes."""
    stage = DecodeImage(size=JPEG_SIZE, crop="random_resized", scale=JPEG_SCALE, ratio=JPEG_RATIO, backend=backend)
    record_of = {path: record for record, path in enumerate(paths)}

    def crop_resize(path: str, box: tuple[int, int, int, int]) -> np.ndarray:
        with open(path, "rb") as f:  # the box is record `record_of[path]`'s for seed 0, epoch 0
            return stage.decode(f.read(), record_generator(0, 0, 0, record_of[path]))

    result = jpeg_psnr(crop_resize, paths)
    stage.close()
    return result


def run(options: BenchOptions) -> list[dict]:
    n = options.records(NUM_RECORDS)
    root = image_folder(n)
    first, pipeline = build_to_first_batch(lambda: build_pipeline(root))
    block(last_batch(pipeline))  # the rest of the warm-up epoch, finished before the rebuild is timed
    rebuild = rebuild_seconds(lambda: build_pipeline(root))
    pillow = build_pipeline(root, backend="pillow")
    threads = build_pipeline(root, executor="threads")
    source = ImageFolderSource(root=root)
    paths, labels = list(source.paths), np.asarray(source.labels)
    floors = {"floor": Floor(paths, labels), "floor[full_scale]": Floor(paths, labels, full_scale=True),
              "decode_limit": Floor(paths, labels, decode_only=True), "decode_limit[processes]": ProcessLimit(paths),
              "decode_limit[1 thread]": Floor(paths, labels, decode_only=True, threads=1),
              "ceiling[processes]": ProcessCeiling(paths)}
    floor_first = first_batch_seconds(lambda: floors["floor"].epoch(0))
    for floor in floors.values():
        block(list(floor.epoch(0)))
    for warm in (pillow, threads):
        for _ in warm:
            pass
    counters = {name: iter(range(1, 10**6)) for name in floors}
    sides = {"datarax": lambda: pipeline, "datarax[pillow]": lambda: pillow, "datarax[threads]": lambda: threads,
             **{name: (lambda name=name: floors[name].epoch(next(counters[name]))) for name in floors}}
    rates = interleaved_rates(sides, n, options.repeats)
    for floor in floors.values():
        floor.close()
    quality = {"datarax": decode_image_psnr(paths, pipeline_backend(pipeline)),
               "datarax[pillow]": decode_image_psnr(paths, "pillow")}
    quality["floor"] = quality["datarax[threads]"] = quality["datarax"]  # the same boxes, decoder (tested)
    reader = {"datarax": reader_ms(pipeline), "datarax[threads]": reader_ms(threads)}
    executor = str(pipeline.source.stages[0].executor)
    threads.close()
    main = row("jpeg", rates["datarax"], rates["floor"], records=n, first_batch_s=round(first, 3),
               rebuild_first_batch_s=round(rebuild, 3), floor_first_batch_s=round(floor_first, 3),
               batch_size=BATCH, threads=os.cpu_count(), decoder=pipeline_backend(pipeline), executor=executor,
               reader_ms_per_batch=reader["datarax"], **quality["datarax"])
    extra = []
    notes = {"datarax[pillow]": "DecodeImage(backend='pillow'): Pillow draft + resize(box), bilinear",
             "decode_limit": "libjpeg-turbo at the box's DCT scale on all cores; no resize, no framework",
             "floor[full_scale]": "the floor decoding every file at full size (no DCT scaling)",
             "datarax[threads]": "DecodeImage(executor='threads'): the reader reads the files, threads decode "
                                 "them; reader ms a batch: " + ", ".join(f"{k} {v}" for k, v in reader[
                                     "datarax[threads]"].items()),
             "decode_limit[processes]": "decode_limit's work in os.cpu_count() worker processes",
             "ceiling[processes]": "DecodeImage's per-record work (read, box, decode, warp) in os.cpu_count() "
                                   "worker processes, each given its share of the epoch at once (no batches)",
             "decode_limit[1 thread]": f"decode_limit's work on one thread; DecodeImage's own work on a record "
                                       f"(decode, crop, resize; OpenCV on one thread, as in a worker process) "
                                       f"takes {work_ratio(paths):.2f}x its decode"}
    one = rates["decode_limit[1 thread]"]["el_s"]
    for name in ("decode_limit", "decode_limit[processes]"):
        notes[name] += f"; {rates[name]['el_s'] / one:.2f}x its one-thread rate"
    for name in ("datarax[pillow]", "datarax[threads]", "decode_limit", "decode_limit[processes]",
                 "decode_limit[1 thread]", "floor[full_scale]", "ceiling[processes]"):
        extra.append({"scenario": "jpeg", "framework": name, "el_s": round(rates[name]["el_s"], 1),
                      "ratio_to_datarax": round(rates[name]["el_s"] / rates["datarax"]["el_s"], 3),
                      "ratio_to_floor": round(rates[name]["el_s"] / rates["floor"]["el_s"], 3),
                      "el_s_runs": rates[name]["el_s_runs"], "settings": notes[name], **quality.get(name, {})})
    return [main, *extra]


def reader_ms(pipeline: Pipeline) -> dict[str, float]:
    """Milliseconds a batch in each part of the pipeline's reader (source read, DecodeImage, copy to
    device), over every batch it has read: where a batch's time goes on the host."""
    return {p["name"]: round(1e3 * p["seconds"] / max(p["calls"], 1), 2) for p in pipeline.reader_timings()}


def pipeline_backend(pipeline: Pipeline) -> str:
    """The JPEG backend the pipeline's DecodeImage resolved to."""
    return next(s.backend for s in pipeline.source.stages if isinstance(s, DecodeImage))
