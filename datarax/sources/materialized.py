"""`MaterializedSource`: a decode-once cache (written by `datarax.host.materialize`) read back, with
the checks that refuse a stale or damaged cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import (
    check_bool,
    check_choice,
    check_field_name,
    check_int,
    check_positive_int,
    check_seed,
    field,
    require,
)
from datarax.core.construct import resolve_arguments
from datarax.core.errors import CorruptFileError, DataraxError
from datarax.core.fields import ENCODED, read_batch
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs
from datarax.samplers.base import Sampler
from datarax.samplers.simple import default_sampler
from datarax.sources.array_record import (
    ARRAY_RECORD,
    RANDOM_ACCESS_OPTIONS,
    ArrayRecordSource,
    ArrayRecordSourceConfig,
    open_reader,
)

FORMATS = ("raw", "jpeg")
FORMAT_VERSION = 1
KIND = "datarax.materialized"
MANIFEST = "manifest.json"


class StaleCacheError(DataraxError, ValueError):
    """A materialized cache that no longer matches its source or the prefix asked for."""


@dataclasses.dataclass(frozen=True)
class MaterializeConfig:
    """The deterministic prefix `materialize` runs once (stored in the cache's manifest).

    Attributes:
        max_side: the longest side, in pixels, of a stored image; larger images are reduced
            (aspect kept, Lanczos), smaller ones are never enlarged.
        format: "raw" (uncompressed RGB or gray as binary PPM/PGM: lossless, fastest to decode)
            or "jpeg" (several times fewer bytes, lossy at `quality`).
        quality: the JPEG quality (1-100) of `format="jpeg"`; ignored by "raw".
        field: the field holding the encoded images; the other fields are copied as they are.
    """

    max_side: int
    format: str = "raw"
    quality: int = 90
    field: str = "image"

    def __post_init__(self):
        check_positive_int(*field(self, "max_side"), unit="pixels")
        check_choice(*field(self, "format"), FORMATS)
        check_int(*field(self, "quality"), 1, high=100)
        check_field_name(*field(self, "field"))

    def settings(self) -> dict[str, Any]:
        """The settings that change what is stored ("raw" ignores the quality)."""
        out = dataclasses.asdict(self)
        if self.format == "raw":
            out["quality"] = None
        return out


@dataclasses.dataclass(frozen=True)
class MaterializedSourceConfig(ShuffleConfig):
    """Configuration of a `MaterializedSource`: the prefix the cache must hold, and its order.

    Attributes:
        max_side, format, quality, field: the prefix asked for, checked against the manifest.
        shuffle: None follows the source the cache was made from (storage order without one).
        seed: the shuffle seed when `shuffle=True`.
    """

    max_side: int
    format: str = "raw"
    quality: int = 90
    field: str = "image"
    shuffle: bool | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self):
        # ShuffleConfig's checks, with None allowed for "follow the source".
        check_bool(*field(self, "shuffle"), allow_none=True)
        check_seed(*field(self, "seed"), allow_none=True)
        self.prefix()

    def prefix(self) -> MaterializeConfig:
        """The prefix fields as the `MaterializeConfig` they describe."""
        return MaterializeConfig(max_side=self.max_side, format=self.format, quality=self.quality, field=self.field)


def source_stamp(source: DataSourceModule) -> tuple[dict[str, Any], np.ndarray | None]:
    """`(stamp, file stats)` identifying a source's content for a cache: its `structure()`, length
    and the hash of its files' `(size, mtime_ns)`."""
    paths = getattr(source, "paths", None)
    stats = None
    if paths is not None:
        stats = np.array([(s.st_size, s.st_mtime_ns) for s in map(os.stat, paths)], np.int64).reshape(-1, 2)
    files = None if stats is None else hashlib.sha256(stats.tobytes()).hexdigest()[:16]
    return {"structure": source.structure(), "records": len(source), "files": files}, stats


def _stale(directory: str, differences: Sequence[str]) -> StaleCacheError:
    return StaleCacheError(
        f"the materialized cache {directory!r} no longer matches: {'; '.join(differences)}. Delete the directory or "
        f"call datarax.host.materialize(source, {directory!r}, ...) again, which rewrites it")


def _corrupt(directory: str, what: str) -> CorruptFileError:
    return CorruptFileError(f"the materialized cache {directory!r} is damaged: {what}. Delete the directory and call "
                            f"datarax.host.materialize(source, {directory!r}, ...) again")


def _source_differences(directory: str, manifest: dict, source: DataSourceModule) -> list[str]:
    stamp, stats = source_stamp(source)
    cached = manifest["source"]
    out = []
    if stamp["records"] != cached["records"]:
        out.append(f"the source has {stamp['records']} records, the cache {cached['records']}")
    if stamp["structure"] != cached["structure"]:
        out.append(f"the source is now {stamp['structure']}, the cache was made from {cached['structure']}")
    if not out and stamp["files"] != cached["files"]:
        old = _load_stats(directory)
        if stats is not None and old is not None and old.shape == stats.shape:
            row = int(np.argmax((old != stats).any(axis=1)))
            out.append(f"file {source.describe_record(row)!r} changed (size {old[row, 0]} -> {stats[row, 0]} bytes, "
                       f"mtime_ns {old[row, 1]} -> {stats[row, 1]})")
        else:
            out.append("the source's files changed (sizes or modification times)")
    return out


def _load_stats(directory: str) -> np.ndarray | None:
    path = os.path.join(directory, "source_files.npy")
    return np.load(path) if os.path.isfile(path) else None


def read_manifest(directory: str) -> dict[str, Any]:
    """A cache's manifest, checked to be one this version reads."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory!r} is not a materialized cache (no {MANIFEST}); write one with "
                                f"datarax.host.materialize(source, {directory!r}, max_side=...)")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise _corrupt(directory, f"{MANIFEST} cannot be read ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise _corrupt(directory, f"{MANIFEST} is not a datarax cache manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise _stale(directory, [f"it has format version {manifest.get('format_version')}, this datarax reads "
                                 f"{FORMAT_VERSION}"])
    return manifest


class MaterializedSource(DataSourceModule):
    """A cache written by `materialize`, served as the source it was made from.

    Records keep their ids; `field` holds the small encoded images. Opening checks the manifest
    against `source` and the settings (`StaleCacheError`) and the shards' sizes (`CorruptFileError`).

    Args:
        config: the prefix asked for and the record order (or give its fields as keywords).
        directory: the cache folder; also by position.
        source: the source the cache was made from, checked against the manifest (None: not checked).
        rngs: draws the shuffle seed when `shuffle=True` and `config.seed` is None.

    Example:
        >>> cache = MaterializedSource("/data/photos-160", source=source, max_side=160)
    """

    positional = ("directory",)

    def __init__(self, config: MaterializedSourceConfig | None = None, *args: Any,
                 directory: str | os.PathLike | None = None, source: DataSourceModule | None = None,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config, directory = resolve_arguments(MaterializedSourceConfig, config, settings, "MaterializedSource",
                                              {"directory": directory}, args=args, positional=self.positional)
        prefix = config.prefix()
        if source is not None and not isinstance(source, DataSourceModule):
            raise TypeError(f"MaterializedSource source must be the DataSourceModule the cache was made from (or "
                            f"None), got {type(source).__name__}")
        directory = os.fspath(directory)
        manifest = read_manifest(directory)
        differences = [f"{name} is {manifest['prefix'].get(name)!r} in the cache, {value!r} asked"
                       for name, value in prefix.settings().items() if manifest["prefix"].get(name) != value]
        if source is not None:
            differences += _source_differences(directory, manifest, source)
        if differences:
            raise _stale(directory, differences)
        shards = [os.path.join(directory, s["name"]) for s in manifest["shards"]]
        for shard, entry in zip(shards, manifest["shards"]):
            size = os.path.getsize(shard) if os.path.isfile(shard) else None
            if size != entry["bytes"]:
                raise _corrupt(directory, f"shard {entry['name']!r} has {size} bytes, the manifest says "
                                          f"{entry['bytes']} (missing or truncated)")
        try:
            found = _shard_counts(shards)
        except CorruptFileError as exc:
            raise _corrupt(directory, str(exc)) from None
        promised = [s["records"] for s in manifest["shards"]]
        if found != promised:
            raise _corrupt(directory, f"its shards hold {found} records, the manifest says {promised}")
        self.config, self.directory, self.source = config, directory, source
        self.seed = seed_from_rngs(config.seed, rngs)

        self.images = ArrayRecordSource(ArrayRecordSourceConfig(encoded=config.field), paths=shards)
        arrays = {}
        for name, entry in manifest["fields"].items():
            path = os.path.join(directory, entry["file"])
            if not os.path.isfile(path) or os.path.getsize(path) != entry["bytes"]:
                raise _corrupt(directory, f"field file {entry['file']!r} is missing or truncated")
            arrays[name] = np.load(path, mmap_mode="r")
        self._store = Handles(arrays=arrays, manifest=manifest)
        # What was stored, not how long it took: a cache written again from the same source resumes.
        stored = {k: v for k, v in manifest.items() if k != "seconds"}
        self._fingerprint = hashlib.sha256(json.dumps(stored, sort_keys=True).encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.images)

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        spec = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in self._store.arrays.items()}
        return {self.config.field: jax.ShapeDtypeStruct((), ENCODED), **spec}

    @property
    def manifest(self) -> dict[str, Any]:
        """The cache's manifest (a copy)."""
        return json.loads(json.dumps(self._store.manifest))

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return read_batch(indices, out, self.element_spec(), len(self), self._read_flat)

    def _read_flat(self, flat: np.ndarray, out: dict[str, np.ndarray]) -> None:
        name = self.config.field
        self.images.get_batch(flat, {name: out[name]})
        for k, v in self._store.arrays.items():
            np.take(v, flat, axis=0, out=out[k], mode="clip")

    def describe_record(self, record_id: int) -> str:
        cached = self.images.describe_record(record_id)
        return cached if self.source is None else f"{cached}, from {self.source.describe_record(record_id)}"

    def sampler(self) -> Sampler | None:
        """The source's default sampler under `shuffle=None` (given a source), else the usual choice."""
        if self.config.shuffle is None and self.source is not None:
            return default_sampler(self.source)
        return None

    def structure(self) -> str:
        # The manifest's hash covers the source's stamp, the prefix and every shard's size.
        prefix = self.config.prefix()
        return f"MaterializedSource(len={len(self)}, manifest_sha256={self._fingerprint}, prefix={prefix})"

    def close(self) -> None:
        """Closes the shard readers."""
        self.images.close()


def _shard_counts(paths: Sequence[str]) -> list[int]:
    """Each shard's record count, read from its index (its first and last records are read back)."""
    ar = require(ARRAY_RECORD, owner="MaterializedSource", extra="data", package="array_record")
    counts = []
    for path in paths:
        reader = open_reader(ar, path, RANDOM_ACCESS_OPTIONS)
        counts.append(int(reader.num_records()))
        reader.close()
    return counts
