"""16- and 32-bit single-channel images (Pillow modes `I;16`, `I`, `F`) as 8-bit gray, scaled over
a value range instead of clipped at 255 by `convert("RGB")`.

Example:
    >>> gray = to_eight_bits(Image.open("scan.png"), (0, 4095), Image)  # 12-bit samples in a 16-bit PNG
"""

from __future__ import annotations

from typing import Any

import numpy as np

from datarax.host.stage import Refusal

SCALE_ROWS_BYTES = 16 * 2**20  # the float64 scratch of the scaling, a block of rows at a time


def is_high_depth(mode: str) -> bool:
    """Pillow's 16- and 32-bit single-channel modes: `I;16` (and its byte orders), `I`, `F`."""
    return mode in ("I", "F") or mode.startswith("I;16")


def to_eight_bits(image: Any, value_range: tuple[float, float] | None, image_module: Any) -> Any:
    """A 16- or 32-bit single-channel image as an 8-bit gray (`L`) one; other images unchanged.

    `round(255 * (v - low) / (high - low))` over `value_range` (default (0, 65535), or (0, 1) for `F`).

    Raises:
        Refusal: a value (or a NaN) outside the range.
    """
    mode = image.mode
    if not is_high_depth(mode):
        return image
    low, high = value_range or ((0.0, 1.0) if mode == "F" else (0.0, 65535.0))
    values = np.asarray(image)
    smallest, largest = values.min(), values.max()  # a NaN makes both NaN, and fails the test below
    if not (low <= smallest and largest <= high):
        kind = "float" if mode == "F" else f"{8 * values.itemsize}-bit"
        raise Refusal(f"is a {kind} image (Pillow mode {mode}) with values from {smallest} to {largest}, outside "
                      f"value_range=({low:g}, {high:g}) that maps to 0-255; pass DecodeImage(value_range=(low, "
                      "high)) with the range its samples use (e.g. (0, 4095) for 12-bit), or remove the file")
    out = np.empty(values.shape, np.uint8)
    step = max(1, SCALE_ROWS_BYTES // (8 * max(1, values.shape[1])))
    for top in range(0, len(values), step):
        block = (values[top:top + step].astype(np.float64) - low) * (255.0 / (high - low))
        np.rint(block, out=block)
        out[top:top + step] = block
    return image_module.fromarray(out)  # a 2-D uint8 array is an L image
