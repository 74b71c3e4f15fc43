import json

import numpy as np
import pytest
from source_checks import check_exact_resume, check_shuffled_coverage, pipeline_reads_streams, stream_batches

from datarax import Pipeline
from datarax.sources import MemorySource
from datarax.sources._records import decode_record
from datarax.sources.array_record import write_array_records
from datarax.sources.grain_interop import (
    GrainDataSource,
    GrainSource,
    GrainSourceConfig,
    GrainStreamSource,
    GrainStreamSourceConfig,
    to_grain,
    to_grain_iter_dataset,
)

grain = pytest.importorskip("grain")

N = 200


def make_data(n: int = N) -> dict[str, np.ndarray]:
    ids = np.arange(n, dtype=np.int64)
    return {"id": ids, "vec": np.stack([ids, ids * 3], 1).astype(np.float32)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_array_records(tmp_path_factory.mktemp("grain") / "d", make_data(), num_shards=2)


def record_source(files):
    return grain.sources.ArrayRecordDataSource(files)


@pytest.mark.parametrize("kind", ["data_source", "map_dataset"])
def test_grain_sources_read_like_numpy(files, kind):
    if kind == "data_source":
        src = GrainSource(source=record_source(files), decode=decode_record)
    else:
        src = GrainSource(source=grain.MapDataset.source(record_source(files)).map(decode_record))
    data, idx = make_data(), np.array([[199, 0], [100, 57]])
    got = src.get_batch(idx)
    for k, v in data.items():
        np.testing.assert_array_equal(got[k], v[idx])


def test_pipeline_coverage_and_resume_over_a_grain_source(files):
    def make():
        return Pipeline(GrainSource(GrainSourceConfig(shuffle=True, seed=2), source=record_source(files),
                                            decode=decode_record), batch_size=48)
    check_shuffled_coverage(make, "id", np.arange(N))
    check_exact_resume(make, "vec", seed=7)


def test_datarax_source_as_grain_map_dataset():
    data = make_data()
    ds = to_grain(MemorySource(data=data))
    assert len(ds) == N
    np.testing.assert_array_equal(ds[17]["vec"], data["vec"][17])
    batch = next(iter(ds.batch(5)))  # grain's own batching over our records
    np.testing.assert_array_equal(batch["id"], np.arange(5))
    shuffled = [int(e["id"]) for e in ds.shuffle(seed=0)]
    assert sorted(shuffled) == list(range(N)) and shuffled != list(range(N))
    with pytest.raises(IndexError, match="GrainDataSource index 200 is out of range \\[0, 200\\)"):
        GrainDataSource(MemorySource(data=data))[200]


def test_pipeline_as_grain_iter_dataset_checkpoints_through_grain_state():
    def make():
        return Pipeline(MemorySource(data=make_data()), batch_size=32)
    ds = to_grain_iter_dataset(make(), num_epochs=2)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = [np.asarray(b["id"]) for b in it]
    resumed = iter(to_grain_iter_dataset(make(), num_epochs=2))
    resumed.set_state(state)
    got = [np.asarray(b["id"]) for b in resumed]
    assert len(got) == len(expected) == 14 - 5
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def grain_stream(files, batched: bool, workers: int = 0):
    ds = grain.MapDataset.source(record_source(files)).shuffle(seed=5).map(decode_record)
    if batched:
        ds = ds.batch(9)
    ds = ds.to_iter_dataset()
    if workers:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return GrainStreamSource(GrainStreamSourceConfig(batched=batched, num_records=N), dataset=ds)


@pytest.mark.parametrize("batched", [False, True])
def test_grain_stream_resumes_exactly_from_any_batch(files, batched):
    src = grain_stream(files, batched)
    full = stream_batches(src, "id", batch_size=16)
    reference = np.concatenate([b[0] for b in full])
    np.testing.assert_array_equal(np.sort(reference), np.arange(N))
    for k in (0, 4, len(full) - 2):
        _, epoch, position, state = full[k]
        rest = stream_batches(src, "id", batch_size=16, epoch=epoch, position=position, state=state)
        np.testing.assert_array_equal(np.concatenate([b[0] for b in rest]), reference[position:])


def test_grain_worker_processes_feed_a_resumable_stream(files):
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain's worker processes read absl flags, as in any grain program
        flags.FLAGS.mark_as_parsed()
    src = grain_stream(files, batched=True, workers=2)
    full = stream_batches(src, "vec", batch_size=20)
    reference = np.concatenate([b[0] for b in full])
    np.testing.assert_array_equal(np.sort(reference[:, 0]), np.arange(N))
    _, epoch, position, state = full[3]
    rest = stream_batches(src, "vec", batch_size=20, epoch=epoch, position=position, state=state)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in rest]), reference[position:])


@pytest.mark.skipif(not pipeline_reads_streams(), reason="the pipeline iterator does not read stream sources yet")
def test_pipeline_over_a_grain_stream(files):
    check_exact_resume(lambda: Pipeline(grain_stream(files, batched=True), batch_size=24), "id", seed=3)


def test_errors(files):
    with pytest.raises(TypeError, match="GrainSource elements must be dicts of arrays, got bytes.*pass decode=fn"):
        GrainSource(source=record_source(files))
    with pytest.raises(ValueError, match="GrainSource got a None element \\(filtered out"):
        GrainSource(source=grain.MapDataset.source(record_source(files)).map(decode_record)
                    .filter(lambda r: r["id"] > 0))
    with pytest.raises(ValueError, match="GrainSource source has length .*; it must be finite.*remove .repeat"):
        GrainSource(source=grain.MapDataset.range(5).map(lambda i: {"x": i}).repeat())
    with pytest.raises(TypeError, match="GrainSource source must be a grain RandomAccessDataSource or MapDataset"):
        GrainSource(source=grain.MapDataset.range(5).to_iter_dataset())
    with pytest.raises(ValueError, match="GrainStreamSource dataset yields no elements in epoch 0"):
        GrainStreamSource(dataset=grain.MapDataset.range(0).to_iter_dataset())
