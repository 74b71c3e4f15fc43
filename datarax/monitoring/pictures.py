"""Batches drawn as pictures: a PNG grid of a field's records (images as they are, audio as
log-magnitude spectrograms), each tile with an optional caption; `datarax preview`, `datarax replay
--show` and the incidents of a `StepGuard` draw with it. docs/cli.md ("preview") has the layout.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from datarax.core.checks import require

GAP = 2
MIN_TILE = 64
CAPTION = 12
BACKGROUND = 96
DYNAMIC_RANGE_DB = 80.0
OWNER = "a PNG grid (datarax preview, replay --show, a StepGuard's incidents)"


def field_kind(shape: tuple[int, ...], dtype: Any) -> str | None:
    """"image", "audio" or None for a record of `shape` and `dtype`."""
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.number):
        return None
    floating = np.issubdtype(dtype, np.floating)
    if floating and (len(shape) == 1 and shape[0] >= 64 or len(shape) == 2 and shape[0] <= 8 and shape[1] >= 64):
        return "audio"
    if len(shape) == 2 and min(shape) >= 4 or len(shape) == 3 and shape[-1] in (1, 3, 4) and min(shape[:2]) >= 4:
        return "image"
    return None

def choose_field(spec: Mapping[str, Any], field: str | None) -> tuple[str, str]:
    """`(field, "image" | "audio")`: the named field, else the first image-like, else the first audio-like one."""
    kinds = {name: field_kind(tuple(leaf.shape[1:]), leaf.dtype) for name, leaf in spec.items()
             if hasattr(leaf, "shape")}
    described = ", ".join(f"{n} {np.dtype(spec[n].dtype).name}{list(spec[n].shape[1:])}" for n in kinds)
    if field is not None:
        if field not in spec:
            raise ValueError(f"--field {field!r} is not a field of the pipeline's batches ({described})")
        if kinds.get(field) is None:
            raise ValueError(f"--field {field!r} is neither an image (H, W[, 1|3|4]) nor audio (T,) or (C, T) of "
                             f"floats per record: {described}")
        return field, kinds[field]
    for wanted in ("image", "audio"):
        for name, kind in kinds.items():
            if kind == wanted:
                return name, kind
    raise ValueError(f"the pipeline's batches have no image (H, W[, 1|3|4]) or audio ((T,) or (C, T) floats, T >= 64) "
                     f"field to draw: {described}; name one with --field")

def to_uint8(images: np.ndarray) -> np.ndarray:
    """Images as uint8: floats in [0, 1] times 255, other floats from their 1st..99th percentile."""
    if images.dtype == np.uint8:
        return images
    values = images.astype(np.float64)
    if np.issubdtype(images.dtype, np.integer):
        low, high = 0.0, 255.0
    elif values.size and values.min() >= 0.0 and values.max() <= 1.0:
        low, high = 0.0, 1.0
    else:
        low, high = np.percentile(values, [1, 99]) if values.size else (0.0, 1.0)
        if high <= low:
            high = low + 1.0
    return np.clip(np.rint((values - low) / (high - low) * 255.0), 0, 255).astype(np.uint8)

def spectrograms(waves: np.ndarray) -> np.ndarray:
    """uint8 log-magnitude spectrograms `(n, frequencies, frames)` of waveforms `(n, T)` or `(n, C, T)`."""
    if waves.ndim == 3:
        waves = waves.mean(axis=1)
    waves = waves.astype(np.float64)
    length = waves.shape[-1]
    n_fft = 2 ** int(math.floor(math.log2(min(512, max(16, math.sqrt(4 * length))))))
    n_fft = min(n_fft, 2 ** int(math.floor(math.log2(length))))
    hop = max(1, n_fft // 4)
    frames = 1 + (length - n_fft) // hop
    starts = np.arange(frames) * hop
    windows = waves[:, starts[:, None] + np.arange(n_fft)] * np.hanning(n_fft)
    magnitude = np.abs(np.fft.rfft(windows, axis=-1))  # (n, frames, frequencies)
    db = 20.0 * np.log10(np.maximum(magnitude, 1e-10))
    top = db.max()
    scaled = (np.clip(db, top - DYNAMIC_RANGE_DB, top) - (top - DYNAMIC_RANGE_DB)) / DYNAMIC_RANGE_DB
    tiles = np.rint(scaled * 255.0).astype(np.uint8)
    return tiles.transpose(0, 2, 1)[:, ::-1, :]  # frequencies up the tile, time left to right

def grid(tiles: np.ndarray, captions: list[str] | None = None) -> np.ndarray:
    """The tiles `(n, h, w[, c])`, scaled up to `MIN_TILE`, in `ceil(sqrt(n))` columns on one uint8 RGB
    canvas, each with its caption below it when `captions` are given."""
    if tiles.ndim == 3:
        tiles = tiles[..., None]
    if tiles.shape[-1] == 1:
        tiles = np.repeat(tiles, 3, axis=-1)
    tiles = tiles[..., :3]
    count, h, w, _ = tiles.shape
    scale = max(1, math.ceil(MIN_TILE / min(h, w)))
    tiles = tiles.repeat(scale, axis=1).repeat(scale, axis=2)
    h, w = h * scale, w * scale
    cols = math.ceil(math.sqrt(count))
    rows = math.ceil(count / cols)
    strip = CAPTION if captions is not None else 0
    canvas = np.full((rows * (h + strip) + (rows + 1) * GAP, cols * w + (cols + 1) * GAP, 3), BACKGROUND, np.uint8)
    for i, tile in enumerate(tiles):
        r, c = divmod(i, cols)
        top, left = GAP + r * (h + strip + GAP), GAP + c * (w + GAP)
        canvas[top:top + h, left:left + w] = tile
    if captions is None:
        return canvas
    image_module = require("PIL.Image", owner=OWNER, extra="image", package="pillow")
    from PIL import ImageDraw, ImageFont

    image = image_module.fromarray(canvas)
    draw, font = ImageDraw.Draw(image), ImageFont.load_default()
    for i, caption in enumerate(captions):
        r, c = divmod(i, cols)
        top, left = GAP + r * (h + strip + GAP) + h, GAP + c * (w + GAP)
        while caption and draw.textlength(caption, font=font) > w - 2:  # what fits under the tile
            caption = caption[:-1]
        draw.text((left + 1, top), caption, fill=(255, 255, 255), font=font)
    return np.asarray(image)

def save_grid(records: np.ndarray, kind: str, captions: list[str] | None, out: str | os.PathLike) -> np.ndarray:
    """Writes records of one field (`kind` "image" or "audio", as `choose_field` says) as a PNG grid,
    each tile captioned when `captions` are given; returns the canvas. Non-finite values are drawn as 0."""
    image_module = require("PIL.Image", owner=OWNER, extra="image", package="pillow")
    if np.issubdtype(records.dtype, np.floating):
        records = np.nan_to_num(records, nan=0.0, posinf=0.0, neginf=0.0)
    tiles = to_uint8(records) if kind == "image" else spectrograms(records)
    canvas = grid(tiles, captions)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    image_module.fromarray(canvas).save(os.fspath(out), format="PNG")
    return canvas
