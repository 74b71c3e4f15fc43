"""Decode once: the cache against Pillow's reduction of the same files, exact epochs, the crop
distribution against the uncached path (KS), and stale or damaged caches refused by name."""

from __future__ import annotations

import io
import json
import os
import shutil
import time

import numpy as np
import pytest
from PIL import Image, ImageOps
from scipy import stats
from skimage import data as photos

from datarax import Pipeline
from datarax.host import DecodeImage, HostContext, materialize
from datarax.host.decode_once import materialize_main
from datarax.pipeline.state import IteratorStateError
from datarax.sources import CorruptFileError, ImageFolderSource, MaterializedSource, StaleCacheError

SIZES = [(300, 451), (180, 120), (64, 90), (250, 250), (97, 301)]  # (h, w); (64, 90) is under max_side


def gradient(height: int, width: int) -> np.ndarray:
    """Red grows down, green grows right: a crop's corners give its box in relative terms."""
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    return np.stack([y, x, np.full_like(y, 128)], -1).round().astype(np.uint8)


def write_folder(root, count: int = 20, kinds=("jpg", "png")) -> str:
    coffee = photos.coffee()
    for i in range(count):
        h, w = SIZES[i % len(SIZES)]
        pixels = gradient(h, w) if i % 2 else coffee[:h, :w]
        folder = os.path.join(root, f"class{i % 3}")
        os.makedirs(folder, exist_ok=True)
        kind = kinds[i % len(kinds)]
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:03d}.{kind}"), quality=92)
    # An EXIF-rotated file: the cache stores it upright.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(coffee[:200, :300]).save(os.path.join(root, "class0", "rotated.jpg"), exif=exif.tobytes())
    return str(root)


@pytest.fixture
def folder(tmp_path):
    return write_folder(tmp_path / "images")


def reference(path: str, max_side: int) -> np.ndarray:
    image = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
    factor = max_side / max(image.size)
    if factor < 1:
        image = image.resize((round(image.width * factor), round(image.height * factor)), Image.Resampling.LANCZOS)
    return np.asarray(image, np.float64)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return 10 * np.log10(255**2 / max(np.mean((np.asarray(a, np.float64) - b) ** 2), 1e-12))


@pytest.mark.parametrize("fmt,min_psnr", [("raw", 30.0), ("jpeg", 28.0)])
def test_round_trip_is_the_reduced_source(tmp_path, folder, fmt, min_psnr):
    source = ImageFolderSource(root=folder)
    cache = materialize(source, tmp_path / "cache", max_side=96, format=fmt, shard_records=4)
    assert len(cache) == len(source) and len(cache.manifest["shards"]) == 6
    batch = cache.get_batch(np.arange(len(source)))
    np.testing.assert_array_equal(batch["label"], source.labels)
    for record, path in enumerate(source.paths):
        want = reference(path, 96)
        got = Image.open(io.BytesIO(batch["image"][record]))
        assert got.size == (want.shape[1], want.shape[0]) and max(got.size) <= 96, path
        # Pillow's own reduction, within the DCT-scale decode's and the JPEG's small differences.
        assert psnr(np.asarray(got.convert("RGB")), want) > min_psnr, path
        if fmt == "jpeg" and max(Image.open(path).size) <= 96 and path.endswith(".jpg"):
            assert batch["image"][record] == open(path, "rb").read()  # small JPEGs keep their bytes


def test_reopening_checks_and_reuses(tmp_path, folder):
    source = ImageFolderSource(root=folder)
    first = materialize(source, tmp_path / "cache", max_side=64)
    stamp = os.path.getmtime(tmp_path / "cache" / "manifest.json")
    again = materialize(source, tmp_path / "cache", max_side=64)  # a fresh cache: opened, not rewritten
    assert os.path.getmtime(tmp_path / "cache" / "manifest.json") == stamp
    assert again.structure() == first.structure()
    opened = MaterializedSource(directory=tmp_path / "cache", max_side=64)  # without the source: its own checks only
    assert opened.structure() == first.structure()


def raw_pipeline(source, seed: int = 1):
    stages = [DecodeImage(size=8, crop="random_resized", seed=seed)]
    return Pipeline(source, stages, batch_size=7).raw_loader()


