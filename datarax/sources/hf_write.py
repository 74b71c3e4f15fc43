"""`write_hf_parquet`: a parquet file with HF `Image` and `Audio` columns, written without `torchcodec`.

Example:
    >>> write_hf_parquet("train.parquet", {"image": ["cat.jpg", photo_array], "label": [0, 1]}, images=("image",))
"""

from __future__ import annotations

import io
import os
import wave
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from datarax.core.checks import check_positive_int, is_int, require


def _encode_image(value: Any, where: str) -> tuple[bytes, str | None]:
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (1, 3, 4)):
            raise ValueError(f"write_hf_parquet {where} is an array of dtype {value.dtype} and shape {value.shape}; an "
                             "image array must be uint8 (h, w), (h, w, 1), (h, w, 3) or (h, w, 4)")
        image = require("PIL.Image", owner="write_hf_parquet", extra="image", package="pillow")
        buf = io.BytesIO()
        image.fromarray(value[..., 0] if value.ndim == 3 and value.shape[2] == 1 else value).save(buf, format="PNG")
        return buf.getvalue(), None
    return _file_value(value, where, "an encoded image (bytes), its file path, or a uint8 array")


def _encode_audio(value: Any, where: str) -> tuple[bytes, str | None]:
    if isinstance(value, tuple):
        if len(value) != 2 or not is_int(value[1]) or value[1] <= 0:
            raise ValueError(f"write_hf_parquet {where} is {type(value).__name__} of {len(value)}; an audio array is "
                             "given as (samples, sample_rate) with a positive int rate")
        samples, rate = np.asarray(value[0]), int(value[1])
        if samples.ndim not in (1, 2) or samples.size == 0:
            raise ValueError(f"write_hf_parquet {where} has samples of shape {samples.shape}; give (n,) mono or "
                             "(n, channels) samples")
        if samples.dtype == np.int16:
            pcm = samples
        elif np.issubdtype(samples.dtype, np.floating):
            if not np.all(np.isfinite(samples)) or np.abs(samples).max() > 1.0:
                raise ValueError(f"write_hf_parquet {where}: float samples must be finite and in [-1, 1] (peak "
                                 f"{np.nanmax(np.abs(samples)):.3g}); scale them, or pass int16 samples")
            pcm = np.round(samples * 32767).astype(np.int16)
        else:
            raise ValueError(f"write_hf_parquet {where} has samples of dtype {samples.dtype}; give float samples in "
                             "[-1, 1] or int16")
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1 if pcm.ndim == 1 else pcm.shape[1])
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(pcm.astype("<i2").tobytes())
        return buf.getvalue(), None
    return _file_value(value, where, "an encoded audio file (bytes), its file path, or (samples, sample_rate)")


def _file_value(value: Any, where: str, expected: str) -> tuple[bytes, str | None]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        if not len(value):
            raise ValueError(f"write_hf_parquet {where} is empty (0 bytes); give {expected}")
        return bytes(value), None
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"write_hf_parquet {where} names {path!r}, which is not a file; give {expected}")
        with open(path, "rb") as f:
            return f.read(), os.path.basename(path)
    raise TypeError(f"write_hf_parquet {where} is {type(value).__name__}; give {expected}")


def write_hf_parquet(path: str | os.PathLike, columns: Mapping[str, Sequence[Any]], *, images: Sequence[str] = (),
                     audio: Sequence[str] = (), row_group_size: int | None = None) -> str:
    """Writes `columns` as one parquet file that HF `datasets` reads with `Image`/`Audio` features.

    Args:
        path: the parquet file to write (its folder must exist).
        columns: column name -> one value per row. Columns named in `images` or `audio` hold
            encoded files (bytes), file paths, or arrays (images: uint8 `(h, w[, c])`, written as
            PNG; audio: `(samples, sample_rate)`, written as 16-bit WAV). Others as pyarrow infers.
        images: the columns to store as `datasets.Image()`.
        audio: the columns to store as `datasets.Audio()`.
        row_group_size: rows per parquet row group (None: pyarrow's default); a `ShardedSource` reads
            one as a block.

    Returns:
        The path written.
    """
    datasets = require("datasets", owner="write_hf_parquet", extra="data")
    pa = require("pyarrow", owner="write_hf_parquet", extra="data")
    pq = require("pyarrow.parquet", owner="write_hf_parquet", extra="data", package="pyarrow")
    if not isinstance(columns, Mapping) or not columns:
        raise ValueError(f"write_hf_parquet columns must be a non-empty dict of column name -> values, got {columns!r}")
    images, audio = tuple(images), tuple(audio)
    for kind, names in (("images", images), ("audio", audio)):
        unknown = [n for n in names if n not in columns]
        if unknown:
            raise ValueError(f"write_hf_parquet {kind}={names!r} names {unknown}, which are not columns "
                             f"(columns: {list(columns)})")
    both = set(images) & set(audio)
    if both:
        raise ValueError(f"write_hf_parquet columns {sorted(both)} are in both images= and audio=; pick one")
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"write_hf_parquet columns must all have one value per row, got lengths {lengths}")
    arrays, features = {}, {}
    for name, values in columns.items():
        if name in images or name in audio:
            encode = _encode_image if name in images else _encode_audio
            rows = [encode(v, f"{name}[{i}]") for i, v in enumerate(values)]
            arrays[name] = pa.array([{"bytes": data, "path": stored} for data, stored in rows],
                                    type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
            features[name] = datasets.Image() if name in images else datasets.Audio()
        else:
            arrays[name] = pa.array(np.asarray(values) if isinstance(values, np.ndarray) else list(values))
            features[name] = datasets.Features.from_arrow_schema(pa.schema([(name, arrays[name].type)]))[name]
    schema = datasets.Features(features).arrow_schema
    table = pa.Table.from_arrays([arrays[n].cast(schema.field(n).type) for n in columns], schema=schema)
    path = os.fspath(path)
    check_positive_int(row_group_size, "write_hf_parquet row_group_size", allow_none=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path
