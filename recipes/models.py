"""Small Flax NNX classifiers and the classification loss the recipes share."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class ConvNet(nnx.Module):
    """A small CNN for tiny images: 3x3 convolutions (the second of each pair strided), then a head.

    Args:
        in_channels: channels of the input images.
        num_classes: outputs of the head.
        widths: channels of each convolution; every second one has stride 2.
        image_size: (height, width) of the input, to size the flattened features.
        hidden: width of the hidden dense layer before the head (0: none).
        rngs: parameter initialisation.

    `backbone(x)` returns the features before the head, so a recipe can swap heads.
    """

    def __init__(self, in_channels: int, num_classes: int, *, widths: Sequence[int] = (32, 64, 64),
                 image_size: tuple[int, int] = (8, 8), hidden: int = 128, rngs: nnx.Rngs):
        convs, channels = [], in_channels
        height, width = image_size
        for i, out in enumerate(widths):
            stride = 2 if i % 2 == 1 else 1
            convs.append(nnx.Conv(channels, out, (3, 3), strides=stride, rngs=rngs))
            channels = out
            height, width = -(-height // stride), -(-width // stride)
        self.convs = nnx.List(convs)
        features = height * width * channels
        self.hidden = nnx.Linear(features, hidden, rngs=rngs) if hidden else None
        self.head = nnx.Linear(hidden or features, num_classes, rngs=rngs)

    def backbone(self, x: jax.Array) -> jax.Array:
        for conv in self.convs:
            x = nnx.relu(conv(x))
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
