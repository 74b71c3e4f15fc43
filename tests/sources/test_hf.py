import pathlib
import sys

import numpy as np
import pytest
from source_checks import check_exact_resume, check_shuffled_coverage

from datarax import Pipeline
from datarax.core.fields import UnsupportedColumnError
from datarax.sources import CorruptFileError
from datarax.sources.hf import HFSource, HFSourceConfig, load_files

datasets = pytest.importorskip("datasets")

N = 300


def make_table(n: int = N) -> dict:
    rng = np.random.default_rng(0)
    ids = np.arange(n, dtype=np.int64)
    return {
        "id": ids,
        "image": rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8),
        "score": rng.random(n).astype(np.float32),
        "text": [f"record {i}" for i in ids],
        "tokens": [list(range(i % 5 + 1)) for i in ids],  # ragged
    }


@pytest.fixture(scope="module")
def table():
    return make_table()


@pytest.fixture(scope="module")
def files(tmp_path_factory, table):
    """The same rows as three parquet files, one csv and one arrow file."""
    root = tmp_path_factory.mktemp("hf")
    ds = datasets.Dataset.from_dict(table)
    parquet = []
    for i, (a, b) in enumerate([(0, 100), (100, 200), (200, N)]):
        parquet.append(str(root / f"part-{i}.parquet"))
        ds.select(range(a, b)).to_parquet(parquet[-1])
    csv = str(root / "table.csv")
    ds.select_columns(["id", "score", "text"]).to_csv(csv, index=False)
    ds.save_to_disk(str(root / "saved"))
    arrow = sorted((root / "saved").glob("*.arrow"))[0]
    return {"parquet": parquet, "csv": [csv], "arrow": [str(arrow)], "cache": str(root / "cache")}


@pytest.fixture(scope="module")
def parquet_ds(files):
    return load_files(files["parquet"], cache_dir=files["cache"])


NUMERIC = ("id", "image", "score")


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_rows_match_the_written_table(parquet_ds, table, mode):
    src = HFSource(HFSourceConfig(fields=NUMERIC, mode=mode), dataset=parquet_ds)
    assert len(src) == N and (src.memory is not None) == (mode == "eager")
    assert src.element_spec()["image"].shape == (4, 4, 3)
    idx = np.array([[299, 0, 150], [42, 100, 199]])
    got = src.get_batch(idx)
    for k in NUMERIC:
        np.testing.assert_array_equal(got[k], np.asarray(table[k])[idx])


@pytest.mark.parametrize("kind,columns", [("csv", ("id", "score")), ("arrow", NUMERIC)])
def test_csv_and_arrow_files(files, table, kind, columns):
    src = HFSource(HFSourceConfig(fields=columns, mode="lazy"),
                   dataset=load_files(files[kind], cache_dir=files["cache"]))
    got = src.get_batch(np.array([7, 250]))
    for k in columns:
        np.testing.assert_allclose(got[k], np.asarray(table[k])[[7, 250]], rtol=1e-6)


def test_index_mapping_of_a_selected_and_shuffled_dataset(parquet_ds, table):
    view = parquet_ds.shuffle(seed=4).select(range(50))
    expected = np.asarray(view["id"])
    for mode in ("eager", "lazy"):
        src = HFSource(HFSourceConfig(fields=("id",), mode=mode), dataset=view)
        np.testing.assert_array_equal(src.get_batch(np.arange(50))["id"], expected)


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_pipeline_full_epoch_coverage_under_shuffle(parquet_ds, mode):
    def make():
        return Pipeline(HFSource(HFSourceConfig(fields=NUMERIC, shuffle=True, seed=2, mode=mode),
                                         dataset=parquet_ds), batch_size=64)
    check_shuffled_coverage(make, "id", np.arange(N))


