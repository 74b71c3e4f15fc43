"""`datarax preview`: the PNG grid's size and pixels, against numpy and scipy references."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
from PIL import Image

from datarax.cli.main import main
from datarax.cli.preview import CAPTION, GAP, MIN_TILE, spectrograms, to_uint8

HELPERS = '''
import numpy as np

def images():
    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 256, (5, 8, 8, 3), dtype=np.uint8), "label": np.arange(5, dtype=np.int32)}

def tones():
    t = np.arange(1024) / 8000.0
    freqs = np.array([300.0, 900.0, 2000.0])
    return {"audio": np.sin(2 * np.pi * freqs[:, None] * t).astype(np.float32), "label": np.arange(3, dtype=np.int32)}
'''


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "preview_helpers.py").write_text(HELPERS)
    return tmp_path


def write(folder, text):
    path = folder / "run.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def memory_job(folder, data: str, batch_size: int) -> str:
    """A configuration over `[source.memory]` data = `data` (a function of an allowed helper module)."""
    module = data.split(":")[0]
    return write(folder, f"""
        allow = ["{module}"]
        batch_size = {batch_size}
        [source.memory]
        data = "{data}"
    """)


def expected_size(count: int, h: int, w: int, captions: bool = True) -> tuple[int, int]:
    """(width, height) of the grid, written from the layout rule: whole-factor upscaling to MIN_TILE,
    ceil(sqrt(n)) columns, GAP pixels between and around tiles, a CAPTION strip under each labelled row."""
    scale = max(1, math.ceil(MIN_TILE / min(h, w)))
    cols = math.ceil(math.sqrt(count))
    rows = math.ceil(count / cols)
    strip = CAPTION if captions else 0
    return cols * w * scale + (cols + 1) * GAP, rows * (h * scale + strip) + (rows + 1) * GAP


def test_an_image_grid_has_the_layout_size_and_the_records_pixels(folder, capsys):
    path = memory_job(folder, "preview_helpers:images", 2)
    out = folder / "grid.png"
    assert main(["preview", path, "--out", str(out), "--n", "5"]) == 0
    assert expected_size(5, 8, 8) == (200, 158)  # 8x8 tiles scaled 8x to 64x64, 3 columns, 2 rows, captioned
    grid = np.asarray(Image.open(out))
    assert Image.open(out).size == (200, 158) and grid.shape == (158, 200, 3)
    assert (f"wrote {out}: 5 images of field 'image' (uint8 [8, 8, 3] per record), labelled by field 'label', "
            "200x158 px") in capsys.readouterr().out
    import preview_helpers

    records = preview_helpers.images()["image"]  # an unshuffled source: the first five records, in order
    row = 64 + CAPTION + GAP
    for i, record in enumerate(records):
        r, c = divmod(i, 3)
        tile = grid[GAP + r * row:GAP + r * row + 64, GAP + c * (64 + GAP):GAP + c * (64 + GAP) + 64]
        np.testing.assert_array_equal(tile, np.kron(record, np.ones((8, 8, 1), np.uint8)))


def caption_strips(grid: np.ndarray, count: int, side: int = 64) -> list[np.ndarray]:
    cols = math.ceil(math.sqrt(count))
    row = side + CAPTION + GAP
    return [grid[GAP + r * row + side:GAP + r * row + side + CAPTION,
                 GAP + c * (side + GAP):GAP + c * (side + GAP) + side]
            for r, c in (divmod(i, cols) for i in range(count))]


def test_each_tile_is_captioned_by_its_label(folder, capsys):
    """Equal labels give equal captions, different labels different ones, and every caption has ink:
    the strip under a tile depends on its record's label and on nothing else."""
    (folder / "labelled.py").write_text(textwrap.dedent("""
        import numpy as np
        def data():
            return {"image": np.zeros((6, 8, 8, 3), np.uint8), "label": np.array([3, 7, 3, 11, 7, 3], np.int32),
                    "other": np.array([5, 5, 5, 5, 5, 5], np.int32)}
    """))
    path = memory_job(folder, "labelled:data", 6)
    out = folder / "labelled.png"
    assert main(["preview", path, "--out", str(out), "--n", "6"]) == 0
    strips = caption_strips(np.asarray(Image.open(out)), 6)
    labels = [3, 7, 3, 11, 7, 3]
    for i in range(6):
        assert (strips[i] != 96).any()  # something is written on the background
        for j in range(6):
            assert np.array_equal(strips[i], strips[j]) == (labels[i] == labels[j])
    assert main(["preview", path, "--out", str(out), "--n", "6", "--label", "other"]) == 0
    strips = caption_strips(np.asarray(Image.open(out)), 6)
    assert all(np.array_equal(strip, strips[0]) for strip in strips)
    assert "labelled by field 'other'" in capsys.readouterr().out
    assert main(["preview", path, "--out", str(out), "--label", "image"]) == 1
    assert "--label 'image' must name a field holding one integer per record" in capsys.readouterr().err


