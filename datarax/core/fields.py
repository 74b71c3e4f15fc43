"""Field specs and batch buffers: what a source's records look like and how a batch is read into them.

Every source returns fixed-shape numeric fields. Columns that cannot be batched (strings,
ragged lists, nested structs) are either left out by the user (`fields=`), or turned into
arrays by a user function (`convert=`); otherwise the source fails at construction with
`UnsupportedColumnError` naming the columns and both fixes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from datarax.core.checks import describe_value
from datarax.core.errors import DataraxError

Spec = dict[str, jax.ShapeDtypeStruct]
ENCODED = np.dtype(object)  # the dtype of an encoded field (one bytes or str object per record)
FlatReader = Callable[[np.ndarray, dict[str, np.ndarray]], None]


class UnsupportedColumnError(DataraxError, TypeError):
    """A column that cannot become a fixed-shape numeric array, and no `convert` was given."""


def unsupported_message(owner: str, problems: Mapping[str, str]) -> str:
    listing = "; ".join(f"{name!r} ({why})" for name, why in problems.items())
    return (
        f"{owner} cannot batch column(s) {listing}: only fixed-shape numeric or bool columns become "
        "arrays. Leave them out with fields=(...) naming the columns to keep, or pass convert=fn that "
        "turns a batch of them into fixed-shape numeric arrays"
    )


def batchable(dtype: Any) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind != "O" and (np.issubdtype(dtype, np.number) or dtype == np.bool_)


def check_columns(columns: Any, available: Sequence[str], owner: str) -> tuple[str, ...]:
    """The columns to read: all when `columns` is None, else the named ones (which must exist)."""
    if columns is None:
        return tuple(available)
    if isinstance(columns, str) or not isinstance(columns, (tuple, list)) or not columns:
        raise TypeError(f"{owner}.fields must be None or a non-empty tuple of column names, got {columns!r}")
    missing = [c for c in columns if c not in available]
    if missing:
        raise KeyError(f"{owner} columns {missing} are not in the data; available columns: {list(available)}")
    return tuple(columns)


def check_column_config(columns: Any, owner: str) -> None:
    if columns is not None and (isinstance(columns, str) or not isinstance(columns, tuple) or not columns
                                or not all(isinstance(c, str) for c in columns)):
        raise TypeError(f"{owner}.fields must be None (all columns) or a non-empty tuple of names, got {columns!r}")


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become one level with '/'-joined names."""
    flat: dict[str, Any] = {}
    for name, value in record.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, key + "/"))
        else:
            flat[key] = value
    return flat


def spec_of(arrays: Mapping[str, Any], owner: str, *, batched: bool) -> dict[str, jax.ShapeDtypeStruct]:
    """The element spec of a record (or of a batch when `batched`), checking every field."""
    spec, problems = {}, {}
    for name, value in arrays.items():
        arr = np.asarray(value)
        if not batchable(arr.dtype):
            problems[name] = f"dtype {arr.dtype}"
        elif batched and arr.ndim == 0:
            problems[name] = "a scalar where a batch was expected"
        else:
            spec[name] = jax.ShapeDtypeStruct(arr.shape[1:] if batched else arr.shape, arr.dtype)
    if problems:
        raise UnsupportedColumnError(unsupported_message(owner, problems))
    if not spec:
        raise ValueError(f"{owner} has no fields to read; select at least one numeric column")
    return spec


def check_convert_output(result: Any, size: int, owner: str) -> dict[str, np.ndarray]:
    """Validates what a user `convert` function returned for a batch of `size` records."""
    if not isinstance(result, Mapping):
        raise TypeError(f"{owner} convert must return a dict of arrays, got {describe_value(result)}")
    out = {}
    for name, value in result.items():
        arr = np.asarray(value)
        if not batchable(arr.dtype) or arr.ndim == 0 or arr.shape[0] != size:
            raise UnsupportedColumnError(
                f"{owner} convert returned field {name!r} as {describe_value(arr)}; it must return numeric "
                f"arrays with a leading axis of {size} (one row per record in the batch)"
            )
        out[name] = arr
    return out


def spec_table(spec: Mapping[str, jax.ShapeDtypeStruct]) -> dict[str, tuple]:
    """`{field: (shape, dtype)}` of a spec in field order: plain data for `structure()` strings and comparisons."""
    return {k: (tuple(v.shape), str(v.dtype)) for k, v in sorted(spec.items())}


def allocate(spec: Mapping[str, jax.ShapeDtypeStruct], lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Uninitialised buffers for a batch of `spec` records with leading axes `lead`."""
    return {k: np.empty(lead + tuple(s.shape), s.dtype) for k, s in spec.items()}


def take_batch(arrays: Mapping[str, np.ndarray], indices: np.ndarray,
               out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The rows `indices` of every array (clipped like `np.take(..., mode="clip")`), into `out` when given."""
    if out is None:
        return {k: np.take(v, indices, axis=0, mode="clip") for k, v in arrays.items()}
    for k, v in arrays.items():
        np.take(v, indices, axis=0, out=out[k], mode="clip")
    return out


def read_batch(indices: np.ndarray, out: dict[str, np.ndarray] | None, spec: Mapping[str, jax.ShapeDtypeStruct],
               num_records: int, read_flat: FlatReader) -> dict[str, np.ndarray]:
    """Runs `read_flat(flat_indices, flat_out)` for indices of any shape, into `out` when given.

    Indices are clipped into [0, num_records) like `np.take(..., mode="clip")` on the in-memory
    path, so the padded tail of a final short batch reads valid records.
    """
    indices = np.asarray(indices)
    flat = np.clip(indices.reshape(-1).astype(np.int64, copy=False), 0, num_records - 1)
    if out is None:
        out = allocate(spec, indices.shape)
    flat_out = {k: out[k].reshape((flat.size,) + tuple(spec[k].shape)) for k in spec}
    read_flat(flat, flat_out)
    return out


def stack_into(records: Sequence[Mapping[str, Any]], out: dict[str, np.ndarray], owner: str) -> None:
    """Copies per-record dicts into the rows of `out` (one `np.stack` per field)."""
    for name, buf in out.items():
        try:
            np.stack([r[name] for r in records], out=buf, casting="same_kind")
        except KeyError:
            raise KeyError(f"{owner} record is missing field {name!r}; every record needs the fields "
                           f"{sorted(out)}") from None
        except (ValueError, TypeError) as exc:
            shapes = sorted({np.shape(r[name]) for r in records})
            raise UnsupportedColumnError(
                f"{owner} field {name!r} does not fit its spec {buf.shape[1:]} {buf.dtype}: the records "
                f"have shapes {shapes[:4]} ({exc}). Ragged fields must be padded to one shape or left out"
            ) from None
