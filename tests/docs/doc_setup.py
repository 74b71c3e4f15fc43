"""What some docs blocks take as given, made before they run (small, offline).

A block asks with `<!-- docs-test: setup: NAME, ... -->` on the line above its fence. Each function
here runs in the block's working folder: it writes the files a reader of that page would already
have, or returns the objects the block says it takes (a dict of names for the page's namespace).
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import sys
import textwrap
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


# The README's configuration file, with a small [trainer] table, and the module of the user's that it allows.
MY_TRANSFORMS = '''
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


def make_data():
    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 255, (256, 28, 28, 1)).astype(np.float32),
            "label": rng.integers(0, 10, (256,)).astype(np.int32)}


def normalize(element, key=None):
    return element.update_data({"image": element.data["image"] / 255.0})


def augment(element, key):
    flip = jax.random.bernoulli(key, 0.5)
    image = element.data["image"]
    return element.update_data({"image": jnp.where(flip, jnp.flip(image, axis=1), image)})


def model(*, rngs):
    return nnx.Sequential(lambda x: x.reshape(len(x), -1), nnx.Linear(28 * 28, 10, rngs=rngs))


def loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["image"]), batch["label"]).mean()
'''

EXPERIMENT_TOML = '''
allow = ["my_transforms"]
batch_size = 32

[source.memory]
data = "my_transforms:make_data"
rngs = 0

[[stages]]
element = { fn = "my_transforms:normalize", stochastic = false, rngs = 0 }

[[stages]]
element = { fn = "my_transforms:augment", stochastic = true, stream_name = "augmentations", rngs = 42 }

[[stages]]
brightness = { max_delta = 0.3, learnable = true }

[trainer]
model = "my_transforms:model"
loss = "my_transforms:loss"
optimizer = { adam = { learning_rate = 1e-3 } }
steps = 4
'''


def experiment_toml() -> None:
    """`experiment.toml` (the README's file with a [trainer] table) and `my_transforms.py` beside it."""
    Path("my_transforms.py").write_text(textwrap.dedent(MY_TRANSFORMS).lstrip())
    Path("experiment.toml").write_text(textwrap.dedent(EXPERIMENT_TOML).lstrip())
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def digit_images_in_data() -> None:
    """`digit_images_parquet`'s files in a folder `data/`."""
    os.makedirs("data", exist_ok=True)
    make_data().digits("data")


def image_classifier() -> dict:
    """`model`, `train_pipeline`, `eval_pipeline` on 8x8 images of 10 classes, and `pipeline`, whose
    brightness stage has a learnable strength (for joint training)."""
    import numpy as np
    from flax import nnx

    from datarax import Pipeline
    from datarax import transforms as T
    from datarax.sources import MemorySource

    rng = np.random.default_rng(0)
    images = rng.random((256, 8, 8, 1), dtype=np.float32)
    labels = rng.integers(0, 10, 256).astype(np.int32)
    train = MemorySource(data={"image": images[:192], "label": labels[:192]}, shuffle=True, seed=0)
    model = nnx.Sequential(lambda x: x.reshape(len(x), -1), nnx.Linear(64, 10, rngs=nnx.Rngs(0)))
    return {
        "model": model,
        "train_pipeline": Pipeline(train, batch_size=32),
        "eval_pipeline": Pipeline(MemorySource(data={"image": images[192:], "label": labels[192:]}), batch_size=32),
        "pipeline": Pipeline(train, [T.Brightness(max_delta=0.3, learnable=True, field="image", rngs=nnx.Rngs(1))],
                             batch_size=32),
    }


def token_lm() -> dict:
    """`model` (a bigram language model over 64 tokens) and `train`, `val` pipelines of 16-token rows with a
    `loss_mask`."""
    import numpy as np
    from flax import nnx

    from datarax import Pipeline
    from datarax.sources import MemorySource

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (96, 16)).astype(np.int32)
    mask = np.ones_like(tokens, dtype=bool)
    mask[:, 12:] = False  # padding at the end of each row
    data = {"tokens": tokens, "loss_mask": mask}
    return {
        "model": nnx.Embed(64, 64, rngs=nnx.Rngs(0)),  # row t: the logits of the token after token t
        "train": Pipeline(MemorySource(data={k: v[:64] for k, v in data.items()}, shuffle=True, seed=0), batch_size=16),
        "val": Pipeline(MemorySource(data={k: v[64:] for k, v in data.items()}), batch_size=16),
    }


def jitted_loop() -> dict:
    """A hand-written loop's pieces: `pipeline` (8x8 images), `state` (a linear model's weights) and a
    jitted `train_step(state, batch) -> (state, loss)`."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from datarax import Pipeline
    from datarax.sources import MemorySource

    rng = np.random.default_rng(0)
    data = {"image": rng.random((512, 8, 8), dtype=np.float32), "label": rng.integers(0, 10, 512).astype(np.int32)}

    @jax.jit
    def train_step(state, batch):
        def loss_fn(w):
            logits = batch["image"].reshape(len(batch["image"]), -1) @ w
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), batch["label"][:, None], 1))
        loss, grad = jax.value_and_grad(loss_fn)(state)
        return state - 0.1 * grad, loss

    return {"pipeline": Pipeline(MemorySource(data=data, shuffle=True, seed=0), batch_size=32),
            "state": jnp.zeros((64, 10)), "train_step": train_step}


def image_paths_parquet() -> None:
    """`data/train.parquet`: an HF `Image` column whose rows name files (`img/000.png`, ...) under `data/`."""
    import json

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    os.makedirs("data/img", exist_ok=True)
    names = [f"img/{i:03d}.png" for i in range(4)]
    for i, name in enumerate(names):
        Image.fromarray(np.full((16, 16, 3), 60 * i, np.uint8)).save(os.path.join("data", name))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    image = pa.array([{"bytes": None, "path": name} for name in names],
                     type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    table = pa.table({"image": image, "label": pa.array([0, 1, 0, 1], pa.int64())})
    metadata = {"huggingface": json.dumps({"info": {"features": features.to_dict()}})}
    pq.write_table(table.replace_schema_metadata(metadata), "data/train.parquet")