def test_every_epoch_is_a_permutation_of_the_cache_and_resumes(tmp_path, folder):
    source = ImageFolderSource(root=folder, shuffle=True, seed=4)
    cache = materialize(source, tmp_path / "cache", max_side=64, shard_records=5)
    decode = DecodeImage(size=8, crop="random_resized", seed=1)
    orders = []
    loader = raw_pipeline(cache)
    for epoch in range(2):
        batches = list(loader)
        ids = np.concatenate([np.asarray(b["record_ids"]) for b in batches])
        assert sorted(ids.tolist()) == list(range(len(source)))  # each record once
        assert {int(np.asarray(b["epoch"])[0]) for b in batches} == {epoch}
        np.testing.assert_array_equal(np.concatenate([np.asarray(b["label"]) for b in batches]), source.labels[ids])
        want = decode(cache.get_batch(ids), HostContext(ids, epoch))["image"]
        np.testing.assert_array_equal(np.concatenate([np.asarray(b["image"]) for b in batches]), want)
        orders.append(ids)
    assert not np.array_equal(orders[0], orders[1])  # the source's shuffle, a new order per epoch

    it = raw_pipeline(cache).epochs(2)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = np.concatenate([np.asarray(b["image"]) for b in it])
    fresh = raw_pipeline(MaterializedSource(directory=tmp_path / "cache", source=source, max_side=64)).epochs(2)
    fresh.set_state(state)
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["image"]) for b in fresh]), rest)
    with pytest.raises(IteratorStateError):  # a state of the uncached pipeline is another pipeline's
        raw_pipeline(source).epochs(2).set_state(state)


def boxes(images: np.ndarray) -> dict[str, np.ndarray]:
    """A gradient crop's relative box, read off its corner pixels: area, aspect, centre."""
    top, left = images[:, 0, 0, 0] / 255, images[:, 0, 0, 1] / 255
    bottom, right = images[:, -1, -1, 0] / 255, images[:, -1, -1, 1] / 255
    h, w = bottom - top, right - left
    return {"area": h * w, "aspect": w / np.maximum(h, 1e-3), "cy": (top + bottom) / 2, "cx": (left + right) / 2}


def crops(source, epochs, scale=(0.08, 1.0)) -> dict[str, np.ndarray]:
    stage = DecodeImage(size=16, crop="random_resized", scale=scale, seed=2)
    ids = np.arange(len(source))
    out = np.concatenate([stage(source.get_batch(ids), HostContext(ids, e))["image"] for e in epochs])
    return boxes(out.astype(np.float64))


def test_random_crops_on_the_cache_follow_the_uncached_distribution(tmp_path):
    root = tmp_path / "gradients"
    for i in range(40):
        h, w = SIZES[i % len(SIZES)]
        os.makedirs(root / f"c{i % 2}", exist_ok=True)
        Image.fromarray(gradient(h * 2, w * 2)).save(root / f"c{i % 2}" / f"{i:03d}.png")
    source = ImageFolderSource(root=root)
    cache = materialize(source, tmp_path / "cache", max_side=120)
    uncached = crops(source, range(0, 12))  # independent draws: other epochs on each side
    cached = crops(cache, range(12, 24))
    for name in uncached:
        assert stats.ks_2samp(cached[name], uncached[name]).pvalue > 1e-3, name
    # The same epoch draws the same numbers on both paths: boxes agree up to rounding.
    same = crops(cache, range(0, 12))
    for name in ("area", "cy", "cx"):
        assert np.median(np.abs(same[name] - uncached[name])) < 0.02, name
    wrong = crops(cache, range(12, 24), scale=(0.3, 1.0))  # the test sees another scale range
    assert stats.ks_2samp(wrong["area"], uncached["area"]).pvalue < 1e-6


def replace_a_file(source):
    path = source.paths[3]
    time.sleep(0.01)
    Image.fromarray(photos.astronaut()[:120, :80]).save(path)


def add_a_file(source):
    Image.fromarray(photos.astronaut()[:60, :60]).save(os.path.join(os.path.dirname(source.paths[0]), "new.png"))


@pytest.mark.parametrize("change,says", [
    (replace_a_file, r"changed \(size"),
    (add_a_file, "records, the cache"),
])
def test_a_changed_source_is_refused_naming_the_cache(tmp_path, folder, change, says):
    source = ImageFolderSource(root=folder)
    materialize(source, tmp_path / "cache", max_side=64)
    change(source)
    changed = ImageFolderSource(root=folder)
    with pytest.raises(StaleCacheError, match=says) as info:
        MaterializedSource(directory=tmp_path / "cache", source=changed, max_side=64)
    assert str(tmp_path / "cache") in str(info.value) and "Delete the directory" in str(info.value)
    with pytest.warns(UserWarning, match="rewriting"):
        rewritten = materialize(changed, tmp_path / "cache", max_side=64)
    assert len(rewritten) == len(changed)
    MaterializedSource(directory=tmp_path / "cache", source=changed, max_side=64)  # fresh again


