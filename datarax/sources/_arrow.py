"""Arrow columns to fixed-shape numpy arrays, without a Python object per row.

A numeric column becomes a `(rows,)` array; a (fixed-size or variable) list column whose lists
all have the same length at every nesting level becomes `(rows, d1, d2, ...)` by flattening the
list values and reshaping (the uniformity check reads only the list offsets). Strings, structs,
maps, nulls and ragged lists are reported as unsupported with the reason, so the source can
name them in its error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from datarax.sources._columns import UnsupportedColumnError


def _storage(array: Any) -> Any:
    # Extension arrays (e.g. HF's Array2D/Array3D) wrap a plain list storage.
    return array.storage if hasattr(array.type, "storage_type") else array


def _chunks(column: Any) -> list:
    return list(column.chunks) if hasattr(column, "chunks") else [column]


def flatten_chunk(chunk: Any) -> tuple[np.ndarray, tuple[int, ...]] | str:
    """The values of an arrow array and its row shape, or why it is not a fixed-shape numeric array."""
    import pyarrow as pa

    array, shape = _storage(chunk), []
    while True:
        if array.null_count:
            return f"{array.null_count} missing values"
        t = array.type
        if pa.types.is_fixed_size_list(t):
            shape.append(t.list_size)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            lengths = np.diff(array.offsets.to_numpy())
            if lengths.size and lengths.min() != lengths.max():
                return f"ragged lists (lengths {int(lengths.min())} to {int(lengths.max())})"
            shape.append(int(lengths[0]) if lengths.size else 0)
        elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            return array.to_numpy(zero_copy_only=False), tuple(shape)
        else:
            return f"arrow type {chunk.type}"
        array = _storage(array.flatten())


def column_layout(column: Any) -> tuple[tuple[int, ...], np.dtype] | str:
    """`(row shape, dtype)` of an arrow (chunked) column, or why it cannot be batched."""
    layout = None
    for chunk in _chunks(column):
        flat = flatten_chunk(chunk)
        if isinstance(flat, str):
            return flat
        if len(chunk) == 0:
            continue
        values, shape = flat
        if layout is not None and layout != (shape, values.dtype):
            return f"rows of different shapes ({layout[0]} and {shape})"
        layout = (shape, values.dtype)
    return layout if layout is not None else f"no rows to infer the shape of {column.type} from"


def chunk_view(chunk: Any, row: tuple[int, ...], name: str, owner: str) -> np.ndarray:
    """An arrow array as a `(len, *row)` numpy array: zero-copy for numeric lists without nulls."""
    flat = flatten_chunk(chunk)
    if isinstance(flat, str) or flat[1] != tuple(row):
        found = flat if isinstance(flat, str) else f"rows of shape {flat[1]}"
        raise UnsupportedColumnError(
            f"{owner} column {name!r} has {found} in this part of the data where its spec is {tuple(row)}: every row "
            "must have the same shape. Pad the data, leave the column out (columns=...), or pass convert=fn"
        )
    return flat[0].reshape((len(chunk),) + tuple(row))


def column_into(column: Any, out: np.ndarray, name: str, owner: str) -> None:
    """Copies an arrow (chunked) column whose rows have `out`'s row shape into `out` (rows first)."""
    start = 0
    for chunk in _chunks(column):
        n = len(chunk)
        if n:
            out[start:start + n] = chunk_view(chunk, out.shape[1:], name, owner)
            start += n
    if start != len(out):
        raise ValueError(f"{owner} column {name!r} has {start} rows, expected {len(out)}")
