import pathlib
import sys

import jax
import numpy as np
import pytest
from source_checks import check_exact_resume, check_shuffled_coverage

from datarax import Pipeline
from datarax.core.fields import UnsupportedColumnError
from datarax.sources import CorruptFileError
from datarax.sources._records import RecordFormatError, decode_record, encode_record
from datarax.sources.array_record import (
    ArrayRecordSource,
    ArrayRecordSourceConfig,
    write_array_records,
)

ar = pytest.importorskip("array_record.python.array_record_module")

N = 300
FIELDS = [  # (name, shape, dtype): a table of layouts the record format must round-trip
    ("u8_image", (4, 5, 3), np.uint8),
    ("i64_scalar", (), np.int64),
    ("f32_vector", (7,), np.float32),
    ("bool_flag", (), np.bool_),
    ("i16_matrix", (2, 3), np.int16),
]


def make_data(n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    data = {"id": np.arange(n, dtype=np.int64)}
    for name, shape, dtype in FIELDS:
        data[name] = (rng.random((n,) + shape) * 100).astype(dtype)
    return data


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_array_records(tmp_path_factory.mktemp("ar") / "train", make_data(), num_shards=3)


@pytest.mark.parametrize("name,shape,dtype", FIELDS)
def test_record_roundtrip_per_record(name, shape, dtype):
    value = (np.arange(int(np.prod(shape))).reshape(shape) % 7).astype(dtype)
    back = decode_record(encode_record({name: value, "k": np.int32(3)}))
    np.testing.assert_array_equal(back[name], value)
    assert back[name].dtype == dtype and back[name].shape == shape and back["k"].shape == ()


def test_batch_reads_match_numpy_gather_across_files(files):
    data = make_data()
    src = ArrayRecordSource(paths=files)
    assert len(src) == N
    idx = np.array([[0, 299, 100], [101, 5, 200]])  # spans all three files, 2-D
    got = src.get_batch(idx)
    for k, v in data.items():
        np.testing.assert_array_equal(got[k], v[idx])
    # reused buffers: a second read into the same `out` overwrites them in place
    out = src.get_batch(np.arange(8))
    again = src.get_batch(np.arange(8, 16), out=out)
    assert again is out
    np.testing.assert_array_equal(out["f32_vector"], data["f32_vector"][8:16])


def test_glob_pattern_and_spec(files):
    src = ArrayRecordSource(paths=str(files[0]).replace("00000-of", "*-of"))
    spec = src.element_spec()
    assert len(src) == N and spec["u8_image"].shape == (4, 5, 3) and spec["bool_flag"].dtype == np.bool_


def test_pipeline_full_epoch_coverage_under_shuffle(files):
    def make():
        return Pipeline(ArrayRecordSource(ArrayRecordSourceConfig(shuffle=True, seed=3), paths=files),
                                batch_size=64)
    check_shuffled_coverage(make, "id", np.arange(N))


def test_pipeline_exact_resume_mid_epoch(files):
    def make():
        return Pipeline(ArrayRecordSource(ArrayRecordSourceConfig(shuffle=True, seed=5), paths=files),
                                batch_size=32)
    check_exact_resume(make, "u8_image", seed=11)


def test_user_decode_for_foreign_records(tmp_path):
    path = str(tmp_path / "raw.array_record")
    writer = ar.ArrayRecordWriter(path, "group_size:1")
    for i in range(40):
        writer.write(f"{i},{i * i}".encode())
    writer.close()

    def parse(record: bytes) -> dict:
        a, b = record.decode().split(",")
        return {"a": np.int32(a), "b": np.array([int(b)], np.int64)}

    src = ArrayRecordSource(paths=path, decode=parse)
    batch = src.get_batch(np.array([3, 39]))
    np.testing.assert_array_equal(batch["a"], [3, 39])
    np.testing.assert_array_equal(batch["b"], [[9], [1521]])
    with pytest.raises(RecordFormatError, match="is not a datarax fixed-layout record.*pass decode=fn"):
        ArrayRecordSource(paths=path)


def test_records_with_different_layouts_are_rejected(tmp_path):
    path = str(tmp_path / "mixed.array_record")
    records = [encode_record({"x": np.zeros(3, np.float32)}), encode_record({"x": np.zeros(4, np.float32)}),
               encode_record({"x": np.ones(3, np.int32)})]
    writer = ar.ArrayRecordWriter(path, "group_size:1")
    for record in records:
        writer.write(record)
    writer.close()
    src = ArrayRecordSource(paths=path)
    with pytest.raises(RecordFormatError, match=f"record 1 of .*mixed.array_record is {len(records[1])} bytes, the "
                                                f"dataset's records are {len(records[0])}.*same fields, dtypes and "
                                                "shapes"):
        src.get_batch(np.array([0, 1]))
    with pytest.raises(RecordFormatError, match="record 2 of .*mixed.array_record has a different layout"):
        src.get_batch(np.array([0, 2]))


def test_missing_file_error(tmp_path):
    missing = str(tmp_path / "nope.array_record")
    with pytest.raises(FileNotFoundError, match=r"ArrayRecordSource paths: '.*nope.array_record' does not exist"):
        ArrayRecordSource(paths=missing)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        ArrayRecordSource(paths=str(tmp_path / "*.array_record"))


def test_missing_package_error_names_the_extra(monkeypatch, files):
    monkeypatch.setitem(sys.modules, "array_record.python.array_record_module", None)
    with pytest.raises(ImportError, match=r"ArrayRecordSource needs the `array_record` package: "
                                          r"pip install 'datarax\[data\]'"):
        ArrayRecordSource(paths=files)


def test_unsupported_field_error():
    with pytest.raises(UnsupportedColumnError, match="fields {'name': '<U3'} are not numeric"):
        encode_record({"name": np.array("abc"), "x": np.int32(1)})


def test_bad_config_and_args(files):
    with pytest.raises(TypeError, match="ArrayRecordSourceConfig.shuffle must be True or False, got 1"):
        ArrayRecordSourceConfig(shuffle=1)
    with pytest.raises(ValueError, match="write_array_records num_shards must be an int >= 1, got 0"):
        write_array_records("/tmp/unused", {"x": np.arange(3)}, num_shards=0)
    with pytest.raises(TypeError, match="decode must be a function"):
        ArrayRecordSource(paths=files, decode="json")


def write_raw(path, blobs: list[bytes]) -> str:
    writer = ar.ArrayRecordWriter(str(path), "group_size:1")
    for blob in blobs:
        writer.write(blob)
    writer.close()
    return str(path)


@pytest.fixture(scope="module")
def jpeg_files(tmp_path_factory):
    from source_checks import jpeg_photos

    root = tmp_path_factory.mktemp("ar_jpeg")
    photos = jpeg_photos(26)
    return photos, [write_raw(root / "photos-0.array_record", photos[:10]),
                    write_raw(root / "photos-1.array_record", photos[10:])]


def test_encoded_mode_reads_each_record_as_its_bytes(jpeg_files):
    from datarax.core.fields import ENCODED

    photos, paths = jpeg_files
    src = ArrayRecordSource(ArrayRecordSourceConfig(encoded="jpeg"), paths=paths)
    assert src.element_spec() == {"jpeg": jax.ShapeDtypeStruct((), ENCODED)} and len(src) == 26
    batch = src.get_batch(np.array([[25, 3], [10, 9]]))
    assert batch["jpeg"].dtype == object and batch["jpeg"].shape == (2, 2)
    assert [batch["jpeg"][i, j] for i in range(2) for j in range(2)] == [photos[k] for k in (25, 3, 10, 9)]
    assert src.describe_record(12) == f"record 2 of {paths[1]}"
    assert "encoded=jpeg" in src.structure()


def test_encoded_jpegs_decode_like_pillow_with_exact_epochs_and_resume(jpeg_files):
    from source_checks import PillowDecode, pillow_pixels

    photos, paths = jpeg_files

    def make():
        source = ArrayRecordSource(ArrayRecordSourceConfig(encoded="jpeg", shuffle=True, seed=6), paths=paths)
        return Pipeline(source, [PillowDecode("jpeg", photos)], batch_size=4)

    batch = next(iter(make()))
    for row, i in enumerate(np.asarray(batch["index"])):
        np.testing.assert_array_equal(np.asarray(batch["jpeg"])[row], pillow_pixels(photos[i]))
    check_shuffled_coverage(make, "index", np.arange(26))
    check_exact_resume(make, None, seed=2)


def test_encoded_mode_errors(jpeg_files):
    _, paths = jpeg_files
    with pytest.raises(ValueError, match=r"ArrayRecordSourceConfig.encoded must be a non-empty field name"):
        ArrayRecordSourceConfig(encoded="")
    with pytest.raises(ValueError, match=r"got decode= and ArrayRecordSourceConfig\(encoded='jpeg'\); pass one"):
        ArrayRecordSource(ArrayRecordSourceConfig(encoded="jpeg"), paths=paths, decode=lambda b: {"x": 0})
    with pytest.raises(TypeError, match=r"field 'jpeg' holds encoded records .* DecodeImage"):
        Pipeline(ArrayRecordSource(ArrayRecordSourceConfig(encoded="jpeg"), paths=paths), [], batch_size=2)


def damaged_copy(files, tmp_path, damage):
    """Copies of the shards with the last one damaged by `damage(bytes) -> bytes`."""
    copies = []
    for i, f in enumerate(files):
        data = pathlib.Path(f).read_bytes()
        path = tmp_path / f"copy-{i}.array_record"
        path.write_bytes(damage(data) if i == len(files) - 1 else data)
        copies.append(str(path))
    return copies


def overwrite(start, length):
    def damage(data):
        noise = np.random.default_rng(start).bytes(length)
        return data[:start] + noise + data[start + length:]
    return damage


UNOPENABLE = {  # damages ArrayRecord's footer or signature: the reader opens but is not ok()
    "garbled": lambda data: np.random.default_rng(1).bytes(len(data)),
    "truncated_half": lambda data: data[:len(data) // 2],
    "truncated_tail": lambda data: data[:-10],
    "empty": lambda data: b"",
    "garbled_postscript": overwrite(65600, 30),
}


@pytest.mark.parametrize("damage", sorted(UNOPENABLE))
def test_a_damaged_shard_among_good_ones_fails_naming_the_file(files, tmp_path, damage):
    copies = damaged_copy(files, tmp_path, UNOPENABLE[damage])
    with pytest.raises(CorruptFileError, match=r"copy-2\.array_record"):
        ArrayRecordSource(paths=copies)


def test_a_single_garbled_file_is_reported_as_damaged_not_empty(files, tmp_path):
    path = tmp_path / "only.array_record"
    path.write_bytes(np.random.default_rng(2).bytes(131072))
    with pytest.raises(CorruptFileError, match=r"only\.array_record.*not a readable ArrayRecord file"):
        ArrayRecordSource(paths=[str(path)])


@pytest.mark.parametrize("start", [100, 500, 3000])
def test_a_garbled_record_fails_the_epoch_naming_the_file_and_record(files, tmp_path, start):
    copies = damaged_copy(files, tmp_path, overwrite(start, 30))
    seen = 0
    # A damaged first or last record is found when the file is opened, any other when it is read.
    with pytest.raises(CorruptFileError, match=r"copy-2\.array_record.*(record|readable)"):
        source = ArrayRecordSource(ArrayRecordSourceConfig(shuffle=True, seed=0), paths=copies)
        for batch in Pipeline(source, [], batch_size=32):
            seen += len(batch["id"])
    assert seen < N


def crafted(header: bytes, body: bytes = b"\x00" * 8) -> bytes:
    """A record whose prefix is right but whose header is `header` (written by no one honest)."""
    import struct

    return b"DRX1" + struct.pack("<I", len(header)) + header + body


# (the header's JSON, the fault the error must name): every kind of malformed header
CRAFTED = [
    (b'[["x", "<U2", [1]]]', r"dtype '<U2' \(<U2\), not a numeric or bool type"),
    (b'[["x", "V8", []]]', r"dtype 'V8' \(\|V8\), not a numeric or bool type"),
    (b'[["x", "O", []]]', r"dtype 'O' \(object\), not a numeric or bool type"),
    (b'[["x", "i4,i4", []]]', r"dtype 'i4,i4' .*not a numeric or bool type"),
    (b'[["x", "M8[s]", []]]', r"dtype 'M8\[s\]' .*not a numeric or bool type"),
    (b'[["x", "zz", []]]', r"dtype 'zz', which is no numpy type"),
    (b'[["x", "<f4", [-2]]]', r"shape '\[-2\]', not a list of non-negative ints"),
    (b'[["x", "<f4", [true]]]', r"shape '\[True\]', not a list of non-negative ints"),
    (b'[["x", "<f4", [1000]]]', r"field 'x' \(float32, shape \[1000\]\) needs 4000 bytes, past the record's"),
    (b'{"x": 1}', r"it is dict .*not a non-empty list of \[name, dtype, shape\] fields"),
    (b'[]', r"it is list '\[\]', not a non-empty list"),
    (b'[["x", "<f4"]]', r"entry 0 is .*not \[name, dtype, shape\]"),
    (b'[[7, "<f4", [2]]]', r"entry 0 has the name '7', not a new non-empty string"),
    (b'[["x", "<f4", [1]], ["x", "<f4", [1]]]', r"entry 1 has the name 'x', not a new non-empty string"),
    (b'[["x", "<f4", [2]', r"it is not UTF-8 JSON \(JSONDecodeError"),
    (b'\xff\xfe', r"it is not UTF-8 JSON \(UnicodeDecodeError"),
]


@pytest.mark.parametrize("header, fault", CRAFTED)
def test_a_crafted_header_is_a_corrupt_file_error_naming_file_record_and_fault(tmp_path, header, fault):
    path = str(tmp_path / "crafted.array_record")
    good = encode_record({"x": np.zeros(2, np.float32)})
    for first, position in ((crafted(header), 0), (good, 3)):  # at open (the first record), and at a later read
        writer = ar.ArrayRecordWriter(path, "group_size:1")
        for i in range(5):
            writer.write(crafted(header) if i == position else good)
        writer.close()
        with pytest.raises(CorruptFileError, match=rf"^record {position} of '?.*crafted\.array_record'? has a "
                                                   rf"corrupt header: (field .x. has the )?{fault}"):
            list(Pipeline(ArrayRecordSource(paths=path), [], batch_size=5))


def test_a_header_longer_than_its_record_is_named():
    from datarax.sources._records import parse_layout

    record = b"DRX1" + (1000).to_bytes(4, "little") + b"[]"
    with pytest.raises(CorruptFileError, match=r"r has a corrupt header: its header length 1000 runs past"):
        parse_layout(record, "r")


def test_random_header_bytes_never_reach_numpy_or_jax():
    """Whatever bytes (or JSON) a header holds, parsing gives a layout of plain numeric fields whose
    sizes add up to the record, or a CorruptFileError: never numpy's or JAX's own errors."""
    import json
    import struct

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from datarax.core.fields import batchable
    from datarax.sources._records import parse_layout

    json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**41) | st.floats(allow_nan=False)
                               | st.sampled_from(["x", "<f4", "<U3", "V2", "O", "|b1", "<i8", "c8", "", "m8"]),
                               lambda inner: st.lists(inner, max_size=4), max_leaves=12)

    def check(record: bytes) -> None:
        try:
            layout = parse_layout(record, "r")
        except CorruptFileError:
            return
        assert all(batchable(f.dtype) and f.dtype.kind in "biufc" and all(s >= 0 for s in f.shape)
                   for f in layout.fields)
        assert layout.size == len(record) == layout.fields[-1].offset + layout.fields[-1].nbytes
        decode_record(record)  # and it decodes

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=64), st.binary(max_size=32))
    def raw(header, body):
        check(crafted(header, body))

    @settings(max_examples=300, deadline=None)
    @given(json_values, st.integers(0, 40))
    def structured(value, body):
        check(crafted(json.dumps(value).encode(), b"\x00" * body))

    raw()
    structured()
    check(b"DRX1" + struct.pack("<I", 3))  # a prefix whose header is missing