def test_eager_is_device_resident_and_lazy_is_host(parquet_ds):
    eager = HFSource(HFSourceConfig(fields=NUMERIC, mode="eager"), dataset=parquet_ds)
    lazy = HFSource(HFSourceConfig(fields=NUMERIC, mode="lazy"), dataset=parquet_ds)
    assert eager.device_arrays() is not None and lazy.device_arrays() is None
    np.testing.assert_array_equal(eager.get_batch(np.arange(10))["image"], lazy.get_batch(np.arange(10))["image"])


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_pipeline_exact_resume_mid_epoch(parquet_ds, mode):
    def make():
        return Pipeline(HFSource(HFSourceConfig(fields=NUMERIC, shuffle=True, seed=9, mode=mode),
                                         dataset=parquet_ds), batch_size=32)
    check_exact_resume(make, "image", seed=3)


def test_convert_turns_strings_and_ragged_lists_into_arrays(parquet_ds, table):
    def convert(batch):
        assert isinstance(batch["text"], list) and isinstance(batch["id"], np.ndarray)
        padded = np.zeros((len(batch["tokens"]), 5), np.int32)
        for i, t in enumerate(batch["tokens"]):
            padded[i, :len(t)] = t
        return {"text_len": np.array([len(t) for t in batch["text"]], np.int32), "tokens": padded}

    src = HFSource(HFSourceConfig(mode="lazy"), dataset=parquet_ds, convert=convert)
    assert set(src.element_spec()) == {"id", "image", "score", "text_len", "tokens"}
    got = src.get_batch(np.array([3, 9, 298]))
    np.testing.assert_array_equal(got["text_len"], [len(table["text"][i]) for i in (3, 9, 298)])
    np.testing.assert_array_equal(got["tokens"][2, :table["tokens"][298].__len__()], table["tokens"][298])
    np.testing.assert_array_equal(got["id"], [3, 9, 298])


def test_unsupported_columns_error_names_them_and_both_fixes(parquet_ds):
    with pytest.raises(UnsupportedColumnError, match=r"cannot batch column\(s\) 'text' \(arrow type string\); 'tokens' "
                                                     r"\(ragged lists \(lengths 1 to 5\)\).*fields=.*convert="):
        HFSource(dataset=parquet_ds)


def test_ragged_rows_found_at_read_time_in_lazy_mode(tmp_path):
    rows = {"x": [[1, 2]] * 1500 + [[1, 2, 3]] * 10}  # uniform in the first 1024 rows sampled for the spec
    ds = datasets.Dataset.from_dict(rows)
    src = HFSource(HFSourceConfig(mode="lazy"), dataset=ds)
    with pytest.raises(UnsupportedColumnError, match="column 'x' has ragged lists.*where its spec is \\(2,\\)"):
        src.get_batch(np.array([0, 1505]))


def test_missing_file_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"load_files paths: \['.*missing.parquet'\] do not exist"):
        load_files([str(tmp_path / "missing.parquet")])


def test_errors_for_wrong_inputs(parquet_ds, files):
    with pytest.raises(KeyError, match=r"HFSource columns \['nope'\] are not in the data"):
        HFSource(HFSourceConfig(fields=("nope",)), dataset=parquet_ds)
    with pytest.raises(TypeError, match="dataset is a dict of splits \\['train'\\]; pass one split"):
        HFSource(dataset=datasets.DatasetDict({"train": parquet_ds}))
    with pytest.raises(ValueError, match="HFSourceConfig.mode must be one of .*got 'fast'"):
        HFSourceConfig(mode="fast")
    with pytest.raises(TypeError, match="HFSourceConfig.fields must be None .*got 'id'"):
        HFSourceConfig(fields="id")
    with pytest.raises(ValueError, match="cannot tell the format of"):
        load_files([files["parquet"][0], files["csv"][0]])


def test_missing_package_error_names_the_extra(monkeypatch, parquet_ds):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"HFSource needs the `datasets` package: pip install 'datarax\[data\]'"):
        HFSource(dataset=parquet_ds)


ENCODED_N = 30


