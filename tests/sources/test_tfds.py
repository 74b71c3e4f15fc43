import os
import sys

import numpy as np
import pytest
from source_checks import check_exact_resume, check_shuffled_coverage

from datarax import Pipeline
from datarax.core.fields import UnsupportedColumnError
from datarax.sources.tfds import NEEDS_TF, TFDSSource, TFDSSourceConfig

tfds = pytest.importorskip("tensorflow_datasets")

N = 120
NAME = "datarax_tiny_test"


def record(i: int) -> dict:
    return {"image": np.full((4, 4, 3), i % 251, np.uint8), "label": i % 10, "id": i,
            "caption": f"image number {i}", "meta": {"score": np.float32(i) / 2}}


class DataraxTinyTest(tfds.core.GeneratorBasedBuilder):
    """A few records with numeric, nested and text features, prepared as ArrayRecord files."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Tensor(shape=(4, 4, 3), dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=10),
            "id": np.int64,
            "caption": tfds.features.Text(),
            "meta": {"score": np.float32},
        }))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(N), "test": self._generate_examples(10)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, record(i)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tfds"))
    DataraxTinyTest(data_dir=root, file_format="array_record").download_and_prepare()
    return root


NUMERIC = ("image", "label", "id", "meta/score")


def config(data_dir, **kw) -> TFDSSourceConfig:
    return TFDSSourceConfig(name=NAME, split="train", data_dir=data_dir, **{"fields": NUMERIC, **kw})


def test_reads_match_the_generated_records(data_dir):
    src = TFDSSource(config(data_dir))
    assert len(src) == N
    assert src.element_spec()["image"].shape == (4, 4, 3) and src.element_spec()["meta/score"].dtype == np.float32
    got = src.get_batch(np.array([[0, 119], [37, 5]]))
    ids = got["id"]  # TFDS shuffles records while preparing: check every field against the record's id
    for (r, c), i in np.ndenumerate(ids):
        expected = record(int(i))
        np.testing.assert_array_equal(got["image"][r, c], expected["image"])
        assert got["label"][r, c] == expected["label"] and got["meta/score"][r, c] == expected["meta"]["score"]


def test_pipeline_full_epoch_coverage_under_shuffle(data_dir):
    def make():
        return Pipeline(TFDSSource(config(data_dir, shuffle=True, seed=1)), batch_size=32)
    order = np.concatenate([np.asarray(b["id"]) for b in Pipeline(TFDSSource(config(data_dir)), batch_size=32)])
    check_shuffled_coverage(make, "id", order)


def test_pipeline_exact_resume_mid_epoch(data_dir):
    check_exact_resume(lambda: Pipeline(TFDSSource(config(data_dir, shuffle=True, seed=2)), batch_size=16),
                       "image", seed=4)


def test_text_feature_is_unsupported_unless_converted(data_dir):
    with pytest.raises(UnsupportedColumnError, match=r"cannot batch column\(s\) 'caption' \(dtype object\).*convert="):
        TFDSSource(config(data_dir, fields=None))
    def convert(batch):
        return {"caption_len": np.array([len(c) for c in batch["caption"]], np.int32)}
    src = TFDSSource(config(data_dir, fields=("id", "caption")), convert=convert)
    got = src.get_batch(np.arange(6))
    np.testing.assert_array_equal(got["caption_len"], [len(record(int(i))["caption"]) for i in got["id"]])


def test_mock_data_reads_match_per_index_reads():
    with tfds.testing.mock_data(num_examples=40):
        src = TFDSSource(TFDSSourceConfig(name="mnist", split="train", shuffle=True, seed=0))
        reference = tfds.data_source("mnist", split="train")
        idx = np.array([3, 0, 39])
        got = src.get_batch(idx)
        for j, i in enumerate(idx):
            np.testing.assert_array_equal(got["image"][j], reference[int(i)]["image"])
            assert got["label"][j] == reference[int(i)]["label"]
        ids = np.concatenate([np.asarray(b["label"]) for b in Pipeline(src, batch_size=16)])
        np.testing.assert_array_equal(np.sort(ids), np.sort([reference[i]["label"] for i in range(40)]))


def test_missing_dataset_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"TFDSSource cannot open '{NAME}' split 'train' in data_dir=.*"
                                                "Prepare it first"):
        TFDSSource(TFDSSourceConfig(name=NAME, data_dir=str(tmp_path / "empty")))


def test_missing_packages(monkeypatch, data_dir):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(ImportError, match=f"^{NEEDS_TF.replace('(', '.').replace(')', '.')}$"):
        TFDSSource(config(data_dir, read="load"))
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"TFDSSource needs the `tensorflow-datasets` package: "
                                          r"pip install 'datarax\[data\]'"):
        TFDSSource(config(data_dir))


def test_bad_config():
    with pytest.raises(ValueError, match="TFDSSourceConfig.read must be one of .*got 'tfdata'"):
        TFDSSourceConfig(name="mnist", read="tfdata")
    with pytest.raises(TypeError, match="TFDSSourceConfig.name must be a dataset name such as 'mnist', got ''"):
        TFDSSourceConfig(name="")



@pytest.mark.skipif(not os.environ.get("DATARAX_SLOW_TESTS"), reason="imports TensorFlow (tens of seconds); "
                    "set DATARAX_SLOW_TESTS=1 to run")
def test_load_path_with_tensorflow_matches_the_data_source(data_dir, tmp_path):
    pytest.importorskip("tensorflow")
    tfrecord_dir = str(tmp_path / "tfrecord")
    DataraxTinyTest(data_dir=tfrecord_dir, file_format="tfrecord").download_and_prepare()
    with pytest.raises(ValueError, match="it is prepared as TFRecord, which has no random access.*read='load'"):
        TFDSSource(config(tfrecord_dir))
    loaded = TFDSSource(config(tfrecord_dir, read="load"))
    direct = TFDSSource(config(data_dir))
    assert len(loaded) == len(direct) == N and loaded.element_spec() == direct.element_spec()
    a, b = loaded.get_batch(np.arange(N)), direct.get_batch(np.arange(N))
    order_a, order_b = np.argsort(a["id"]), np.argsort(b["id"])
    for k in NUMERIC:
        np.testing.assert_array_equal(a[k][order_a], b[k][order_b])
