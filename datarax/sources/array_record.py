"""Random-access batch reads from ArrayRecord files.

Records are datarax fixed-layout records (`write_array_records`, decoded a batch at a time), any
bytes with a user `decode` function, or raw encoded records (`encoded="jpeg"`) for a host stage.
"""

from __future__ import annotations

import dataclasses
import glob
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_field_name, check_int, field, require
from datarax.core.construct import resolve_arguments
from datarax.core.errors import REWRITE, CorruptFileError
from datarax.core.fields import ENCODED, flatten, read_batch, spec_of, spec_table, stack_into
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs
from datarax.sources._records import decode_batch_into, encode_record, parse_layout
from datarax.sources.memory import validate_arrays

RANDOM_ACCESS_OPTIONS = "readahead_buffer_size:0"
ARRAY_RECORD = "array_record.python.array_record_module"
Decoder = Callable[[bytes], Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class ArrayRecordSourceConfig(ShuffleConfig):
    """Configuration of an `ArrayRecordSource`.

    Attributes:
        reader_options: ArrayRecord reader options (the default turns read-ahead off).
        encoded: a field name for each record's raw bytes (for a host stage); None decodes here.
    """

    reader_options: str = RANDOM_ACCESS_OPTIONS
    encoded: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.reader_options, str):
            raise TypeError(f"ArrayRecordSourceConfig.reader_options must be a string such as "
                            f"{RANDOM_ACCESS_OPTIONS!r}, got {self.reader_options!r}")
        check_field_name(*field(self, "encoded"), allow_none=True)


def expand_paths(paths: Any, owner: str) -> list[str]:
    """Paths (or glob patterns) to existing files, in the order given (globs sorted)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, Sequence) or not paths:
        raise TypeError(f"{owner} paths must be a path, a glob pattern or a non-empty list of them, got {paths!r}")
    files: list[str] = []
    for p in map(os.fspath, paths):
        matches = sorted(glob.glob(p)) if glob.has_magic(p) else [p]
        if not matches or not all(os.path.isfile(m) for m in matches):
            raise FileNotFoundError(f"{owner} paths: {p!r} does not exist (or matches no file); check the path, "
                                    "or write the files first (e.g. with write_array_records)")
        files.extend(matches)
    return files


class ArrayRecordSource(DataSourceModule):
    """Serves records from one or more ArrayRecord files as one random-access dataset.

    Args:
        config: shuffling and reader options.
        paths: a file, a glob pattern, or a list of them, concatenated in order; also by position.
        decode: optional function from one record's bytes to a dict of fixed-shape arrays; None
            reads datarax fixed-layout records.
        rngs: draws the shuffle seed when `config.seed` is None.

    Example:
        >>> files = write_array_records("/tmp/data/train", {"x": np.arange(100)}, num_shards=2)
        >>> src = ArrayRecordSource(files, shuffle=True, seed=0)
        >>> src.get_batch(np.array([5, 60]))["x"]
        array([ 5, 60])
    """

    positional = ("paths",)

    def __init__(self, config: ArrayRecordSourceConfig | None = None, *args: Any, paths: Any = None,
                 decode: Decoder | None = None, rngs: nnx.Rngs | None = None, **settings: Any):
        ar = require(ARRAY_RECORD, owner="ArrayRecordSource", extra="data", package="array_record")
        config, paths = resolve_arguments(ArrayRecordSourceConfig, config, settings, "ArrayRecordSource",
                                          {"paths": paths}, args=args, positional=self.positional)
        if decode is not None and not callable(decode):
            raise TypeError(f"ArrayRecordSource decode must be a function bytes -> dict of arrays, got {decode!r}")
        if decode is not None and config.encoded is not None:
            raise ValueError(f"ArrayRecordSource got decode= and ArrayRecordSourceConfig(encoded={config.encoded!r}); "
                             "pass one: decode turns records into arrays here, encoded leaves them to a host stage")
        self.config = config
        files = expand_paths(paths, "ArrayRecordSource")
        readers = []
        try:
            for f in files:
                readers.append(open_reader(ar, f, config.reader_options))
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        counts = np.array([r.num_records() for r in readers], np.int64)
        if counts.sum() == 0:
            raise ValueError(f"ArrayRecordSource files {files} hold no records; write at least one record")
        self._ends = tuple(int(e) for e in np.cumsum(counts))
        self._names = tuple((os.path.basename(f), int(c)) for f, c in zip(files, counts))
        self._files = tuple(files)
        self._decode_name = None if decode is None else getattr(decode, "__qualname__", type(decode).__name__)
        first = readers[int(np.argmax(counts > 0))].read([0])[0]
        if config.encoded is not None:
            layout, spec = None, {config.encoded: jax.ShapeDtypeStruct((), ENCODED)}
        elif decode is None:
            layout = parse_layout(first, f"record 0 of {files[int(np.argmax(counts > 0))]!r}")
            spec = layout.spec()
        else:
            layout = None
            spec = spec_of(flatten(decode(first)), "ArrayRecordSource decode output", batched=False)
        self._io = Handles(readers=readers, layout=layout, decode=decode, spec=spec,
                           starts=np.concatenate([[0], np.cumsum(counts)[:-1]]))
        self.seed = seed_from_rngs(config.seed, rngs)

    def __len__(self) -> int:
        return self._ends[-1]

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._io.spec)

    def _records(self, flat: np.ndarray) -> list[bytes]:
        # Reading each file's records in ascending position order is ~20% faster than in
        # shuffled order (sequential chunk access); the records are put back in order after.
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
        starts = self._io.starts
        bounds = np.searchsorted(ordered, np.asarray(self._ends), side="left")
        records: list[bytes] = []
        low = 0
        for f, high in enumerate(bounds.tolist()):
            if high > low:
                records.extend(self._read_file(f, (ordered[low:high] - starts[f]).tolist()))
            low = high
        return list(operator.itemgetter(*np.argsort(order).tolist())(records)) if flat.size > 1 else records

    def _read_file(self, f: int, positions: list[int]) -> list[bytes]:
        reader = self._io.readers[f]
        try:
            return reader.read(positions)
        except RuntimeError as exc:
            # Riegeli checks every chunk's hashes; find the first bad record for the message.
            bad = next((p for p in positions if _read_error(reader, [p]) is not None), positions[0])
            raise CorruptFileError(f"ArrayRecordSource cannot read record {bad} of {self._files[f]!r}: {exc}; "
                                   f"the file is damaged: {REWRITE}") from None

    def _read_flat(self, flat: np.ndarray, out: dict[str, np.ndarray]) -> None:
        records = self._records(flat)
        if self.config.encoded is not None:
            out[self.config.encoded][...] = _object_array(records)
        elif self._io.layout is not None:
            decode_batch_into(records, self._io.layout, out, lambda i: self.describe_record(int(flat[i])))
        else:
            decode = self._io.decode
            stack_into([flatten(decode(r)) for r in records], out, "ArrayRecordSource decode output")

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return read_batch(indices, out, self._io.spec, len(self), self._read_flat)

    def describe_record(self, record_id: int) -> str:
        """`record 5 of train-00001-of-00002.array_record`: the file and the record's place in it."""
        f = int(np.searchsorted(np.asarray(self._ends), record_id, side="right"))
        return f"record {record_id - int(self._io.starts[f])} of {self._files[f]}"

    def structure(self) -> str:
        return (f"ArrayRecordSource(len={len(self)}, spec={spec_table(self._io.spec)}, files={list(self._names)}, "
                f"decode={self._decode_name}, encoded={self.config.encoded})")

    def close(self) -> None:
        """Closes the file readers; the source cannot read afterwards."""
        for reader in self._io.readers:
            reader.close()