@pytest.fixture(scope="module")
def encoded_files(tmp_path_factory):
    """Parquet with an HF Image feature (photographs), an Audio feature (tones) and a text column."""
    from source_checks import flac_tones, jpeg_photos

    root = tmp_path_factory.mktemp("hf_encoded")
    photos, sounds = jpeg_photos(ENCODED_N), flac_tones(ENCODED_N)
    ds = datasets.Dataset.from_dict({
        "id": np.arange(ENCODED_N, dtype=np.int32),
        "image": [{"bytes": b, "path": f"photo{i}.jpg"} for i, b in enumerate(photos)],
        "audio": [{"bytes": b, "path": f"tone{i}.flac"} for i, b in enumerate(sounds)],
        "caption": [f"photo number {i}" for i in range(ENCODED_N)],
    })
    ds = ds.cast_column("image", datasets.Image()).cast_column("audio", datasets.Audio())
    paths = [str(root / "a.parquet"), str(root / "b.parquet")]
    ds.select(range(0, 13)).to_parquet(paths[0])
    ds.select(range(13, ENCODED_N)).to_parquet(paths[1])
    return {"paths": paths, "cache": str(root / "cache"), "photos": photos, "sounds": sounds}


@pytest.fixture(scope="module")
def encoded_ds(encoded_files):
    return load_files(encoded_files["paths"], cache_dir=encoded_files["cache"])


def test_encoded_columns_are_the_stored_bytes(encoded_ds, encoded_files):
    from datarax.core.fields import ENCODED

    src = HFSource(HFSourceConfig(fields=("id",), encoded=("image", "audio", "caption")), dataset=encoded_ds)
    spec = src.element_spec()
    assert [spec[k].dtype for k in ("image", "audio", "caption")] == [ENCODED] * 3 and spec["id"].dtype == np.int32
    rows = np.array([[29, 0], [13, 12]])
    batch = src.get_batch(rows)
    assert batch["image"].shape == (2, 2) and batch["image"].dtype == object
    for (r, c), i in np.ndenumerate(rows):
        assert batch["image"][r, c] == encoded_files["photos"][i]
        assert batch["audio"][r, c] == encoded_files["sounds"][i]
        assert batch["caption"][r, c] == f"photo number {i}"
    assert src.describe_record(13).startswith("row 13 of ") and src.describe_record(13).endswith(
        ", image 'photo13.jpg', audio 'tone13.flac'")


def test_encoded_images_decode_like_pillow_with_exact_epochs_and_resume(encoded_ds, encoded_files):
    from source_checks import PillowDecode, pillow_pixels

    photos = encoded_files["photos"]

    def make():
        source = HFSource(HFSourceConfig(fields=("id",), encoded=("image",), shuffle=True, seed=4), dataset=encoded_ds)
        return Pipeline(source, [PillowDecode("image", photos)], batch_size=4)

    batch = next(iter(make()))
    for row, i in enumerate(np.asarray(batch["id"])):
        np.testing.assert_array_equal(np.asarray(batch["image"])[row], pillow_pixels(photos[i]))
    np.testing.assert_array_equal(np.asarray(batch["index"]), np.asarray(batch["id"]))
    check_shuffled_coverage(make, "index", np.arange(ENCODED_N))
    check_exact_resume(make, None, seed=1)


def test_encoded_audio_decodes_like_soundfile_and_names_a_corrupt_record(encoded_ds, encoded_files):
    import io

    import soundfile as sf

    from datarax.host import DecodeAudio
    from datarax.sources import RecordError

    def make(dataset):
        source = HFSource(HFSourceConfig(fields=("id",), encoded=("audio",), shuffle=True, seed=2), dataset=dataset)
        return Pipeline(source, [DecodeAudio(sample_rate=8000, length=4000, crop="start")], batch_size=8)

    check_shuffled_coverage(lambda: make(encoded_ds), "id", np.arange(ENCODED_N))
    check_exact_resume(lambda: make(encoded_ds), None, seed=3)
    batch = next(iter(make(encoded_ds)))
    for row, i in enumerate(np.asarray(batch["id"])):
        expected = sf.read(io.BytesIO(encoded_files["sounds"][i]), dtype="float32")[0][:4000]
        np.testing.assert_array_equal(np.asarray(batch["audio"])[row, :len(expected)], expected)

    def damage(row):
        if row["id"] == 17:
            row["audio"] = {"bytes": row["audio"]["bytes"][:60], "path": "tone17.flac"}
        return row

    broken = encoded_ds.cast_column("audio", datasets.Audio(decode=False)).map(damage)
    broken = broken.cast_column("audio", datasets.Audio())
    with pytest.raises(RecordError, match=r"record 17 \(row 17 of .*, audio 'tone17.flac'\) is not a readable"):
        list(make(broken))


