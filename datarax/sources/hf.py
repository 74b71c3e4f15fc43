"""HuggingFace `datasets` as datarax sources: map-style `HFSource`, streaming `HFStreamSource`.

Both read Arrow data directly into fixed-shape numpy arrays (`datarax.sources._arrow`); shuffling
is datarax's, never HF's. Columns that are not fixed-shape numeric are left out with `fields=`,
turned into arrays by `convert(batch)`, or read as encoded records (`encoded=`: HF `Image`/`Audio`,
binary or string columns) for a host stage. docs/sources.md ("HuggingFace `datasets`") has the details.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_int_range, narrowed_dtype, require
from datarax.core.errors import REWRITE, CorruptFileError
from datarax.core.fields import allocate, check_columns, read_batch, spec_table
from datarax.core.source import DataSourceModule, Handles, seed_from_rngs
from datarax.sources._arrow import TableConverter as TableConverter
from datarax.sources._arrow import chunk_view, encoded_path, encoded_take, flatten_chunk
from datarax.sources._hf_config import Convert as Convert
from datarax.sources._hf_config import HFSourceConfig as HFSourceConfig
from datarax.sources._hf_config import check_arguments
from datarax.sources._hf_stream import HFStreamSource as HFStreamSource
from datarax.sources._paths import DataPathError, confine, read_data_file
from datarax.sources.memory import MemorySource, MemorySourceConfig

_FORMATS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json", ".arrow": "arrow"}


def load_files(paths: str | os.PathLike | Sequence[str | os.PathLike], *, streaming: bool = False,
               file_format: str | None = None, cache_dir: str | None = None) -> Any:
    """Loads local parquet/csv/json/arrow files as one `datasets` split (works offline).

    Returns a `datasets.Dataset`, or a `datasets.IterableDataset` (one shard per file) when
    `streaming`. The format comes from the file extension unless `file_format` is given.
    """
    datasets = require("datasets", owner="load_files", extra="data")
    files = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    if not files:
        raise ValueError("load_files needs at least one file path, got none")
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"load_files paths: {missing} do not exist; check the paths (files are read "
                                "locally, nothing is downloaded)")
    if file_format is None:
        kinds = {_FORMATS.get(os.path.splitext(f)[1].lower()) for f in files}
        if None in kinds or len(kinds) != 1:
            raise ValueError(f"load_files cannot tell the format of {files} from their extensions; pass "
                             f"file_format= one of {sorted(set(_FORMATS.values()))}")
        file_format = kinds.pop()
    schemas = {f: check_table_file(f, file_format) for f in files}
    check_same_columns(schemas)
    dataset = datasets.load_dataset(file_format, data_files=files, split="train", streaming=streaming,
                                    cache_dir=cache_dir)
    roots = tuple(dict.fromkeys(os.path.dirname(os.path.abspath(f)) for f in files))
    for cache in getattr(dataset, "cache_files", None) or ():
        _FILES_ROOTS[cache["filename"]] = roots
    return dataset


# The folders of the data files `load_files` read, by the Arrow cache file HF made of them (a
# select/shuffle of the dataset keeps its cache files, so it keeps its roots).
_FILES_ROOTS: dict[str, tuple[str, ...]] = {}


def files_roots(dataset: Any, files_root: str | None) -> tuple[str, ...]:
    """The dataset's roots: `files_root` if set, else the folders of the files `load_files` read."""
    if files_root is not None:
        return (os.path.abspath(files_root),)
    roots: dict[str, None] = {}
    for cache in getattr(dataset, "cache_files", None) or ():
        roots.update(dict.fromkeys(_FILES_ROOTS.get(cache["filename"], ())))
    return tuple(roots)


def check_same_columns(schemas: dict[str, Any]) -> None:
    """Files read as one split must agree on their columns and types; a ValueError names the first
    file that differs from the first one and how (HF only says it "couldn't cast" a table)."""
    known = [(path, schema) for path, schema in schemas.items() if schema is not None]
    if len(known) < 2:
        return
    first_path, first = known[0]
    for path, schema in known[1:]:
        if schema.equals(first, check_metadata=False):
            continue
        a = {field.name: str(field.type) for field in first}
        b = {field.name: str(field.type) for field in schema}
        only_a = {k: v for k, v in a.items() if k not in b}
        only_b = {k: v for k, v in b.items() if k not in a}
        typed = {k: (a[k], b[k]) for k in a if k in b and a[k] != b[k]}
        parts = ([f"columns only in the first: {only_a}"] if only_a else []) + \
                ([f"columns only in the second: {only_b}"] if only_b else []) + \
                ([f"types that differ (first, second): {typed}"] if typed else []) or ["column order differs"]
        raise ValueError(f"load_files: {first_path!r} and {path!r} do not have the same columns ({'; '.join(parts)}); "
                         "files read as one split must share one schema: rewrite them with the same columns and "
                         "types, or load them as separate datasets")


