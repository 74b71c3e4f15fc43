"""`DecodeImage`: JPEG/PNG/WebP bytes to fixed-size uint8 RGB images, crop fused into the decode.

The crop box is chosen before decoding, so a JPEG decodes at 1/2, 1/4 or 1/8 scale when the box
allows, then resizes with one bilinear call. docs/sources.md ("Images") has the details.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from datarax.control.budget import MemoryBudget, SharedBudget, default_budget, human
from datarax.control.pool import ThreadPool
from datarax.control.processes import EXECUTORS, BatchesAhead, choose_executor, lease, row_blocks
from datarax.core.checks import (
    check_choice,
    check_field_name,
    check_numbers,
    check_positive_int,
    check_range,
    check_seed,
    check_size,
    field,
    require,
    set_field,
)
from datarax.core.construct import resolve_config
from datarax.core.errors import RecordError
from datarax.host.bit_depth import SCALE_ROWS_BYTES, is_high_depth, to_eight_bits
from datarax.host.jpeg import BACKENDS, TURBO_REVISION, TurboDecoder, resolve_backend, turbo_modules
from datarax.host.map import picklable
from datarax.host.stage import (
    ON_ERROR,
    BadRecords,
    DecodingStage,
    HostContext,
    Refusal,
    Spec,
    check_encoded_field,
)
from datarax.samplers.keyed import rekeyed_generator
from datarax.sources.file_folder import FileRef

RESIZE_MODES = ("shorter_side", "fixed", "none")
CROP_MODES = ("center", "random_resized")

_ORIENTATION_TAG = 0x0112
# Raw records up to this size are warped on the calling thread (see `DecodeImage._all_small_raw`).
INLINE_RAW_BYTES = 1 << 20
_DRAFT_SCALES = (8, 4, 2, 1)
Box = tuple[float, float, float, float]  # (left, top, right, bottom), Pillow's order


def _pillow() -> Any:
    return require("PIL.Image", owner="DecodeImage", extra="image", package="pillow")


@dataclasses.dataclass(frozen=True)
class DecodeImageConfig:
    """Configuration of `DecodeImage`.

    Attributes:
        size: the output size, an int (a square) or (height, width).
        resize: how a `crop="center"` image reaches `size`: "shorter_side" (resize, then
            centre-crop), "fixed" (resize straight to size) or "none" (must already be that size).
        crop: "center" (deterministic, per `resize`) or "random_resized" (RandomResizedCrop).
        scale: RandomResizedCrop's range of the box area as a fraction of the image area.
        ratio: RandomResizedCrop's range of the box aspect ratio (width / height).
        field: the field holding the encoded images.
        out_field: where the decoded images go (None: replace `field`; another name keeps `field`).
        num_threads: decoding threads, or worker processes under `executor="processes"` (None:
            `os.cpu_count()`); it changes no output.
        on_error: "raise" (a `RecordError` naming the record) or "skip" (write zeros, set
            `<out_field>_ok` to False and warn once per record).
        seed: the crop seed; None: the pipeline's seed.
        value_range: the (low, high) values of a 16- or 32-bit single-channel image that become 0
            and 255; None: (0, 65535) for integer modes, (0, 1) for float. A value outside it (or
            NaN) refuses the record.
        max_decode_bytes: the memory the concurrent decodes may hold at once (None: a quarter of
            host memory, at most 8 GiB); an image needing more alone is refused as a bad record.
        backend: the JPEG decoder: "turbo" (libjpeg-turbo via `simplejpeg` + OpenCV warp),
            "pillow", or "auto" (turbo when both wheels are installed). Non-JPEG, CMYK and damaged
            files always go through Pillow. Part of the fingerprint: a state saved under one
            backend does not resume under the other.
        executor: "auto" (the default), "threads" or "processes": worker processes read each
            file (from a `FileFolderSource`/`ImageFolderSource`) and decode it; they scale where
            threads do not (a gVisor sandbox's file reads, Python's share of each record). "auto"
            picks processes unless they cannot start here (`choose_executor`: one core, or a script
            that builds its pipeline outside `if __name__ == "__main__":`), and the stage's
            `executor` says which it runs and why. The same output and fingerprint either way.
    """

    size: int | tuple[int, int]
    resize: str = "shorter_side"
    crop: str = "center"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    field: str = "image"
    out_field: str | None = None
    num_threads: int | None = None
    on_error: str = "raise"
    seed: int | None = None
    backend: str = "auto"
    value_range: tuple[float, float] | None = None
    max_decode_bytes: int | None = None
    executor: str = "auto"

    def __post_init__(self):
        set_field(self, "size", check_size(*field(self, "size")))
        check_choice(*field(self, "resize"), RESIZE_MODES)
        check_choice(*field(self, "crop"), CROP_MODES)
        if self.crop == "random_resized" and self.resize == "none":
            raise ValueError("DecodeImageConfig(crop='random_resized') resizes its box to size, so resize='none' "
                             "cannot hold; leave resize at its default")
        set_field(self, "scale", check_range(*field(self, "scale"), 0.0, 1.0))
        set_field(self, "ratio", check_range(*field(self, "ratio"), 0.0, math.inf))
        check_field_name(*field(self, "field"))
        check_field_name(*field(self, "out_field"), allow_none=True)
        check_positive_int(*field(self, "num_threads"), allow_none=True, unit="threads")
        check_choice(*field(self, "on_error"), ON_ERROR)
        check_seed(*field(self, "seed"), allow_none=True)
        check_choice(*field(self, "backend"), BACKENDS)
        if self.value_range is not None:
            pair = check_numbers(*field(self, "value_range"), "a pair (low, high) of numbers")
            if len(pair) != 2 or not pair[0] < pair[1]:
                raise ValueError(f"DecodeImageConfig.value_range must be a pair (low, high) with low < high, got "
                                 f"{self.value_range!r}; e.g. (0, 4095) for 12-bit samples, or None")
            set_field(self, "value_range", pair)
        check_positive_int(*field(self, "max_decode_bytes"), allow_none=True, unit="bytes")
        check_choice(*field(self, "executor"), EXECUTORS)


def shorter_side_box(height: int, width: int, out_h: int, out_w: int) -> Box:
    """The box of a (height, width) image that torchvision's `Resize(shorter side)` + `CenterCrop` keeps."""
    if out_h * width >= out_w * height:  # the height binds: it becomes out_h
        new_h, new_w = out_h, max(out_w, int(out_h * width / height))
    else:
        new_h, new_w = max(out_h, int(out_w * height / width)), out_w
    top, left = int(round((new_h - out_h) / 2.0)), int(round((new_w - out_w) / 2.0))
    sy, sx = height / new_h, width / new_w
    return (left * sx, top * sy, (left + out_w) * sx, (top + out_h) * sy)


