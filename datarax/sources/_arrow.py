"""Arrow columns to fixed-shape numpy arrays, without a Python object per row.

Numeric columns and list columns uniform at every nesting level become arrays; strings, structs,
maps, nulls and ragged lists are reported as unsupported with the reason. Encoded columns (binary,
strings, HF `Image`/`Audio` structs) go through `encoded_take` as object arrays for a host stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from datarax.core.fields import ENCODED, UnsupportedColumnError, allocate, check_convert_output, unsupported_message


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
            "must have the same shape. Pad the data, leave the column out (fields=...), or pass convert=fn"
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


def encoded_kind(arrow_type: Any) -> str | None:
    """How a column passes through as encoded records: "file" (HF `Image`/`Audio` struct), "bytes",
    "text", or None."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        names = {arrow_type.field(i).name for i in range(arrow_type.num_fields)}
        data = arrow_type.field("bytes").type if "bytes" in names else None
        file = "path" in names and data is not None and (pa.types.is_binary(data) or pa.types.is_large_binary(data))
        return "file" if file else None
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "bytes"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "text"
    return None


def _file_parts(chunk: Any) -> tuple[Any, Any]:
    """The `bytes` and `path` arrays of a file struct (flatten accounts for the struct's offset)."""
    parts = dict(zip([chunk.type.field(i).name for i in range(chunk.type.num_fields)], chunk.flatten()))
    return parts["bytes"], parts["path"]


def encoded_take(chunk: Any, rows: np.ndarray, read_path: Callable[[int, str], bytes],
                 where: Callable[[int], str]) -> np.ndarray:
    """The rows of an encoded column chunk as an object array of `bytes` (or `str` for text).

    A file whose bytes are missing is read by `read_path(row, path)`; text that is not valid UTF-8
    raises `CorruptFileError` naming `where(row)`.
    """
    import pyarrow as pa

    index = pa.array(np.asarray(rows, np.int64))
    if encoded_kind(chunk.type) != "file":
        taken = chunk.take(index)
        try:
            return taken.to_numpy(zero_copy_only=False)
        except pa.ArrowException:
            if encoded_kind(chunk.type) != "text":
                raise
            _raise_bad_text(taken, rows, where)
            raise
    data, paths = _file_parts(chunk)
    values = data.take(index).to_numpy(zero_copy_only=False)
    missing = np.flatnonzero(np.equal(values, None))
    if missing.size:
        for i, path in zip(missing.tolist(), paths.take(index).to_numpy(zero_copy_only=False)[missing]):
            if path is not None:
                values[i] = read_path(int(rows[i]), path)
    return values


def _raise_bad_text(taken: Any, rows: np.ndarray, where: Callable[[int], str]) -> None:
    """Raises `CorruptFileError` naming the first row of `taken` whose text is not UTF-8."""
    import pyarrow as pa

    from datarax.core.errors import REWRITE, CorruptFileError

    raw = taken.view(pa.large_binary() if pa.types.is_large_string(taken.type) else pa.binary())
    for i, data in enumerate(raw.to_pylist()):
        try:
            if data is not None:
                data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptFileError(f"{where(int(rows[i]))} holds text that is not UTF-8 ({exc.reason} at byte "
                                   f"{exc.start}: {data[max(0, exc.start - 8):exc.start + 8]!r}); {REWRITE}, or read "
                                   "the column as bytes") from None


def encoded_path(chunk: Any, row: int) -> str | None:
    """The `path` stored with row `row` of a file struct chunk (None for other columns)."""
    if encoded_kind(chunk.type) != "file":
        return None
    return _file_parts(chunk)[1][row].as_py()


class TableConverter:
    """Turns rows of the selected Arrow columns into the source's arrays (`convert` included)."""

    def __init__(self, sample: Any, names: tuple[str, ...],
                 convert: Callable[[dict[str, Any]], Mapping[str, Any]] | None, owner: str,
                 encoded: tuple[str, ...] = ()):
        self.owner, self.convert, self.encoded = owner, convert, encoded
        self.names = tuple(n for n in names if n not in encoded)
        not_encodable = {n: str(sample.column(n).type) for n in encoded if encoded_kind(sample.column(n).type) is None}
        if not_encodable:
            raise UnsupportedColumnError(
                f"{owner} encoded columns {not_encodable} are not bytes, text or encoded files; encoded= names "
                "HF Image/Audio feature, binary or string columns (numeric columns are read as arrays without it)")
        layouts, bad = {}, {}
        for name in self.names:
            layout = column_layout(sample.column(name))
            (bad if isinstance(layout, str) else layouts)[name] = layout
        if bad and convert is None:
            raise UnsupportedColumnError(_unsupported(owner, bad, sample))
        self.numeric = {k: jax.ShapeDtypeStruct(*v) for k, v in layouts.items()}
        self.passthrough = tuple(self.numeric)
        self.spec = dict(self.numeric)
        self.spec.update({n: jax.ShapeDtypeStruct((), ENCODED) for n in encoded})
        if convert is not None:
            head = sample.slice(0, min(2, len(sample)))
            out = self._run_convert(self.numeric_arrays(head), lambda n: head.column(n).to_pylist(), len(head))
            self.passthrough = tuple(k for k in self.numeric if k not in out)
            self.spec.update({k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in out.items()})

    def numeric_arrays(self, table: Any) -> dict[str, np.ndarray]:
        """The numeric columns of an Arrow table as new arrays."""
        out = {}
        for name, s in self.numeric.items():
            out[name] = np.empty((len(table),) + tuple(s.shape), s.dtype)
            column_into(table.column(name), out[name], name, self.owner)
        return out

    def _run_convert(self, numeric: Mapping[str, np.ndarray], others: Callable[[str], list], size: int) -> dict:
        raw = {n: numeric[n] if n in self.numeric else others(n) for n in self.names}
        return check_convert_output(self.convert(raw), size, f"{self.owner} convert")

    def write_converted(self, numeric: Mapping[str, np.ndarray], others: Callable[[str], list], size: int,
                        out: Mapping[str, np.ndarray]) -> None:
        """Runs `convert` on one batch (numeric columns as arrays, `others(name)` as lists) into `out`."""
        for name, value in self._run_convert(numeric, others, size).items():
            if name not in out or value.shape[1:] != out[name].shape[1:]:
                raise UnsupportedColumnError(
                    f"{self.owner} convert returned {name!r} with rows of shape {value.shape[1:]}, but the first "
                    f"batch set its spec to {self.spec.get(name)}; convert must return the same fields and shapes "
                    "for every batch (pad to a fixed length)")
            out[name][...] = value

    def arrays(self, table: Any) -> dict[str, np.ndarray]:
        """All of the source's fields for the rows of an Arrow table."""
        numeric = self.numeric_arrays(table)
        if self.convert is None:
            return numeric
        out = allocate(self.spec, (len(table),))
        for name in self.passthrough:
            out[name] = numeric[name]
        self.write_converted(numeric, lambda n: table.column(n).to_pylist(), len(table), out)
        return out


def _unsupported(owner: str, bad: Mapping[str, str], sample: Any) -> str:
    """The unsupported-column message, plus how to read bytes and text columns as encoded records."""
    message = unsupported_message(owner, bad)
    readable = [n for n in bad if encoded_kind(sample.column(n).type) is not None]
    if readable:
        message += (f". Column(s) {readable} hold encoded files, bytes or text: read them unchanged with "
                    f"HFSourceConfig(encoded={tuple(readable)!r}) and decode them with a host stage at the head "
                    "of the pipeline's stages (DecodeImage, DecodeAudio, Tokenize)")
    return message
