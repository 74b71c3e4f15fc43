"""The shard formats `ShardedSource` reads (parquet row groups, webdataset tar samples, ArrayRecord
records), indexed into blocks `[records, first byte, end byte, native id, decoded bytes]` and read
back by byte range. Bytes that do not parse raise `CorruptFileError`; a store's `OSError` stays one.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from typing import Any

import numpy as np

from datarax.control.retry import RetryPolicy
from datarax.core.checks import narrowed_dtype, require
from datarax.core.errors import CorruptFileError, DataraxError

FORMATS = ("auto", "parquet", "tar", "array_record")
SUFFIXES = {".parquet": "parquet", ".tar": "tar", ".array_record": "array_record"}
TAR_BLOCK = 512
FIXED_LIST = re.compile(r"fixed_size_list<(?:item|element): (\w+)>\[(\d+)\]")
# Arrow's type names -> numpy dtypes. A 64-bit integer column is a 32-bit field unless JAX's 64-bit
# mode is on (as in every source); values that do not fit are refused, never wrapped.
NUMERIC = {"int8": np.dtype(np.int8), "int16": np.dtype(np.int16), "int32": np.dtype(np.int32),
            "int64": np.dtype(np.int64), "uint8": np.dtype(np.uint8), "uint16": np.dtype(np.uint16),
            "uint32": np.dtype(np.uint32), "uint64": np.dtype(np.uint64), "halffloat": np.dtype(np.float16),
            "float": np.dtype(np.float32), "double": np.dtype(np.float64), "bool": np.dtype(np.bool_)}
INT_FIX = ("read it as encoded bytes for a host_map that parses it (parquet: list it in encoded=(...); tar: leave it "
           "out of int_fields), or rewrite it as int32 or float64")



class StoreError(DataraxError):
    """Carries an `OSError` of the store (after its retries) out of pyarrow's parsing, where a
    corrupt page also raises `OSError`."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def device_dtype(dtype: np.dtype) -> np.dtype:
    """The field dtype of a column: a 64-bit integer is 32-bit unless JAX's 64-bit mode is on."""
    return narrowed_dtype(dtype) or dtype


def request(retry: Any, fn: Any) -> Any:
    """`fn()` (one request to the store) under `retry`; a missing file is not retried."""
    return retry.call(fn, permanent=(FileNotFoundError,))


def filesystem(url: str, storage_options: dict | None) -> tuple[Any, str]:
    fsspec = require("fsspec", owner="ShardedSource", extra="data")
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs, path


