"""ImageFolderSource: labels from sorted class folders, exact epochs, and keyed crops through a Pipeline."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from PIL import Image
from skimage import data as photos

from datarax import Pipeline
from datarax.host import DecodeImage, SkippedRecordWarning
from datarax.sources import ImageFolderSource, ImageFolderSourceConfig, RecordError

REPO = pathlib.Path(__file__).resolve().parents[2]
NUM = 40


def write_folder(root: pathlib.Path, num: int = NUM, per_class: int = 1, suffix: str = ".png") -> list[np.ndarray]:
    """`num` PNG (or JPEG) crops of a photograph, `per_class` per class folder `c000`, `c001`, ...; their pixels."""
    photo = photos.astronaut()
    rng = np.random.default_rng(0)
    images = []
    for i in range(num):
        top, left = rng.integers(0, 400, 2)
        h, w = rng.integers(24, 90, 2)
        image = photo[top:top + h, left:left + w]
        folder = root / f"c{i // per_class:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:04d}{suffix}")
        images.append(image)
    return images


@pytest.fixture(scope="module", params=[".png", ".jpg"])
def folder(tmp_path_factory, request):
    """PNGs (decoded by Pillow) and JPEGs (by DecodeImage's default backend: libjpeg-turbo when installed)."""
    root = tmp_path_factory.mktemp("folder")
    write_folder(root, suffix=request.param)
    return root


def test_classes_labels_order_and_paths(tmp_path):
    for name, files in {"dog": ["b.jpg", "a.PNG", "nested/c.webp", "notes.txt"], "cat": ["z.jpeg"],
                        ".ipynb_checkpoints": ["x.jpg"]}.items():
        for f in files:
            (tmp_path / name / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / f).write_bytes(f"{name}/{f}".encode())
    source = ImageFolderSource(root=tmp_path)
    assert source.class_names == ("cat", "dog") and len(source) == 4
    relative = [str(pathlib.Path(p).relative_to(tmp_path)) for p in source.paths]
    assert relative == ["cat/z.jpeg", "dog/a.PNG", "dog/b.jpg", "dog/nested/c.webp"]
    np.testing.assert_array_equal(source.labels, [0, 1, 1, 1])
    batch = source.get_batch(np.array([[3, 0], [1, 1]]))
    assert batch["image"].dtype == object and batch["image"].shape == (2, 2)
    assert batch["image"][0, 0] == b"dog/nested/c.webp" and batch["image"][0, 1] == b"cat/z.jpeg"
    np.testing.assert_array_equal(batch["label"], [[1, 0], [1, 1]])
    assert source.describe_record(2) == source.paths[2]
    assert source.element_spec()["label"] == jax.ShapeDtypeStruct((), np.int32)
    assert len(ImageFolderSource(root=tmp_path, extensions=(".jpg", ".jpeg"))) == 2
    source.close()


def test_missing_or_empty_roots_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"is not a folder; give the folder that holds one sub-folder"):
        ImageFolderSource(root=tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"has no class sub-folders; put the images in root/<class>/<image>"):
        ImageFolderSource(root=tmp_path)
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "readme.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"class folder\(s\) \['cat'\] .* hold no files ending in"):
        ImageFolderSource(root=tmp_path)
    with pytest.raises(ValueError, match=r"extensions must be a tuple of endings"):
        ImageFolderSource(root=tmp_path, extensions=("jpg",))
    config = ImageFolderSourceConfig(root=str(tmp_path), extensions=(".TXT",), shuffle=True, seed=3)
    source = ImageFolderSource(config)
    assert source.config == config and len(source) == 1


