"""Files that some docs blocks read, written into the block's working folder before it runs.

A block asks for them with `<!-- docs-test: files: NAME, ... -->` on the line above its fence; each
function here writes what a reader of that page would already have (small, made offline).
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

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


def digits_parquet() -> None:
    """`data/digits-train.parquet` and `data/digits-test.parquet`: examples/configs/make_data.py's digits."""
    sys.path.insert(0, str(REPO / "examples" / "configs"))
    import make_data

    os.makedirs("data", exist_ok=True)
    make_data.digits("data")
