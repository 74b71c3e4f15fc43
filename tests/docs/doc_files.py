"""Files that some docs blocks read, written into the block's working folder before it runs.

A block asks for them with `<!-- docs-test: files: NAME, ... -->` on the line above its fence; each
function here writes what a reader of that page would already have (small, made offline).
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def make_data():
    """`examples/configs/make_data.py`, the writer of the example configurations' offline data."""
    spec = importlib.util.spec_from_file_location("make_data", REPO / "examples" / "configs" / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def photo_crops(count: int, seed: int = 0) -> dict[str, list[bytes]]:
    """`count` JPEGs per scikit-image photograph (`cat`, `coffee`, `rocket`): random crops of 64 to
    128 pixels a side."""
    from PIL import Image
    from skimage import data

    rng = np.random.default_rng(seed)
    out = {}
    for name, photo in (("cat", data.chelsea()), ("coffee", data.coffee()), ("rocket", data.rocket())):
        out[name] = []
        for _ in range(count):
            h, w = rng.integers(64, 129, 2)
            top, left = rng.integers(0, photo.shape[0] - h), rng.integers(0, photo.shape[1] - w)
            buffer = io.BytesIO()
            Image.fromarray(photo[top:top + h, left:left + w]).save(buffer, format="JPEG", quality=90)
            out[name].append(buffer.getvalue())
    return out


def image_folder():
    """`photos/train/<class>/<nnn>.jpg`: 24 photo crops in each of three classes."""
    for name, jpegs in photo_crops(24).items():
        os.makedirs(f"photos/train/{name}", exist_ok=True)
        for i, jpeg in enumerate(jpegs):
            Path(f"photos/train/{name}/{i:03d}.jpg").write_bytes(jpeg)


def jpeg_array_records():
    """`jpegs-0000{0,1}-of-00002.array_record`: photo crops, one JPEG file's bytes a record."""
    from array_record.python import array_record_module

    jpegs = [jpeg for crops in photo_crops(8).values() for jpeg in crops]
    for shard, rows in enumerate(np.array_split(np.arange(len(jpegs)), 2)):
        writer = array_record_module.ArrayRecordWriter(f"jpegs-{shard:05d}-of-00002.array_record", "group_size:1")
        for row in rows:
            writer.write(jpegs[row])
        writer.close()


def digits_parquet():
    """`train-0.parquet`, `train-1.parquet`: scikit-learn's digits as numeric columns, `image`
    (uint8 8x8) and `label`."""
    import datasets
    from sklearn.datasets import load_digits

    digits = load_digits()
    features = datasets.Features({"image": datasets.Array2D((8, 8), "uint8"), "label": datasets.Value("int64")})
    for part, rows in enumerate(np.array_split(np.arange(len(digits.target)), 2)):
        table = {"image": digits.images[rows].astype(np.uint8), "label": digits.target[rows]}
        datasets.Dataset.from_dict(table, features=features).to_parquet(f"train-{part}.parquet")


def digit_images_parquet():
    """`digits-train.parquet`, `digits-test.parquet` (an HF `Image` column) and the training split as
    four shards, `digits-train-shards/part-*.parquet`: the example configurations' digits."""
    make_data().digits(".")


def speech_parquet():
    """`speech-0.parquet`, `speech-1.parquet`: 32 WAV tones each (8 kHz, half a second) in an HF
    `Audio` column `audio`, with their `label`."""
    data = make_data()
    files, labels = data.tone_files(64)
    for part in range(2):
        data.write_parquet(f"speech-{part}.parquet", "audio", files[part::2], labels[part::2])


def clip_folder():
    """`clips/train/<tone>/`: 16 clips of each of the four tones, WAV and FLAC in turn."""
    import soundfile

    data = make_data()
    files, labels = data.tone_files(64)
    for i, ((name, wav), label) in enumerate(zip(files, labels)):
        folder = Path(f"clips/train/{data.TONES_HZ[label]:g}hz")
        folder.mkdir(parents=True, exist_ok=True)
        if i % 2:
            samples, rate = soundfile.read(io.BytesIO(wav))
            soundfile.write(folder / name.replace(".wav", ".flac"), samples, rate)
        else:
            (folder / name).write_bytes(wav)


def cat_and_bark():
    """`cat.jpg` (scikit-image's cat photograph) and `bark.flac` (a second of decaying noise at 16 kHz)."""
    import soundfile
    from PIL import Image
    from skimage import data

    Image.fromarray(data.chelsea()).save("cat.jpg", quality=90)
    rng = np.random.default_rng(0)
    bark = rng.uniform(-0.5, 0.5, 16000) * np.exp(-np.arange(16000) / 2000)
    soundfile.write("bark.flac", bark, 16000)


def text_files():
    """`train.txt` (Python's help topics, one document a line) and `tokenizer.json` (a 512-token BPE
    trained on them, special tokens `<pad>`, `<eos>`, `<unk>`): the example configurations' text."""
    make_data().text(".")
    os.replace("topics.txt", "train.txt")


def features_module():
    """`features.py`: the module docs/sources.md shows for `HostMap`'s worker processes, as the page
    shows it (its python block that starts with `# features.py`)."""
    page = (REPO / "docs" / "sources.md").read_text()
    blocks = re.findall(r"^```python\n(# features\.py\n.*?)^```", page, re.S | re.M)
    if len(blocks) != 1:
        raise ValueError(f"docs/sources.md must hold one python block starting with '# features.py', found "
                         f"{len(blocks)}")
    Path("features.py").write_text(blocks[0])
