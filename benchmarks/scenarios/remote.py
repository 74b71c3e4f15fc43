"""`remote`: JPEG records streamed from shards behind an object store's latency; batch 64.

Data: 24,000 (`--scale` scales it) 64x64 JPEG crops of scikit-image's photographs with a label,
as 8 parquet shards (HF `Image` feature, row groups of 30: 800 blocks) and the same records as 8
webdataset tar shards, written once under the system temp dir. The streaming peers are 20-50x
slower here, so each of their timed epochs reads its first 3,000 records (their rate is
records / seconds over those); datarax's sides read whole epochs.

The store: `slow://`, an fsspec filesystem over those local files that behaves like s3fs/gcsfs
(`AbstractBufferedFile`, 5 MB read-ahead blocks) and charges every request `LATENCY_S` (20 ms)
plus its bytes at `BANDWIDTH` (100 MB/s per request), sleeping (so the CPU is free meanwhile).

Every side does the same work: decode each JPEG to 64x64 RGB uint8, batch 64, put the batch on
the device as float32 / 255; every side shuffles.

* `datarax`: `ShardedSource(urls=slow://...parquet, encoded=("image",), shuffle=True)` (two-level
  block shuffle, default window) + `DecodeImage(size=64, resize="fixed")`.
* `floor`: the same pipeline over the same shards as local files (`file://`): what the store costs.
* `datarax[tar]`: the pipeline over the tar shards on `slow://`.
* `datasets`: `load_dataset("parquet", data_files=slow://..., streaming=True).shuffle(buffer_size=1000)`,
  HF's own Image decode (Pillow), batched with `.iter(batch_size=64)`: how HF users stream.
* `webdataset`: `WebDataset(slow://...tar, shardshuffle=100).shuffle(1000).decode("rgb8")`, batched
  with `.batched(64)`: the webdataset README's pipeline (a `DataLoader` adds worker processes,
  which this 2-core machine cannot give it; noted in docs).

Also reported: the shuffle's rank correlation with storage order over the epoch (`datarax`), the
requests and bytes each side fetched (read amplification = bytes fetched / bytes of the shards).
Mosaic `streaming` reads only its own MDS format, not these shards, so it is not a row here.
"""

from __future__ import annotations

import importlib
import io
import os
import shutil
import tarfile
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.registry import BenchOptions
from benchmarks.timing import block, row

NUM_RECORDS = 24_000
SHARDS = 8
ROW_GROUP = 30  # records per row group (and per tar block): 800 blocks to shuffle
PEER_RECORDS = 3_000  # records a peer's timed epoch reads (its rate is measured on those)
BATCH = 64
SIZE = 64
LATENCY_S = 0.020
BANDWIDTH = 100e6
CACHE_VERSION = 1


# ----------------------------------------------------------------------------------------------
# The store


class Counter:
    requests = 0
    bytes = 0
    lock = threading.Lock()

    @classmethod
    def charge(cls, nbytes: int) -> None:
        with cls.lock:
            cls.requests += 1
            cls.bytes += nbytes
        time.sleep(LATENCY_S + nbytes / BANDWIDTH)

    @classmethod
    def reset(cls) -> tuple[int, int]:
        with cls.lock:
            out = (cls.requests, cls.bytes)
            cls.requests = cls.bytes = 0
        return out