def check_table_file(path: str, file_format: str) -> Any:
    """Raises `CorruptFileError` naming `path` when a parquet or arrow file is truncated or garbled
    (HF's own error does not name it); returns its Arrow schema (None for text formats)."""
    import pyarrow as pa

    try:
        if file_format == "parquet":
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(path)
            schema = parquet.schema_arrow
            parquet.close()
            return schema
        if file_format == "arrow":
            with pa.memory_map(path) as data:
                try:
                    stream = pa.ipc.open_stream(data)  # HF's .arrow files are IPC streams: no footer
                except pa.ArrowInvalid:
                    data.seek(0)
                    return pa.ipc.open_file(data).schema  # the file format's footer indexes every batch
                for _ in stream:  # zero-copy over the memory map: checks each message's length
                    pass
                return stream.schema
        return None
    except (pa.ArrowException, OSError) as exc:
        raise CorruptFileError(f"load_files: {path!r} is not a readable {file_format} file ({exc}); it is truncated "
                               f"or damaged: {REWRITE}") from None


class HFSource(DataSourceModule):
    """A map-style `datasets.Dataset` as a random-access source.

    Args:
        config: columns, shuffling and eager/lazy reading.
        dataset: one split of a map-style dataset (e.g. from `load_files` or `load_dataset`).
        convert: optional function turning a batch of non-numeric columns into arrays.
        rngs: draws the shuffle seed when `config.seed` is None.

    Example:
        >>> ds = load_files(["train.parquet"])
        >>> source = HFSource(HFSourceConfig(fields=("image", "label"), shuffle=True, seed=0), dataset=ds)
    """

    def __init__(self, config: HFSourceConfig | None = None, *, dataset: Any, convert: Convert | None = None,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config = check_arguments(config, settings, dataset, convert, "HFSource", "Dataset")
        self.config = config
        names = check_columns(config.fields, dataset.column_names, "HFSource")
        check_columns(config.encoded or None, dataset.column_names, "HFSource encoded")
        names += tuple(n for n in config.encoded if n not in names)
        if len(dataset) == 0:
            raise ValueError("HFSource dataset has 0 rows; give it at least one")
        table = dataset.data.table.select(list(names))
        # A dataset after select/shuffle/filter reads its table through an index mapping.
        rows = None if dataset._indices is None else dataset._indices.column(0).to_numpy().astype(np.int64)
        self._length = len(dataset)
        sample = table.slice(0, 1024) if rows is None else table.take(rows[:1024])
        converter = TableConverter(sample, names, convert, "HFSource", config.encoded)
        # Rows are gathered with numpy from zero-copy views of each record batch's numeric columns:
        # Arrow's own take on nested lists rebuilds every offset level (~100x slower per row).
        chunks = table.to_batches()
        ends = np.cumsum([len(c) for c in chunks], dtype=np.int64)
        self._io = Handles(table=table, rows=rows, converter=converter, chunks=chunks, ends=ends,
                           starts=np.concatenate([np.zeros(1, np.int64), ends[:-1]]), views={})
        self.seed = seed_from_rngs(config.seed, rngs)
        self._names = names
        self._identity = (getattr(dataset.info, "dataset_name", None), str(dataset.split),
                          sorted(os.path.basename(f["filename"]) for f in dataset.cache_files))
        self._origin = ", ".join(f["filename"] for f in dataset.cache_files) or "the in-memory dataset"
        self._roots = files_roots(dataset, config.files_root)
        self._check_int_ranges()
        if config.encoded and config.mode == "eager":
            raise ValueError(f"HFSourceConfig(mode='eager') cannot hold the encoded columns {config.encoded} in "
                             "arrays; they are read from the Arrow table per batch: use mode='lazy' (or 'auto')")
        eager = not config.encoded and (config.mode == "eager" or (config.mode == "auto"
                                                                    and table.nbytes <= config.eager_max_bytes))
        self.memory = self._materialise(config) if eager else None

    def _check_int_ranges(self) -> None:
        """Refuses a 64-bit integer column with values JAX (without 64-bit mode) would wrap, naming
        the table row; one zero-copy pass over those columns only."""
        for name, spec in self._io.converter.numeric.items():
            if narrowed_dtype(spec.dtype) is None:
                continue
            for c, chunk in enumerate(self._io.chunks):
                flat = flatten_chunk(chunk.column(name))
                if isinstance(flat, str) or not len(chunk):
                    continue
                start = int(self._io.starts[c])
                check_int_range(flat[0].reshape(len(chunk), -1), "HFSource", name,
                                where=lambda row, start=start: f"row {start + row} of {self._origin}",
                                fix="cast the column in the dataset (dataset.cast_column(name, Value('float64')), or "
                                    "ids remapped to 0..N-1), or leave it out with fields=(...)")

    def _materialise(self, config: HFSourceConfig) -> MemorySource:
        arrays = allocate(self._io.converter.spec, (self._length,))
        for start in range(0, self._length, 8192):
            stop = min(start + 8192, self._length)
            self._read_flat(np.arange(start, stop), {k: v[start:stop] for k, v in arrays.items()})
        return MemorySource(MemorySourceConfig(device_resident=config.device_resident), data=arrays)

    @staticmethod
    def _rows(rows: np.ndarray | None, flat: np.ndarray) -> np.ndarray:
        return flat if rows is None else rows[flat]

    def _view(self, c: int) -> dict[str, np.ndarray]:
        """The numeric columns of record batch `c` as numpy arrays over the Arrow buffers (no copy)."""
        views = self._io.views.get(c)
        if views is None:
            chunk, owner = self._io.chunks[c], "HFSource"
            views = {n: chunk_view(chunk.column(n), tuple(s.shape), n, owner)
                     for n, s in self._io.converter.numeric.items()}
            self._io.views[c] = views
        return views

    def _read_flat(self, flat: np.ndarray, out: dict[str, np.ndarray]) -> None:
        io, converter = self._io, self._io.converter
        rows = self._rows(io.rows, flat)
        chunk = np.searchsorted(io.ends, rows, side="right")
        if chunk.min() == chunk.max():
            groups = [(int(chunk[0]), None)]
        else:
            order = np.argsort(chunk, kind="stable")
            groups = [(int(chunk[g[0]]), g) for g in np.split(order, np.flatnonzero(np.diff(chunk[order])) + 1)]
        for c, where in groups:
            local = rows if where is None else rows[where]
            local = local - io.starts[c]
            views = self._view(c)
            target = out if where is None else allocate(converter.spec, (local.size,))
            for name in converter.passthrough:
                np.take(views[name], local, axis=0, out=target[name])
            for name in converter.encoded:
                start = int(io.starts[c])
                target[name][...] = encoded_take(io.chunks[c].column(name), local, self._path_reader(start, name),
                                                 self._where(start, name))
            if converter.convert is not None:
                columns = io.chunks[c]
                converter.write_converted({n: np.take(v, local, axis=0) for n, v in views.items()},
                                          lambda n: columns.column(n).take(local).to_pylist(), local.size, target)
            if where is not None:
                for name, values in target.items():
                    out[name][where] = values

    def _where(self, start: int, column: str) -> Any:
        """Names a row of `column` in a chunk starting at table row `start`, for errors."""
        return lambda row: f"HFSource row {start + row} of {self._origin}, column {column!r},"

    def _path_reader(self, start: int, column: str) -> Any:
        """Reads the file a row of `column` names (rows in a chunk starting at table row `start`)."""
        config, name = self.config, self._where(start, column)

        def read(row: int, path: str) -> bytes:
            where = name(row)
            path = confine(path, self._roots, config.allow_outside_root, where,
                           "HFSourceConfig(allow_outside_root=True)")
            try:
                return read_data_file(path, config.max_file_bytes, where, "HFSourceConfig(max_file_bytes=...)")
            except FileNotFoundError:
                raise DataPathError(f"{where} names {path!r}, which does not exist (moved or deleted since the "
                                    "dataset was written?): restore the file, set files_root to the folder that holds "
                                    "it, or leave the row out (dataset.filter)") from None
        return read

    def __len__(self) -> int:
        return self._length

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._io.converter.spec)

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        if self.memory is not None:
            return self.memory.get_batch(indices, out)
        return read_batch(indices, out, self._io.converter.spec, self._length, self._read_flat)

    def device_arrays(self) -> dict[str, jax.Array] | None:
        return None if self.memory is None else self.memory.device_arrays()

    def describe_record(self, record_id: int) -> str:
        """`row 17 of /cache/parquet-train.arrow, image 'cat.jpg'`: the table row and stored file names."""
        row = int(self._rows(self._io.rows, np.array([record_id]))[0])
        c = int(np.searchsorted(self._io.ends, row, side="right"))
        chunk, local = self._io.chunks[c], row - int(self._io.starts[c])
        paths = [(n, encoded_path(chunk.column(n), local)) for n in self._io.converter.encoded]
        return f"row {row} of {self._origin}" + "".join(f", {n} {p!r}" for n, p in paths if p)

    def structure(self) -> str:
        name, split, files = self._identity
        convert = self._io.converter.convert
        return (f"HFSource(len={len(self)}, spec={spec_table(self.element_spec())}, dataset={name}, split={split}, "
                f"files={files}, columns={list(self._names)}, encoded={list(self.config.encoded)}, "
                f"convert={None if convert is None else getattr(convert, '__qualname__', repr(convert))})")