def shard_format(url: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    for suffix, name in SUFFIXES.items():
        if url.lower().endswith(suffix):
            return name
    raise ValueError(f"ShardedSource cannot tell the format of {url!r} from its extension; pass format= one of "
                     f"{FORMATS[1:]}")


def store_reader(fs: Any, path: str, retry: Any, counter: list[int] | None = None) -> Any:
    """`fetch(begin, end)`: one retried range request; its final `OSError` comes out as a
    `StoreError`, so pyarrow's own `OSError`s (a corrupt page) are told apart from the store's."""

    def fetch(begin: int, end: int) -> bytes:
        try:
            data = request(retry, lambda: fs.cat_file(path, begin, end))
        except OSError as exc:
            raise StoreError(exc) from exc
        if counter is not None:
            counter[0] += len(data)
        return data

    return fetch


def parquet_footer(fetch: Any, size: int) -> Any:
    """A parquet file's metadata from its footer, read with two range requests through `fetch`."""
    pq = require("pyarrow.parquet", owner="ShardedSource", extra="data", package="pyarrow")
    tail = fetch(max(0, size - 8), size)
    if size < 12 or tail[4:] != b"PAR1":
        raise ValueError(f"it does not end in parquet's magic bytes (last bytes {tail[-4:]!r}, not b'PAR1')")
    length = int.from_bytes(tail[:4], "little")
    if length > size - 12:
        raise ValueError(f"its footer length {length} is more than the file's {size} bytes hold")
    footer = fetch(size - 8 - length, size)
    return pq.ParquetFile(Ranges(size, {size - len(footer): footer}, fetch)).metadata


def parquet_index(meta: Any) -> tuple[list[list[int]], dict[str, str], dict[str, list]]:
    """The row groups (blocks), the columns, and the [min, max] of each 64-bit integer column
    from the footer's statistics (None where a row group has none)."""
    schema = meta.schema.to_arrow_schema()
    columns = {f.name: str(f.type) for f in schema}
    wide = [name for name, kind in columns.items() if kind in ("int64", "uint64")]
    ranges: dict[str, list] = {name: [] for name in wide}
    blocks = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.num_rows == 0:
            continue
        starts, ends = [], []
        for c in range(group.num_columns):
            col = group.column(c)
            start = col.dictionary_page_offset if col.has_dictionary_page and col.dictionary_page_offset else \
                col.data_page_offset
            starts.append(start)
            ends.append(start + col.total_compressed_size)
            name = col.path_in_schema
            if name in ranges:
                stats = col.statistics
                ranges[name].append([int(stats.min), int(stats.max)] if stats is not None and stats.has_min_max
                                    else None)
        blocks.append([group.num_rows, min(starts), max(ends), g, int(group.total_byte_size)])
    return blocks, columns, ranges


def tar_key(name: str) -> tuple[str, str]:
    folder, base = os.path.split(name)
    if "." not in base:
        return name, ""
    stem, ext = base.split(".", 1)
    return os.path.join(folder, stem), ext


def tar_index(fs: Any, path: str, url: str, block_records: int) -> tuple[list[list[int]], dict[str, str], dict]:
    samples: list[tuple[str, int, int, tuple[str, ...]]] = []  # key, first header offset, end, extensions
    with fs.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as archive:
        for member in archive:
            if not member.isfile():
                continue
            key, ext = tar_key(member.name)
            end = member.offset_data + -(-member.size // TAR_BLOCK) * TAR_BLOCK
            if samples and samples[-1][0] == key:
                k, start, _, exts = samples[-1]
                samples[-1] = (k, start, end, exts + (ext,))
            else:
                samples.append((key, member.offset, end, (ext,)))
    if not samples:
        raise CorruptFileError(f"ShardedSource shard {url!r} holds no files; is it a tar archive?")
    fields = samples[0][3]
    for key, _, _, exts in samples:
        if sorted(exts) != sorted(fields):
            raise CorruptFileError(f"ShardedSource shard {url!r}: sample {key!r} has members {sorted(exts)}, the first "
                                   f"sample {sorted(fields)}; every sample needs the same extensions")
    blocks = []
    for i in range(0, len(samples), block_records):
        run = samples[i:i + block_records]
        blocks.append([len(run), run[0][1], run[-1][2], i, run[-1][2] - run[0][1]])
    return blocks, {ext: "bytes" for ext in fields}, {}


def array_record_index(path: str, url: str, block_records: int) -> tuple[list[list[int]], dict[str, str], dict]:
    ar = require("array_record.python.array_record_module", owner="ShardedSource", extra="data",
                 package="array_record")
    reader = ar.ArrayRecordReader(path, "readahead_buffer_size:0")
    try:
        if not reader.ok():
            raise CorruptFileError(f"ShardedSource shard {url!r} is not a readable ArrayRecord file (its index "
                                   "cannot be read); it is truncated or damaged: restore it, or leave it out of urls")
        n = reader.num_records()
    finally:
        reader.close()
    if n == 0:
        raise CorruptFileError(f"ShardedSource shard {url!r} holds no records")
    return [[min(block_records, n - i), i, min(n, i + block_records), i, 0] for i in range(0, n, block_records)], \
        {"record": "bytes"}, {}


def index_shard(url: str, fmt: str, fs: Any, path: str, size: int, block_records: int, retry: RetryPolicy) -> tuple:
    """`(blocks, columns, int ranges)` of one shard; bytes that do not parse are a `CorruptFileError`
    naming the shard (an `OSError` of the store stays one, for the retries)."""
    try:
        if fmt == "parquet":
            return parquet_index(parquet_footer(store_reader(fs, path, retry), size))
        if fmt == "tar":
            return tar_index(fs, path, url, block_records)
        return array_record_index(path, url, block_records)
    except (CorruptFileError, FileNotFoundError):
        raise
    except StoreError as exc:  # the store failed after its retries: an OSError still
        raise exc.error from None
    except (ValueError, OSError, EOFError, tarfile.TarError, RuntimeError) as exc:
        what = {"parquet": "its footer", "tar": "its member headers", "array_record": "its index"}[fmt]
        raise CorruptFileError(f"ShardedSource shard {url!r} is not a readable {fmt} file ({what}: {exc}); it is "
                               "truncated or damaged: restore it, or leave it out of urls") from None


class Ranges(io.RawIOBase):
    """A read-only file of `size` bytes of which some ranges were fetched (a parquet row group):
    pyarrow reads the row group through it; a read outside them is fetched with `fetch(start, end)`
    (counted like any other fetch)."""

    def __init__(self, size: int, ranges: dict[int, bytes], fetch):
        self._size, self._ranges, self._pos, self._fetch = size, sorted(ranges.items()), 0, fetch

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: offset, 1: self._pos + offset, 2: self._size + offset}[whence]
        return self._pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        for start, data in self._ranges:
            if start <= self._pos and self._pos + n <= start + len(data):
                buffer[:n] = data[self._pos - start:self._pos - start + n]
                break
        else:
            buffer[:n] = self._fetch(self._pos, self._pos + n)
        self._pos += n
        return n


def encoded_column(column: Any, name: str) -> list:
    pa = require("pyarrow", owner="ShardedSource", extra="data")
    if pa.types.is_struct(column.type):  # HF Image/Audio: struct<bytes, path>
        values = column.field("bytes").to_pylist()
        if any(v is None for v in values):
            raise CorruptFileError(f"ShardedSource column {name!r} has rows that store only a path, no bytes; a remote "
                                   "shard must carry the files' bytes (write it with datarax.sources.write_hf_parquet)")
        return values
    return column.to_pylist()
