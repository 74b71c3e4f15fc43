"""DecodeImage: Pillow's decode of the same bytes, torchvision's crop maths, keyed crops, bad records."""

from __future__ import annotations

import copy
import math
import os
import pathlib
import pickle
import random
import re
import warnings

import jax
import numpy as np
import pytest
from PIL import Image, ImageOps
from scipy import stats
from skimage import data as photos

from datarax.host import DecodeImage, DecodeImageConfig, HostContext, SkippedRecordWarning
from datarax.host.image import random_resized_box, shorter_side_box
from datarax.host.stage import record_generator
from datarax.sources import RecordError

BILINEAR = Image.Resampling.BILINEAR


def exif_orientation(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def write_cases(folder) -> dict[str, str]:
    """Image files of every kind DecodeImage must read, made from scikit-image photographs."""
    coffee = Image.fromarray(photos.coffee())  # 400 x 600
    chelsea = Image.fromarray(photos.chelsea())  # 300 x 451
    camera = Image.fromarray(photos.camera()[:300, :380])  # grayscale
    rgba = chelsea.copy()
    rgba.putalpha(Image.fromarray(np.linspace(0, 255, 300 * 451).astype(np.uint8).reshape(300, 451)))
    writes = {
        "rgb.jpg": lambda p: coffee.save(p, quality=90),
        "rgb.png": lambda p: chelsea.save(p),
        "rgb.webp": lambda p: Image.fromarray(photos.rocket()).save(p, quality=90),
        "gray.jpg": lambda p: camera.save(p, quality=90),
        "gray.png": lambda p: camera.save(p),
        "rgba.png": lambda p: rgba.save(p),
        "cmyk.jpg": lambda p: coffee.convert("CMYK").save(p, quality=90),
        "palette.png": lambda p: chelsea.quantize(64).save(p),
    }
    writes.update({f"exif{k}.jpg": (lambda p, k=k: chelsea.save(p, quality=90, exif=exif_orientation(k)))
                   for k in range(2, 9)})
    paths = {}
    for name, write in writes.items():
        paths[name] = str(folder / name)
        write(paths[name])
    return paths


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return write_cases(tmp_path_factory.mktemp("images"))


def reference(path: str) -> Image.Image:
    """Pillow's own decode: open, EXIF transpose, RGB."""
    return ImageOps.exif_transpose(Image.open(path)).convert("RGB")


def run(stage: DecodeImage, paths, record_ids=None, epoch=0):
    encoded = np.empty(len(paths), object)
    for i, p in enumerate(paths):
        encoded[i] = pathlib.Path(p).read_bytes()
    ids = np.arange(len(paths)) if record_ids is None else np.asarray(record_ids)
    return stage({"image": encoded}, HostContext(ids, epoch, 0, lambda r: paths[r % len(paths)]))


CASES = ["rgb.jpg", "rgb.png", "rgb.webp", "gray.jpg", "gray.png", "rgba.png", "cmyk.jpg", "palette.png",
         *[f"exif{k}.jpg" for k in range(2, 9)]]


@pytest.mark.parametrize("name", CASES)
def test_decode_equals_pillow_after_exif_transpose(cases, name):
    want = np.asarray(reference(cases[name]))
    got = run(DecodeImage(size=want.shape[:2], resize="none"), [cases[name]])["image"]
    assert got.shape == (1, *want.shape) and got.dtype == np.uint8
    np.testing.assert_array_equal(got[0], want)


def test_exif_cases_really_are_rotated(cases):
    plain = np.asarray(Image.open(cases["exif2.jpg"]).convert("RGB"))
    assert np.asarray(reference(cases["exif6.jpg"])).shape[:2] == plain.shape[1::-1]
    assert not np.array_equal(np.asarray(reference(cases["exif2.jpg"])), plain)


def by_hand_shorter_side(image: Image.Image, out_h: int, out_w: int) -> np.ndarray:
    """torchvision's Resize(shorter side) then CenterCrop, step by step (square outputs)."""
    width, height = image.size
    if width <= height:
        new_w, new_h = out_w, int(out_w * height / width)
    else:
        new_w, new_h = int(out_h * width / height), out_h
    resized = image.resize((new_w, new_h), BILINEAR)
    top, left = int(round((new_h - out_h) / 2.0)), int(round((new_w - out_w) / 2.0))
    return np.asarray(resized.crop((left, top, left + out_w, top + out_h)))


LOSSLESS = ["rgb.png", "gray.png", "rgba.png", "palette.png"]


def assert_close(got, want, atol=1):
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= atol, f"max difference {diff.max()}"


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("size", [64, 200])
def test_shorter_side_is_resize_then_center_crop(cases, name, size):
    got = run(DecodeImage(size=size, resize="shorter_side"), [cases[name]])["image"][0]
    assert_close(got, by_hand_shorter_side(reference(cases[name]), size, size))


@pytest.mark.parametrize("name", LOSSLESS)
def test_fixed_is_one_resize(cases, name):
    got = run(DecodeImage(size=(48, 80), resize="fixed"), [cases[name]])["image"][0]
    np.testing.assert_array_equal(got, np.asarray(reference(cases[name]).resize((80, 48), BILINEAR)))


@pytest.mark.parametrize("name", LOSSLESS + ["exif6.jpg"])
def test_random_resized_resizes_the_record_box(cases, name):
    stage = DecodeImage(size=(40, 56), crop="random_resized", seed=3)
    ids = [5, 77, 1234]
    got = run(stage, [cases[name]] * 3, record_ids=ids, epoch=2)["image"]
    image = reference(cases[name])
    for row, record in enumerate(ids):
        top, left, h, w = random_resized_box(image.height, image.width, (0.08, 1.0), (3 / 4, 4 / 3),
                                             record_generator(3, 0, 2, record))
        box = (left, top, left + w, top + h)
        resized = np.asarray(image.resize((56, 40), BILINEAR, box=box))
        # torchvision crops first, so its edge pixels cannot blend in the pixels just outside the box.
        cropped = np.asarray(image.crop(box).resize((56, 40), BILINEAR))
        if name.endswith(".jpg"):  # a drafted decode: close to the full decode, not equal
            assert np.abs(got[row].astype(float) - resized).mean() < 6
        else:
            np.testing.assert_array_equal(got[row], resized)
            assert_close(got[row, 2:-2, 2:-2], cropped[2:-2, 2:-2])


def by_hand_draft(path: str, box, size) -> np.ndarray:
    """The JPEG path step by step: DCT-scaled decode at the largest 1/2^k keeping the box >= size."""
    image = Image.open(path)
    factor = min((box[2] - box[0]) / size[1], (box[3] - box[1]) / size[0])
    scale = next(s for s in (8, 4, 2, 1) if s <= factor)
    image.draft(None, (image.width // scale, image.height // scale))
    assert image.size == (math.ceil(600 / scale), math.ceil(400 / scale))
    box = tuple(v / scale for v in box)
    return np.asarray(image.convert("RGB").resize((size[1], size[0]), BILINEAR, box=box)), scale


@pytest.mark.parametrize("size", [32, 96, 200])
def test_jpeg_decodes_at_reduced_scale_then_resizes_the_box(cases, size):
    got = run(DecodeImage(size=size, backend="pillow"), [cases["rgb.jpg"]])["image"][0]
    want, scale = by_hand_draft(cases["rgb.jpg"], shorter_side_box(400, 600, size, size), (size, size))
    assert scale == {32: 8, 96: 4, 200: 2}[size]
    np.testing.assert_array_equal(got, want)
    full = by_hand_shorter_side(reference(cases["rgb.jpg"]), size, size)
    assert np.abs(got.astype(float) - full).mean() < 4  # the reduced decode is a faithful thumbnail


def torchvision_get_params(height, width, scale, ratio, rng: random.Random):
    """torchvision.transforms.RandomResizedCrop.get_params, with Python's random for torch's."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.randint(0, height - h)
            j = rng.randint(0, width - w)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def box_features(boxes, height, width):
    boxes = np.asarray(boxes, float)
    top, left, h, w = boxes.T
    return {"scale": h * w / (height * width), "aspect": w / h, "top": top / height, "left": left / width}


@pytest.mark.parametrize("height,width", [(300, 451), (40, 400)])
def test_crop_boxes_follow_random_resized_crop(height, width):
    n, draw = 4000, (lambda scale, r: random_resized_box(height, width, scale, (3 / 4, 4 / 3),
                                                         record_generator(0, 0, 0, r)))
    ours = box_features([draw((0.08, 1.0), r) for r in range(n)], height, width)
    rng = random.Random(0)
    theirs = box_features([torchvision_get_params(height, width, (0.08, 1.0), (3 / 4, 4 / 3), rng)
                           for _ in range(n)], height, width)
    for name in ours:
        assert stats.ks_2samp(ours[name], theirs[name]).pvalue > 1e-3, name
    wrong = box_features([draw((0.2, 1.0), r) for r in range(n)], height, width)
    assert stats.ks_2samp(wrong["scale"], theirs["scale"]).pvalue < 1e-6  # the test sees a wrong scale range


def test_fallback_is_the_clamped_center_crop():
    class Never:  # draws that never fit: area 4x the image
        def uniform(self, low, high):
            return high * 4

    assert random_resized_box(100, 400, (0.08, 1.0), (3 / 4, 4 / 3), Never()) == (0, 133, 100, 133)
    assert random_resized_box(400, 100, (0.08, 1.0), (3 / 4, 4 / 3), Never()) == (133, 0, 133, 100)
    assert random_resized_box(100, 110, (0.08, 1.0), (3 / 4, 4 / 3), Never()) == (0, 0, 100, 110)


@pytest.mark.parametrize("threads", [1, 4])
def test_threads_change_nothing(cases, threads):
    paths = [cases[n] for n in CASES]
    base = run(DecodeImage(size=32, crop="random_resized", num_threads=2), paths)["image"]
    np.testing.assert_array_equal(run(DecodeImage(size=32, crop="random_resized", num_threads=threads), paths)["image"],
                                  base)


def test_the_crop_follows_seed_epoch_and_record(cases):
    paths = [cases["rgb.png"]] * 2
    stage = DecodeImage(size=32, crop="random_resized")
    a = run(stage, paths, record_ids=[0, 1])["image"]
    assert not np.array_equal(a[0], a[1])
    assert not np.array_equal(run(stage, paths, record_ids=[0, 1], epoch=1)["image"], a)
    assert not np.array_equal(run(DecodeImage(size=32, crop="random_resized", seed=1), paths, [0, 1])["image"], a)
    np.testing.assert_array_equal(run(stage, paths[::-1], record_ids=[1, 0])["image"], a[::-1])
    assert stage.stochastic and not DecodeImage(size=32).stochastic


def test_out_field_keeps_the_encoded_field_for_a_second_view(cases):
    out = run(DecodeImage(size=16, out_field="view"), [cases["rgb.png"]])
    assert out["image"].dtype == object and out["view"].shape == (1, 16, 16, 3)


def bad_files(folder, cases):
    good = pathlib.Path(cases["rgb.jpg"]).read_bytes()
    paths = {"good.jpg": cases["rgb.jpg"], "truncated.jpg": str(folder / "truncated.jpg"),
             "corrupt.jpg": str(folder / "corrupt.jpg")}
    pathlib.Path(paths["truncated.jpg"]).write_bytes(good[:len(good) // 3])
    pathlib.Path(paths["corrupt.jpg"]).write_bytes(b"not an image at all" * 10)
    return paths


@pytest.mark.parametrize("bad", ["truncated.jpg", "corrupt.jpg"])
def test_bad_bytes_raise_naming_the_record_and_path(tmp_path, cases, bad):
    paths = bad_files(tmp_path, cases)
    files = [paths["good.jpg"], paths[bad]]
    with pytest.raises(RecordError, match=rf"record 1 \({paths[bad]}\).*on_error='skip'"):
        run(DecodeImage(size=32), files)


def test_skip_writes_zeros_flags_counts_and_warns_once_per_record(tmp_path, cases):
    paths = bad_files(tmp_path, cases)
    files = [paths["good.jpg"], paths["truncated.jpg"], paths["corrupt.jpg"]]
    stage = DecodeImage(size=32, on_error="skip")
    assert stage.output_spec({"image": jax.ShapeDtypeStruct((), object)})["image_ok"].dtype == np.bool_
    with pytest.warns(SkippedRecordWarning) as caught:
        out = run(stage, files)
    assert [str(w.message).split(" in field")[0] for w in caught if w.category is SkippedRecordWarning] == [
        f"DecodeImage could not decode record 1 ({paths['truncated.jpg']})",
        f"DecodeImage could not decode record 2 ({paths['corrupt.jpg']})"]
    np.testing.assert_array_equal(out["image_ok"], [True, False, False])
    assert not out["image"][1:].any() and out["image"][0].any()
    assert stage.skipped == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(stage, files)  # the same records again: counted, not warned again
    assert stage.skipped == 4
    assert "image_ok" not in run(DecodeImage(size=32), files[:1])


def test_a_copy_or_pickle_and_close_leave_a_working_stage(cases):
    stage = DecodeImage(size=32, num_threads=2)
    base = run(stage, [cases["rgb.png"]] * 3)["image"]
    for other in (copy.deepcopy(stage), pickle.loads(pickle.dumps(stage))):
        np.testing.assert_array_equal(run(other, [cases["rgb.png"]] * 3)["image"], base)
    stage.close()
    stage.close()
    np.testing.assert_array_equal(run(stage, [cases["rgb.png"]] * 3)["image"], base)
    stage.close()


def test_structure_names_every_output_setting_but_not_threads_and_the_backend():
    assert DecodeImage(size=32).structure() != DecodeImage(size=32, seed=1).structure()
    assert DecodeImage(size=32).structure() != DecodeImage(size=32, crop="random_resized").structure()
    assert DecodeImage(size=32, num_threads=1).structure() == DecodeImage(size=32, num_threads=8).structure()
    config = DecodeImageConfig(size=(8, 16), crop="random_resized")
    assert DecodeImage(config).config == config and config.size == (8, 16)
    assert DecodeImage(size=32, backend="turbo").structure() != DecodeImage(size=32, backend="pillow").structure()
    # the Pillow backend keeps the fingerprint states were saved under before backends existed
    assert DecodeImage(size=32, backend="pillow").structure() == (
        "DecodeImage(DecodeImageConfig(size=(32, 32), resize='shorter_side', crop='center', scale=(0.08, 1.0), "
        "ratio=(0.75, 1.3333333333333333), field='image', out_field=None, num_threads=None, on_error='raise', "
        "seed=0))")


@pytest.mark.parametrize("kwargs,match", [
    ({"size": 0}, r"size must be a positive int or a \(height, width\) pair"),
    ({"size": 8, "resize": "short"}, r"resize must be one of \('shorter_side', 'fixed', 'none'\), got 'short'"),
    ({"size": 8, "crop": "random"}, r"crop must be one of"),
    ({"size": 8, "scale": (0.5, 0.1)}, r"scale must be a pair"),
    ({"size": 8, "ratio": (0, 1)}, r"ratio must be a pair"),
    ({"size": 8, "on_error": "ignore"}, r"on_error must be one of \('raise', 'skip'\)"),
    ({"size": 8, "num_threads": 0}, r"num_threads must be a positive int"),
    ({"size": 8, "crop": "random_resized", "resize": "none"}, r"resize='none' cannot hold"),
    ({"size": 8, "backend": "cv2"}, r"backend must be one of \('auto', 'turbo', 'pillow'\), got 'cv2'"),
])
def test_bad_settings_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DecodeImage(**kwargs)


def test_output_spec_checks_the_field():
    with pytest.raises(KeyError, match=r"field 'jpeg' is not in the records"):
        DecodeImage(size=8, field="jpeg").output_spec({"image": jax.ShapeDtypeStruct((), object)})
    with pytest.raises(TypeError, match=r"must hold encoded images .* drop DecodeImage"):
        DecodeImage(size=8).output_spec({"image": jax.ShapeDtypeStruct((8, 8, 3), np.uint8)})


JPEGS = [n for n in CASES if n.endswith(".jpg")]
SETTINGS = [{"size": 96}, {"size": (40, 56), "crop": "random_resized", "seed": 3},
            {"size": (200, 120), "resize": "fixed"}, {"size": 24, "crop": "random_resized", "scale": (0.5, 1.0)}]


def lanczos_reference(path: str, stage: DecodeImage, record: int) -> np.ndarray:
    """An accurate reference of the stage's box: full decode, EXIF transpose, Lanczos."""
    image = reference(path)
    # an unset seed is the pipeline's, 0 without rngs
    rng = record_generator(stage.seed or 0, 0, 0, record) if stage.stochastic else None
    box = stage._box(image.height, image.width, rng)
    h, w = stage.config.size
    return np.asarray(image.resize((w, h), Image.Resampling.LANCZOS, box=box))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(float) - b.astype(float)) ** 2)
    return 99.0 if mse == 0 else 10 * math.log10(255**2 / mse)


def backend_outputs(cases, name, settings, ids=(1, 5, 9, 13)):
    turbo = DecodeImage(**settings, backend="turbo")
    pillow = DecodeImage(**settings, backend="pillow")
    got = run(turbo, [cases[name]] * len(ids), record_ids=ids)["image"]
    want = run(pillow, [cases[name]] * len(ids), record_ids=ids)["image"]
    refs = [lanczos_reference(cases[name], turbo, record) for record in ids]
    return got, want, refs


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_turbo_and_pillow_backends_agree(cases, name, settings):
    """The stated tolerance, per image: the backends' outputs within 25 dB PSNR of each other, and
    the turbo output at most 4 dB further than Pillow's from an accurate reference of the box
    (full decode, Lanczos): 3.4 dB is the worst seen, a 16x downscale of fine texture to 24 px, where
    Pillow's antialiasing triangle filter beats a supersampled bilinear warp; files the turbo path does not read (PNG,
    WebP, CMYK) are Pillow's exactly."""
    got, want, refs = backend_outputs(cases, name, settings)
    if not name.endswith(".jpg") or name == "cmyk.jpg":
        np.testing.assert_array_equal(got, want)
        return
    for row, ref in enumerate(refs):
        assert psnr(got[row], want[row]) > 25
        assert psnr(got[row], ref) > psnr(want[row], ref) - 4.0


def test_turbo_is_as_close_to_the_reference_as_pillow_overall(cases):
    """Over every JPEG case and setting: the turbo backend's median and 10th-percentile PSNR
    against the reference are at least Pillow's minus 0.5 dB (measured: about +1 and +2 dB)."""
    turbo, pillow = [], []
    for name in JPEGS:
        if name == "cmyk.jpg":
            continue
        for settings in SETTINGS:
            got, want, refs = backend_outputs(cases, name, settings)
            turbo += [psnr(g, r) for g, r in zip(got, refs)]
            pillow += [psnr(w, r) for w, r in zip(want, refs)]
    assert np.median(turbo) >= np.median(pillow) - 0.5
    assert np.percentile(turbo, 10) >= np.percentile(pillow, 10) - 0.5


def test_turbo_reads_what_it_can_and_leaves_the_rest_to_pillow(cases):
    from datarax.host.jpeg import TurboDecoder

    turbo = TurboDecoder()
    readable = {n for n in CASES if turbo.header(pathlib.Path(cases[n]).read_bytes()) is not None}
    assert readable == {"rgb.jpg", "gray.jpg", *[f"exif{k}.jpg" for k in range(2, 9)]}


@pytest.mark.parametrize("k", range(1, 9))
def test_the_exif_orientation_reader_agrees_with_pillow(cases, k):
    from datarax.host.jpeg import exif_orientation

    path = cases["rgb.jpg" if k == 1 else f"exif{k}.jpg"]
    assert exif_orientation(pathlib.Path(path).read_bytes()) == Image.open(path).getexif().get(0x0112, 1) == k


def test_bad_bytes_name_the_record_on_the_turbo_backend_too(tmp_path, cases):
    paths = bad_files(tmp_path, cases)
    for bad in ("truncated.jpg", "corrupt.jpg"):
        with pytest.raises(RecordError, match=rf"record 1 \({paths[bad]}\)"):
            run(DecodeImage(size=32, backend="turbo"), [paths["good.jpg"], paths[bad]])


def test_auto_picks_turbo_when_installed_and_pillow_otherwise(monkeypatch):
    from datarax.host import jpeg

    assert DecodeImage(size=32).backend == "turbo"
    monkeypatch.setattr(jpeg, "turbo_modules", lambda: None)
    assert DecodeImage(size=32).backend == "pillow"
    with pytest.raises(ImportError, match=r"backend='turbo'\) needs the `simplejpeg`.*backend='pillow'"):
        DecodeImage(size=32, backend="turbo")


def test_a_state_saved_under_one_backend_does_not_resume_under_the_other(tmp_path, cases):
    from datarax import Pipeline
    from datarax.pipeline.state import IteratorStateError
    from datarax.sources import ImageFolderSource

    for i in range(6):
        (tmp_path / "c").mkdir(exist_ok=True)
        (tmp_path / "c" / f"{i}.jpg").write_bytes(pathlib.Path(cases["rgb.jpg"]).read_bytes())

    def pipeline(backend):
        return Pipeline(ImageFolderSource(root=tmp_path), [DecodeImage(size=16, backend=backend)], batch_size=2)

    it = iter(pipeline("turbo"))
    next(it)
    state = it.get_state()
    with pytest.raises(IteratorStateError, match="fingerprint"):
        iter(pipeline("pillow")).set_state(state)
    resumed = iter(pipeline("turbo"))
    resumed.set_state(state)
    np.testing.assert_array_equal(np.asarray(next(resumed)["image"]), np.asarray(next(it)["image"]))


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_raw_ppm_records_take_the_fast_path_and_agree_with_pillow(tmp_path, cases, mode):
    """`materialize(format="raw")` stores binary PPM/PGM: the turbo backend warps its pixels with no
    decode, as close to the reference as Pillow's resize."""
    import io as _io

    from datarax.host.jpeg import TurboDecoder

    buffer = _io.BytesIO()
    reference(cases["rgb.png"]).convert(mode).save(buffer, format="PPM")
    path = tmp_path / "image.ppm"
    path.write_bytes(buffer.getvalue())
    assert TurboDecoder().header(buffer.getvalue()) is not None
    for settings in SETTINGS:
        got, want, refs = backend_outputs({"x": str(path)}, "x", settings)
        for row, ref in enumerate(refs):
            assert psnr(got[row], want[row]) > 25
            assert psnr(got[row], ref) > psnr(want[row], ref) - 4.0
    exact = DecodeImage(size=(300, 451), resize="none", backend="turbo")
    np.testing.assert_array_equal(run(exact, [str(path)])["image"][0],
                                  np.asarray(reference(cases["rgb.png"]).convert(mode).convert("RGB")))


@pytest.mark.parametrize("factors", [(2, 1), (1, 2), (4, 1), (3, 2), (2, 2), (16, 1)], ids=str)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_turbo_averages_every_pixel_an_output_pixel_covers(tmp_path, factors, mode):
    """A box shrinking an axis by a whole factor of 2 or more: each output pixel is the mean of
    the block it covers (numpy's block mean of random pixels, within one grey level), not a
    bilinear sample that skips pixels."""
    fx, fy = factors
    out_h, out_w = 12, 10
    pixels = np.random.default_rng(fx * 10 + fy).integers(0, 256, (out_h * fy, out_w * fx, 3), np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    path = tmp_path / "image.ppm"
    image.save(path, format="PPM")
    values = np.asarray(image.convert("RGB")).astype(float)
    want = values.reshape(out_h, fy, out_w, fx, 3).mean(axis=(1, 3))
    got = run(DecodeImage(size=(out_h, out_w), resize="fixed", backend="turbo"), [str(path)])["image"][0]
    assert np.abs(got - want).max() <= 1.0


HIGH_SHAPE = (37, 53)  # odd, so no resize is a whole factor


def high_depth_files(folder) -> dict[str, tuple[str, np.ndarray]]:
    """16- and 32-bit gray files and their 8-bit references from numpy: `round(255 * v / high)`."""
    rng = np.random.default_rng(5)
    v16 = rng.integers(0, 65536, HIGH_SHAPE, dtype=np.uint16)
    v16[0, :3] = (0, 128, 65535)  # both ends and a value that rounds down
    floats = rng.random(HIGH_SHAPE, dtype=np.float32)
    floats[0, :2] = (0.0, 1.0)
    as16 = np.round(v16.astype(np.float64) * 255 / 65535).astype(np.uint8)
    files = {"16-bit.png": (Image.fromarray(v16), "PNG", as16), "16-bit.tif": (Image.fromarray(v16), "TIFF", as16),
             # Written by hand (binary PGM, big-endian samples): Pillow writes 16-bit PGM from 11.0 only
             "16-bit.pgm": (b"P5\n%d %d\n65535\n" % HIGH_SHAPE[::-1] + v16.astype(">u2").tobytes(), "PPM", as16),
             "int32.tif": (Image.fromarray(v16.astype(np.int32)), "TIFF", as16),
             "float.tif": (Image.fromarray(floats), "TIFF", np.round(floats.astype(np.float64) * 255).astype(np.uint8))}
    out = {}
    for name, (image, fmt, want) in files.items():
        path = str(folder / name)
        if isinstance(image, bytes):
            with open(path, "wb") as f:
                f.write(image)
        else:
            image.save(path, format=fmt)
        out[name] = (path, want)
    return out


@pytest.fixture(scope="module")
def high_depth(tmp_path_factory):
    return high_depth_files(tmp_path_factory.mktemp("high_depth"))


HIGH_MODES = {"16-bit.png": "I;16", "16-bit.tif": "I;16", "16-bit.pgm": "I", "int32.tif": "I", "float.tif": "F"}


@pytest.mark.parametrize("backend", ["pillow", "turbo"])
@pytest.mark.parametrize("name", list(HIGH_MODES))
def test_high_bit_depth_images_are_scaled_to_eight_bits(high_depth, name, backend):
    """Pillow's convert("RGB") clips these at 255 (a 16-bit image comes out white, a float one
    black); they are scaled over their range instead, exactly as numpy rounds them."""
    path, want = high_depth[name]
    assert Image.open(path).mode == HIGH_MODES[name]
    exact = run(DecodeImage(size=HIGH_SHAPE, resize="none", backend=backend), [path])["image"][0]
    np.testing.assert_array_equal(exact, np.repeat(want[..., None], 3, axis=2))
    resized = run(DecodeImage(size=(16, 24), resize="fixed", backend=backend), [path])["image"][0]
    by_hand = Image.fromarray(want).resize((24, 16), BILINEAR, box=(0, 0, HIGH_SHAPE[1], HIGH_SHAPE[0]))
    np.testing.assert_array_equal(resized, np.asarray(by_hand.convert("RGB")))


def test_value_range_maps_the_samples_a_file_uses(tmp_path):
    twelve = np.random.default_rng(2).integers(0, 4096, HIGH_SHAPE, dtype=np.uint16)
    path = str(tmp_path / "12-bit.png")
    Image.fromarray(twelve).save(path)
    got = run(DecodeImage(size=HIGH_SHAPE, resize="none", value_range=(0, 4095)), [path])["image"][0, ..., 0]
    np.testing.assert_array_equal(got, np.round(twelve.astype(np.float64) * 255 / 4095).astype(np.uint8))


def test_values_outside_the_range_are_refused_naming_the_record_and_the_option(tmp_path, high_depth):
    floats = np.full(HIGH_SHAPE, 0.5, np.float32)
    floats[3, 4] = 1.5
    over = str(tmp_path / "hdr.tif")
    Image.fromarray(floats).save(over)
    floats[3, 4] = np.nan
    nan = str(tmp_path / "nan.tif")
    Image.fromarray(floats).save(nan)
    with pytest.raises(RecordError, match=rf"DecodeImage: record 1 \({re.escape(over)}\) is a float image \(Pillow "
                                          r"mode F\) with values from 0.5 to 1.5, outside value_range=\(0, 1\).*"
                                          r"pass DecodeImage\(value_range=\(low, high\)\).*on_error='skip'"):
        run(DecodeImage(size=8), [high_depth["float.tif"][0], over])
    with pytest.raises(RecordError, match=r"record 0 .* is a 16-bit image \(Pillow mode I;16\) with values from 0 to "
                                          r"65535, outside value_range=\(0, 4095\)"):
        run(DecodeImage(size=8, value_range=(0, 4095)), [high_depth["16-bit.png"][0]])
    stage = DecodeImage(size=8, on_error="skip")
    with pytest.warns(SkippedRecordWarning, match=r"record 1 .*nan.tif\) is a float image .* values from nan to nan"):
        out = run(stage, [high_depth["float.tif"][0], nan])
    assert out["image_ok"].tolist() == [True, False] and stage.skipped == 1


@pytest.mark.parametrize("value_range", [(1, 0), (5,), (0, float("inf")), "wide"])
def test_a_bad_value_range_is_named(value_range):
    with pytest.raises(ValueError, match=r"DecodeImageConfig.value_range must be a pair \(low, high\)"):
        DecodeImageConfig(size=8, value_range=value_range)


def write_png(path, size: tuple[int, int], mode: str = "RGB") -> str:
    """A large PNG that costs little to write: a few colours, so it compresses to kilobytes."""
    width, height = size
    stripes = (np.arange(width, dtype=np.uint16)[None, :] // 97 * 40 % 256).astype(np.uint8)
    Image.fromarray(np.broadcast_to(stripes, (height, width)).copy()).convert(mode).save(path, compress_level=1)
    return str(path)


def test_threads_hold_at_most_the_budget_and_decode_what_one_thread_decodes(tmp_path):
    paths = [write_png(tmp_path / f"{i}.png", (1000 + 10 * i, 900)) for i in range(8)]  # ~3.6 MB each to decode
    one = run(DecodeImage(size=24, num_threads=1, backend="pillow"), paths)["image"]
    stage = DecodeImage(size=24, num_threads=4, max_decode_bytes=9 * 2**20, backend="pillow")
    np.testing.assert_array_equal(run(stage, paths)["image"], one)
    assert 0 < stage.budget.peak <= 9 * 2**20
    assert stage.held_bytes() == 9 * 2**20


def test_an_image_over_the_whole_budget_is_refused_naming_the_record_and_the_option(tmp_path, cases):
    big = write_png(tmp_path / "big.png", (2000, 1500), "RGBA")  # 2000 x 1500 x (4 + 4 for RGB) = 24 MB
    files = [cases["rgb.png"], big]
    with pytest.raises(RecordError, match=rf"DecodeImage: record 1 \({re.escape(big)}\) needs about 22.9 MiB to decode "
                                          r"\(a 2000x1500 PNG in mode RGBA\), more than the stage's max_decode_bytes="
                                          r"16,777,216 \(16 MiB\).*raise DecodeImage\(max_decode_bytes=...\)"):
        run(DecodeImage(size=16, max_decode_bytes=16 * 2**20), files)
    stage = DecodeImage(size=16, max_decode_bytes=16 * 2**20, on_error="skip")
    with pytest.warns(SkippedRecordWarning, match=r"record 1 .* needs about 22.9 MiB"):
        assert run(stage, files)["image_ok"].tolist() == [True, False]


def test_the_budget_defaults_from_memory_and_stays_out_of_the_fingerprint():
    from datarax.control.budget import default_budget, host_memory_bytes

    assert DecodeImage(size=8).held_bytes() == default_budget() == min(host_memory_bytes() // 4, 8 * 2**30)
    base = DecodeImage(size=8, backend="pillow").structure()
    assert DecodeImage(size=8, backend="pillow", max_decode_bytes=2**20).structure() == base
    assert DecodeImage(size=8, backend="pillow", value_range=(0, 4095)).structure() != base
    with pytest.raises(ValueError, match=r"max_decode_bytes must be a positive int \(bytes\) or None, got -1"):
        DecodeImageConfig(size=8, max_decode_bytes=-1)


NEAR_LIMIT = """
import io, json, resource, sys
import numpy as np
from PIL import Image
from datarax.host import DecodeImage, HostContext

side = int(Image.MAX_IMAGE_PIXELS ** 0.5)  # 9459 x 9459: just under Pillow's limit, no bomb warning
buffer = io.BytesIO()
Image.new("RGB", (side, side), (40, 90, 200)).save(buffer, format="PNG", compress_level=1)
records = np.empty(4, object)
records[:] = [buffer.getvalue()] * 4  # four records of one 1.2 MB PNG, four threads
stage = DecodeImage(size=32, num_threads=4, backend="pillow", **json.loads(sys.argv[1]))
stage({"image": records[:1]}, HostContext(np.arange(1), 0))  # threads started, first buffers allocated
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 600 * 2**20, resource.RLIM_INFINITY))
out = stage({"image": records}, HostContext(np.arange(4), 0))["image"]
print(json.dumps({"mean": out.reshape(-1, 3).mean(axis=0).tolist(), "peak": stage.budget.peak}))
"""


def test_a_batch_of_near_limit_pngs_decodes_within_the_budget(tmp_path):
    """Each 9459 x 9459 RGB PNG is 1.2 MB on disk and 358 MB to decode; four threads
    decoding them at once need 1.4 GB. In a child under `RLIMIT_AS` 600 MiB above its size, a
    400 MiB budget lets one decode at a time, and the batch decodes exactly."""
    import json
    import subprocess
    import sys

    # glibc's allocator: large blocks always mapped (and unmapped when freed), so the address space
    # the limit counts is the memory in use, not what freed blocks left reserved
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
           "MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    proc = subprocess.run([sys.executable, "-c", NEAR_LIMIT, json.dumps({"max_decode_bytes": 400 * 2**20})], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mean"] == [40.0, 90.0, 200.0]
    side = int(Image.MAX_IMAGE_PIXELS ** 0.5)
    assert result["peak"] == side * side * 4  # one at a time: Pillow holds RGB in 4 bytes a pixel


def test_small_raw_records_are_warped_on_the_calling_thread_with_the_threaded_output(tmp_path, cases):
    """A batch of small raw records (a decode-once cache) skips the thread pool, whose threads would
    only contend for the GIL; the output is the one a one-thread stage gives, and a batch with a
    JPEG in it still uses the pool."""
    paths = []
    for i, mode in enumerate(["RGB", "L", "RGB", "RGB", "L", "RGB"]):
        path = tmp_path / f"{i}.ppm"
        reference(cases["rgb.png"]).rotate(30 * i).convert(mode).save(path, format="PPM")
        paths.append(str(path))
    settings = {"size": 24, "crop": "random_resized", "seed": 3, "backend": "turbo", "executor": "threads"}
    threaded = DecodeImage(**settings, num_threads=4)
    got = run(threaded, paths, record_ids=[5, 9, 2, 7, 11, 0], epoch=2)["image"]
    assert threaded.pool._tasks is None  # the pool never started
    want = run(DecodeImage(**settings, num_threads=1), paths, record_ids=[5, 9, 2, 7, 11, 0], epoch=2)["image"]
    np.testing.assert_array_equal(got, want)
    mixed = run(threaded, [*paths[:3], cases["rgb.jpg"]], record_ids=[5, 9, 2, 7], epoch=2)["image"]
    assert threaded.pool._tasks is not None
    np.testing.assert_array_equal(mixed[:3], want[:3])


def test_a_damaged_raw_record_on_the_inline_path_is_named(tmp_path, cases):
    path = tmp_path / "short.ppm"
    reference(cases["rgb.png"]).save(path, format="PPM")
    path.write_bytes(path.read_bytes()[:5000])  # the header promises more pixels than follow
    good = tmp_path / "good.ppm"
    reference(cases["rgb.png"]).save(good, format="PPM")
    stage = DecodeImage(size=16, backend="turbo", num_threads=2)
    with pytest.raises(RecordError, match="short.ppm"):
        run(stage, [str(good), str(path)])
    skipping = DecodeImage(size=16, backend="turbo", num_threads=2, on_error="skip")
    with pytest.warns(SkippedRecordWarning):
        out = run(skipping, [str(good), str(path)])
    assert out["image_ok"].tolist() == [True, False] and not out["image"][1].any()
