"""Files named by data (HF path-only Image rows, image-folder files): regular files only, bounded,
relative paths from the dataset's folder, nothing outside the dataset unless allowed."""

from __future__ import annotations

import os

import numpy as np
import pytest

from datarax.sources import FileFolderSource, ImageFolderSource
from datarax.sources._paths import DataPathError
from datarax.sources.hf import HFSource, HFSourceConfig, load_files

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

GOOD = b"\x89PNG not decoded here"


def write_rows(folder, paths: list[str | None], byte_values=None) -> str:
    """A parquet file whose `image` column is HF's Image struct: each row bytes=None, path=paths[i]."""
    byte_values = byte_values or [None] * len(paths)
    image = pa.array([{"bytes": b, "path": p} for b, p in zip(byte_values, paths)],
                     type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    table = pa.table({"id": np.arange(len(paths), dtype=np.int32), "image": image})
    path = os.path.join(folder, "rows.parquet")
    pq.write_table(table, path)
    return path


@pytest.fixture
def dataset_dir(tmp_path):
    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    (data / "img" / "a.png").write_bytes(GOOD)
    (tmp_path / "x").write_bytes(b"a secret beside the dataset")
    return tmp_path


def source_for(folder, paths, **settings) -> HFSource:
    ds = load_files([write_rows(str(folder / "data"), paths)], cache_dir=str(folder / "cache"))
    return HFSource(HFSourceConfig(fields=("id",), encoded=("image",), **settings), dataset=ds)


def test_relative_paths_are_read_from_the_dataset_folder_not_the_working_directory(dataset_dir, monkeypatch):
    monkeypatch.chdir("/")
    source = source_for(dataset_dir, ["img/a.png", str(dataset_dir / "data" / "img" / "a.png")])
    batch = source.get_batch(np.array([0, 1]))
    assert list(batch["image"]) == [GOOD, GOOD]


@pytest.mark.parametrize("path, refusal", [
    ("/dev/zero", r"row 0 .*'/dev/zero'.*(outside|a device)"),
    ("/etc/passwd", r"row 0 .*'/etc/passwd'.*outside the dataset's folder"),
    ("../x", r"row 0 .*\.\./x.*outside the dataset's folder.*allow_outside_root=True"),
])
def test_paths_outside_the_dataset_are_refused_naming_row_and_path(dataset_dir, path, refusal):
    source = source_for(dataset_dir, [path])
    with pytest.raises(DataPathError, match=refusal):
        source.get_batch(np.array([0]))


def test_allow_outside_root_reads_elsewhere_but_still_only_regular_bounded_files(dataset_dir):
    source = source_for(dataset_dir, ["../x", "/dev/zero"], allow_outside_root=True)
    assert source.get_batch(np.array([0]))["image"][0] == b"a secret beside the dataset"
    with pytest.raises(DataPathError, match=r"row 1 .*'/dev/zero', which is a device"):
        source.get_batch(np.array([1]))
    small = source_for(dataset_dir, ["../x"], allow_outside_root=True, max_file_bytes=5)
    with pytest.raises(DataPathError, match=r"of 27 bytes, over the limit of 5.*max_file_bytes"):
        small.get_batch(np.array([0]))


def test_a_fifo_in_the_dataset_is_refused_without_blocking(dataset_dir):
    os.mkfifo(dataset_dir / "data" / "img" / "pipe.png")
    source = source_for(dataset_dir, ["img/pipe.png"])
    with pytest.raises(DataPathError, match=r"row 0 .*pipe\.png', which is a FIFO"):
        source.get_batch(np.array([0]))


def test_files_root_sets_the_folder_and_an_unknown_folder_refuses_relative_paths(dataset_dir):
    ds = datasets.Dataset.from_dict({"id": [0]}).add_column(
        "image", [{"bytes": None, "path": "img/a.png"}], feature=datasets.Image(decode=False))
    with pytest.raises(DataPathError, match=r"relative path 'img/a.png'.*files_root"):
        HFSource(HFSourceConfig(fields=("id",), encoded=("image",)), dataset=ds).get_batch(np.array([0]))
    rooted = HFSource(HFSourceConfig(fields=("id",), encoded=("image",), files_root=str(dataset_dir / "data")),
                      dataset=ds)
    assert rooted.get_batch(np.array([0]))["image"][0] == GOOD
    with pytest.raises(TypeError, match="files_root must be a folder path"):
        HFSourceConfig(files_root=3)
    with pytest.raises(ValueError, match="max_file_bytes"):
        HFSourceConfig(max_file_bytes=0)


@pytest.mark.parametrize("cls", [ImageFolderSource, FileFolderSource])
def test_a_folder_symlink_to_a_device_or_fifo_is_refused(tmp_path, cls):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.png").write_bytes(GOOD)
    os.symlink("/dev/zero", tmp_path / "cat" / "b.png")
    os.mkfifo(tmp_path / "cat" / "c.png")
    source = cls(root=str(tmp_path))
    assert source.get_batch(np.array([0]))[source.field][0] == GOOD
    with pytest.raises(DataPathError, match=r"b\.png', which is a device"):
        source.get_batch(np.array([1]))
    with pytest.raises(DataPathError, match=r"c\.png', which is a FIFO"):
        source.get_batch(np.array([2]))
    small = cls(root=str(tmp_path), max_file_bytes=4)
    with pytest.raises(DataPathError, match=r"a\.png' of 21 bytes, over the limit of 4"):
        small.get_batch(np.array([0]))


def test_a_file_deleted_after_the_scan_names_the_record_and_path(tmp_path):
    (tmp_path / "cat").mkdir()
    for name in ("a.png", "b.png"):
        (tmp_path / "cat" / name).write_bytes(GOOD)
    source = ImageFolderSource(root=str(tmp_path))
    (tmp_path / "cat" / "b.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"ImageFolderSource record 1: the file is gone .*b\.png'"):
        source.get_batch(np.array([0, 1]))


def test_a_missing_file_is_a_data_path_error_naming_row_dataset_and_path(dataset_dir):
    """Not a bare FileNotFoundError: the row, the dataset's file and the path; through a pipeline
    with DecodeImage(on_error='skip') too (documented: a missing file is no undecodable record)."""
    from datarax import Pipeline
    from datarax.host import DecodeImage

    source = source_for(dataset_dir, ["img/a.png", "img/gone.png"])
    with pytest.raises(DataPathError, match=r"^HFSource row 1 of .*\.arrow, column 'image', names "
                                            r"'.*data/img/gone\.png', which does not exist .*files_root"):
        source.get_batch(np.array([0, 1]))
    pipeline = Pipeline(source, [DecodeImage(size=4, on_error="skip")], batch_size=2)
    with pytest.raises(DataPathError, match=r"row 1 .*gone\.png', which does not exist"):
        list(pipeline)
