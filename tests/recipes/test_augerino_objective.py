"""The Augerino objective of `recipes.augerino` on toy problems, trained through the real training kit.

* lam = 0: the width does not grow (where rotation hurts the fit it shrinks);
* lam > 0 with inputs the loss is invariant to (radially symmetric blobs): the width grows;
* the regulariser is `lam * ||w||_2` with w in radians, whatever parameterises the magnitude.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.operators.image import RotationConfig, RotationOperator
from datarax.operators.learnable import Magnitude
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer, joint_optimizer
from recipes.augerino import (
    RADIANS_PER_DEGREE,
    WIDTH_FIELD,
    AugmentationPolicy,
    augerino_loss,
    policy_values,
    width_regulariser,
)

SIZE = 9  # odd, so the rotation centre (4, 4) is a pixel centre and a centred blob is rotation-invariant
START = 60.0


class Linear(nnx.Module):
    def __init__(self, seed: int):
        self.dense = nnx.Linear(SIZE * SIZE, 2, rngs=nnx.Rngs(seed))

    def __call__(self, x):
        return self.dense(x.reshape(x.shape[0], -1))


def radial_blobs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Centred Gaussian blobs; the label says whether the blob is narrow or wide (rotation cannot change it)."""
    labels = rng.integers(0, 2, n)
    sigma = np.where(labels == 0, 1.0, 2.5) * rng.uniform(0.9, 1.1, n)
    y, x = np.mgrid[:SIZE, :SIZE] - (SIZE - 1) / 2
    images = np.exp(-(x ** 2 + y ** 2)[None] / (2 * sigma[:, None, None] ** 2))
    return images[..., None].astype(np.float32), labels.astype(np.int32)


def oriented_bars(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A horizontal (label 0) or vertical (label 1) bar through the centre: a quarter turn swaps the classes."""
    labels = rng.integers(0, 2, n)
    images = np.zeros((n, SIZE, SIZE, 1), np.float32)
    middle = SIZE // 2
    images[labels == 0, middle, :, 0] = 1.0
    images[labels == 1, :, middle, 0] = 1.0
    return images * rng.uniform(0.8, 1.2, (n, 1, 1, 1)).astype(np.float32), labels.astype(np.int32)


def train_width(images: np.ndarray, labels: np.ndarray, lam: float, steps: int = 25) -> float:
    """Trains model and rotation width jointly (`Trainer(train_pipeline_params=True)`); the final width in degrees."""
    policy = AugmentationPolicy(
        [RotationOperator(RotationConfig(field="image", degrees=START, learnable=True), rngs=nnx.Rngs(augment=0))],
        units={"Rotation.degrees": RADIANS_PER_DEGREE})
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=0), data={"image": images, "label": labels})
    pipeline = Pipeline(source, [policy], batch_size=32, drop_remainder=True)
    # Plain SGD on the width: a (near-)zero gradient then moves it (almost) nowhere; Adam would
    # normalise float noise into full-size steps.
    tx = joint_optimizer(optax.adam(0.1), optax.sgd(1.0))
    trainer = Trainer(Linear(0), tx, pipeline, augerino_loss(lam), train_pipeline_params=True)
    trainer.fit(num_steps=steps)
    return policy_values(policy)["Rotation.degrees"]


def test_without_the_regulariser_the_width_does_not_grow():
    rng = np.random.default_rng(0)
    width = train_width(*oriented_bars(64, rng), lam=0.0)
    assert width < START - 1.0, width  # rotation hurts the fit, and nothing rewards width: it shrinks


def test_with_the_regulariser_the_width_grows_where_the_loss_is_invariant():
    width = train_width(*radial_blobs(64, np.random.default_rng(1)), lam=0.1)
    assert width > START + 30.0, width


def test_the_regulariser_is_lam_times_the_l2_norm_in_radians():
    op = RotationOperator(RotationConfig(field="image", degrees=30.0, learnable=True), rngs=nnx.Rngs(augment=0))
    policy = AugmentationPolicy([op], units={"Rotation.degrees": RADIANS_PER_DEGREE})
    widths = jnp.stack(list(policy.widths().values()))
    by_hand = 0.05 * 30.0 * math.pi / 180.0  # lam * |w| for one width of 30 degrees = pi / 6 rad
    assert float(width_regulariser(widths, 0.05)) == pytest.approx(by_hand, rel=1e-5)
    assert float(width_regulariser(jnp.asarray([0.3, 0.4]), 2.0)) == pytest.approx(2.0 * 0.5)  # sqrt(.09 + .16)

    # The same 30 degrees held by a differently parameterised magnitude (another sigmoid range, so
    # another raw logit): the regulariser reads the value, not the parameterisation.
    other = RotationOperator(RotationConfig(field="image", degrees=30.0, learnable=True), rngs=nnx.Rngs(augment=0))
    other.magnitudes["degrees"] = Magnitude(30.0, high=360.0, learnable=True, name="degrees")
    assert float(other.magnitudes["degrees"].raw[...]) != pytest.approx(float(op.magnitudes["degrees"].raw[...]))
    reparameterised = AugmentationPolicy([other], units={"Rotation.degrees": RADIANS_PER_DEGREE})
    other_widths = jnp.stack(list(reparameterised.widths().values()))
    assert float(width_regulariser(other_widths, 0.05)) == pytest.approx(by_hand, rel=1e-5)


def test_the_loss_subtracts_the_regulariser_from_the_cross_entropy():
    model = Linear(0)
    images, labels = radial_blobs(4, np.random.default_rng(2))
    widths = np.full((4, 1), 0.5, np.float32)
    plain, _ = augerino_loss(0.2)(model, {"image": jnp.asarray(images), "label": jnp.asarray(labels)})
    regularised, _ = augerino_loss(0.2)(model, {"image": jnp.asarray(images), "label": jnp.asarray(labels),
                                                 WIDTH_FIELD: jnp.asarray(widths)})
    logits = np.asarray(model(jnp.asarray(images)), np.float64)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    cross_entropy = -log_softmax[np.arange(4), labels].mean()
    assert float(plain) == pytest.approx(cross_entropy, rel=1e-5)
    assert float(regularised) == pytest.approx(cross_entropy - 0.2 * 0.5, rel=1e-5)


def test_every_learnable_magnitude_needs_a_unit():
    op = RotationOperator(RotationConfig(field="image", degrees=30.0, learnable=True), rngs=nnx.Rngs(augment=0))
    with pytest.raises(ValueError, match=r"no unit for the learnable magnitudes \['Rotation.degrees'\]"):
        AugmentationPolicy([op], units={})
    with pytest.raises(ValueError, match=r"units names \['Affine.degrees'\]"):
        AugmentationPolicy([op], units={"Rotation.degrees": 1.0, "Affine.degrees": 1.0})