def test_encoded_columns_errors_say_how(encoded_ds):
    with pytest.raises(UnsupportedColumnError, match=r"'image' \(arrow type struct<bytes: binary, path: string>\).*"
                                                     r"read them unchanged with HFSourceConfig\(encoded=\('image', "
                                                     r"'audio', 'caption'\)\)"):
        HFSource(dataset=encoded_ds)
    with pytest.raises(UnsupportedColumnError, match=r"encoded columns \{'id': 'int32'\} are not bytes, text"):
        HFSource(HFSourceConfig(encoded=("id",)), dataset=encoded_ds)
    with pytest.raises(ValueError, match=r"mode='eager'\) cannot hold the encoded columns \('image',\)"):
        HFSource(HFSourceConfig(fields=("id",), encoded=("image",), mode="eager"), dataset=encoded_ds)
    with pytest.raises(TypeError, match=r"HFSourceConfig.encoded must be a tuple of column names"):
        HFSourceConfig(encoded="image")
    with pytest.raises(KeyError, match=r"HFSource encoded columns \['img'\] are not in the data"):
        HFSource(HFSourceConfig(encoded=("img",)), dataset=encoded_ds)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
@pytest.mark.parametrize("streaming", [False, True])
def test_a_truncated_table_file_among_good_ones_fails_naming_the_file(files, tmp_path, kind, streaming):
    good = files[kind][0]
    bad = tmp_path / f"bad.{kind}"
    data = pathlib.Path(good).read_bytes()
    bad.write_bytes(data[:len(data) // 2])
    with pytest.raises(CorruptFileError, match=rf"'.*bad\.{kind}' is not a readable {kind} file"):
        load_files([good, str(bad)], streaming=streaming, cache_dir=str(tmp_path / "cache"))


def test_parquet_files_with_conflicting_schemas_are_named(tmp_path):
    """HF reports this as a generic cast error; load_files names both files and the difference."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datarax.sources.hf import load_files

    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "x": pa.array([0.5, 1.5])}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array(["3", "4"]), "x": pa.array([2.5, 3.5])}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"a\.parquet' and '.*b\.parquet' do not have the same columns "
                                         r"\(types that differ \(first, second\): \{'id': \('int64', 'string'\)\}\)"):
        load_files([tmp_path / "a.parquet", tmp_path / "b.parquet"])


def test_text_that_is_not_utf8_names_the_row_and_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")

    raw = pa.array([b"good", b"bad \xff\xfe text", b"fine"], type=pa.binary())
    table = pa.table({"id": np.arange(3, dtype=np.int32), "text": raw.view(pa.string())})  # unvalidated
    pq.write_table(table, tmp_path / "t.parquet")
    ds = load_files([tmp_path / "t.parquet"], cache_dir=str(tmp_path / "cache"))
    source = HFSource(HFSourceConfig(fields=("id",), encoded=("text",)), dataset=ds)
    assert list(source.get_batch(np.array([2, 0]))["text"]) == ["fine", "good"]
    with pytest.raises(CorruptFileError, match=r"row 1 of .*\.arrow, column 'text', holds text that is not UTF-8 "
                                               r"\(invalid start byte at byte 4"):
        source.get_batch(np.array([0, 1, 2]))
