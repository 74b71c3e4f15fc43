"""The `jpeg` scenario runs at a tiny scale; its floor crops as DecodeImage does; peers do its work."""

from __future__ import annotations

import importlib.util
import tempfile

import numpy as np
import pytest

from benchmarks.peers import runner
from benchmarks.peers.common import JPEG_SIZE, PeerOptions
from benchmarks.registry import BenchOptions
from benchmarks.scenarios import jpeg
from datarax.host import DecodeImage, record_generator


@pytest.fixture
def temp_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_scenario_runs_and_reports_its_row(temp_cache):
    rows = jpeg.run(BenchOptions(repeats=1, scale=0.01))
    assert len(rows) == 1 and rows[0]["scenario"] == "jpeg" and rows[0]["records"] == 40
    assert rows[0]["datarax_el_s"] > 0 and rows[0]["floor_el_s"] > 0
    assert jpeg.image_folder(40) == jpeg.image_folder(40)  # cached


def test_the_floor_crops_exactly_as_decode_image(temp_cache):
    data = jpeg.make_data(16)
    floor = jpeg.Floor(list(data["path"]), data["label"])
    stage = DecodeImage(JPEG_SIZE, crop="random_resized")
    for record in range(16):
        out = np.empty((JPEG_SIZE, JPEG_SIZE, 3), np.uint8)
        floor.decode(data["path"][record], record, 3, out)
        with open(data["path"][record], "rb") as f:
            want = stage.decode(f.read(), record_generator(0, 0, 3, record))
        np.testing.assert_array_equal(out, want)
    floor.pool.shutdown()
    stage.close()


PEERS = [p for p in runner.PEER_MODULES if importlib.util.find_spec(runner.peer_module(p).MODULE)]


@pytest.mark.parametrize("peer", PEERS)
def test_peer_jpeg_loader_delivers_each_record_once(temp_cache, peer):
    data = jpeg.make_data(12)
    loader = runner.workload(peer, "jpeg")(data, PeerOptions(batch_size=4, workers=0))
    batches = list(loader.epoch())
    labels = np.concatenate([b["label"] for b in batches])
    images = np.concatenate([b["image"] for b in batches])
    assert sorted(labels.tolist()) == sorted(data["label"].tolist())
    assert images.shape == (12, JPEG_SIZE, JPEG_SIZE, 3) and images.dtype == np.float32
    assert -3 < images.mean() < 3 and images.std() > 0.1  # normalised photographs, not zeros
