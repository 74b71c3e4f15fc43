"""`ShardedSource`: parquet, webdataset-tar or ArrayRecord shards on any fsspec filesystem, shuffled
in O(1) iterator state, read by byte range ahead of need, resumed exactly.

A manifest lists every shard's blocks; its hash is the fingerprint and a changed shard is refused
(`ShardChangedError`). docs/sources.md ("Sharded and remote data") has the details.

Example:
    >>> source = ShardedSource(urls=["s3://bucket/train-00000.parquet", ...], encoded=("image",),
    ...                        shuffle=True, seed=0)
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import io
import json
import os
import tarfile
import threading
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.control.pool import ThreadPool
from datarax.control.retry import RetryPolicy
from datarax.core.checks import (
    IntegerRangeError,
    check_bool,
    check_choice,
    check_int,
    check_int_range,
    check_number,
    check_positive_int,
    field,
    narrowed_dtype,
    require,
)
from datarax.core.construct import resolve_config
from datarax.core.errors import CorruptFileError
from datarax.core.fields import ENCODED, read_batch
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs
from datarax.samplers.base import Sampler
from datarax.samplers.block import BlockShuffleSampler
from datarax.sources.manifest import ShardChangedError, expand_urls, load_manifest
from datarax.sources.shard_formats import (
    FIXED_LIST,
    FORMATS,
    INT_FIX,
    NUMERIC,
    Ranges,
    StoreError,
    device_dtype,
    encoded_column,
    filesystem,
    parquet_footer,
    request,
    store_reader,
    tar_key,
)


@dataclasses.dataclass(frozen=True)
class ShardedSourceConfig(ShuffleConfig):
    """Configuration of a `ShardedSource`.

    Attributes:
        urls: the shard URLs (any fsspec protocol), in storage order; or one glob pattern.
        format: "parquet", "tar" (webdataset), "array_record" (local files only), or "auto" (by extension).
        fields: the columns (parquet) or member extensions (tar) to read; None: all.
        encoded: parquet columns read as encoded bytes/str; tar members (but `int_fields`) and
            ArrayRecord's `record` field are always encoded.
        int_fields: tar member extensions holding a decimal int (webdataset's `cls`), read as int32.
        window: blocks whose records are shuffled together (the second level of the shuffle).
        block_records: records per block for tar and ArrayRecord (parquet blocks are row groups).
        prefetch_blocks: blocks fetched ahead of the furthest one being read.
        cache_blocks: blocks kept in memory at most (prefetched ones included).
        num_threads: threads fetching blocks.
        manifest_dir: where manifests are cached (None: `~/.cache/datarax/manifests`).
        storage_options: passed to `fsspec.filesystem(protocol, **storage_options)`.
        max_retries: retries of each request to the store after an `OSError`.
        retry_backoff_s: the wait before a request's first retry; each later wait doubles (at most 30 s).
        verify: at open, hash each shard's first and last 64 KiB again and refuse a shard whose hash
            differs from the manifest's.
    """

    urls: tuple[str, ...] | str
    format: str = "auto"
    fields: tuple[str, ...] | None = None
    encoded: tuple[str, ...] = ()
    int_fields: tuple[str, ...] = ("cls",)
    window: int = 16
    block_records: int = 256
    prefetch_blocks: int = 16
    cache_blocks: int = 48
    num_threads: int = 16
    manifest_dir: str | None = None
    storage_options: dict | None = None
    max_retries: int = 5
    retry_backoff_s: float = 0.1
    verify: bool = True

    def __post_init__(self):
        super().__post_init__()
        urls = (self.urls,) if isinstance(self.urls, (str, os.PathLike)) else self.urls
        if not isinstance(urls, (tuple, list)) or not urls or not all(isinstance(u, (str, os.PathLike)) for u in urls):
            raise TypeError(f"ShardedSourceConfig.urls must be a list of shard URLs or one glob pattern, got "
                            f"{self.urls!r}")
        object.__setattr__(self, "urls", tuple(os.fspath(u) for u in urls))
        check_choice(*field(self, "format"), FORMATS)
        for name in ("fields", "encoded", "int_fields"):
            value = getattr(self, name)
            if value is None and name == "fields":
                continue
            value = (value,) if isinstance(value, str) else value
            if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) and v for v in value):
                raise TypeError(f"ShardedSourceConfig.{name} must be a tuple of names, got {getattr(self, name)!r}")
            object.__setattr__(self, name, tuple(value))
        for name in ("window", "block_records", "cache_blocks", "num_threads"):
            check_positive_int(*field(self, name))
        check_int(*field(self, "prefetch_blocks"), 0)
        if self.prefetch_blocks >= self.cache_blocks:
            raise ValueError(f"ShardedSourceConfig.prefetch_blocks ({self.prefetch_blocks}) must be below cache_blocks "
                             f"({self.cache_blocks}), or prefetched blocks evict the ones being read; raise "
                             "cache_blocks")
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise TypeError(f"ShardedSourceConfig.storage_options must be a dict or None, got {self.storage_options!r}")
        check_int(*field(self, "max_retries"), 0)
        check_number(*field(self, "retry_backoff_s"), 0.0)
        check_bool(*field(self, "verify"))

    def retry_policy(self) -> RetryPolicy:
        """The `datarax.pipeline.RetryPolicy` each request to the store is retried under."""
        return RetryPolicy(max_retries=self.max_retries, backoff_s=self.retry_backoff_s)


class ShardedSource(DataSourceModule):
    """Records of parquet, tar or ArrayRecord shards on any fsspec filesystem (see the module docstring).

    Args:
        config: a `ShardedSourceConfig`; or its fields as keywords (`urls=` is required).
        rngs: where an unset shuffle seed is drawn from.
    """

    def __init__(self, config: ShardedSourceConfig | None = None, *, rngs: nnx.Rngs | None = None, **settings: Any):
        self.config = resolve_config(ShardedSourceConfig, config, settings, "ShardedSource")
        urls = expand_urls(self.config.urls, self.config.storage_options, self.config.retry_policy())
        manifest = load_manifest(urls, self.config)
        self.seed = seed_from_rngs(self.config.seed, rngs)
        self._setup(manifest)

    def _setup(self, manifest: dict[str, Any]) -> None:
        self._format = manifest["format"]
        self._fingerprint = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
        blocks = [(s, *b) for s, shard in enumerate(manifest["shards"]) for b in shard["blocks"]]
        counts = np.array([b[1] for b in blocks], np.int64)
        # A plain holder keeps the block table, the cache and the threads out of NNX state and graph.
        starts = np.concatenate([[0], np.cumsum(counts)])
        self._io = Handles(manifest=manifest, blocks=blocks, counts=counts, starts=starts,
                           cache=collections.OrderedDict(), lock=threading.Lock(), pool=None, sampler=None, footers={},
                           fetched=[0], unrequested=[0], retry=self.config.retry_policy())
        self._spec = self._element_spec(manifest["columns"])
        self._check_int_ranges()

    @property
    def manifest(self) -> dict[str, Any]:
        """The shards' blocks and stamps (see `build_manifest`)."""
        return self._io.manifest

    @property
    def fetched_bytes(self) -> int:
        """Bytes read from the shards so far (for read-amplification reports)."""
        return self._io.fetched[0]

    @property
    def unrequested_blocks(self) -> int:
        """Blocks a read had to fetch itself because nothing asked for them ahead (each a wait on the store)."""
        return self._io.unrequested[0]

    def _check_int_ranges(self) -> None:
        """Refuses, at open, a 64-bit integer field whose footer statistics hold a value JAX would wrap."""
        shards = self._io.manifest["shards"]
        for name, spec in self._spec.items():
            if narrowed_dtype(NUMERIC.get(self._io.manifest["columns"].get(name), np.dtype(object))) is None \
                    or spec.dtype == ENCODED:
                continue
            for shard in shards:
                for group, bounds in zip(shard["blocks"], shard.get("int_ranges", {}).get(name, ())):
                    if bounds is not None:
                        check_int_range(np.asarray(bounds, np.int64), "ShardedSource", name, fix=INT_FIX,
                                        where=lambda _, g=group[3], u=shard["url"]: f"row group {g} of {u}")

    def _element_spec(self, columns: dict[str, str]) -> dict[str, jax.ShapeDtypeStruct]:
        config, spec = self.config, {}
        names = list(columns) if config.fields is None else list(config.fields)
        missing = [n for n in (*names, *config.encoded) if n not in columns]
        if missing:
            raise KeyError(f"ShardedSource fields {missing} are not in the shards (they have {sorted(columns)}); "
                           "pick from those")
        for name in dict.fromkeys([*names, *config.encoded]):
            kind, shape = columns[name], ()
            fixed = FIXED_LIST.fullmatch(kind)
            if fixed:  # fixed_size_list<item: float>[3]: a (3,) field
                kind, shape = fixed.group(1), (int(fixed.group(2)),)
            if self._format != "parquet":
                dtype = device_dtype(np.dtype(np.int64)) if name in config.int_fields else ENCODED
            elif name in config.encoded:
                dtype = ENCODED
            elif kind in NUMERIC:
                dtype = device_dtype(NUMERIC[kind])
            else:
                raise TypeError(f"ShardedSource column {name!r} is {columns[name]}, which is not a number or a "
                                f"fixed-size list of numbers; list it in encoded=(...) to read it as bytes/str for a "
                                "host stage, or "
                                "leave it out of fields")
            spec[name] = jax.ShapeDtypeStruct(shape, dtype)
        return spec

    def __len__(self) -> int:
        return int(self._io.starts[-1])

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._spec)

    def sampler(self) -> Sampler:
        """The two-level block shuffle when `shuffle=True`, else storage order."""
        shuffle = bool(self.config.shuffle)
        self._io.sampler = BlockShuffleSampler(self._io.counts, self.config.window, self.seed, shuffle)
        return self._io.sampler

    def upcoming(self, indices: np.ndarray, epoch: int) -> None:
        """Fetches the blocks of the records read next (at most `prefetch_blocks`), so a pipeline with
        its own sampler reads ahead too."""
        if self.config.prefetch_blocks == 0:
            return
        flat = np.clip(np.asarray(indices, np.int64).reshape(-1), 0, len(self) - 1)
        blocks = np.searchsorted(self._io.starts, flat, side="right") - 1
        _, first = np.unique(blocks, return_index=True)
        for b in blocks[np.sort(first)][:self.config.prefetch_blocks].tolist():
            self._block(int(b), requested=True)

    def describe_record(self, record_id: int) -> str:
        b = int(np.searchsorted(self._io.starts, record_id, side="right") - 1)
        shard, _, _, _, native, _ = self._io.blocks[b]
        unit = "row group" if self._format == "parquet" else "block"
        return (f"record {record_id - int(self._io.starts[b])} of {unit} {native} of "
                f"{self._io.manifest['shards'][shard]['url']}")

    # -- reading ---------------------------------------------------------------------------

    def _executor(self) -> ThreadPool:
        if self._io.pool is None:
            self._io.pool = ThreadPool(self.config.num_threads, "datarax-sharded")
        return self._io.pool

    def _block(self, b: int, *, requested: bool = True) -> concurrent.futures.Future:
        """The block's future, fetched now unless cached or in flight (LRU, `cache_blocks` at most);
        `requested=False`: a read needs it now (counted in `unrequested_blocks` when not there)."""
        with self._io.lock:
            future = self._io.cache.get(b)
            if future is not None:
                self._io.cache.move_to_end(b)
                return future
            if not requested:
                self._io.unrequested[0] += 1
            future = self._executor().submit(self._fetch, b)
            self._io.cache[b] = future
            while len(self._io.cache) > self.config.cache_blocks:
                self._io.cache.popitem(last=False)
            return future

    def _forget(self, b: int, future: concurrent.futures.Future) -> None:
        with self._io.lock:
            if self._io.cache.get(b) is future:
                del self._io.cache[b]

    def _fetch(self, b: int) -> dict[str, Any]:
        shard_index, count, start, end, native, _ = self._io.blocks[b]
        shard = self._io.manifest["shards"][shard_index]
        fs, path = filesystem(shard["url"], self.config.storage_options)
        if self._format == "array_record":
            return self._fetch_array_record(path, shard, start, count)
        data = request(self._io.retry, lambda: fs.cat_file(path, start, end))
        if len(data) != end - start:
            raise ShardChangedError(f"ShardedSource shard {shard['url']!r} returned {len(data)} bytes for a block of "
                                    f"{end - start}: it changed since its manifest; restore it, or index the shards "
                                    "again")
        with self._io.lock:
            self._io.fetched[0] += len(data)
        unit = "row group" if self._format == "parquet" else "block"
        where = f"{unit} {native} of {shard['url']}"
        try:
            if self._format == "parquet":
                return self._parquet_rows(fs, path, shard, shard_index, native, start, data, count)
            return self._tar_rows(data, count, where)
        except StoreError as exc:  # the store failed after its retries: still an OSError, retried later
            raise exc.error from None
        except (CorruptFileError, ShardChangedError, IntegerRangeError):
            raise
        except Exception as exc:  # the bytes arrived whole: any failure to parse them is damage
            raise CorruptFileError(f"ShardedSource cannot read {where}: {type(exc).__name__}: {exc}; the shard is "
                                   "damaged or changed: restore it, or index the shards again") from None

    def _parquet_rows(self, fs, path, shard, shard_index, group, start, data, count) -> dict[str, Any]:
        pq = require("pyarrow.parquet", owner="ShardedSource", extra="data", package="pyarrow")
        size = shard["size"]
        fetch = store_reader(fs, path, self._io.retry, self._io.fetched)
        metadata = self._io.footers.get(shard_index)
        if metadata is None:  # the footer, read once per shard (two small range requests)
            metadata = self._io.footers[shard_index] = parquet_footer(fetch, size)
        file = Ranges(size, {start: data}, fetch)
        table = pq.ParquetFile(file, metadata=metadata, page_checksum_verification=True).read_row_group(
            group, columns=list(self._spec))
        if table.num_rows != count:
            raise ShardChangedError(f"ShardedSource row group {group} of {shard['url']!r} has {table.num_rows} rows, "
                                    f"the manifest {count}; the shard changed: index the shards again")
        rows = {}
        for name, spec in self._spec.items():
            column = table.column(name).combine_chunks()
            if spec.dtype == ENCODED:
                rows[name] = encoded_column(column, name)
            else:
                values = (column.flatten() if spec.shape else column).to_numpy(zero_copy_only=False)
                check_int_range(values.reshape(count, -1), "ShardedSource", name, fix=INT_FIX,
                                where=lambda row: f"row {row} of row group {group} of {shard['url']}")
                rows[name] = values.astype(spec.dtype).reshape(-1, *spec.shape)
        return rows

    def _tar_rows(self, data: bytes, count: int, where: str) -> dict[str, Any]:
        rows: dict[str, list] = {name: [] for name in self._spec}
        keys: list[str] = []
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                key, ext = tar_key(member.name)
                if not keys or keys[-1] != key:
                    keys.append(key)
                if ext in rows:
                    content = archive.extractfile(member).read()
                    rows[ext].append(int(content.decode().strip()) if ext in self.config.int_fields else content)
        if len(keys) != count or any(len(v) != count for v in rows.values()):
            raise CorruptFileError(f"ShardedSource {where} holds {len(keys)} samples, the manifest {count}")
        out = {}
        for name, values in rows.items():
            if self._spec[name].dtype == ENCODED:
                out[name] = values
                continue
            try:
                wide = np.asarray(values, np.int64)
            except OverflowError:
                raise CorruptFileError(f"ShardedSource {where}: a '{name}' member holds an integer beyond 64 bits; "
                                       "int_fields must hold decimal ints of at most 64 bits") from None
            check_int_range(wide, "ShardedSource", name, fix=INT_FIX, where=lambda row: f"sample {row} of {where}")
            out[name] = wide.astype(self._spec[name].dtype)
        return out

    def _fetch_array_record(self, path, shard, start, count) -> dict[str, Any]:
        ar = require("array_record.python.array_record_module", owner="ShardedSource", extra="data",
                     package="array_record")
        reader = ar.ArrayRecordReader(path, "readahead_buffer_size:0")
        try:
            records = reader.read(list(range(start, start + count)))
        except RuntimeError as exc:
            raise CorruptFileError(f"ShardedSource cannot read block {start // self.config.block_records} of "
                                   f"{shard['url']} (records {start} to {start + count - 1}): {exc}; the shard is "
                                   "damaged: restore it, or leave it out of urls") from None
        finally:
            reader.close()
        with self._io.lock:
            self._io.fetched[0] += sum(len(r) for r in records)
        return {"record": records}

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return read_batch(indices, out, self._spec, len(self), self._read_flat)

    def read(self, indices: np.ndarray, epoch: int, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        result = self.get_batch(indices, out)
        self._prefetch(np.asarray(indices).reshape(-1), epoch)
        return result

    def _read_flat(self, flat: np.ndarray, out: dict[str, np.ndarray]) -> None:
        blocks = np.searchsorted(self._io.starts, flat, side="right") - 1
        needed = {b: self._block(b, requested=False) for b in np.unique(blocks).tolist()}
        for b, future in needed.items():
            try:
                rows = future.result()
            except BaseException:
                self._forget(b, future)  # a failed fetch is not cached: a retry fetches it again
                raise
            sel = np.flatnonzero(blocks == b)
            offsets = flat[sel] - self._io.starts[b]
            for name, values in rows.items():
                column = out[name]
                if isinstance(values, np.ndarray):
                    column[sel] = values[offsets]
                else:
                    for row, offset in zip(sel.tolist(), offsets.tolist()):
                        column[row] = values[offset]

    def _prefetch(self, flat: np.ndarray, epoch: int) -> None:
        """Queues the next `prefetch_blocks` blocks after these records' in the epoch's block order
        (near the epoch's end, the next epoch's first blocks)."""
        sampler = self._io.sampler
        if sampler is None or self.config.prefetch_blocks == 0 or flat.size == 0:
            return
        order, rank, _ = sampler.epoch_order(epoch) if sampler.shuffle else (None, None, None)
        blocks = np.searchsorted(self._io.starts, flat, side="right") - 1
        last = int(rank[blocks].max()) if rank is not None else int(blocks.max())
        # the rest of this window is read next too (its records are shuffled together)
        window_end = (last // sampler.window + 1) * sampler.window if sampler.shuffle else last + 1
        count = len(self._io.blocks)
        ahead = list(range(last + 1, min(count, max(window_end, last + 1 + self.config.prefetch_blocks))))
        wanted = [int(order[r]) if order is not None else r for r in ahead[:self.config.prefetch_blocks]]
        if last + 1 + self.config.prefetch_blocks > count:
            # The epoch ends within the look-ahead: the next epoch's first blocks follow (at most
            # `prefetch_blocks` fetched that a run stopping here never reads).
            following = sampler.epoch_order(epoch + 1)[0] if sampler.shuffle else np.arange(count)
            wanted += [int(b) for b in following[:self.config.prefetch_blocks - len(wanted)]]
        for b in wanted:
            self._block(b)

    def held_bytes(self) -> int:
        """Memory the block cache may hold at most: `cache_blocks` of the largest decoded block
        (ArrayRecord: records are read per block and not counted here; each is one record's bytes)."""
        largest = max((b[5] for b in self._io.blocks), default=0)
        return self.config.cache_blocks * int(largest)

    def structure(self) -> str:
        fields = {k: str(v.dtype) for k, v in self._spec.items()}
        return (f"ShardedSource(format={self._format}, len={len(self)}, blocks={len(self._io.blocks)}, "
                f"manifest_sha256={self._fingerprint}, fields={fields})")

    def close(self) -> None:
        """Stops the fetching threads and drops the cached blocks (a later read starts them again)."""
        with self._io.lock:
            pool, self._io.pool = self._io.pool, None
            for future in self._io.cache.values():
                future.cancel()
            self._io.cache.clear()
        if pool is not None:
            pool.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "seed": self.seed, "manifest": self.manifest}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config, self.seed = state["config"], state["seed"]
        self._setup(state["manifest"])