def register_slow_filesystem() -> None:
    """Registers `slow://` (local files behind a charged request) with fsspec."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem
    from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

    class SlowFile(AbstractBufferedFile):
        def _fetch_range(self, start, end):
            with open(self.path, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
            Counter.charge(len(data))
            return data

    class SlowFileSystem(AbstractFileSystem):
        protocol = "slow"
        root_marker = "/"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.local = LocalFileSystem()

        @classmethod
        def _strip_protocol(cls, path):
            path = path[len("slow://"):] if path.startswith("slow://") else path
            return "/" + path.lstrip("/")

        def info(self, path, **kwargs):
            Counter.charge(0)
            info = self.local.info(self._strip_protocol(path))
            return {**info, "name": self._strip_protocol(path)}

        def ls(self, path, detail=True, **kwargs):
            Counter.charge(0)
            return self.local.ls(self._strip_protocol(path), detail=detail)

        def _open(self, path, mode="rb", block_size="default", autocommit=True, cache_options=None, **kwargs):
            return SlowFile(self, self._strip_protocol(path), mode, block_size, autocommit,
                            cache_options=cache_options, **kwargs)

        def cat_file(self, path, start=None, end=None, **kwargs):
            path = self._strip_protocol(path)
            size = os.path.getsize(path)
            start = 0 if start is None else (start if start >= 0 else size + start)
            end = size if end is None else (end if end >= 0 else size + end)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(max(0, end - start))
            Counter.charge(len(data))
            return data

    fsspec.register_implementation("slow", SlowFileSystem, clobber=True)


# ----------------------------------------------------------------------------------------------
# The data


def write_shards(n: int, seed: int = 0) -> dict[str, list[str]]:
    """Parquet and tar shards of the same `n` records (cached by count and seed)."""
    root = os.path.join(tempfile.gettempdir(), f"datarax-bench-remote-v{CACHE_VERSION}-n{n}-seed{seed}")
    parquet = [os.path.join(root, f"train-{i:03d}.parquet") for i in range(SHARDS)]
    tars = [os.path.join(root, f"train-{i:03d}.tar") for i in range(SHARDS)]
    if os.path.isfile(os.path.join(root, "DONE")):
        return {"parquet": parquet, "tar": tars}
    import pyarrow.parquet as pq
    from PIL import Image
    from skimage import data as photos

    from datarax.sources import write_hf_parquet

    sources = [photos.astronaut(), photos.coffee(), photos.chelsea(), photos.rocket()]
    rng = np.random.default_rng(seed)
    staging = tempfile.mkdtemp(prefix="datarax-bench-remote-", dir=tempfile.gettempdir())
    for shard, ids in enumerate(np.array_split(np.arange(n), SHARDS)):
        jpegs, labels = [], []
        for i in ids.tolist():
            photo = sources[i % len(sources)]
            top, left = int(rng.integers(0, photo.shape[0] - 96)), int(rng.integers(0, photo.shape[1] - 96))
            crop = Image.fromarray(photo[top:top + 96, left:left + 96]).resize((SIZE, SIZE))
            buf = io.BytesIO()
            crop.save(buf, format="JPEG", quality=90)
            jpegs.append(buf.getvalue())
            labels.append(i % 10)
        path = os.path.join(staging, os.path.basename(parquet[shard]))
        write_hf_parquet(path, {"image": jpegs, "label": labels}, images=("image",))
        table = pq.read_table(path)
        pq.write_table(table, path, row_group_size=ROW_GROUP)  # HF-style metadata kept, row groups of 100
        with tarfile.open(os.path.join(staging, os.path.basename(tars[shard])), "w") as archive:
            for i, data, label in zip(ids.tolist(), jpegs, labels):
                for ext, payload in (("jpg", data), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(payload)
                    archive.addfile(info, io.BytesIO(payload))
    open(os.path.join(staging, "DONE"), "w").close()
    try:
        os.rename(staging, root)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return {"parquet": parquet, "tar": tars}


# ----------------------------------------------------------------------------------------------
# The sides


@jax.jit
def to_float(image):
    return image.astype(jnp.float32) / 255.0


def datarax_side(urls: list[str], fmt: str, manifest_dir: str):
    from datarax import Pipeline
    from datarax.host import DecodeImage
    from datarax.sources import ShardedSource

    field = "image" if fmt == "parquet" else "jpg"
    settings = dict(encoded=("image",), fields=("label",)) if fmt == "parquet" else \
        dict(fields=("jpg", "cls"), block_records=ROW_GROUP)
    source = ShardedSource(urls=urls, shuffle=True, seed=0, manifest_dir=manifest_dir, **settings)
    pipeline = Pipeline(source, [DecodeImage(size=SIZE, resize="fixed", field=field)], batch_size=BATCH)

    def epoch():
        for batch in pipeline:
            yield to_float(batch[field])

    return pipeline, epoch


def datasets_side(urls: list[str], cache_dir: str):
    import datasets

    stream = datasets.load_dataset("parquet", data_files=urls, split="train", streaming=True, cache_dir=cache_dir)
    counter = iter(range(10**6))

    def epoch():
        ds = stream.shuffle(seed=next(counter), buffer_size=1000)
        for _, batch in zip(range(PEER_RECORDS // BATCH), ds.iter(batch_size=BATCH)):
            images = np.stack([np.asarray(im.convert("RGB")) for im in batch["image"]])
            yield to_float(jax.device_put(images))

    return epoch


def webdataset_side(urls: list[str]):
    import fsspec
    import webdataset as wds

    def opener(url, mode="rb", bufsize=8192, **kwargs):
        return fsspec.open(url, mode).open()

    importlib.import_module("webdataset.gopen").gopen_schemes["slow"] = opener  # the module, not the function

    def epoch():
        ds = (wds.WebDataset(urls, shardshuffle=100, empty_check=False).shuffle(1000).decode("rgb8")
              .to_tuple("jpg", "cls").batched(BATCH))
        for _, (images, _) in zip(range(PEER_RECORDS // BATCH), ds):
            yield to_float(jax.device_put(np.asarray(images)))

    return epoch


def amplification_by_hosts(sampler, source, hosts=(1, 2, 4, 8)) -> dict[int, float]:
    """Bytes the hosts fetch over the bytes stored, per host count, from the epoch's order: each
    host takes its contiguous rows of every global batch (64 rows a host, as `DataSharding`
    splits them) and fetches each block its rows touch once (the cache holds a window)."""
    ids = sampler.indices(np.arange(len(sampler)), 0)
    starts = source._io.starts
    blocks = np.searchsorted(starts, ids, side="right") - 1
    sizes = np.array([b[3] - b[2] for b in source._io.blocks], np.float64)
    out = {}
    for h in hosts:
        batch = BATCH * h
        full = len(ids) // batch * batch
        per_host = blocks[:full].reshape(-1, h, BATCH)
        fetched = sum(sizes[np.unique(per_host[:, k])].sum() for k in range(h))
        out[h] = round(float(fetched / sizes.sum()), 3)
    return out


def interleaved_counted(sides, repeats: int) -> dict[str, dict]:
    """`interleaved_rates` for sides that read different numbers of records: each epoch's rate is
    the records it yielded over its time (the clock stops when its last batch is ready)."""
    import statistics

    runs = {name: [] for name in sides}
    for _ in range(repeats):
        for name, side in sides.items():
            start, count, last = time.perf_counter(), 0, None
            for last in side():
                count += last.shape[0]
            block(last)
            runs[name].append(count / (time.perf_counter() - start))
    return {name: {"el_s": statistics.median(r), "el_s_runs": [round(x, 1) for x in r]} for name, r in runs.items()}


def rank_correlation(pipeline, epoch: int = 0) -> float:
    """Spearman's rank correlation of `epoch`'s order with storage order."""
    from scipy import stats

    ids = pipeline.sampler.indices(np.arange(len(pipeline.sampler)), epoch)
    return float(stats.spearmanr(np.arange(len(ids)), ids).statistic)


RANK_EPOCHS = 20


def rank_correlation_over_epochs(pipeline, epochs: int = RANK_EPOCHS) -> dict:
    """The shuffle's rank correlation over its first `epochs` epochs: one epoch's value is one draw
    (about normal, sd 1/sqrt(blocks)), so its mean absolute value says what the shuffle does."""
    values = np.abs([rank_correlation(pipeline, e) for e in range(epochs)])
    return {"epochs": epochs, "mean_abs": round(float(values.mean()), 4), "max_abs": round(float(values.max()), 4),
            "share_at_most_0.05": round(float((values <= 0.05).mean()), 3)}


def run(options: BenchOptions) -> list[dict]:
    n = options.records(NUM_RECORDS)
    files = write_shards(n)
    register_slow_filesystem()
    work = tempfile.mkdtemp(prefix="datarax-bench-remote-run-")
    slow = {fmt: [f"slow://{p}" for p in paths] for fmt, paths in files.items()}
    local = [f"file://{p}" for p in files["parquet"]]
    pipeline, remote = datarax_side(slow["parquet"], "parquet", os.path.join(work, "m"))
    floor_pipeline, floor = datarax_side(local, "parquet", os.path.join(work, "m"))
    tar_pipeline, tar = datarax_side(slow["tar"], "tar", os.path.join(work, "m"))
    sides = {"datarax": remote, "floor": floor, "datarax[tar]": tar}
    try:
        sides["datasets"] = datasets_side(slow["parquet"], os.path.join(work, "hf"))
    except ImportError:
        pass
    try:
        sides["webdataset"] = webdataset_side(slow["tar"])
    except ImportError:
        pass
    firsts = {}
    for name, side in sides.items():  # warm-up epoch (compiles, manifests), first batch timed
        Counter.reset()
        start = time.perf_counter()
        iterator = iter(side())
        block(next(iterator))
        firsts[name] = round(time.perf_counter() - start, 3)
        for out in iterator:
            pass
        block(out)
    fetched = {}

    def counted(name, side):
        def epoch():
            Counter.reset()
            yield from side()
            fetched[name] = Counter.reset()
        return epoch

    rates = interleaved_counted({name: counted(name, side) for name, side in sides.items()}, options.repeats)
    shard_bytes = {fmt: sum(os.path.getsize(p) for p in paths) for fmt, paths in files.items()}
    main = row("remote", rates["datarax"], rates["floor"], records=n, batch_size=BATCH, latency_ms=LATENCY_S * 1e3,
               bandwidth_mb_s=BANDWIDTH / 1e6, first_batch_s=firsts["datarax"], floor_first_batch_s=firsts["floor"],
               rank_correlation=round(rank_correlation(pipeline), 4),
               rank_correlation_over_epochs=rank_correlation_over_epochs(pipeline),
               window=pipeline.source.source.config.window,
               read_amplification_by_hosts=amplification_by_hosts(pipeline.sampler, pipeline.source.source),
               requests=fetched.get("datarax", (0, 0))[0],
               read_amplification=round(fetched.get("datarax", (0, 0))[1] / shard_bytes["parquet"], 3))
    extra = []
    for name in sides:
        if name in ("datarax", "floor"):
            continue
        fmt = "tar" if name in ("datarax[tar]", "webdataset") else "parquet"
        requests, nbytes = fetched.get(name, (0, 0))
        extra.append({"scenario": "remote", "framework": name, "el_s": round(rates[name]["el_s"], 1),
                      "ratio_to_datarax": round(rates[name]["el_s"] / rates["datarax"]["el_s"], 3),
                      "ratio_to_floor": round(rates[name]["el_s"] / rates["floor"]["el_s"], 3),
                      "el_s_runs": rates[name]["el_s_runs"], "first_batch_s": firsts[name], "requests": requests,
                      "read_amplification": round(nbytes / shard_bytes[fmt], 3)})
    for p in (pipeline, floor_pipeline, tar_pipeline):
        p.source.close()
    shutil.rmtree(work, ignore_errors=True)
    return [main, *extra]