@pytest.mark.parametrize("settings,says", [
    ({"max_side": 80}, "max_side is 64 in the cache, 80 asked"),
    ({"max_side": 64, "format": "jpeg"}, "format is 'raw' in the cache, 'jpeg' asked"),
])
def test_a_changed_prefix_is_refused_naming_the_cache(tmp_path, folder, settings, says):
    source = ImageFolderSource(root=folder)
    materialize(source, tmp_path / "cache", max_side=64)
    with pytest.raises(StaleCacheError, match=says) as info:
        MaterializedSource(directory=tmp_path / "cache", source=source, **settings)
    assert str(tmp_path / "cache") in str(info.value)


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def test_a_truncated_shard_is_refused(tmp_path, folder):
    source = ImageFolderSource(root=folder)
    materialize(source, tmp_path / "cache", max_side=64, shard_records=8)
    truncate(tmp_path / "cache" / "records-00001-of-00003.array_record")
    with pytest.raises(CorruptFileError, match="records-00001-of-00003.array_record.*truncated"):
        MaterializedSource(directory=tmp_path / "cache", source=source, max_side=64)


def test_a_garbled_shard_is_named_when_read_never_shortened(tmp_path, folder):
    source = ImageFolderSource(root=folder)
    cache_dir = tmp_path / "cache"
    materialize(source, cache_dir, max_side=64, shard_records=8)
    shard = cache_dir / "records-00000-of-00003.array_record"
    data = bytearray(shard.read_bytes())
    inside = [i for i in range(len(data)) if data[i:i + 3] == b"P6\n"][3] + 100  # the pixels of record 3
    data[inside:inside + 64] = bytes(64)  # same size: only the chunk hashes can tell
    shard.write_bytes(bytes(data))
    cache = MaterializedSource(directory=cache_dir, source=source, max_side=64)  # its first and last records are intact
    assert len(cache) == len(source)
    with pytest.raises(CorruptFileError, match="record 3 of .*records-00000-of-00003.*hash mismatch"):
        cache.get_batch(np.arange(8))


def test_a_folder_that_is_not_a_cache_is_never_replaced(tmp_path, folder):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a datarax cache"):
        materialize(ImageFolderSource(root=folder), tmp_path / "mine", max_side=64)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    with pytest.raises(FileNotFoundError, match="materialize"):
        MaterializedSource(directory=tmp_path / "mine", max_side=64)


def test_a_bad_image_names_the_file_and_leaves_no_cache(tmp_path, folder):
    source = ImageFolderSource(root=folder)
    with open(source.paths[2], "wb") as f:
        f.write(b"not an image")
    with pytest.raises(Exception, match=os.path.basename(source.paths[2])):
        materialize(ImageFolderSource(root=folder), tmp_path / "cache", max_side=64)
    assert not (tmp_path / "cache").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".cache")]


@pytest.mark.parametrize("kwargs,match", [
    ({"max_side": 0}, "MaterializeConfig.max_side must be a positive int"),
    ({"max_side": 64, "format": "png"}, "MaterializeConfig.format must be one of"),
    ({"max_side": 64, "quality": 101}, r"MaterializeConfig.quality must be an int in \[1, 100\]"),
    ({"max_side": 64, "field": "photo"}, "materialize field 'photo'"),
])
def test_bad_settings_name_the_argument(tmp_path, folder, kwargs, match):
    with pytest.raises((ValueError, KeyError), match=match):
        materialize(ImageFolderSource(root=folder), tmp_path / "cache", **kwargs)


def test_materialize_main(tmp_path, folder, capsys):
    assert materialize_main([folder, str(tmp_path / "cache"), "--max-side", "48", "--format", "jpeg"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == len(ImageFolderSource(root=folder))
    MaterializedSource(directory=tmp_path / "cache", source=ImageFolderSource(root=folder), max_side=48, format="jpeg")
    shutil.rmtree(tmp_path / "cache")


def test_sixteen_bit_images_are_cached_scaled_to_eight_bits_as_decode_image_scales_them(tmp_path):
    values = np.random.default_rng(4).integers(0, 65536, (30, 40), dtype=np.uint16)
    for label in ("a", "b"):
        (tmp_path / "photos" / label).mkdir(parents=True)
        Image.fromarray(values).save(tmp_path / "photos" / label / "x.png")
    cache = materialize(ImageFolderSource(root=tmp_path / "photos"), tmp_path / "cache", max_side=64)
    stored = Image.open(io.BytesIO(cache.get_batch(np.arange(1))["image"][0]))
    np.testing.assert_array_equal(np.asarray(stored), np.round(values.astype(np.float64) * 255 / 65535))