def random_resized_box(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                       rng: np.random.Generator) -> tuple[int, int, int, int]:
    """`(top, left, h, w)` drawn as torchvision's `RandomResizedCrop.get_params` draws it."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def pillow_bytes(mode: str, width: int, height: int, transposed: bool) -> int:
    """Peak bytes of decoding a `width` x `height` image of `mode` on the Pillow path (within 1% of
    measured peak resident memory for L, RGB, RGBA and P PNGs)."""
    pixels = width * height
    stored = 1 if mode in ("1", "L", "P") else 2 if mode.startswith("I;16") else 4
    if is_high_depth(mode):
        return pixels * (2 * stored + 2 * (1 + transposed)) + SCALE_ROWS_BYTES
    converted = 1 if mode == "L" else 4
    copies = (mode not in ("RGB", "L")) + transposed
    return pixels * (stored + copies * converted)


def image_summary(image: Any) -> str:
    """`a 9459x9459 PNG in mode RGB`: an opened image, for refusals."""
    return f"a {image.size[0]}x{image.size[1]} {image.format or 'image'} in mode {image.mode}"


def _transposes() -> dict[int, Any]:
    """EXIF orientation -> the Pillow transpose that makes the image upright (as `ImageOps.exif_transpose`)."""
    t = _pillow().Transpose
    return {2: t.FLIP_LEFT_RIGHT, 3: t.ROTATE_180, 4: t.FLIP_TOP_BOTTOM, 5: t.TRANSPOSE, 6: t.ROTATE_270,
            7: t.TRANSVERSE, 8: t.ROTATE_90}


class DecodeImage(DecodingStage):
    """Decodes encoded images into fixed-size uint8 RGB arrays (HWC), with a crop fused into the decode.

    Every mode becomes RGB, 16/32-bit gray is scaled over `value_range`, EXIF orientation applies.
    Output: `(B, h, w, 3)` uint8, plus a bool `<out_field>_ok` when `on_error="skip"`.

    Args:
        config: a `DecodeImageConfig`; or its fields as keywords, `size` also by position.

    Example:
        >>> stages = [DecodeImage(128, crop="random_resized", seed=0), HorizontalFlipOperator(rngs=nnx.Rngs(0))]
        >>> pipeline = Pipeline(ImageFolderSource("photos/train", shuffle=True), stages, batch_size=64)

    Attributes:
        skipped: records replaced by zeros so far (`on_error="skip"`).
        budget: the `MemoryBudget` the decodes share (`budget.limit` is `held_bytes()`).
    """

    work = "image_decode"
    positional = ("size",)
    # Under `executor="processes"`: blocks of a batch per worker (more: finer load balancing, more messages).
    chunks_per_worker = 1

    def __init__(self, config: DecodeImageConfig | None = None, *args: Any, **settings: Any):
        self._setup(resolve_config(DecodeImageConfig, config, settings, "DecodeImage", args=args,
                                   positional=self.positional))

    def _setup(self, config: DecodeImageConfig) -> None:
        self.config = config
        self.seed = config.seed
        self.stochastic = config.crop == "random_resized"
        self.out_field = config.out_field or config.field
        self.ok_field = f"{self.out_field}_ok" if config.on_error == "skip" else None
        self.num_threads = config.num_threads or os.cpu_count() or 1
        self.pool = ThreadPool(self.num_threads, "datarax-decode-image")
        limit = config.max_decode_bytes or default_budget()
        self._batches = None  # in worker processes: the workers' lease and the batches they decode ahead
        self.executor = choose_executor(config.executor, "DecodeImage", workers=self.num_threads)
        if self.executor.executor == "processes":
            workers = lease(DecodeJob(config), self.num_threads, "datarax-decode-image", (limit, "DecodeImage"))
            self.budget: MemoryBudget = workers.shared
            self._batches = BatchesAhead(workers, [(self.out_field, config.size + (3,), "uint8")])
            if config.out_field in (None, config.field):
                self.reads_files = config.field
        else:
            self.budget = MemoryBudget(limit, "DecodeImage")
        self.bad_records = BadRecords(config.on_error, "DecodeImage", config.field, self.ok_field,
                                      "Remove or replace the file (corrupt, truncated or not an image)")
        self._image = _pillow()
        self._transpose = _transposes()
        self.backend = resolve_backend(config.backend)
        self._turbo = TurboDecoder() if self.backend == "turbo" else None

    def output_spec(self, input_spec: Spec) -> Spec:
        check_encoded_field(input_spec, self.config.field, "DecodeImage", holds="encoded images (bytes)",
                            decoded_fix="it is already decoded, so drop DecodeImage")
        h, w = self.config.size
        spec = {**input_spec, self.out_field: jax.ShapeDtypeStruct((h, w, 3), np.uint8)}
        if self.ok_field is not None:
            spec[self.ok_field] = jax.ShapeDtypeStruct((), np.bool_)
        return spec

    def structure(self) -> str:
        # Settings that change no output stay out; pillow, an unset value_range and seed keep old fingerprints.
        config = dataclasses.replace(self.config, num_threads=None, seed=self.config.seed or 0)
        settings = ", ".join(f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
                             if f.name not in ("backend", "max_decode_bytes", "executor")
                             and not (f.name == "value_range" and config.value_range is None))
        suffix = "" if self.backend == "pillow" else f"[backend={self.backend}, revision={TURBO_REVISION}]"
        return f"DecodeImage(DecodeImageConfig({settings})){suffix}"

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (in worker processes; empty until the first batch, and after close)."""
        return [] if self._batches is None else self._batches.pool.pids

    def __call__(self, batch: dict[str, np.ndarray], ctx: HostContext) -> dict[str, np.ndarray]:
        data = batch[self.config.field]
        out = ctx.buffer(self.out_field, (len(data), *self.config.size, 3), np.uint8)
        if self._batches is not None:
            return self._in_processes(batch, data, ctx, out)

        seed = ctx.seed_of(self.seed)

        def decode(row: int) -> None:
            rng = rekeyed_generator(seed, ctx.stage, ctx.epoch, int(ctx.record_ids[row])) if self.stochastic else None
            self.decode_into(data[row], rng, out[row])

        return self.decode_rows(batch, ctx, {self.out_field: out}, decode, inline=self._all_small_raw(data))

    def ahead(self, batch: dict[str, np.ndarray], ctx: HostContext) -> None:
        """Under `executor="processes"`, the workers start on this batch (the one after the batch read
        next) once that one is in flight (`BatchesAhead`)."""
        if self._batches is not None:
            self._batches.ahead(self._key(ctx), self._chunks(batch[self.config.field], ctx))

    def _in_processes(self, batch: dict[str, np.ndarray], data: np.ndarray, ctx: HostContext,
                      out: np.ndarray) -> dict[str, np.ndarray]:
        """The batch read (where `data` holds `FileRef`s) and decoded by the worker processes, which take
        its chunks of rows from one queue and write them into shared memory; then copied into `out`."""
        results = self._batches.read(self._key(ctx), lambda: self._chunks(data, ctx), {self.out_field: out})
        failures: list[BaseException | None] = []
        for fatal, block in results:
            if fatal is not None:  # a file that cannot be read fails the batch, as the source's own read does
                raise fatal
            failures.extend(block)
        failures = [RecordError(f"DecodeImage: {ctx.where(row)} {exc}") if isinstance(exc, Refusal) else exc
                    for row, exc in enumerate(failures)]
        return self.resolve_rows(batch, ctx, {self.out_field: out}, failures)

    def _key(self, ctx: HostContext) -> tuple:
        return np.asarray(ctx.record_ids, np.int64).tobytes(), int(ctx.epoch), ctx.stage, ctx.seed_of(self.seed)

    def _chunks(self, data: np.ndarray, ctx: HostContext) -> list[tuple[int, int, tuple]]:
        """A batch's work for the workers: one contiguous block of rows per worker."""
        seed, ids = ctx.seed_of(self.seed), np.asarray(ctx.record_ids, np.int64)
        return [(low, high, (list(data[low:high]), ids[low:high], int(ctx.epoch), ctx.stage, seed))
                for low, high in row_blocks(len(data), self.num_threads * self.chunks_per_worker)]

    def _all_small_raw(self, data: np.ndarray) -> bool:
        """True when the turbo path reads every record as small raw pixels (a decode-once cache): only
        the warp is left, and threads would mostly contend for the GIL, so they run inline."""
        return self._turbo is not None and all(
            isinstance(d, bytes) and d[:2] in (b"P6", b"P5") and len(d) <= INLINE_RAW_BYTES for d in data)

    def decode(self, data: bytes, rng: np.random.Generator | None = None) -> np.ndarray:
        """One record: encoded bytes to a `(h, w, 3)` uint8 array (`rng` draws a random-resized box)."""
        out = np.empty((*self.config.size, 3), np.uint8)
        self.decode_into(data, rng, out)
        return out

    def decode_into(self, data: bytes, rng: np.random.Generator | None, out: np.ndarray) -> None:
        """One record decoded into `out`, an `(h, w, 3)` uint8 row (turbo where it reads the file, else Pillow)."""
        if self._turbo is not None:
            header = self._turbo.header(data)
            if header is not None:
                drawn = self._box(header[0], header[1], rng)
                if drawn is None:  # resize="none": the whole image, which must already have the size
                    self._check_unresized(header[0], header[1])
                box = drawn or (0, 0, header[1], header[0])
                needed = self._turbo.working_bytes(header, box, out.shape[:2])
                kind = "PPM" if header.pixels >= 0 else "JPEG"
                with self._reserve(needed, f"a {header.width}x{header.height} {kind}"):
                    decoded = self._turbo.decode_into(data, header, box, out)
                if decoded:
                    return
                # libjpeg-turbo refused it: Pillow decodes it (or reports it) with the box already drawn
                out[...] = self._decode_pillow(data, lambda height, width: drawn)
                return
        out[...] = self._decode_pillow(data, lambda height, width: self._box(height, width, rng))

    def _reserve(self, needed: int, what: str) -> Any:
        """The budget held for one decode of `needed` bytes; a `Refusal` when it can never fit."""
        if not self.budget.fits(needed):
            raise Refusal(f"needs about {human(needed)} to decode ({what}), more than the stage's "
                          f"max_decode_bytes={self.budget.limit:,} ({human(self.budget.limit)}), which all its "
                          "threads' decodes share; raise DecodeImage(max_decode_bytes=...) if the host has the "
                          "memory, or remove the file")
        return self.budget.reserve(needed)

    def _check_unresized(self, height: int, width: int) -> None:
        out_h, out_w = self.config.size
        if (height, width) != (out_h, out_w):
            raise ValueError(f"the image is {height}x{width} (h x w) but resize='none' needs {out_h}x{out_w}; "
                             "pick resize='shorter_side' or 'fixed'")

    def _decode_pillow(self, data: bytes, draw_box: Callable[[int, int], Box | None]) -> np.ndarray:
        image_module = self._image
        image = self._open(data)
        with contextlib.ExitStack() as held:
            # getexif decodes a PNG whose EXIF is not in its header, so such a PNG reserves first.
            early = image.format == "PNG" and "exif" not in image.info
            if early:
                held.enter_context(self._reserve(pillow_bytes(image.mode, *image.size, False), image_summary(image)))
            transpose, height, width = self._upright(image)
            box = draw_box(height, width)
            out_h, out_w = self.config.size
            reduce = 1
            if box is not None:
                factor = min((box[2] - box[0]) / out_w, (box[3] - box[1]) / out_h)
                wanted = next(s for s in _DRAFT_SCALES if s <= factor or s == 1)
                if wanted > 1:
                    raw_w, raw_h = image.size
                    drafted = image.draft(None, (raw_w // wanted, raw_h // wanted))
                    if drafted is not None:  # a JPEG: the box shrinks with the DCT-scaled decode
                        reduce = round(raw_w / drafted[1][2])
            if not early:  # the pixels are decoded from here on, at the drafted size
                held.enter_context(self._reserve(pillow_bytes(image.mode, *image.size, transpose is not None),
                                                 image_summary(image)))
            image = to_eight_bits(image, self.config.value_range, image_module)
            if image.mode not in ("RGB", "L"):
                image = image.convert("RGB")  # before resizing: P and 1 resize by nearest, RGBA premultiplies
            if transpose is not None:
                image = image.transpose(transpose)
            if box is not None:
                if reduce != 1:
                    box = (box[0] / reduce, box[1] / reduce, box[2] / reduce, box[3] / reduce)
                image = image.resize((out_w, out_h), image_module.Resampling.BILINEAR, box=box)
            else:
                self._check_unresized(image.size[1], image.size[0])
            if image.mode == "L":  # replicating gray after the resize is the same and a third of the work
                image = image.convert("RGB")
            return np.asarray(image)

    def _upright(self, image: Any) -> tuple[Any, int, int]:
        """`(transpose, height, width)` of an opened image: the EXIF turn that makes it upright (None)
        and its upright size."""
        orientation = image.getexif().get(_ORIENTATION_TAG, 1)
        transpose = self._transpose.get(orientation)
        width, height = image.size
        if transpose is not None and orientation >= 5:  # a quarter turn: the upright image is height x width
            width, height = height, width
        return transpose, height, width

    def draws(self, batch: dict[str, np.ndarray], ctx: HostContext) -> dict[str, np.ndarray]:
        """`{"box": int64[B, 4]}`: each record's random-resized crop as (top, left, height, width) in its
        upright image, as the decode draws it; -1s for a record whose header cannot be read (its decode
        fails and names it). Empty for a centre crop."""
        if not self.stochastic:
            return {}
        data, config, seed = batch[self.config.field], self.config, ctx.seed_of(self.seed)
        boxes = np.full((len(data), 4), -1, np.int64)
        for row in range(len(data)):
            try:
                encoded = data[row].read() if isinstance(data[row], FileRef) else data[row]
                header = self._turbo.header(encoded) if self._turbo is not None else None
                height, width = (header[0], header[1]) if header is not None else self._upright(self._open(encoded))[1:]
            except Exception:  # whatever a bad file raises; decoding it raises (or skips) it by name
                continue
            rng = rekeyed_generator(seed, ctx.stage, ctx.epoch, int(ctx.record_ids[row]))
            boxes[row] = random_resized_box(height, width, config.scale, config.ratio, rng)
        return {"box": boxes}

    def _open(self, data: bytes) -> Any:
        """Pillow's lazy open (the header only), with empty and unrecognised files said plainly."""
        if isinstance(data, (bytes, bytearray, memoryview)) and len(data) == 0:
            raise ValueError("empty file (0 bytes)")
        try:
            return self._image.open(io.BytesIO(data))
        except self._image.UnidentifiedImageError:
            # Pillow's own message names only its in-memory buffer (<_io.BytesIO object at 0x...>)
            raise self._image.UnidentifiedImageError(
                f"cannot identify image file ({len(data):,} bytes, starting {bytes(data[:16])!r})") from None

    def _box(self, height: int, width: int, rng: np.random.Generator | None) -> Box | None:
        """The source box (upright coordinates) that becomes the output; None for resize='none'."""
        config = self.config
        if config.crop == "random_resized":
            top, left, h, w = random_resized_box(height, width, config.scale, config.ratio, rng)
            return (left, top, left + w, top + h)
        if config.resize == "fixed":
            return (0, 0, width, height)
        if config.resize == "shorter_side":
            return shorter_side_box(height, width, *config.size)
        return None


class DecodeJob:
    """A worker process's part of a batch (`DecodeImage` in worker processes): read each file
    (a `FileRef`) or take its bytes, decode it into its row, and return `(fatal, failures)`: the
    exception of a file that could not be read (raised for the batch) and each row's None or error."""

    def __init__(self, config: DecodeImageConfig):
        # The seed comes with each task: stages that differ only in it share the workers (`lease`).
        self.config = dataclasses.replace(config, executor="threads", num_threads=1, seed=None)
        self.stage: DecodeImage | None = None
        self.budget: SharedBudget | None = None

    def attach(self, budget: SharedBudget) -> None:
        self.budget = budget

    def __call__(self, task: tuple, outputs: dict[str, np.ndarray]) -> tuple[BaseException | None, list]:
        if self.stage is None:
            self.stage = DecodeImage(self.config)
            if self.budget is not None:  # the stage's one budget, shared by all its workers
                self.stage.budget = self.budget
            if self.stage.backend == "turbo":  # one core a worker: OpenCV's own threads would oversubscribe
                turbo_modules()[1].setNumThreads(1)
        records, ids, epoch, stage, seed = task
        out = outputs[self.stage.out_field]
        failures: list[BaseException | None] = []
        for row, record in enumerate(records):
            try:
                data = record.read() if isinstance(record, FileRef) else record
            except Exception as exc:  # the source's own error (missing file, over max_file_bytes)
                return picklable(exc), []
            rng = rekeyed_generator(seed, stage, epoch, int(ids[row])) if self.stage.stochastic else None
            try:
                self.stage.decode_into(data, rng, out[row])
                failures.append(None)
            except Exception as exc:  # decoders raise many kinds for bad bytes; the parent names the record
                failures.append(picklable(exc))
        return None, failures
