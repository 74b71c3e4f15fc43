"""ShardedSource: parquet, tar and ArrayRecord shards over fsspec (`memory://`, `file://`), each epoch
a permutation, exact resume (fresh process, other host counts), changed shards refused, transient
errors retried with the same records, encoded records through host stages."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import textwrap

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from scipy import stats

from datarax import Pipeline
from datarax.host import HostMap
from datarax.pipeline import RetryPolicy
from datarax.samplers import BlockShuffleSampler, default_sampler
from datarax.sources import ShardedSource
from datarax.sources.manifest import ShardChangedError

SIZES = (40, 47, 54)  # records per shard
TOTAL = sum(SIZES)


def ids_of(shard: int, n: int) -> np.ndarray:
    return np.arange(n) + 1000 * shard


def parquet_bytes(shard: int, n: int) -> bytes:
    vectors = pa.array((ids_of(shard, n)[:, None] * 3 + np.arange(3)).astype(np.float32).tolist(),
                       type=pa.list_(pa.float32(), 3))
    table = pa.table({"x": ids_of(shard, n), "payload": [f"rec{shard}-{i}".encode() for i in range(n)],
                      "vec": vectors})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=9)
    return buf.getvalue()


def tar_bytes(shard: int, n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        for i, x in enumerate(ids_of(shard, n)):
            for ext, data in (("payload", f"rec{shard}-{i}".encode()), ("cls", str(int(x)).encode())):
                info = tarfile.TarInfo(f"part/{shard:02d}-{i:04d}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_shards(fmt: str, where, tmp_path) -> list[str]:
    """The shards on `where` ("memory" or "file"), their URLs in storage order."""
    urls = []
    for shard, n in enumerate(SIZES):
        if fmt == "array_record":
            from array_record.python import array_record_module as ar

            path = tmp_path / f"shard-{shard}.array_record"
            writer = ar.ArrayRecordWriter(str(path), "group_size:1")
            for x in ids_of(shard, n):
                writer.write(int(x).to_bytes(8, "little"))
            writer.close()
            urls.append(f"file://{path}")
            continue
        data = parquet_bytes(shard, n) if fmt == "parquet" else tar_bytes(shard, n)
        suffix = ".parquet" if fmt == "parquet" else ".tar"
        if where == "memory":
            url = f"memory://{tmp_path.name}/shard-{shard}{suffix}"
            fsspec.filesystem("memory").pipe(url, data)
        else:
            path = tmp_path / f"shard-{shard}{suffix}"
            path.write_bytes(data)
            url = f"file://{path}"
        urls.append(url)
    return urls


def decode_x(record, rng):
    return {"record": np.int64(int.from_bytes(record["record"], "little"))}


def build(urls, fmt, tmp_path, **settings):
    settings.setdefault("shuffle", True)
    settings.setdefault("seed", 3)
    settings.setdefault("block_records", 10)
    settings.setdefault("window", 2)
    fields = {"parquet": ("x",), "tar": ("cls",), "array_record": None}[fmt]
    source = ShardedSource(urls=urls, fields=fields, manifest_dir=str(tmp_path / "manifests"), **settings)
    stages = [HostMap(fn=decode_x, outputs={"record": ((), np.int64)})] if fmt == "array_record" else []
    return source, stages


def x_field(fmt):
    return {"tar": "cls", "parquet": "x", "array_record": "record"}[fmt]


CASES = [("parquet", "memory"), ("parquet", "file"), ("tar", "memory"), ("tar", "file"), ("array_record", "file")]


def epoch_values(pipeline, name):
    return np.concatenate([np.asarray(b[name]) for b in pipeline])


@pytest.mark.parametrize("fmt, where", CASES)
def test_every_epoch_is_a_permutation(tmp_path, fmt, where):
    urls = write_shards(fmt, where, tmp_path)
    source, stages = build(urls, fmt, tmp_path)
    pipeline = Pipeline(source, stages, batch_size=8)
    want = np.concatenate([ids_of(s, n) for s, n in enumerate(SIZES)])
    epochs = [epoch_values(pipeline, x_field(fmt)) for _ in range(3)]
    for values in epochs:
        np.testing.assert_array_equal(np.sort(values), want)
    assert not np.array_equal(epochs[0], want) and not np.array_equal(epochs[0], epochs[1])
    plain, stages = build(urls, fmt, tmp_path, shuffle=False)
    np.testing.assert_array_equal(epoch_values(Pipeline(plain, stages, batch_size=8), x_field(fmt)), want)


def test_records_and_encoded_fields_match_the_shards(tmp_path):
    urls = write_shards("parquet", "memory", tmp_path)
    source = ShardedSource(urls=urls, encoded=("payload",), manifest_dir=str(tmp_path / "m"))
    batch = source.get_batch(np.array([0, 40, 139, 86, 87]))
    assert batch["payload"].tolist() == [b"rec0-0", b"rec1-0", b"rec2-52", b"rec1-46", b"rec2-0"]
    assert batch["x"].tolist() == [0, 1000, 2052, 1046, 2000] and batch["x"].dtype == np.int32
    np.testing.assert_array_equal(batch["vec"], batch["x"][:, None] * 3.0 + np.arange(3))  # fixed-size lists
    assert batch["vec"].dtype == np.float32 and source.element_spec()["vec"].shape == (3,)
    assert source.describe_record(41) == f"record 1 of row group 0 of {urls[1]}"
    tar = ShardedSource(urls=write_shards("tar", "file", tmp_path), manifest_dir=str(tmp_path / "m"), block_records=7)
    got = tar.get_batch(np.array([3, 41]))
    assert got["payload"].tolist() == [b"rec0-3", b"rec1-1"] and got["cls"].tolist() == [3, 1001]


def test_the_block_shuffle_reference():
    """The sampler against a direct numpy construction: blocks in Feistel order, records of each
    window of 3 blocks permuted within the window only."""
    counts = [5, 3, 8, 2, 6, 4, 7]
    sampler = BlockShuffleSampler(counts, window=3, seed=11)
    starts = np.concatenate([[0], np.cumsum(counts)])
    order, _, _ = sampler.epoch_order(2)
    ids = sampler.indices(np.arange(sum(counts)), 2)
    assert sorted(ids.tolist()) == list(range(sum(counts)))
    pos = 0
    for w in range(0, len(counts), 3):
        members = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in order[w:w + 3]])
        np.testing.assert_array_equal(np.sort(ids[pos:pos + len(members)]), np.sort(members))
        pos += len(members)
    assert sorted(order.tolist()) == list(range(len(counts))) and not np.array_equal(order, np.arange(7))


@pytest.mark.parametrize("window, limit", [(1, 0.5), (4, 0.25), (16, 0.1)])
def test_shuffle_quality_by_window(window, limit):
    """Rank correlation with storage order over 200 blocks of 50 records falls with the window
    (measured: about 0.03, 0.02, 0.01; the bounds leave room for the seed)."""
    sampler = BlockShuffleSampler([50] * 200, window=window, seed=0)
    ids = sampler.indices(np.arange(10_000), 0)
    assert abs(stats.spearmanr(np.arange(10_000), ids).statistic) < limit


def test_resume_in_a_fresh_process_gives_the_identical_stream(tmp_path):
    urls = write_shards("parquet", "file", tmp_path)
    source, _ = build(urls, "parquet", tmp_path)
    reference = list(epoch_values(Pipeline(source, [], batch_size=8).epochs(2), "x"))
    it = Pipeline(build(urls, "parquet", tmp_path)[0], [], batch_size=8).epochs(2)
    head = [int(v) for _ in range(13) for v in np.asarray(next(it)["x"])]
    state = json.dumps(it.get_state())
    code = textwrap.dedent(f"""
        import json, sys, numpy as np
        from datarax import Pipeline
        from datarax.sources import ShardedSource
        source = ShardedSource(urls={urls!r}, fields=("x",), manifest_dir={str(tmp_path / 'manifests')!r},
                               shuffle=True, seed=3, block_records=10, window=2)
        it = Pipeline(source, [], batch_size=8).epochs(2)
        it.set_state(json.loads(sys.stdin.read()))
        print(json.dumps([int(v) for b in it for v in np.asarray(b["x"])]))
    """)
    out = subprocess.run([sys.executable, "-c", code], input=state, capture_output=True, text=True, check=True)
    assert head + json.loads(out.stdout) == [int(v) for v in reference]


def test_a_changed_shard_is_refused_and_a_missing_one_named(tmp_path):
    urls = write_shards("parquet", "memory", tmp_path)
    build(urls, "parquet", tmp_path)
    fs = fsspec.filesystem("memory")
    fs.pipe(urls[1], parquet_bytes(1, 48))
    with pytest.raises(ShardChangedError, match=rf"shard '{urls[1]}' changed since its manifest .* \(size \d+ -> \d+"):
        build(urls, "parquet", tmp_path)
    fs.rm(urls[2])
    with pytest.raises(FileNotFoundError, match=rf"shard '{urls[2]}' does not exist"):
        ShardedSource(urls=urls, manifest_dir=str(tmp_path / "other"))


class Flaky(MemoryFileSystem):
    """The memory filesystem whose range reads fail with OSError on the calls listed."""

    protocol = "flakymem"
    failures: set = set()
    calls = [0]

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol("memory://" + path.removeprefix("flakymem://"))

    def cat_file(self, path, start=None, end=None, **kwargs):
        Flaky.calls[0] += 1
        if Flaky.calls[0] in Flaky.failures:
            raise ConnectionError(f"injected failure {Flaky.calls[0]}")
        return super().cat_file(path, start, end, **kwargs)


@pytest.mark.parametrize("prefetch", [0, 8])
def test_transient_errors_are_retried_with_the_same_records(tmp_path, prefetch):
    fsspec.register_implementation("flakymem", Flaky, clobber=True)
    for shard, n in enumerate(SIZES):
        Flaky().pipe(f"/{tmp_path.name}/f-{shard}.parquet", parquet_bytes(shard, n))
    urls = [f"flakymem://{tmp_path.name}/f-{shard}.parquet" for shard in range(3)]
    reference = epoch_values(Pipeline(build(urls, "parquet", tmp_path)[0], [], batch_size=8), "x")
    Flaky.calls[0], Flaky.failures = 0, {3, 4, 9, 20}
    source = build(urls, "parquet", tmp_path, prefetch_blocks=prefetch)[0]
    pipeline = Pipeline(source, [], batch_size=8, retry_policy=RetryPolicy(max_retries=3, backoff_s=0.0))
    np.testing.assert_array_equal(epoch_values(pipeline, "x"), reference)
    assert Flaky.calls[0] > 20  # every injected failure happened, and was retried
    Flaky.failures = set()


def test_bad_settings_name_the_setting(tmp_path):
    urls = write_shards("parquet", "memory", tmp_path)
    with pytest.raises(KeyError, match=r"fields \['y'\] are not in the shards"):
        ShardedSource(urls=urls, fields=("y",), manifest_dir=str(tmp_path / "m"))
    with pytest.raises(TypeError, match=r"column 'payload' is binary, which is not a number or a fixed-size list of "
                                        r"numbers; list it in encoded"):
        ShardedSource(urls=urls, manifest_dir=str(tmp_path / "m"))
    with pytest.raises(ValueError, match=r"prefetch_blocks \(16\) must be below cache_blocks \(4\)"):
        ShardedSource(urls=urls, cache_blocks=4, manifest_dir=str(tmp_path / "m"))
    with pytest.raises(ValueError, match=r"cannot tell the format of 'memory://x/y.bin'"):
        ShardedSource(urls=["memory://x/y.bin"], manifest_dir=str(tmp_path / "m"))
    with pytest.raises(FileNotFoundError, match=r"pattern 'memory://nowhere/\*.parquet' matches no files"):
        ShardedSource(urls="memory://nowhere/*.parquet", manifest_dir=str(tmp_path / "m"))
    source = ShardedSource(urls=f"memory://{tmp_path.name}/shard-*.parquet", fields=("x",),
                           manifest_dir=str(tmp_path / "m"))
    assert len(source) == TOTAL


def test_hf_image_parquet_shards_decode_through_decode_image(tmp_path):
    """JPEG records of HF `Image` parquet shards on memory:// reach DecodeImage as the files' bytes:
    each image equals the same stage's decode of the original file, and the record-keyed random
    crops are identical after a resume."""
    from PIL import Image
    from skimage import data as photos

    from datarax.host import DecodeImage
    from datarax.sources import write_hf_parquet

    photo = photos.astronaut()
    jpegs = []
    for i in range(30):
        buf = io.BytesIO()
        Image.fromarray(photo[i * 8:i * 8 + 64, i * 5:i * 5 + 80]).save(buf, format="JPEG", quality=90)
        jpegs.append(buf.getvalue())
    urls = []
    for shard in range(3):
        path = tmp_path / f"img-{shard}.parquet"
        write_hf_parquet(path, {"image": jpegs[shard * 10:(shard + 1) * 10], "label": list(range(shard * 10,
                                                                                                 shard * 10 + 10))},
                         images=("image",))
        url = f"memory://{tmp_path.name}/img-{shard}.parquet"
        fsspec.filesystem("memory").pipe(url, path.read_bytes())
        urls.append(url)

    def make(crop="center"):
        source = ShardedSource(urls=urls, encoded=("image",), fields=("label",), shuffle=True, seed=2,
                               manifest_dir=str(tmp_path / "m"))
        return Pipeline(source, [DecodeImage(size=32, resize="fixed", crop=crop, backend="pillow", seed=1)],
                        batch_size=4)

    batches = list(make())
    labels = np.concatenate([np.asarray(b["label"]) for b in batches])
    images = np.concatenate([np.asarray(b["image"]) for b in batches])
    assert sorted(labels.tolist()) == list(range(30))
    local = DecodeImage(size=32, resize="fixed", backend="pillow")
    for label, image in zip(labels.tolist(), images):
        np.testing.assert_array_equal(image, local.decode(jpegs[label]))
    from sources.source_checks import check_exact_resume

    check_exact_resume(lambda: make("random_resized"), None, seed=4)


def test_hf_stream_source_points_encoded_columns_to_sharded_source():
    datasets = pytest.importorskip("datasets")
    from datarax.sources import HFStreamSource

    stream = datasets.Dataset.from_dict({"image": [b"x"], "label": [0]}).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"use datarax.sources.ShardedSource\(urls=\[...\], encoded=\('image',\)\)"):
        HFStreamSource(dataset=stream, encoded=("image",))


def test_held_bytes_bound_the_block_cache(tmp_path):
    urls = write_shards("parquet", "file", tmp_path)
    largest = max(pq.ParquetFile(u.removeprefix("file://")).metadata.row_group(g).total_byte_size
                  for u in urls for g in range(pq.ParquetFile(u.removeprefix("file://")).metadata.num_row_groups))
    source = ShardedSource(urls=urls, fields=("x",), cache_blocks=12, prefetch_blocks=3,
                           manifest_dir=str(tmp_path / "m"))
    assert source.held_bytes() == 12 * largest
    Pipeline(source, [], batch_size=8).epochs(1).__next__()
    assert len(source._io.cache) <= 12


def test_the_config_memory_check_counts_the_block_cache(tmp_path, monkeypatch, capsys):
    """`datarax validate` adds `held_bytes()` (the cache's bound) to the batches it checks."""
    from datarax.cli.main import main
    from datarax.config import sizes

    urls = write_shards("parquet", "file", tmp_path)
    largest = max(pq.ParquetFile(u.removeprefix("file://")).metadata.row_group(g).total_byte_size
                  for u in urls for g in range(pq.ParquetFile(u.removeprefix("file://")).metadata.num_row_groups))
    config = tmp_path / "job.toml"
    config.write_text(f'batch_size = 4\nprefetch = 1\n[source.sharded]\nurls = {urls!r}\nfields = ["x"]\n'
                      f'cache_blocks = 40\nprefetch_blocks = 2\nmanifest_dir = "{tmp_path / "m"}"\n'.replace("'", '"'))
    batches = 4 * (4 + 8) * 4  # 4 rows of an int32 field and an int64 id, in the 4 buffers of prefetch 1
    monkeypatch.setattr(sizes, "host_memory_bytes", lambda: batches + 40 * largest - 1)
    assert main(["validate", str(config)]) == 1
    err = capsys.readouterr().err
    assert f"plus {sizes.human(40 * largest)} the source and stages keep" in err, err
    monkeypatch.setattr(sizes, "host_memory_bytes", lambda: batches + 40 * largest)
    assert main(["validate", str(config)]) == 0


def cached_blocks(source) -> set[int]:
    return set(source._io.cache)


def test_host_stages_read_through_the_source_so_it_prefetches_the_blocks_that_come_next(tmp_path):
    from datarax.host.stage import HostStageSource

    urls = write_shards("parquet", "file", tmp_path)
    stage = HostMap(fn=lambda record, rng: {"payload": np.int64(len(record["payload"]))},
                    outputs={"payload": ((), np.int64)})

    def make():
        return ShardedSource(urls=urls, fields=("x", "payload"), encoded=("payload",), shuffle=True, seed=3,
                             window=2, prefetch_blocks=4, cache_blocks=12, manifest_dir=str(tmp_path / "m"))

    plain, behind = make(), make()
    default_sampler(plain), default_sampler(behind)  # what a Pipeline does: the source then knows the order
    ids = plain._io.sampler.indices(np.arange(8), 0)
    plain.read(ids, 0)
    HostStageSource(behind, [stage]).read(ids, 0)
    order, rank, _ = plain._io.sampler.epoch_order(0)
    blocks = np.searchsorted(plain._io.starts, ids, side="right") - 1
    last = int(rank[blocks].max())
    expected = set(blocks.tolist()) | {int(b) for b in order[last + 1:last + 1 + 4]}
    assert cached_blocks(plain) == cached_blocks(behind) == expected


@pytest.mark.parametrize("shuffle", [True, False])
def test_the_last_batches_of_an_epoch_prefetch_the_next_epochs_first_blocks(tmp_path, shuffle):
    urls = write_shards("parquet", "file", tmp_path)
    source = ShardedSource(urls=urls, fields=("x",), shuffle=shuffle, seed=3, window=2, prefetch_blocks=4,
                           cache_blocks=12, manifest_dir=str(tmp_path / "m"))
    sampler = default_sampler(source)
    ids = sampler.indices(np.arange(TOTAL - 8, TOTAL), 0)
    source.read(ids, 0)
    blocks = set((np.searchsorted(source._io.starts, ids, side="right") - 1).tolist())
    following = sampler.epoch_order(1)[0][:4] if shuffle else np.arange(4)
    assert cached_blocks(source) == blocks | {int(b) for b in following}
    # the next epoch's first batch then finds its blocks fetched
    assert set((np.searchsorted(source._io.starts, sampler.indices(np.arange(8), 1), side="right") - 1).tolist()) \
        <= cached_blocks(source)


def garble(data: bytes, start: int, count: int = 8) -> bytes:
    out = bytearray(data)
    for i in range(start, start + count):
        out[i] ^= 0xFF
    return bytes(out)


def footer_start(data: bytes) -> int:
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


def first_page(data: bytes, group: int) -> int:
    column = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(group).column(0)
    return column.data_page_offset + column.total_compressed_size // 2


@pytest.mark.parametrize("damage, match", [
    (lambda data: data[:len(data) // 2], r"shard 'file://.*shard-1\.parquet' is not a readable parquet file \(its "
                                         r"footer"),
    (lambda data: garble(data, footer_start(data) + 4, 16), r"shard 'file://.*shard-1\.parquet' is not a readable "
                                                            r"parquet file"),
    (lambda data: garble(data, first_page(data, 2)), r"cannot read row group 2 of file://.*shard-1\.parquet: OSError"),
])
def test_a_damaged_shard_is_refused_naming_its_url_and_block(tmp_path, damage, match):
    from datarax.sources import CorruptFileError

    urls = write_shards("parquet", "file", tmp_path)
    path = urls[1].removeprefix("file://")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(damage(data))
    with pytest.raises(CorruptFileError, match=match):
        source = ShardedSource(urls=urls, fields=("x",), manifest_dir=str(tmp_path / "m"), block_records=10)
        list(Pipeline(source, [], batch_size=8))


class SeededFlaky(MemoryFileSystem):
    """The memory filesystem whose every request (range read, info, open) times out with
    probability `rate`, from a seeded generator."""

    protocol = "seededflaky"
    rate = 0.0
    rng = np.random.default_rng(0)
    failures = [0]

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol("memory://" + path.removeprefix("seededflaky://"))

    def _maybe_fail(self):
        if SeededFlaky.rng.random() < SeededFlaky.rate:
            SeededFlaky.failures[0] += 1
            raise TimeoutError("injected timeout")

    def cat_file(self, path, start=None, end=None, **kwargs):
        self._maybe_fail()
        return super().cat_file(path, start, end, **kwargs)

    def info(self, path, **kwargs):
        self._maybe_fail()
        return super().info(path, **kwargs)

    def _open(self, path, *args, **kwargs):
        self._maybe_fail()
        return super()._open(path, *args, **kwargs)


@pytest.mark.parametrize("rate, settings", [(0.05, {}), (0.2, {"max_retries": 12, "retry_backoff_s": 0.0})])
def test_random_timeouts_still_give_the_exact_stream_ten_runs_in_ten(tmp_path, rate, settings):
    """12 shards, two shuffled epochs, every request timing out at `rate`: each of 10 runs (a fresh
    source, manifest and cache each) reads exactly the stream of a run without faults."""
    fsspec.register_implementation("seededflaky", SeededFlaky, clobber=True)
    sizes = [20 + 3 * s for s in range(12)]
    for shard, n in enumerate(sizes):
        SeededFlaky().pipe(f"/{tmp_path.name}/t-{shard:02d}.parquet", parquet_bytes(shard, n))
    urls = [f"seededflaky://{tmp_path.name}/t-{shard:02d}.parquet" for shard in range(12)]

    def run(name: str) -> np.ndarray:
        source = ShardedSource(urls=urls, fields=("x",), shuffle=True, seed=5, block_records=10, window=2,
                               manifest_dir=str(tmp_path / name), **settings)
        return epoch_values(Pipeline(source, [], batch_size=8).epochs(2), "x")

    SeededFlaky.rate = 0.0
    reference = run("reference")
    SeededFlaky.rate, SeededFlaky.failures[0] = rate, 0
    try:
        for seed in range(10):
            SeededFlaky.rng = np.random.default_rng(seed)
            np.testing.assert_array_equal(run(f"run-{seed}"), reference)
    finally:
        SeededFlaky.rate = 0.0
    assert SeededFlaky.failures[0] > 10 * rate * 50  # the faults happened (over 50 requests a run)


def test_a_rewrite_keeping_size_and_mtime_is_refused_at_open(tmp_path):
    import os

    def shard(values) -> bytes:
        buf = io.BytesIO()
        pq.write_table(pa.table({"x": np.asarray(values, np.int64)}), buf, compression="none", use_dictionary=False)
        return buf.getvalue()

    path = tmp_path / "s.parquet"
    path.write_bytes(shard(range(30)))
    stat = os.stat(path)
    url = f"file://{path}"
    ShardedSource(urls=[url], manifest_dir=str(tmp_path / "m"))  # the manifest, with the shard's hash
    rewritten = shard(range(100, 130))
    assert len(rewritten) == stat.st_size
    path.write_bytes(rewritten)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ShardChangedError, match=rf"shard '{url}' was rewritten .* same size \({stat.st_size}\) and "
                                                r"modification time, but the hash .* changed"):
        ShardedSource(urls=[url], manifest_dir=str(tmp_path / "m"))
    unverified = ShardedSource(urls=[url], manifest_dir=str(tmp_path / "m"), verify=False)  # documented: not checked
    assert unverified.get_batch(np.array([0]))["x"].tolist() == [100]


def test_a_custom_sampler_still_gets_its_blocks_fetched_ahead(tmp_path):
    """Under a sampler of the user's, the reader tells the source the next batch's records before it
    reads the current one: only the first batch's blocks (those the second does not share) are
    fetched when read (the source's own block order is not in use)."""
    from datarax.samplers.simple import ShuffleSampler

    urls = write_shards("parquet", "file", tmp_path)
    source = ShardedSource(urls=urls, fields=("x",), manifest_dir=str(tmp_path / "m"), block_records=10)
    sampler = ShuffleSampler(len(source), seed=4)
    pipeline = Pipeline(source, [], batch_size=8, sampler=sampler)
    values = epoch_values(pipeline, "x")
    assert sorted(values.tolist()) == sorted(np.concatenate([ids_of(s, n) for s, n in enumerate(SIZES)]).tolist())
    def blocks(positions):
        return set((np.searchsorted(source._io.starts, sampler.indices(positions, 0), side="right") - 1).tolist())

    assert source.unrequested_blocks == len(blocks(np.arange(8)) - blocks(np.arange(8, 16))) > 0
