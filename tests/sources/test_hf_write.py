"""write_hf_parquet: HF Image/Audio parquet without torchcodec, read back by `datasets` and decoded
by datarax to the original pixels and samples."""

from __future__ import annotations

import io
import subprocess
import sys
import wave

import numpy as np
import pytest
from PIL import Image
from skimage import data as photos

from datarax import Pipeline
from datarax.host import DecodeAudio, DecodeImage
from datarax.sources.hf import HFSource, HFSourceConfig, load_files
from datarax.sources.hf_write import write_hf_parquet

datasets = pytest.importorskip("datasets")

RATE = 8000


def tone(freq: float, n: int) -> np.ndarray:
    return (0.4 * np.sin(2 * np.pi * freq * np.arange(n) / RATE)).astype(np.float32)


@pytest.fixture
def written(tmp_path):
    photo = photos.astronaut()[:48, :64]
    gray = photos.camera()[:48, :64]
    jpeg = io.BytesIO()
    Image.fromarray(photo).save(jpeg, format="JPEG", quality=95)
    on_disk = tmp_path / "coffee.png"
    Image.fromarray(photos.coffee()[:48, :64]).save(on_disk)
    flac = tmp_path / "hum.wav"
    with wave.open(str(flac), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(RATE)
        w.writeframes((tone(300, 500) * 32767).round().astype("<i2").tobytes())
    columns = {
        "image": [photo, gray, jpeg.getvalue(), str(on_disk)],
        "audio": [(tone(200, 600), RATE), (np.round(tone(250, 500) * 32767).astype(np.int16), RATE), str(flac),
                  (tone(350, 700), RATE)],
        "label": [3, 1, 4, 1],
        "caption": ["a", "b", "c", "d"],
    }
    path = write_hf_parquet(tmp_path / "train.parquet", columns, images=("image",), audio=("audio",))
    return {"path": path, "photo": photo, "gray": gray, "jpeg": jpeg.getvalue(), "disk": on_disk, "tmp": tmp_path}


def test_datasets_reads_image_and_audio_features(written):
    ds = load_files([written["path"]], cache_dir=str(written["tmp"] / "cache"))
    assert ds.features["image"] == datasets.Image() and ds.features["audio"] == datasets.Audio()
    assert ds.features["label"] == datasets.Value("int64") and ds.features["caption"] == datasets.Value("string")
    raw = ds.cast_column("image", datasets.Image(decode=False)).cast_column("audio", datasets.Audio(decode=False))
    assert raw[2]["image"]["bytes"] == written["jpeg"] and raw[3]["image"]["path"] == "coffee.png"
    assert raw[0]["image"]["path"] is None
    np.testing.assert_array_equal(np.asarray(ds.select_columns(["image"])[0]["image"]), written["photo"])  # HF decodes
    assert ds["label"] == [3, 1, 4, 1]


def test_datarax_decodes_the_original_pixels_and_samples(written):
    ds = load_files([written["path"]], cache_dir=str(written["tmp"] / "cache"))
    source = HFSource(HFSourceConfig(fields=("label",), encoded=("image", "audio")), dataset=ds)
    stages = [DecodeImage(size=(48, 64), resize="none", backend="pillow"),
              DecodeAudio(sample_rate=RATE, length=800, crop="start")]
    batch = next(iter(Pipeline(source, stages, batch_size=4)))
    images, audio = np.asarray(batch["image"]), np.asarray(batch["audio"])
    np.testing.assert_array_equal(images[0], written["photo"])                     # PNG: lossless
    np.testing.assert_array_equal(images[1], np.repeat(written["gray"][..., None], 3, axis=2))
    np.testing.assert_array_equal(images[3], photos.coffee()[:48, :64])
    for row, (freq, n) in enumerate([(200, 600), (250, 500), (300, 500), (350, 700)]):
        np.testing.assert_allclose(audio[row, :n], tone(freq, n), atol=1 / 32767)   # 16-bit quantisation
        assert np.all(audio[row, n:] == 0) and int(batch["audio_length"][row]) == n


def test_writing_needs_no_torchcodec(tmp_path):
    """In a fresh process: writing audio arrays imports no torchcodec (HF's own encoder needs it)."""
    code = ("import sys, numpy as np; from datarax.sources.hf_write import write_hf_parquet; "
            f"write_hf_parquet({str(tmp_path / 'a.parquet')!r}, {{'audio': [(np.zeros(10, np.float32), 8000)]}}, "
            "audio=('audio',)); print('torchcodec' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bad_values_name_the_row_and_the_fix(tmp_path):
    out = tmp_path / "x.parquet"
    with pytest.raises(ValueError, match=r"audio\[0\]: float samples must be finite and in \[-1, 1\] \(peak 2\)"):
        write_hf_parquet(out, {"audio": [(np.full(4, 2.0), RATE)]}, audio=("audio",))
    with pytest.raises(FileNotFoundError, match=r"image\[1\] names '.*missing.png', which is not a file"):
        write_hf_parquet(out, {"image": [b"\xff\xd8", str(tmp_path / "missing.png")]}, images=("image",))
    with pytest.raises(ValueError, match=r"image\[0\] is an array of dtype float64"):
        write_hf_parquet(out, {"image": [np.zeros((4, 4))]}, images=("image",))
    with pytest.raises(ValueError, match=r"images=\('img',\) names \['img'\], which are not columns"):
        write_hf_parquet(out, {"image": [b"x"]}, images=("img",))
    with pytest.raises(ValueError, match=r"one value per row, got lengths \{'image': 1, 'label': 2\}"):
        write_hf_parquet(out, {"image": [b"x"], "label": [1, 2]}, images=("image",))
    with pytest.raises(ValueError, match=r"audio\[0\] is tuple of 3"):
        write_hf_parquet(out, {"audio": [(np.zeros(3), RATE, 1)]}, audio=("audio",))
    assert not out.exists()