def test_every_shuffled_epoch_has_each_record_once(tmp_path):
    images = write_folder(tmp_path, num=30, per_class=4)
    pipeline = Pipeline(ImageFolderSource(root=tmp_path, shuffle=True, seed=1), [DecodeImage(size=16, resize="fixed")],
                        batch_size=7)
    orders = []
    for _ in range(2):
        seen, labels = [], []
        for batch in pipeline:
            labels.extend(np.asarray(batch["label"]).tolist())
            seen.extend(np.asarray(batch["image"]).reshape(len(batch["label"]), -1).tolist())
        # Each output is the fixed resize of one file: match it back to its file.
        reference = {bytes(np.asarray(Image.fromarray(images[i]).resize((16, 16), Image.Resampling.BILINEAR))
                           .ravel()): i for i in range(len(images))}
        ids = [reference[bytes(np.asarray(s, np.uint8))] for s in seen]
        assert sorted(ids) == list(range(30))
        np.testing.assert_array_equal(labels, np.arange(30)[ids] // 4)
        orders.append(ids)
    assert orders[0] != orders[1] and orders[0] != sorted(orders[0])


def build(root, batch_size=8, threads=2):
    source = ImageFolderSource(root=root, shuffle=True, seed=4)
    return Pipeline(source, [DecodeImage(size=24, crop="random_resized", num_threads=threads, seed=9)],
                    batch_size=batch_size)


def per_record(batches) -> np.ndarray:
    """Each record's crop, by record (one image per class folder, so the label is the record id)."""
    images = {}
    for batch in batches:
        for label, image in zip(np.asarray(batch["label"]), np.asarray(batch["image"])):
            images.setdefault(int(label), []).append(image)
    return np.stack([np.stack(images[i]) for i in range(NUM)])


@pytest.mark.parametrize("batch_size,threads", [(7, 1), (64, 4), (7, 4)])
def test_crops_do_not_depend_on_batch_size_or_threads(folder, batch_size, threads):
    base = per_record(build(folder).epochs(2))
    np.testing.assert_array_equal(per_record(build(folder, batch_size, threads).epochs(2)), base)
    assert not np.array_equal(base[:, 0], base[:, 1])  # a new crop each epoch


RESUME = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from sources.test_image_folder import build
it = build({root!r}).epochs(2)
it.set_state(json.loads({state!r}))
batches = [{{k: np.asarray(v) for k, v in b.items()}} for b in it]
np.savez({out!r}, image=np.concatenate([b["image"] for b in batches]),
         label=np.concatenate([b["label"] for b in batches]))
"""


def test_resume_mid_epoch_in_a_fresh_process(folder, tmp_path):
    it = build(folder).epochs(2)
    for _ in range(7):  # into the second epoch (5 batches each)
        next(it)
    state = json.dumps(it.get_state())
    rest = [{k: np.asarray(v) for k, v in b.items()} for b in it]
    out = tmp_path / "rest.npz"
    code = RESUME.format(tests=str(REPO / "tests"), root=str(folder), state=state, out=str(out))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = np.load(out)
    np.testing.assert_array_equal(resumed["label"], np.concatenate([b["label"] for b in rest]))
    np.testing.assert_array_equal(resumed["image"], np.concatenate([b["image"] for b in rest]))


def test_a_corrupt_file_fails_the_pipeline_naming_its_path(tmp_path):
    write_folder(tmp_path, num=6)
    bad = tmp_path / "c003" / "0003.png"
    bad.write_bytes(bad.read_bytes()[:100])
    pipeline = Pipeline(ImageFolderSource(root=tmp_path), [DecodeImage(size=16)], batch_size=4)
    with pytest.raises(RecordError, match=rf"record 3 \({bad}\)"):
        list(pipeline)


def test_the_fingerprint_follows_the_files_not_the_root(tmp_path):
    write_folder(tmp_path / "a", num=4)
    write_folder(tmp_path / "b", num=4)
    assert ImageFolderSource(root=tmp_path / "a").structure() == ImageFolderSource(root=tmp_path / "b").structure()
    (tmp_path / "b" / "c000" / "0000.png").rename(tmp_path / "b" / "c000" / "0000b.png")
    assert ImageFolderSource(root=tmp_path / "a").structure() != ImageFolderSource(root=tmp_path / "b").structure()


def test_an_unreadable_image_file_fails_the_read_naming_the_file(tmp_path):
    write_folder(tmp_path, num=4)
    source = ImageFolderSource(root=tmp_path)
    gone = source.paths[2]
    pathlib.Path(gone).unlink()
    with pytest.raises(OSError, match=gone):
        list(Pipeline(source, [DecodeImage(size=8, field="image")], batch_size=2))


def test_a_deleted_file_is_named_with_its_record(tmp_path):
    write_folder(tmp_path, num=4)
    source = ImageFolderSource(root=tmp_path)
    gone = source.paths[2]
    pathlib.Path(gone).unlink()
    with pytest.raises(FileNotFoundError, match=rf"ImageFolderSource record 2: the file is gone \(deleted or moved "
                                                rf"since the folder was scanned\); .*build the source again.*: "
                                                rf"'{gone}'"):
        list(Pipeline(source, [DecodeImage(size=8)], batch_size=2))


def test_padding_rows_are_decoded_once_and_a_bad_record_counts_once(tmp_path, monkeypatch):
    """Five files, the last one damaged, batch_size 4: the final batch is record 4 and three padding
    rows repeating it. They are copies of its one decode, and it is skipped once, not four times.
    Counted on threads, where the decodes run in this process; the stage dedups before either
    executor sees the batch."""
    write_folder(tmp_path, num=5)
    (tmp_path / "c004" / "0004.png").write_bytes(b"not a png")
    decoded = []
    original = DecodeImage.decode_into
    monkeypatch.setattr(DecodeImage, "decode_into", lambda self, *args: decoded.append(1) or original(self, *args))
    stage = DecodeImage(size=8, on_error="skip", executor="threads")
    with pytest.warns(SkippedRecordWarning, match=r"record 4 "):
        batches = list(Pipeline(ImageFolderSource(root=tmp_path), [stage], batch_size=4))
    assert [np.asarray(b["image_ok"]).tolist() for b in batches] == [[True] * 4, [False]]
    assert stage.skipped == 1 and len(decoded) == 5


def test_a_file_name_with_control_characters_is_escaped_in_errors(tmp_path):
    """A file name is data: a newline or a terminal escape in it must not forge a log line."""
    write_folder(tmp_path, num=3)
    forged = tmp_path / "c001" / "x\nINFO all good\x1b[2K.png"
    forged.write_bytes(b"not a png")
    with pytest.raises(RecordError) as caught:
        list(Pipeline(ImageFolderSource(root=tmp_path), [DecodeImage(size=8)], batch_size=4))
    message = str(caught.value)
    assert "\n" not in message and "\x1b" not in message
    assert r"c001/x\nINFO all good\x1b[2K.png)" in message


@pytest.mark.parametrize("content,says", [
    (b"", r"ValueError: empty file \(0 bytes\)"),
    (b"GIF89 not really",
     r"UnidentifiedImageError: cannot identify image file \(16 bytes, starting b'GIF89 not really'\)"),
])
def test_an_empty_or_unknown_file_says_so_naming_the_record(tmp_path, content, says):
    write_folder(tmp_path, num=3)
    bad = tmp_path / "c001" / "0001.png"
    bad.write_bytes(content)
    with pytest.raises(RecordError, match=rf"record 1 \({bad}\) in field 'image': {says}") as caught:
        list(Pipeline(ImageFolderSource(root=tmp_path), [DecodeImage(size=8)], batch_size=4))
    assert "BytesIO" not in str(caught.value)