def test_an_audio_field_is_drawn_as_spectrograms(folder, capsys):
    path = memory_job(folder, "preview_helpers:tones", 3)
    out = folder / "spectrograms.png"
    assert main(["preview", path, "--out", str(out), "--n", "3"]) == 0
    # 1024 samples: n_fft 64 (the power of two up to sqrt(4 * 1024)), hop 16: 33 bins x 61 frames.
    assert Image.open(out).size == expected_size(3, 33, 61) == (250, 162)
    assert "3 spectrograms of field 'audio'" in capsys.readouterr().out


def test_spectrograms_match_scipy_stft():
    from scipy import signal

    rng = np.random.default_rng(1)
    t = np.arange(2000) / 8000.0
    waves = np.stack([np.sin(2 * np.pi * 440 * t), 0.3 * rng.standard_normal(t.size)]).astype(np.float32)
    tiles = spectrograms(waves)
    n_fft = 64  # sqrt(4 * 2000) = 89 -> 64
    _, _, stft = signal.stft(waves.astype(np.float64), window=np.hanning(n_fft), nperseg=n_fft, noverlap=n_fft - 16,
                             boundary=None, padded=False, axis=-1)
    db = 20 * np.log10(np.maximum(np.abs(stft) * np.hanning(n_fft).sum(), 1e-10))  # scipy divides by the window sum
    top = db.max()
    reference = np.rint((np.clip(db, top - 80, top) - (top - 80)) / 80 * 255)[:, ::-1, :]
    assert tiles.shape == reference.shape == (2, 33, 1 + (2000 - 64) // 16)
    assert np.abs(tiles.astype(int) - reference.astype(int)).max() <= 1
    assert np.argmax(tiles[0].sum(axis=1)) == 32 - round(440 * n_fft / 8000)  # the tone's row, low at the bottom


@pytest.mark.parametrize("values,expected", [
    (np.array([[0.0, 0.5], [1.0, 0.25]], np.float32), np.array([[0, 128], [255, 64]], np.uint8)),  # [0, 1] * 255
    (np.array([[0, 7], [300, 255]], np.int32), np.array([[0, 7], [255, 255]], np.uint8)),  # integers clipped
])
def test_to_uint8(values, expected):
    np.testing.assert_array_equal(to_uint8(values), expected)


def test_normalised_floats_span_their_percentiles():
    values = np.random.default_rng(2).normal(0.0, 2.0, (4, 10, 10, 3)).astype(np.float32)
    low, high = np.percentile(values.astype(np.float64), [1, 99])
    expected = np.clip(np.rint((values.astype(np.float64) - low) / (high - low) * 255), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(to_uint8(values), expected)


def test_a_field_that_cannot_be_drawn_is_a_one_line_error(folder, capsys):
    path = memory_job(folder, "preview_helpers:tones", 3)
    assert main(["preview", path, "--field", "label", "--out", str(folder / "x.png")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--field 'label' is neither an image (H, W[, 1|3|4]) nor audio" in err
    assert not (folder / "x.png").exists()
