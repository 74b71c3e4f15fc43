"""The fast JPEG path of `DecodeImage`: libjpeg-turbo at DCT scale, then one exact bilinear warp.

`simplejpeg` decodes at the largest DCT scale (1/2, 1/4, 1/8) that keeps the box at least the
output's size; OpenCV's `warpAffine` samples the box (EXIF orientation included) straight into the
output row, supersampling an axis that still shrinks by 2x or more. Non-JPEG, CMYK/YCCK and
damaged files fall back to Pillow. docs/benchmarks.md (`jpeg`) has speed and quality.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import numpy as np

BACKENDS = ("auto", "turbo", "pillow")
# Bumped whenever the turbo path's pixels change, so a state saved under another revision is
# refused (it is in `DecodeImage`'s fingerprint) rather than resumed on other crops.
# 2: an axis shrinking 2x or more is supersampled (was: block-averaged before the warp).
TURBO_REVISION = 2
TURBO_HINT = "pip install simplejpeg opencv-python-headless (or pip install 'datarax[image]')"
_JPEG_MAGIC = b"\xff\xd8"
_RAW_HEADER = re.compile(rb"P([56])\s+(\d+)\s+(\d+)\s+255\s")
_COLOURS = {"Gray": "GRAY", "YCbCr": "RGB", "RGB": "RGB"}  # header colorspace -> decode target


def turbo_modules() -> tuple[Any, Any] | None:
    """`(simplejpeg, cv2)` when both import, else None."""
    try:
        import cv2
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg, cv2


def resolve_backend(backend: str) -> str:
    """The backend `DecodeImage` runs: "auto" is "turbo" when its wheels are installed, else "pillow"."""
    if backend == "pillow":
        return backend
    if turbo_modules() is not None:
        return "turbo"
    if backend == "turbo":
        raise ImportError(f"DecodeImage(backend='turbo') needs the `simplejpeg` and `opencv-python-headless` "
                          f"packages: {TURBO_HINT}; or pass backend='pillow'")
    return "pillow"


def exif_orientation(data: bytes) -> int:
    """The EXIF orientation (1-8) of a JPEG's APP1 segment; 1 when it has none or it cannot be read.

    Reads the markers before the first scan only; a malformed segment counts as no orientation
    (Pillow's `getexif` does the same).
    """
    pos, end = 2, len(data)
    while pos + 4 <= end and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xDA:  # start of scan: no more metadata
            break
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        body = data[pos + 4:pos + 2 + length]
        if marker == 0xE1 and body[:6] == b"Exif\x00\x00":
            return _tiff_orientation(body[6:])
        pos += 2 + length
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return 1
    for i in range(int.from_bytes(tiff[ifd:ifd + 2], order)):
        entry = tiff[ifd + 2 + 12 * i:ifd + 14 + 12 * i]
        if len(entry) < 12:
            break
        if int.from_bytes(entry[:2], order) == 0x0112:
            value = int.from_bytes(entry[8:10], order)
            return value if 1 <= value <= 8 else 1
    return 1


def _upright_to_raw(orientation: int, raw_h: int, raw_w: int) -> tuple[tuple[float, float, float], ...]:
    """The affine map from upright to raw image coordinates (pixel i spans [i, i + 1)), as the rows
    `(a, b, c)` of raw x and raw y = `a * x + b * y + c`."""
    x, y = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)
    flip_x, flip_y = (-1.0, 0.0, raw_w), (0.0, -1.0, raw_h)
    rows = {  # (raw x, raw y) as functions of upright (x, y, 1)
        1: (x, y), 2: (flip_x, y), 3: (flip_x, flip_y), 4: (x, flip_y),
        5: (y, x), 6: (y, (-1.0, 0.0, raw_h)), 7: ((0.0, -1.0, raw_w), (-1.0, 0.0, raw_h)),
        8: ((0.0, -1.0, raw_w), x),
    }[orientation]
    return rows


class Header(NamedTuple):
    """What the fast path needs to know of a file before decoding it (upright height and width)."""

    height: int
    width: int
    orientation: int
    colour: str  # "RGB" or "GRAY"
    pixels: int = -1  # where a raw (PPM/PGM) file's pixels start; -1 for a JPEG


def raw_header(data: bytes) -> Header | None:
    """The header of a binary PPM (P6) or PGM (P5) with 8-bit samples and no comments (what
    `materialize(format="raw")` and Pillow write), else None."""
    match = _RAW_HEADER.match(data)
    if match is None:
        return None  # a comment, 16-bit samples, or not a PPM: Pillow reads it
    width, height = int(match[2]), int(match[3])
    channels = 3 if match[1] == b"6" else 1
    if len(data) < match.end() + width * height * channels:
        return None
    return Header(height, width, 1, "RGB" if channels == 3 else "GRAY", match.end())


def _eighths(box: tuple[float, float, float, float], out_size: tuple[int, int]) -> int:
    """The DCT scale (in eighths) a JPEG is decoded at for `box`: the smallest that still covers
    the output size."""
    left, top, right, bottom = box
    factor = min((right - left) / out_size[1], (bottom - top) / out_size[0])
    # libjpeg-turbo's SIMD scales, 1/8, 1/4, 1/2 or 1: the k/8 between them decode in plain C,
    # and measured slower for a gain under 0.2 dB (docs/benchmarks.md, `jpeg`)
    return next((e for e in (1, 2, 4) if 8 / e <= factor), 8)


class TurboDecoder:
    """Decodes one JPEG's (or raw PPM's) box into an output row; `decode_into` returns False for
    what it cannot read."""

    def __init__(self):
        modules = turbo_modules()
        if modules is None:
            raise ImportError(f"the turbo JPEG backend needs simplejpeg and OpenCV: {TURBO_HINT}")
        self.simplejpeg, self.cv2 = modules

    def header(self, data: bytes) -> Header | None:
        """The file's `Header`, or None when this path cannot read it."""
        if not isinstance(data, bytes):
            return None
        if data[:2] != _JPEG_MAGIC:
            return raw_header(data)
        try:
            height, width, colorspace, _ = self.simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return None  # damaged: Pillow reports it as it always has
        colour = _COLOURS.get(colorspace)
        if colour is None:  # CMYK, YCCK: Pillow converts them as it always has
            return None
        orientation = exif_orientation(data)
        if orientation >= 5:
            height, width = width, height
        return Header(height, width, orientation, colour)

    def working_bytes(self, header: Header, box: tuple[float, float, float, float], out_size: tuple[int, int]) -> int:
        """What `decode_into` holds at its peak for this box: the image at its DCT scale (a raw
        file's pixels are read in place) and the supersampled warp, at most the reduced box plus
        the output per axis."""
        height, width, orientation, colour, pixels = header
        channels = 3 if colour == "RGB" else 1
        out_h, out_w = out_size
        scale = 1 if pixels >= 0 else 8 // _eighths(box, out_size)
        decoded = 0 if pixels >= 0 else math.ceil(height / scale) * math.ceil(width / scale) * channels
        left, top, right, bottom = box
        dense = (out_w + math.ceil((right - left) / scale)) * (out_h + math.ceil((bottom - top) / scale))
        return decoded + dense * channels

    def decode_into(self, data: bytes, header: Header, box: tuple[float, float, float, float],
                    out: np.ndarray) -> bool:
        """Writes the upright `box` (left, top, right, bottom) of the image, resampled to `out`'s
        (h, w, 3) shape, into `out`; False when libjpeg-turbo refuses the file."""
        height, width, orientation, colour, pixels = header
        raw_h, raw_w = (width, height) if orientation >= 5 else (height, width)
        out_h, out_w = out.shape[:2]
        left, top, right, bottom = box
        if pixels >= 0:  # raw pixels: nothing to decode
            shape = (raw_h, raw_w, 3) if colour == "RGB" else (raw_h, raw_w)
            image = np.frombuffer(data, np.uint8, count=math.prod(shape), offset=pixels).reshape(shape)
            return self._warp_into(image, 1.0, orientation, (raw_h, raw_w), box, out)
        eighths = _eighths(box, (out_h, out_w))
        size = (math.ceil(raw_h * eighths / 8), math.ceil(raw_w * eighths / 8))
        try:
            image = self.simplejpeg.decode_jpeg(data, colorspace=colour, min_height=size[0], min_width=size[1])
        except ValueError:
            return False
        if image.shape[:2] != size:
            return False  # libjpeg-turbo chose another scale: let Pillow decode it
        return self._warp_into(image, 8 / eighths, orientation, (raw_h, raw_w), box, out)

    def _warp_into(self, image: np.ndarray, scale: float, orientation: int, raw_size: tuple[int, int],
                   box: tuple[float, float, float, float], out: np.ndarray) -> bool:
        """Resamples the upright `box` of `image` (the stored `raw_size` image reduced by `scale`) into `out`."""
        raw_h, raw_w = raw_size
        if image.ndim == 3 and image.shape[2] == 1:  # libjpeg-turbo's grayscale: one plane
            image = image[..., 0]
        out_h, out_w = out.shape[:2]
        left, top, right, bottom = box
        # Edge coordinates (pixel i spans [i, i + 1)): output (j, i) -> upright -> raw -> reduced,
        # composed by hand: a handful of floats, not 3x3 numpy products, on a per-record path.
        kx, ky = (right - left) / out_w, (bottom - top) / out_h
        (ax, bx, cx), (ay, by, cy) = _upright_to_raw(orientation, raw_h, raw_w)
        rows = [(a * kx / scale, b * ky / scale, (a * left + b * top + c) / scale)
                for a, b, c in ((ax, bx, cx), (ay, by, cy))]
        # An axis still shrinking 2x or more is warped at that whole multiple of the output and then
        # averaged back in blocks: the bilinear warp skips pixels past 2x.
        ux = max(1, int(abs(rows[0][0]) + abs(rows[1][0])))
        uy = max(1, int(abs(rows[0][1]) + abs(rows[1][1])))
        # the warp maps pixel indices (centres at integers) on both sides
        matrix = np.array([(a / ux, b / uy, c + 0.5 * (a / ux + b / uy) - 0.5) for a, b, c in rows])
        cv2 = self.cv2
        flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
        border = cv2.BORDER_REPLICATE
        if ux == 1 and uy == 1:
            if image.ndim == 2:
                out[...] = cv2.warpAffine(image, matrix, (out_w, out_h), flags=flags,
                                          borderMode=border).reshape(out_h, out_w, 1)
            else:
                cv2.warpAffine(image, matrix, (out_w, out_h), dst=out, flags=flags, borderMode=border)
            return True
        dense = cv2.warpAffine(image, matrix, (out_w * ux, out_h * uy), flags=flags, borderMode=border)
        # Block means (a bilinear resize by exactly 2 is the 2-pixel mean; far faster than area resize).
        exact_pairs = ux <= 2 and uy <= 2
        small = cv2.resize(dense, (out_w, out_h), interpolation=cv2.INTER_LINEAR if exact_pairs else cv2.INTER_AREA)
        out[...] = small.reshape(out_h, out_w, -1)
        return True
