"""What some docs blocks take as given, made before they run (small, offline).

A block asks with `<!-- docs-test: setup: NAME, ... -->` on the line above its fence. Each function
here runs in the block's working folder: it writes the files a reader of that page would already
have, or returns the objects the block says it takes (a dict of names for the page's namespace).
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
