"""What every peer shares: the options it receives, the work it must do, and how it is timed.

The work per scenario is defined once here, so each framework does exactly the same thing:

* `cifar`: uint8 HWC image -> float in [0, 1], reflect-pad by 4, random 32x32 crop, random
  horizontal flip (p = 0.5), per-channel normalisation; label passed through; a fresh shuffle
  every epoch; batch 256.
* `tokens`: int32 token rows, a fresh shuffle every epoch, batch 1024, no transform.
* `augment_chain`: crop, flip, brightness, contrast, rotation, noise on float images (see
  `augment_chain_numpy` and `benchmarks.scenarios.augment_chain`); two image sizes.
* `jpeg`: JPEG files -> RandomResizedCrop(128, scale (0.08, 1), ratio (3/4, 4/3)) with bilinear
  (antialiased) resampling, random horizontal flip, ImageNet normalisation to float32 HWC; label
  passed through; a fresh shuffle every epoch; batch 64 (see `jpeg_pillow` and
  `benchmarks.scenarios.jpeg`).

Every batch ends as `jax.Array`s on the default device (what a JAX training step consumes), so
each peer also pays the host-to-device copy that datarax's own numbers include.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], np.float32)
CIFAR_PAD = 4


@dataclasses.dataclass(frozen=True)
class PeerOptions:
    """How a peer runs a scenario.

    Attributes:
        batch_size: records per batch (the scenario's).
        repeats: timed epochs; the median rate is reported.
        seed: shuffle and augmentation seed.
        workers: loader worker processes/threads (None: the peer's best setting for this machine).
    """

    batch_size: int
    repeats: int = 3
    seed: int = 0
    workers: int | None = None


@dataclasses.dataclass
class Loader:
    """A peer's loader for one scenario: `epoch()` yields one epoch of numpy batches.

    Attributes:
        epoch: returns an iterable over the next epoch's batches (dicts of numpy arrays).
        settings: a one-line description of the loader configuration, for the report.
        quality: for image workloads, the loader's own decode + crop + resize of one file's box
            `(top, left, h, w)` to a uint8 HWC image (no flip, no normalisation), so its output
            can be compared with an accurate reference on the same boxes (`jpeg_psnr`).
        close: stops the loader's background work (threads, worker processes), so that it takes
            no host cores from what is timed after it; nothing to do by default.
    """

    epoch: Callable[[], Iterable[dict[str, np.ndarray]]]
    settings: str
    quality: Callable[[str, tuple[int, int, int, int]], np.ndarray] | None = None
    close: Callable[[], None] = lambda: None


class MissingPeerError(ImportError):
    """The framework a peer needs is not installed."""


def require(module: str, peer: str, install: str) -> Any:
    """Imports a peer's framework, with an install hint when it is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingPeerError(f"the {peer} peer needs {module!r}: {install} (or pip install 'datarax[bench]'); "
                               f"import failed with: {exc}") from exc


def reflect_index(size: int, pad: int) -> np.ndarray:
    """Source index of each position of a reflect-padded axis (numpy's `mode="reflect"`)."""
    return np.concatenate([np.arange(pad, 0, -1), np.arange(size), np.arange(size - 2, size - 2 - pad, -1)])


@functools.lru_cache(maxsize=8)
def _cifar_tables(height: int, width: int, channels: int) -> tuple[np.ndarray, ...]:
    shape = (height, width, channels)
    # Full-size scale/offset arrays: numpy broadcasting over a last axis of 3 is several times slower.
    scale = np.ascontiguousarray(np.broadcast_to(1.0 / (255.0 * CIFAR_STD), shape), np.float32)
    offset = np.ascontiguousarray(np.broadcast_to(CIFAR_MEAN / CIFAR_STD, shape), np.float32)
    return reflect_index(height, CIFAR_PAD), reflect_index(width, CIFAR_PAD), scale, offset


def cifar_augment_numpy(image: np.ndarray, dy: int, dx: int, flip: bool) -> np.ndarray:
    """The cifar work on one uint8 HWC image in numpy, for given crop offsets and flip.

    Equal to `np.pad(image / 255, 4, mode="reflect")`, cropped at (dy, dx), flipped, normalised;
    the padding is done by index tables rather than `np.pad`, which is 5x slower per image.
    """
    rows, cols, scale, offset = _cifar_tables(*image.shape)
    h, w = image.shape[:2]
    cols = cols[dx:dx + w][::-1] if flip else cols[dx:dx + w]
    out = image.take(rows[dy:dy + h], axis=0).take(cols, axis=1).astype(np.float32)
    out *= scale
    out -= offset
    return out


JPEG_SIZE = 128
JPEG_SCALE = (0.08, 1.0)
JPEG_RATIO = (3 / 4, 4 / 3)
JPEG_MEAN = (0.485, 0.456, 0.406)
JPEG_STD = (0.229, 0.224, 0.225)
_JPEG_SCALE = np.float32(1 / 255) / np.asarray(JPEG_STD, np.float32)
_JPEG_OFFSET = np.asarray(JPEG_MEAN, np.float32) / np.asarray(JPEG_STD, np.float32)


QUALITY_FILES = 256


def jpeg_quality_boxes(paths: Sequence[str]) -> list[tuple[int, int, int, int]]:
    """The boxes every side is measured on: record i's RandomResizedCrop box for seed 0, epoch 0."""
    from PIL import Image

    from datarax.host.image import random_resized_box
    from datarax.host.stage import record_generator

    boxes = []
    for record, path in enumerate(paths):
        with Image.open(path) as image:
            width, height = image.size
        boxes.append(random_resized_box(height, width, JPEG_SCALE, JPEG_RATIO, record_generator(0, 0, 0, record)))
    return boxes


def jpeg_reference(path: str, box: tuple[int, int, int, int]) -> np.ndarray:
    """The accurate reference for a box: a full (accurate-DCT) decode, the box, a Lanczos resize."""
    return _full_decode_resize(path, box, "LANCZOS")


def psnr(image: np.ndarray, reference: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two uint8 images."""
    mse = float(np.mean((image.astype(np.float64) - reference.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def jpeg_psnr(crop_resize: Callable[[str, tuple[int, int, int, int]], np.ndarray], paths: Sequence[str],
              count: int = QUALITY_FILES) -> dict[str, float]:
    """Median and 10th-percentile PSNR of `crop_resize` against `jpeg_reference` on the first
    `count` files' boxes (the same boxes for every side)."""
    paths = [str(p) for p in paths[:count]]
    values = [psnr(crop_resize(path, box), jpeg_reference(path, box))
              for path, box in zip(paths, jpeg_quality_boxes(paths))]
    return {"psnr_db": round(float(np.median(values)), 2), "psnr_p10_db": round(float(np.percentile(values, 10)), 2)}


def pillow_crop_resize(path: str, box: tuple[int, int, int, int]) -> np.ndarray:
    """`jpeg_pillow`'s resampling of a given box: a full decode, one bilinear (antialiased) resize."""
    return _full_decode_resize(path, box, "BILINEAR")


def _full_decode_resize(path: str, box: tuple[int, int, int, int], method: str) -> np.ndarray:
    from PIL import Image

    top, left, h, w = box
    with Image.open(path) as image:
        image = image.convert("RGB")
    return np.asarray(image.resize((JPEG_SIZE, JPEG_SIZE), Image.Resampling[method],
                                   box=(left, top, left + w, top + h)))


def jpeg_pillow(path: str, rng: np.random.Generator) -> np.ndarray:
    """The jpeg work on one file as a torchvision pipeline does it with Pillow: a full decode,
    `RandomResizedCrop.get_params`, one bilinear resize of the box, flip, normalise (float32 HWC)."""
    from PIL import Image

    from datarax.host.image import random_resized_box

    with Image.open(path) as image:
        image = image.convert("RGB")
    top, left, h, w = random_resized_box(image.height, image.width, JPEG_SCALE, JPEG_RATIO, rng)
    image = image.resize((JPEG_SIZE, JPEG_SIZE), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    return _flip_normalise(np.asarray(image), rng)


def _flip_normalise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The jpeg work after the crop: a random horizontal flip, then ImageNet normalisation (float32)."""
    if rng.random() < 0.5:
        image = image[:, ::-1]
    out = image.astype(np.float32)
    out *= _JPEG_SCALE
    out -= _JPEG_OFFSET
    return out


def turbo_crop_resize(path: str, box: tuple[int, int, int, int]) -> np.ndarray:
    """How a user plugs libjpeg-turbo into a loader: `simplejpeg` at the DCT scale the box allows
    (1/2, 1/4, 1/8), the box cropped at that scale (rounded outwards) and `cv2.resize` bilinear."""
    with open(path, "rb") as f:
        return _turbo_box(f.read(), box)


def _turbo_box(data: bytes, box: tuple[int, int, int, int]) -> np.ndarray:
    import cv2
    import simplejpeg

    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    top, left, h, w = box
    factor = min(h, w) / JPEG_SIZE
    scale = next(s for s in (8, 4, 2, 1) if s <= factor or s == 1)
    image = simplejpeg.decode_jpeg(data, min_height=-(-height // scale), min_width=-(-width // scale))
    crop = image[top // scale:-(-(top + h) // scale), left // scale:-(-(left + w) // scale)]
    return cv2.resize(crop, (JPEG_SIZE, JPEG_SIZE), interpolation=cv2.INTER_LINEAR)


def jpeg_turbo(path: str, rng: np.random.Generator) -> np.ndarray:
    """`turbo_crop_resize` of a RandomResizedCrop box, flip, normalise (float32 HWC)."""
    import simplejpeg

    from datarax.host.image import random_resized_box

    with open(path, "rb") as f:
        data = f.read()
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    return _flip_normalise(_turbo_box(data, random_resized_box(height, width, JPEG_SCALE, JPEG_RATIO, rng)), rng)


LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def augment_chain_settings() -> tuple[float, float, float]:
    """(max_delta, degrees, sigma) of the `augment_chain` scenario, read from its module."""
    from benchmarks.scenarios import augment_chain

    return augment_chain.MAX_DELTA, augment_chain.DEGREES, augment_chain.SIGMA


def augment_chain_numpy(image: np.ndarray, u: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The `augment_chain` work on one float HWC image in numpy/scipy.

    Random crop after reflect-padding by side/8, horizontal flip, brightness and contrast
    factors `1 + max_delta * U(-1, 1)` (contrast blends with the mean luma), a bilinear rotation by
    `degrees * U(-1, 1)` with zero fill, additive Gaussian noise; clipped to [0, 1] after each
    colour step, as the datarax operators do. `u` holds six uniforms, `noise` standard normals.
    """
    from scipy import ndimage

    max_delta, degrees, sigma = augment_chain_settings()
    side, pad = image.shape[0], image.shape[0] // 8
    span = 2 * pad + 1
    rows = reflect_index(side, pad)[int(u[0] * span):][:side]
    cols = reflect_index(image.shape[1], pad)[int(u[1] * span):][:image.shape[1]]
    out = image.take(rows, axis=0).take(cols[::-1] if u[2] < 0.5 else cols, axis=1)
    out = np.clip(out * (1.0 + max_delta * (2 * u[3] - 1)), 0.0, 1.0)
    gray = float((out @ LUMA).mean())
    out = np.clip(gray + (1.0 + max_delta * (2 * u[4] - 1)) * (out - gray), 0.0, 1.0)
    out = ndimage.rotate(out, degrees * (2 * u[5] - 1), axes=(1, 0), reshape=False, order=1, mode="constant")
    return np.clip(out + sigma * noise, 0.0, 1.0).astype(np.float32)


def to_device(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch of numpy arrays as jax.Arrays on the default device."""
    import jax

    return jax.device_put(batch)


def time_loader(loader: Loader, repeats: int, *, warmup: int = 1, paths: Sequence[str] | None = None) -> dict:
    """`time_epochs` of a Loader, with its settings in the result (and its `jpeg_psnr` on `paths`
    when it has a `quality` function; measured after the timing)."""
    result = {**time_epochs(loader.epoch, repeats, warmup=warmup), "settings": loader.settings}
    if loader.quality is not None and paths is not None:
        result.update(jpeg_psnr(loader.quality, paths))
    return result


def time_epochs(run_epoch: Callable[[], Iterable[dict]], repeats: int, *, warmup: int = 1) -> dict:
    """Median records per second over `repeats` epochs, after `warmup` untimed ones.

    `run_epoch()` returns the batches of one epoch (dicts of arrays); records are counted from
    the batches themselves, and each batch is moved to the JAX device before the next is drawn.
    """
    import jax

    for _ in range(warmup):
        for batch in run_epoch():
            to_device(batch)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        count, last = 0, None
        for batch in run_epoch():
            last = to_device(batch)
            count += len(next(iter(batch.values())))
        jax.block_until_ready(last)
        rates.append(count / (time.perf_counter() - start))
    return {"el_s": statistics.median(rates), "el_s_runs": [round(r, 1) for r in rates]}
