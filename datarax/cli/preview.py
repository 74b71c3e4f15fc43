"""`datarax preview CONFIG`: a PNG grid of what the pipeline outputs, to look at its augmentation.

Image fields are drawn as they are (normalised floats mapped from their 1st to 99th percentile),
audio fields as log-magnitude spectrograms; a label field adds a caption strip under each tile.
docs/cli.md ("preview") has the layout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from datarax.core.checks import is_int, require
from datarax.monitoring.pictures import CAPTION as CAPTION
from datarax.monitoring.pictures import GAP as GAP
from datarax.monitoring.pictures import MIN_TILE as MIN_TILE
from datarax.monitoring.pictures import choose_field, save_grid
from datarax.monitoring.pictures import spectrograms as spectrograms
from datarax.monitoring.pictures import to_uint8 as to_uint8

LABEL_FIELDS = ("label", "labels", "class", "cls")


def choose_label(spec: Mapping[str, Any], label: str | None, drawn: str) -> str | None:
    """The field whose value captions each tile: `label` when given (it must hold one integer per
    record), else the first of `LABEL_FIELDS` that does, else None."""
    def scalar_int(name: str) -> bool:
        leaf = spec.get(name)
        return leaf is not None and tuple(leaf.shape[1:]) == () and np.issubdtype(np.dtype(leaf.dtype), np.integer)

    if label is not None:
        if not scalar_int(label) or label == drawn:
            raise ValueError(f"--label {label!r} must name a field holding one integer per record (fields: "
                             + ', '.join(f'{n} {np.dtype(v.dtype).name}{list(v.shape[1:])}' for n, v in spec.items())
                             + ")")
        return label
    return next((name for name in LABEL_FIELDS if scalar_int(name)), None)


def captions_of(labels: np.ndarray, source: Any) -> list[str]:
    """`"3 cat"` per record: the label, and its class name when the source lists `class_names`."""
    names = getattr(getattr(source, "source", source), "class_names", None)
    out = []
    for value in labels.tolist():
        name = names[value] if names is not None and 0 <= value < len(names) else None
        out.append(f"{value} {name}" if name is not None else str(value))
    return out


def first_records(pipeline: Any, count: int, *fields: str) -> list[np.ndarray]:
    """The first `count` records of each of `fields` (fewer when an epoch holds fewer)."""
    parts: list[list[np.ndarray]] = [[] for _ in fields]
    have = 0
    iterator = iter(pipeline)
    try:
        for batch in iterator:
            rows = min(count - have, len(batch[fields[0]]))
            for part, name in zip(parts, fields):
                part.append(np.asarray(jax.device_get(batch[name]))[:rows])
            have += rows
            if have >= count:
                break
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    return [np.concatenate(part) for part in parts]


def write_preview(pipeline: Any, out: str | os.PathLike, *, count: int = 16, field: str | None = None,
                  label: str | None = None) -> str:
    """Writes the PNG grid of `count` records of the pipeline's first batches, each tile captioned by
    its label field when there is one; returns a one-line report."""
    require("PIL.Image", owner="datarax preview", extra="image", package="pillow")
    if not is_int(count) or count < 1:
        raise ValueError(f"--n must be a positive number of records, got {count!r}")
    name, kind = choose_field(pipeline.output_spec(), field)
    label = choose_label(pipeline.output_spec(), label, name)
    records, *labels = first_records(pipeline, count, name, *([label] if label is not None else []))
    canvas = save_grid(records, kind, captions_of(labels[0], pipeline.source) if labels else None, out)
    what = "images" if kind == "image" else "spectrograms"
    labelled = f", labelled by field {label!r}" if label is not None else ""
    return (f"wrote {os.fspath(out)}: {len(records)} {what} of field {name!r} ({records.dtype.name} "
            f"{list(records.shape[1:])} per record){labelled}, {canvas.shape[1]}x{canvas.shape[0]} px")
