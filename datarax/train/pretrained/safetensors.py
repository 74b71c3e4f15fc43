"""safetensors files as `{key: numpy array}`: read without any extra package, written with `safetensors`.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each key to
`{"dtype", "shape", "data_offsets"}` (plus an optional `"__metadata__"` of strings), then the raw
little-endian bytes. Reading is that much parsing and one `np.frombuffer` per tensor, so it needs no
package and covers `BF16` (as `ml_dtypes.bfloat16`, which JAX ships). Writing goes through the
`safetensors` package (`pip install 'datarax[pretrained]'`), the reference implementation:

    save_safetensors({"head.weight": w}, "head.safetensors", metadata={"format": "pt"})
    tensors, metadata = load_safetensors("head.safetensors", with_metadata=True)
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from datarax.core.checks import require

DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
}
# A header longer than this is not a real checkpoint's (guards against reading a wrong file whole).
MAX_HEADER_BYTES = 100 * 2**20


def _numpy_dtype(code: str, path: str) -> np.dtype:
    if code not in DTYPES:
        raise ValueError(f"{path}: tensor dtype {code!r} is not one of {sorted(DTYPES)}")
    if code == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(DTYPES[code]).newbyteorder("<")


def load_safetensors(path: str | os.PathLike, *, with_metadata: bool = False
                     ) -> dict[str, np.ndarray] | tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors of a safetensors file (and its `__metadata__` strings when `with_metadata`).

    Raises:
        ValueError: the file is not a safetensors file (its header does not parse or its offsets
            do not fit the file), naming the file.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path} is not a safetensors file: {len(data)} bytes")
    (size,) = struct.unpack("<Q", data[:8])
    if size > min(MAX_HEADER_BYTES, len(data) - 8):
        raise ValueError(f"{path} is not a safetensors file: its header length {size} does not fit the file")
    try:
        header = json.loads(data[8:8 + size])
    except ValueError as exc:
        raise ValueError(f"{path} is not a safetensors file: its header is not JSON ({exc})") from None
    body = memoryview(data)[8 + size:]
    metadata = dict(header.pop("__metadata__", None) or {})
    tensors = {}
    for key, info in header.items():
        dtype = _numpy_dtype(info["dtype"], path)
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= start <= end <= len(body) or end - start != int(np.prod(shape)) * dtype.itemsize:
            raise ValueError(f"{path}: tensor {key!r} of shape {shape} {info['dtype']} has data_offsets "
                             f"{[start, end]}, which do not fit its size or the file")
        tensors[key] = np.frombuffer(body[start:end], dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
    return (tensors, metadata) if with_metadata else tensors


def save_safetensors(tensors: Mapping[str, Any], path: str | os.PathLike, *,
                     metadata: Mapping[str, str] | None = None) -> None:
    """Writes `{key: array}` (numpy or JAX arrays) to `path` with the `safetensors` package.

    bfloat16 arrays are written as `BF16` (through their raw bits: `safetensors.numpy` knows no
    bfloat16), so `load_safetensors` and torch read them back as bfloat16.
    """
    st = require("safetensors.numpy", owner="save_safetensors", extra="pretrained", package="safetensors")
    arrays: dict[str, np.ndarray] = {}
    bf16: list[str] = []
    for key, value in tensors.items():
        if not isinstance(key, str):
            raise TypeError(f"save_safetensors: keys must be strings, got {key!r}")
        array = np.ascontiguousarray(np.asarray(value))
        if array.dtype.name == "bfloat16":
            array, _ = array.view(np.uint16), bf16.append(key)
        arrays[key] = array
    st.save_file(arrays, os.fspath(path), metadata=dict(metadata or {}) or None)
    if bf16:
        _retype(os.fspath(path), bf16)


def _retype(path: str, keys: list[str]) -> None:
    """Marks `keys` as BF16 in a written file's header (same byte length: 'U16' and 'BF16' differ by one)."""
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    for key in keys:
        header[key]["dtype"] = "BF16"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header with spaces to 8-byte alignment
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data[8 + size:])
