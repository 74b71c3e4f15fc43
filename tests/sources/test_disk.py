import pathlib

import numpy as np
import pytest
from source_checks import check_exact_resume, check_shuffled_coverage

from datarax import Pipeline
from datarax.sources import CorruptFileError
from datarax.sources.disk import (
    StreamingDiskSource,
    StreamingDiskSourceConfig,
    save_npy_dataset,
)

N = 257


def make_data(n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"id": np.arange(n, dtype=np.int32), "image": rng.integers(0, 255, (n, 6, 6, 3), dtype=np.uint8),
            "feat": rng.standard_normal((n, 5)).astype(np.float32)}


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    root = tmp_path_factory.mktemp("npy")
    save_npy_dataset(root, make_data())
    return root


def test_reads_match_numpy_and_stay_on_disk(directory):
    data = make_data()
    src = StreamingDiskSource(paths=str(directory))
    assert len(src) == N and set(src.element_spec()) == {"id", "image", "feat"}
    assert all(isinstance(v, np.memmap) for v in src._maps.arrays.values())  # nothing loaded up front
    idx = np.array([[256, 0], [13, 13]])
    got = src.get_batch(idx)
    for k, v in data.items():
        np.testing.assert_array_equal(got[k], v[idx])
    out = {k: np.empty((3,) + v.shape[1:], v.dtype) for k, v in data.items()}
    assert src.get_batch(np.array([5, 6, 7]), out=out) is out
    np.testing.assert_array_equal(out["feat"], data["feat"][5:8])


def test_dict_of_paths(directory):
    src = StreamingDiskSource(paths={"label": directory / "id.npy"})
    np.testing.assert_array_equal(src.get_batch(np.array([4, 2]))["label"], [4, 2])


def test_pipeline_full_epoch_coverage_under_shuffle(directory):
    def make():
        return Pipeline(StreamingDiskSource(StreamingDiskSourceConfig(shuffle=True, seed=4), paths=str(directory)),
                                batch_size=50)
    check_shuffled_coverage(make, "id", np.arange(N))


def test_pipeline_exact_resume_mid_epoch(directory):
    def make():
        return Pipeline(StreamingDiskSource(StreamingDiskSourceConfig(shuffle=True, seed=6), paths=str(directory)),
                                batch_size=32)
    check_exact_resume(make, "image", seed=8)


def test_missing_files_and_bad_arrays(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"StreamingDiskSource paths: directory '.*nowhere' does not exist"):
        StreamingDiskSource(paths=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="holds no .npy files"):
        StreamingDiskSource(paths=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"paths\['x'\]: '.*x.npy' does not exist"):
        StreamingDiskSource(paths={"x": tmp_path / "x.npy"})
    np.save(tmp_path / "names.npy", np.array(["a", "b"]))
    with pytest.raises(TypeError, match="field 'names' .* has dtype <U1; only numeric and bool arrays"):
        StreamingDiskSource(paths={"names": tmp_path / "names.npy"})
    np.save(tmp_path / "a.npy", np.arange(3))
    np.save(tmp_path / "b.npy", np.arange(4))
    with pytest.raises(ValueError, match="'a' has 3 but 'b' has 4"):
        StreamingDiskSource(paths={"a": tmp_path / "a.npy", "b": tmp_path / "b.npy"})
    with pytest.raises(TypeError, match="StreamingDiskSourceConfig.shuffle must be True or False, got 'yes'"):
        StreamingDiskSourceConfig(shuffle="yes")


NPY_DAMAGE = {  # (damage, what the message says)
    "truncated": (lambda data: data[:len(data) // 2], "is truncated"),
    "header_only": (lambda data: data[:128], "is truncated"),
    "extra_bytes": (lambda data: data + b"\0" * 16, "is longer than its header says"),
    "garbled_magic": (lambda data: b"\0" * 8 + data[8:], "is not a readable .npy file"),
    "empty": (lambda data: b"", "is not a readable .npy file"),
}


@pytest.mark.parametrize("damage", sorted(NPY_DAMAGE))
def test_a_damaged_npy_file_fails_naming_the_file(tmp_path, damage):
    paths = save_npy_dataset(tmp_path, make_data(20))
    damage_fn, says = NPY_DAMAGE[damage]
    feat = pathlib.Path(paths["feat"])
    feat.write_bytes(damage_fn(feat.read_bytes()))
    with pytest.raises(CorruptFileError, match=rf"field 'feat' \('.*feat\.npy'\) {says}"):
        StreamingDiskSource(paths=tmp_path)
