"""The manifest of a `ShardedSource`: every shard's blocks, stamps and sample hash, built once,
cached as JSON and checked against the store each time the source opens (docs/sources.md).

Its SHA-256 is the source's fingerprint: record id -> (shard, block, offset) is arithmetic on it,
on every host, as long as the shards stay as they were; a shard that changed is refused, named.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from datarax.control.pool import ThreadPool
from datarax.core.errors import DataraxError
from datarax.sources.shard_formats import filesystem, index_shard, request, shard_format

if TYPE_CHECKING:
    from datarax.sources.sharded import ShardedSourceConfig

MANIFEST_VERSION = 3  # 2: each block's decoded size; 3: each shard's sample hash and integer ranges
SAMPLE_BYTES = 64 * 1024  # the head and the tail of a shard hashed by `verify`


class ShardChangedError(DataraxError, ValueError):
    """A shard differs from the manifest the source (or a saved state) was built on."""


def default_manifest_dir() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")),
                        "datarax", "manifests")


def stamp_of(fs: Any, path: str, url: str) -> dict[str, Any]:
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"ShardedSource shard {url!r} does not exist; check the URL (and its credentials), "
                                "or remove it from urls=") from None
    etag = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or info.get("created")
    return {"size": int(info["size"]), "etag": None if etag is None else str(etag)}


def sample_hash(fs: Any, path: str, size: int, retry: Any) -> str:
    """SHA-256 (16 hex digits) of a shard's first and last 64 KiB (two concurrent range requests)."""
    if size <= SAMPLE_BYTES:
        return hashlib.sha256(request(retry, lambda: fs.cat_file(path, 0, size))).hexdigest()[:16]
    pool = ThreadPool(2, "datarax-manifest")
    try:
        head, tail = pool.map(lambda span: request(retry, lambda: fs.cat_file(path, *span)),
                              [(0, SAMPLE_BYTES), (size - SAMPLE_BYTES, size)])
    finally:
        pool.close()
    return hashlib.sha256(head + tail).hexdigest()[:16]


def expand_urls(urls: tuple[str, ...], storage_options: dict | None, retry: Any = None) -> tuple[str, ...]:
    """A single glob pattern expanded and sorted; explicit lists as given."""
    if len(urls) == 1 and any(c in urls[0] for c in "*?["):
        fs, path = filesystem(urls[0], storage_options)
        protocol = urls[0].split("://", 1)[0] + "://" if "://" in urls[0] else ""
        found = sorted(fs.glob(path) if retry is None else request(retry, lambda: fs.glob(path)))
        if not found:
            raise FileNotFoundError(f"ShardedSource urls pattern {urls[0]!r} matches no files; check the pattern")
        return tuple(protocol + f if protocol and not f.startswith(protocol) else f for f in found)
    return urls


def build_manifest(urls: Sequence[str], config: ShardedSourceConfig) -> dict[str, Any]:
    """Lists every shard's blocks (record counts, byte ranges), stamps (size, ETag/mtime), the hash
    `verify` compares, and the range of each 64-bit integer column per block (parquet statistics)."""
    retry = config.retry_policy()

    def one(url: str) -> dict[str, Any]:
        fmt = shard_format(url, config.format)
        fs, path = filesystem(url, config.storage_options)
        stamp = request(retry, lambda: stamp_of(fs, path, url))
        if fmt == "array_record" and "://" in url and not url.startswith("file://"):
            raise ValueError(f"ShardedSource reads ArrayRecord shards from local files only (the reader needs a "
                             f"path), got {url!r}; copy the shards to a local disk, or write parquet/tar shards")
        blocks, columns, ranges = request(retry, lambda: index_shard(url, fmt, fs, path, stamp["size"],
                                                                   config.block_records, retry))
        return {"url": url, "format": fmt, **stamp, "sample_sha256": sample_hash(fs, path, stamp["size"], retry),
                "blocks": blocks, "columns": columns, "int_ranges": ranges}

    shards = on_threads(one, urls)
    formats = {s["format"] for s in shards}
    if len(formats) != 1:
        raise ValueError(f"ShardedSource shards must share one format, got {sorted(formats)}; list them separately")
    first = shards[0]["columns"]
    for s in shards[1:]:
        if s["columns"] != first:
            raise ValueError(f"ShardedSource shards {shards[0]['url']!r} and {s['url']!r} have different columns "
                             f"({first} against {s['columns']}); shards of one source share one schema")
    return {"version": MANIFEST_VERSION, "format": formats.pop(), "columns": first, "shards": shards}


def manifest_key(urls: Sequence[str], config: ShardedSourceConfig) -> str:
    text = json.dumps({"urls": list(urls), "format": config.format, "block_records": config.block_records})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_manifest(urls: Sequence[str], config: ShardedSourceConfig) -> dict[str, Any]:
    """The cached manifest (every shard re-stamped and compared), else a new one, cached."""
    folder = config.manifest_dir or default_manifest_dir()
    path = os.path.join(folder, f"{manifest_key(urls, config)}.json")
    if os.path.isfile(path):
        with open(path) as f:
            manifest = json.load(f)
        if manifest.get("version") == MANIFEST_VERSION:
            check_stamps(manifest, config, path)
            return manifest
    manifest = build_manifest(urls, config)
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f)
    os.replace(tmp, path)
    return manifest


def check_stamps(manifest: dict[str, Any], config: ShardedSourceConfig, where: str) -> None:
    """Raises `ShardChangedError` naming the first shard whose size or ETag/mtime differ, or (with
    `config.verify`) whose sample hash differs."""
    retry = config.retry_policy()

    def stamp(shard):
        fs, path = filesystem(shard["url"], config.storage_options)
        now = request(retry, lambda: stamp_of(fs, path, shard["url"]))
        if config.verify and now["size"] == shard["size"] and now["etag"] == shard["etag"]:
            now["sample_sha256"] = sample_hash(fs, path, now["size"], retry)
        return shard, now

    for shard, now in on_threads(stamp, manifest["shards"]):
        if now["size"] != shard["size"] or now["etag"] != shard["etag"]:
            raise ShardChangedError(
                f"ShardedSource shard {shard['url']!r} changed since its manifest {where!r} was made (size "
                f"{shard['size']} -> {now['size']}, etag {shard['etag']} -> {now['etag']}): its records may have "
                "moved, so positions would name other records; restore the shard, or delete the manifest to "
                "index the shards again (a saved iterator state will then be refused)")
        if "sample_sha256" in now and now["sample_sha256"] != shard["sample_sha256"]:
            raise ShardChangedError(
                f"ShardedSource shard {shard['url']!r} was rewritten since its manifest {where!r} was made: same "
                f"size ({shard['size']}) and modification time, but the hash of its first and last 64 KiB changed "
                f"({shard['sample_sha256']} -> {now['sample_sha256']}; a copy that kept the file times?): its "
                "records may have moved; restore the shard, or delete the manifest to index the shards again (a "
                "saved iterator state will then be refused)")



def on_threads(fn: Any, items: Sequence[Any]) -> list[Any]:
    """`[fn(item) for item in items]` on up to 16 threads: one request per shard waits on the store."""
    pool = ThreadPool(min(16, len(items)), "datarax-manifest")
    try:
        return pool.map(fn, items)
    finally:
        pool.close()
