"""The models, losses and metrics the example configurations train (`image.toml`, `audio.toml`,
`text.toml`); the files name them by import path and allow this module (`allow = ["example_jobs"]`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class ImageModel(nnx.Module):
    """Two 3x3 convolutions, each followed by a 2x2 average pool, and a linear head."""

    def __init__(self, classes: int = 10, size: int = 24, width: int = 16, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(3, width, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(width, 2 * width, (3, 3), rngs=rngs)
        self.head = nnx.Linear(2 * width * (size // 4) ** 2, classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = nnx.avg_pool(nnx.relu(self.conv1(images)), (2, 2), strides=(2, 2))
        x = nnx.avg_pool(nnx.relu(self.conv2(x)), (2, 2), strides=(2, 2))
        return self.head(x.reshape(x.shape[0], -1))


class AudioModel(nnx.Module):
    """Per-band mean and spread of a log-mel spectrogram over time, then a two-layer MLP."""

    def __init__(self, bands: int = 32, classes: int = 4, hidden: int = 32, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(2 * bands, hidden, rngs=rngs)
        self.head = nnx.Linear(hidden, classes, rngs=rngs)

    def __call__(self, log_mel: jax.Array) -> jax.Array:
        features = jnp.concatenate([log_mel.mean(axis=-1), log_mel.std(axis=-1)], axis=-1) / 40.0
        return self.head(nnx.relu(self.hidden(features)))


class TextModel(nnx.Module):
    """A next-token model: each token's embedding and its predecessor's, through an MLP."""

    def __init__(self, vocab: int = 512, width: int = 64, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.hidden = nnx.Linear(2 * width, width, rngs=rngs)
        self.head = nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        here = self.embed(tokens)
        before = jnp.concatenate([jnp.zeros_like(here[:, :1]), here[:, :-1]], axis=1)
        return self.head(nnx.relu(self.hidden(jnp.concatenate([here, before], axis=-1))))


def image_model(classes: int = 10, size: int = 24, *, rngs: nnx.Rngs) -> ImageModel:
    return ImageModel(classes, size, rngs=rngs)


def audio_model(bands: int = 32, classes: int = 4, *, rngs: nnx.Rngs) -> AudioModel:
    return AudioModel(bands, classes, rngs=rngs)


def text_model(vocab: int = 512, *, rngs: nnx.Rngs) -> TextModel:
    return TextModel(vocab, rngs=rngs)


def image_loss(model: ImageModel, batch: dict) -> tuple[jax.Array, jax.Array]:
    logits = model(batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits


def audio_loss(model: AudioModel, batch: dict) -> tuple[jax.Array, jax.Array]:
    logits = model(batch["log_mel"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits


def accuracy(batch: dict, logits: jax.Array) -> jax.Array:
    return (logits.argmax(-1) == batch["label"]).mean()


def next_token_loss(model: TextModel, batch: dict) -> jax.Array:
    """Cross-entropy of each token given the ones before it in its document piece (same segment)."""
    tokens, segments = batch["tokens"], batch["segment_ids"]
    logits = model(tokens)[:, :-1]
    targets = tokens[:, 1:]
    weights = (batch["loss_mask"][:, 1:] & (segments[:, 1:] == segments[:, :-1])).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (losses * weights).sum() / jnp.maximum(weights.sum(), 1.0)