def open_reader(ar: Any, path: str, options: str) -> Any:
    """An ArrayRecord reader of `path` whose index and first and last records were read back (a
    damaged file otherwise opens as an empty shard)."""
    try:
        reader = ar.ArrayRecordReader(path, options)
    except (RuntimeError, ValueError) as exc:
        raise CorruptFileError(f"ArrayRecordSource file {path!r} is not a readable ArrayRecord file ({exc}); "
                               f"{REWRITE}") from None
    problem = None
    if not reader.ok():
        problem = _read_error(reader, [0]) or "its record index cannot be read"
    elif reader.num_records():
        problem = _read_error(reader, [0, reader.num_records() - 1])
    if problem is not None:
        try:
            reader.close()
        except RuntimeError:
            pass  # closing a failed reader reports the same failure again
        raise CorruptFileError(f"ArrayRecordSource file {path!r} is not a readable ArrayRecord file: it is "
                               f"truncated or damaged ({problem}); {REWRITE}")
    return reader


def _read_error(reader: Any, positions: list[int]) -> str | None:
    try:
        reader.read(positions)
    except RuntimeError as exc:
        return str(exc)
    return None


def _object_array(values: list) -> np.ndarray:
    # np.array(list of bytes) would make a fixed-width bytes array; records stay Python objects.
    out = np.empty(len(values), object)
    out[:] = values
    return out


def write_array_records(prefix: str | os.PathLike, data: Mapping[str, Any], *, num_shards: int = 1,
                        options: str = "group_size:1") -> list[str]:
    """Writes a dict of equal-length arrays as fixed-layout records into `num_shards` files named
    `{prefix}-{i:05d}-of-{num_shards:05d}.array_record`; returns their paths in order."""
    ar = require(ARRAY_RECORD, owner="write_array_records", extra="data", package="array_record")
    arrays = validate_arrays(data, "write_array_records")
    check_int(num_shards, "write_array_records num_shards", 1)
    n = len(next(iter(arrays.values())))
    prefix = os.fspath(prefix)
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    bounds = np.linspace(0, n, num_shards + 1).astype(np.int64)
    paths = []
    for shard in range(num_shards):
        path = f"{prefix}-{shard:05d}-of-{num_shards:05d}.array_record"
        writer = ar.ArrayRecordWriter(path, options)
        for i in range(bounds[shard], bounds[shard + 1]):
            writer.write(encode_record({k: v[i] for k, v in arrays.items()}))
        writer.close()
        paths.append(path)
    return paths
