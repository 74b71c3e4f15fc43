"""Decode once: a reduced copy of an image source in ArrayRecord shards, for epochs that repeat.

`materialize` runs the deterministic prefix of decoding once (decode, EXIF orientation, RGB, the
longer side reduced to at most `max_side`) and writes the small images into ArrayRecord shards;
later epochs read them and keep their random crops. `MaterializedSource` refuses a cache whose
`manifest.json` no longer matches its source. docs/sources.md ("Decode once") has the details.

    >>> cache = materialize(ImageFolderSource(root="photos/train", shuffle=True), "/data/photos-160",
    ...                     max_side=160)
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence

import numpy as np

from datarax.control.pool import ThreadPool
from datarax.core.checks import check_positive_int, require
from datarax.core.errors import CorruptFileError, RecordError, printable
from datarax.core.fields import ENCODED
from datarax.core.source import DataSourceModule
from datarax.host.bit_depth import to_eight_bits
from datarax.sources.materialized import (
    FORMAT_VERSION,
    FORMATS,
    KIND,
    MANIFEST,
    MaterializeConfig,
    MaterializedSource,
    MaterializedSourceConfig,
    StaleCacheError,
    source_stamp,
)

SHARD_RECORDS = 8192
# One record per chunk (random access) and no compression: raw pixels barely compress and JPEG
# not at all, while decompressing brotli (ArrayRecord's default) doubled the read time of a record.
WRITER_OPTIONS = "group_size:1,uncompressed"
ORIENTATION_TAG = 0x0112  # the EXIF tag
READ_CHUNK = 256  # records read and shrunk per step: enough to keep every thread busy
def shrink_image(data: bytes, config: MaterializeConfig) -> bytes:
    """One record of the prefix: encoded image bytes to the stored bytes (see `MaterializeConfig`).

    The result is upright (the EXIF orientation applied, none stored), RGB or gray, with its
    longer side at most `config.max_side`.
    """
    image_module = require("PIL.Image", owner="materialize", extra="image", package="pillow")
    image_ops = require("PIL.ImageOps", owner="materialize", extra="image", package="pillow")
    image = image_module.open(io.BytesIO(data))
    raw_w, raw_h = image.size
    quarter_turn = image.getexif().get(ORIENTATION_TAG, 1) >= 5  # the upright image is raw_h x raw_w
    factor = config.max_side / max(raw_w, raw_h)
    if factor >= 1 and config.format == "jpeg" and image.format == "JPEG":
        return bytes(data)  # already small: the original bytes decode to exactly what the source gives
    if factor < 1:
        image.draft(None, (math.ceil(raw_w * factor), math.ceil(raw_h * factor)))  # JPEG: decode at a DCT scale
    image = to_eight_bits(image_ops.exif_transpose(image), None, image_module)  # as DecodeImage scales 16-bit
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")  # as DecodeImage converts: before resizing (palettes, alpha)
    if factor < 1:
        upright_w, upright_h = (raw_h, raw_w) if quarter_turn else (raw_w, raw_h)
        target = (max(1, round(upright_w * factor)), max(1, round(upright_h * factor)))
        image = image.resize(target, image_module.Resampling.LANCZOS)
    out = io.BytesIO()
    if config.format == "raw":
        image.save(out, format="PPM")
    else:
        image.save(out, format="JPEG", quality=config.quality)
    return out.getvalue()


def materialize(source: DataSourceModule, directory: str | os.PathLike, *, max_side: int, format: str = "raw",
                quality: int = 90, field: str = "image", num_threads: int | None = None,
                shard_records: int = SHARD_RECORDS) -> MaterializedSource:
    """Writes (or reuses) the decode-once cache of `source` in `directory` and opens it.

    A matching cache is opened as it is; a stale or damaged one is rewritten with a warning; a
    non-empty directory that is not a cache is refused, never deleted.

    Args:
        source: a random-access source whose `field` holds encoded images (e.g. `ImageFolderSource`).
        directory: the cache folder (created; its parent must be writable).
        max_side, format, quality, field: the prefix (see `MaterializeConfig`).
        num_threads: threads decoding and re-encoding (None: `os.cpu_count()`).
        shard_records: records per ArrayRecord shard.

    Returns:
        The cache as a `MaterializedSource` (its sampler follows the source's default).
    """
    opened = MaterializedSourceConfig(max_side=max_side, format=format, quality=quality, field=field)
    config = opened.prefix()
    if not isinstance(source, DataSourceModule):
        raise TypeError(f"materialize source must be a random-access DataSourceModule such as ImageFolderSource, "
                        f"got {type(source).__name__}")
    check_positive_int(num_threads, "materialize num_threads", allow_none=True, unit="threads")
    check_positive_int(shard_records, "materialize shard_records", unit="records")
    directory = os.fspath(directory)
    if os.path.isfile(os.path.join(directory, MANIFEST)):
        try:
            return MaterializedSource(opened, directory=directory, source=source)
        except (StaleCacheError, CorruptFileError) as exc:
            warnings.warn(f"{exc}; materialize is rewriting it", stacklevel=2)
    elif os.path.isdir(directory) and os.listdir(directory):
        raise FileExistsError(f"materialize directory {directory!r} holds files but no {MANIFEST}, so it is not a "
                              "datarax cache; give a new or empty directory (materialize replaces only its caches)")
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.writing-", dir=parent)
    try:
        write_cache(source, staging, config, num_threads or os.cpu_count() or 1, shard_records)
        _replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return MaterializedSource(opened, directory=directory, source=source)


def write_cache(source: DataSourceModule, folder: str, config: MaterializeConfig, num_threads: int,
                shard_records: int) -> dict:
    """Writes the shards, the other fields and (last) the manifest of `source` into `folder`."""
    from datarax.sources.array_record import ARRAY_RECORD  # datarax.sources imports datarax.host

    ar = require(ARRAY_RECORD, owner="materialize", extra="data", package="array_record")
    spec = source.element_spec()
    if config.field not in spec or spec[config.field].dtype != ENCODED:
        raise KeyError(f"materialize field {config.field!r} must be a field of encoded images; the source's fields "
                       f"are {sorted(spec)}; set field= to the one holding the image bytes")
    others = {k: v for k, v in spec.items() if k != config.field}
    encoded = [k for k, v in others.items() if v.dtype == ENCODED]
    if encoded:
        raise TypeError(f"materialize stores one encoded field ({config.field!r}), but {encoded} are encoded too; "
                        "materialize a source without them (or decode them into arrays first)")
    start = time.perf_counter()
    stamp, stats = source_stamp(source)
    n = len(source)
    arrays = {k: np.empty((n,) + tuple(v.shape), v.dtype) for k, v in others.items()}
    num_shards = math.ceil(n / shard_records)
    shards = []
    pool = ThreadPool(num_threads, "datarax-materialize")
    try:
        for shard in range(num_shards):
            name = f"records-{shard:05d}-of-{num_shards:05d}.array_record"
            low, high = shard * shard_records, min(n, (shard + 1) * shard_records)
            writer = ar.ArrayRecordWriter(os.path.join(folder, name), WRITER_OPTIONS)
            for chunk in range(low, high, READ_CHUNK):
                ids = np.arange(chunk, min(high, chunk + READ_CHUNK))
                batch = source.get_batch(ids)
                for k, v in arrays.items():
                    v[ids] = batch[k]
                for record in _shrink_batch(source, batch[config.field], ids, config, pool):
                    writer.write(record)
            writer.close()
            shards.append({"name": name, "records": high - low, "bytes": os.path.getsize(os.path.join(folder, name))})
    finally:
        pool.close()
    fields = {}
    for k, v in arrays.items():
        np.save(os.path.join(folder, f"field-{k}.npy"), v)  # np.save adds nothing else to the name
        fields[k] = {"file": f"field-{k}.npy", "bytes": os.path.getsize(os.path.join(folder, f"field-{k}.npy"))}
    if stats is not None:
        np.save(os.path.join(folder, "source_files.npy"), stats)
    manifest = {"kind": KIND, "format_version": FORMAT_VERSION, "source": stamp, "prefix": config.settings(),
                "records": n, "shards": shards, "fields": fields,
                "seconds": round(time.perf_counter() - start, 3)}
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def _shrink_batch(source: DataSourceModule, data: np.ndarray, ids: np.ndarray, config: MaterializeConfig,
                  pool: ThreadPool) -> list[bytes]:
    def shrink(row: int) -> bytes | Exception:
        try:
            return shrink_image(data[row], config)
        except Exception as exc:  # Pillow raises many kinds for bad bytes; all name the record
            return exc

    results = pool.map(shrink, range(len(ids)))
    for row, result in enumerate(results):
        if isinstance(result, Exception):
            raise RecordError(f"materialize could not decode record {int(ids[row])} "
                              f"({printable(source.describe_record(int(ids[row])))}): {type(result).__name__}: "
                              f"{result}; remove or replace the file and run materialize again") from result
    return results


def _replace(staging: str, directory: str) -> None:
    """Puts the finished `staging` folder at `directory`, moving an old cache aside first."""
    old = None
    if os.path.exists(directory):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old-", dir=os.path.dirname(staging))
        os.rename(directory, os.path.join(old, "cache"))
    os.rename(staging, directory)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def materialize_main(argv: Sequence[str] | None = None) -> int:
    """`datarax materialize ROOT DIRECTORY --max-side N [--format raw|jpeg] [--quality Q] [--threads T]`.

    Materializes an image folder (`ImageFolderSource(ROOT)`) into DIRECTORY and prints the
    manifest's summary as one JSON line. Returns the exit status.
    """
    from datarax.sources.image_folder import ImageFolderSource

    parser = argparse.ArgumentParser(prog="datarax materialize",
                                     description="Decode an image folder once into a reduced ArrayRecord cache.")
    parser.add_argument("root", help="the image folder (root/<class>/<image>)")
    parser.add_argument("directory", help="the cache folder to write (an existing cache is reused or rewritten)")
    parser.add_argument("--max-side", type=int, required=True, help="the longest side of a stored image, in pixels")
    parser.add_argument("--format", choices=FORMATS, default="raw", help="raw (lossless, fastest) or jpeg (smaller)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality for --format jpeg")
    parser.add_argument("--threads", type=int, default=None, help="decoding threads (default: all cores)")
    args = parser.parse_args(argv)
    cache = materialize(ImageFolderSource(root=args.root), args.directory, max_side=args.max_side, format=args.format,
                        quality=args.quality, num_threads=args.threads)
    manifest = cache.manifest
    print(json.dumps({"directory": args.directory, "records": manifest["records"], "shards": len(manifest["shards"]),
                      "bytes": sum(s["bytes"] for s in manifest["shards"]), "seconds": manifest["seconds"]}))
    cache.close()
    return 0

