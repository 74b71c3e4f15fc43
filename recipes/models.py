"""Small Flax NNX classifiers and the classification loss the recipes share."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

# The constant that makes a normal truncated at +-2 std have unit variance (as in jax.nn.initializers).
_TRUNCATED_STD = 0.87962566103423978


def host_lecun_normal(rng: np.random.Generator) -> Callable:
    """LeCun-normal initialiser (truncated at 2 std) drawn with numpy on the host.

    Equivalent in distribution to `jax.nn.initializers.lecun_normal()`. Each distinct shape of
    JAX's own initialiser compiles a truncated-normal program (about a second each on a small
    CPU); a recipe's start-up should not pay that.
    """

    def init(key, shape, dtype=jnp.float32):
        x = rng.standard_normal(shape)
        outside = np.abs(x) > 2.0
        while outside.any():
            x[outside] = rng.standard_normal(int(outside.sum()))
            outside = np.abs(x) > 2.0
        fan_in = int(np.prod(shape[:-1]))
        return jnp.asarray(x * np.sqrt(1.0 / fan_in) / _TRUNCATED_STD, dtype)

    return init


def host_zeros(key, shape, dtype=jnp.float32) -> jax.Array:
    return jnp.asarray(np.zeros(shape), dtype)


def host_init(seed: int) -> dict:
    """`kernel_init`/`bias_init` keyword arguments for nnx.Conv/nnx.Linear, seeded on the host."""
    return {"kernel_init": host_lecun_normal(np.random.default_rng(seed)), "bias_init": host_zeros}


class ConvNet(nnx.Module):
    """A small CNN for tiny images: 3x3 convolutions (the second of each pair strided), then a head.

    Args:
        in_channels: channels of the input images.
        num_classes: outputs of the head.
        widths: channels of each convolution; every second one has stride 2.
        image_size: (height, width) of the input, to size the flattened features.
        hidden: width of the hidden dense layer before the head (0: none).
        pool: "flatten" keeps every position; "width" averages over the width axis first (time,
            for spectrograms laid out (frequency, time, channel)), so the features do not depend
            on where in time a sound is.
        seed: parameter initialisation (LeCun normal, drawn on the host; see `host_lecun_normal`).

    `backbone(x)` returns the features before the head, so a recipe can swap heads.
    """

    def __init__(self, in_channels: int, num_classes: int, *, widths: Sequence[int] = (32, 64, 64),
                 image_size: tuple[int, int] = (8, 8), hidden: int = 128, pool: str = "flatten", seed: int = 0):
        if pool not in ("flatten", "width"):
            raise ValueError(f"pool must be 'flatten' or 'width', got {pool!r}")
        rngs, init = nnx.Rngs(seed), host_init(seed)
        self.pool = pool
        convs, channels = [], in_channels
        height, width = image_size
        for i, out in enumerate(widths):
            stride = 2 if i % 2 == 1 else 1
            convs.append(nnx.Conv(channels, out, (3, 3), strides=stride, rngs=rngs, **init))
            channels = out
            height, width = -(-height // stride), -(-width // stride)
        self.convs = nnx.List(convs)
        features = height * channels * (1 if pool == "width" else width)
        self.hidden = nnx.Linear(features, hidden, rngs=rngs, **init) if hidden else None
        self.head = nnx.Linear(hidden or features, num_classes, rngs=rngs, **init)

    def backbone(self, x: jax.Array) -> jax.Array:
        for conv in self.convs:
            x = nnx.relu(conv(x))
        if self.pool == "width":
            x = x.mean(axis=2)
        x = x.reshape(x.shape[0], -1)
        return nnx.relu(self.hidden(x)) if self.hidden is not None else x

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.backbone(x))


def classification_loss(model: nnx.Module, batch: dict) -> tuple[jax.Array, jax.Array]:
    """Mean softmax cross-entropy of `model(batch["image"])` against `batch["label"]`; aux: logits."""
    logits = model(batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits


def accuracy(batch: dict, logits: jax.Array) -> jax.Array:
    return (logits.argmax(-1) == batch["label"]).mean()


CLASSIFICATION_METRICS = {"accuracy": accuracy}


def count_params(module: nnx.Module) -> int:
    return int(sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param))))


def as_float_image(x: jax.Array, scale: float) -> jax.Array:
    """An integer image as float32 in [0, 1] (`x / scale`)."""
    return x.astype(jnp.float32) / scale
