import numpy as np
import pytest
from source_checks import check_exact_resume, pipeline_reads_streams, stream_batches

from datarax import Pipeline
from datarax.core.fields import UnsupportedColumnError
from datarax.sources.hf import HFSourceConfig, HFStreamSource, load_files

datasets = pytest.importorskip("datasets")

N, SHARDS = 300, 4
needs_stream_pipeline = pytest.mark.skipif(not pipeline_reads_streams(),
                                           reason="the pipeline iterator does not read stream sources yet")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfstream")
    ids = np.arange(N, dtype=np.int64)
    ds = datasets.Dataset.from_dict({"id": ids, "pair": np.stack([ids, -ids], 1), "text": [str(i) for i in ids]})
    paths = []
    for i, part in enumerate(np.array_split(ids, SHARDS)):
        paths.append(str(root / f"shard-{i}.parquet"))
        ds.select(part.tolist()).to_parquet(paths[-1])
    return paths


def stream(files, **config) -> HFStreamSource:
    config = {"fields": ("id", "pair"), **config}
    return HFStreamSource(HFSourceConfig(**config), dataset=load_files(files, streaming=True))


def ids_of(batches) -> np.ndarray:
    return np.concatenate([b[0] for b in batches])


def test_unshuffled_stream_is_the_files_in_order(files):
    src = stream(files, block_size=40)
    assert src.num_records() in (None, N)  # known only when HF has the split's metadata
    batches = stream_batches(src, "pair", batch_size=32)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), np.stack([np.arange(N), -np.arange(N)], 1))
    assert [len(b[0]) for b in batches][-1] == N % 32  # the short final batch is kept


@pytest.mark.parametrize("block_size", [16, 64, 1000])
def test_shuffled_epochs_cover_every_record_once_in_new_orders(files, block_size):
    src = stream(files, shuffle=True, seed=3, block_size=block_size)
    epochs = [ids_of(stream_batches(src, "id", batch_size=48, epoch=e, end_epoch=e + 1)) for e in range(2)]
    for ids in epochs:
        np.testing.assert_array_equal(np.sort(ids), np.arange(N))
        assert not np.array_equal(ids, np.arange(N))
    assert not np.array_equal(epochs[0], epochs[1])


@pytest.mark.parametrize("shuffle,block_size,batch_size", [(True, 32, 20), (True, 7, 64), (False, 50, 33)])
def test_resume_at_every_batch_boundary_is_exact(files, shuffle, block_size, batch_size):
    src = stream(files, shuffle=shuffle, seed=8, block_size=block_size)
    full = stream_batches(src, "id", batch_size=batch_size, end_epoch=2)
    reference = ids_of(full)
    for k in np.random.default_rng(0).choice(len(full) - 1, 4, replace=False):
        _, epoch, position, state = full[k]
        rest = stream_batches(src, "id", batch_size=batch_size, epoch=epoch, position=position, state=state,
                              end_epoch=2)
        done = sum(len(b[0]) for b in full[:k + 1])
        np.testing.assert_array_equal(ids_of(rest), reference[done:])


def test_convert_and_unsupported_columns(files):
    with pytest.raises(UnsupportedColumnError, match=r"'text' \(arrow type string\).*fields=.*convert="):
        HFStreamSource(dataset=load_files(files, streaming=True))
    def convert(b):
        return {"digits": np.array([len(t) for t in b["text"]], np.int32)}
    src = HFStreamSource(HFSourceConfig(fields=("id", "text")), dataset=load_files(files, streaming=True),
                         convert=convert)
    assert set(src.element_spec()) == {"id", "digits"}
    got = stream_batches(src, "digits", batch_size=N)[0][0]
    np.testing.assert_array_equal(got, [len(str(i)) for i in range(N)])


def test_errors(files):
    with pytest.raises(TypeError, match="HFStreamSource dataset must be a datasets.IterableDataset, got Dataset; "
                                        "use HFSource for it"):
        HFStreamSource(dataset=datasets.Dataset.from_dict({"x": [1]}))
    src = stream(files)
    with pytest.raises(ValueError, match="stream state must be a dict with keys \\['part', 'block', 'offset'\\]"):
        src.open(0, {"part": 0})
    with pytest.raises(ValueError, match="does not fit this dataset"):
        src.open(0, {"part": 9, "block": 0, "offset": 0, "hf": None})


@needs_stream_pipeline
def test_pipeline_reads_and_resumes_a_stream(files):
    def make():
        return Pipeline(stream(files, shuffle=True, seed=1, block_size=32), batch_size=25)
    pipeline = make()
    first = np.concatenate([np.asarray(b["id"]) for b in pipeline])
    np.testing.assert_array_equal(np.sort(first), np.arange(N))
    check_exact_resume(make, "pair", seed=4)


@needs_stream_pipeline
def test_pipeline_rejects_a_sampler_for_a_stream(files):
    from datarax.samplers.simple import SequentialSampler

    with pytest.raises(TypeError, match="is a stream, read in order on one process: sampler and sharding must be None"):
        Pipeline(stream(files), batch_size=8, sampler=SequentialSampler(N))
