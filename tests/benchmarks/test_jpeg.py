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
from datarax.host import DecodeImage
from datarax.host.stage import record_generator


@pytest.fixture
def temp_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_scenario_runs_and_reports_its_row(temp_cache):
    rows = jpeg.run(BenchOptions(repeats=1, scale=0.01))
    assert [r.get("framework", "datarax") for r in rows] == ["datarax", "datarax[pillow]", "datarax[threads]",
                                                             "decode_limit", "decode_limit[processes]",
                                                             "decode_limit[1 thread]", "floor[full_scale]",
                                                             "ceiling[processes]"]
    assert all(r["scenario"] == "jpeg" for r in rows) and rows[0]["records"] == 40
    assert rows[0]["datarax_el_s"] > 0 and rows[0]["floor_el_s"] > 0 and all(r["el_s"] > 0 for r in rows[1:])
    assert rows[0]["decoder"] == "turbo" and 30 < rows[0]["psnr_db"] < 60 and 30 < rows[1]["psnr_db"] < 60
    assert rows[0]["first_batch_s"] > 0 and rows[0]["rebuild_first_batch_s"] > 0
    assert jpeg.image_folder(40) == jpeg.image_folder(40)  # cached


def test_the_floor_crops_exactly_as_decode_image(temp_cache):
    data = jpeg.make_data(16)
    floor = jpeg.Floor(list(data["path"]), data["label"])
    stage = DecodeImage(size=JPEG_SIZE, crop="random_resized")
    for record in range(16):
        out = np.empty((JPEG_SIZE, JPEG_SIZE, 3), np.uint8)
        floor.decode(data["path"][record], record, 3, out)  # the floor uses the turbo path's own primitive
        with open(data["path"][record], "rb") as f:
            want = stage.decode(f.read(), record_generator(0, 0, 3, record))
        np.testing.assert_array_equal(out, want)
    floor.pool.shutdown()
    stage.close()


PEERS = [p for p in runner.PEER_MODULES if importlib.util.find_spec(runner.peer_module(p).MODULE)]


def peers_with(workload: str) -> list[str]:
    """The installed peers that do `workload` (the numpy loader does only cifar)."""
    return [p for p in PEERS if runner.workload(p, workload) is not None]


@pytest.mark.parametrize("peer", peers_with("jpeg"))
def test_peer_jpeg_loader_delivers_each_record_once(temp_cache, peer):
    data = jpeg.make_data(12)
    loader = runner.workload(peer, "jpeg")(data, PeerOptions(batch_size=4, workers=0))
    batches = list(loader.epoch())
    labels = np.concatenate([b["label"] for b in batches])
    images = np.concatenate([b["image"] for b in batches])
    assert sorted(labels.tolist()) == sorted(data["label"].tolist())
    assert images.shape == (12, JPEG_SIZE, JPEG_SIZE, 3) and images.dtype == np.float32
    assert -3 < images.mean() < 3 and images.std() > 0.1  # normalised photographs, not zeros


@pytest.mark.parametrize("peer", peers_with("jpeg_variant"))
def test_peer_jpeg_variants_run_in_their_own_process_and_report_their_quality(tmp_path, monkeypatch, peer):
    """As the benchmark runs them: each in a fresh process (torchvision, TensorFlow and OpenCV do not
    share one process safely), its rate and its PSNR on the shared boxes in the result."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    recipe = runner.Recipe("jpeg_variant", "benchmarks.scenarios.jpeg:make_data", 12, 4)
    result = runner.run_isolated(peer, recipe, repeats=1, workers=0)
    assert "error" not in result, result
    assert result["el_s"] > 0 and 25 < result["psnr_db"] < 60 and result["psnr_p10_db"] <= result["psnr_db"]


def test_the_psnr_of_the_reference_itself_is_perfect_and_a_shift_lowers_it(temp_cache):
    from benchmarks.peers.common import jpeg_psnr, jpeg_reference

    paths = list(jpeg.make_data(4)["path"])
    assert jpeg_psnr(jpeg_reference, paths)["psnr_db"] == 99.0
    shifted = jpeg_psnr(lambda p, b: jpeg_reference(p, (max(b[0] - 2, 0) if b[0] else 2, b[1], b[2] - 2, b[3])),
                        paths)["psnr_db"]
    assert shifted < 35
