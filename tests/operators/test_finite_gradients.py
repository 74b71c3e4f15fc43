"""Gradients are finite for extreme but valid inputs, for every differentiable image operator.

Found by adversarial use: the hue maths returned NaN at near-black pixels with tiny unequal
channels (0 * inf in untaken branches), which then reached every learnable stage upstream.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import transforms as T
from datarax.core.element import Element
from datarax.core.operator import BatchContext

EXTREMES = {
    "tiny unequal channels": [1e-21, 5e-22, 2e-22],
    "denormal": [1e-38, 0.0, 1e-39],
    "black": [0.0, 0.0, 0.0],
    "white": [1.0, 1.0, 1.0],
    "near white": [1.0, 1.0, 1.0 - 1e-7],
    "grey": [0.5, 0.5, 0.5],
    "one channel": [1e-30, 0.0, 0.0],
}

# Image operators with a float image in and out (MixUp/CutMix have their own tests), each with
# every continuous magnitude learnable where it has one.
OPERATORS = ["Brightness", "Contrast", "Saturation", "Hue", "Gamma", "Grayscale", "Solarize", "Standardize",
             "HorizontalFlip", "VerticalFlip", "Rotation", "Affine", "Translate", "GaussianNoise",
             "GaussianBlur", "Cutout", "RandomResizedCrop", "Resize"]


def image_of(pixel, size=6):
    image = np.broadcast_to(np.asarray(pixel, np.float32), (2, size, size, 3)).copy()
    image[:, : size // 2] = 0.0  # a black region beside the extreme pixels, as blur leaves them
    return jnp.asarray(image)


def build(name):
    kwargs = {"size": 6} if name in ("RandomResizedCrop", "Resize") else {}
    build = getattr(T, name)
    try:
        return build(learnable=True, rngs=nnx.Rngs(0), **kwargs)
    except ValueError:  # no continuous magnitude to learn
        return build(rngs=nnx.Rngs(0), **kwargs)


WEIGHTS = np.random.default_rng(1).normal(size=(2, 6, 6, 3)).astype(np.float32)


def loss(module, x):
    out = module(Element({"image": x}), BatchContext.for_batch(2))
    return jnp.sum(out.data["image"] * WEIGHTS)


# jitted, as a training step runs it (op by op, each primitive would compile on its own); one
# function for every case, so an operator's program compiles once for its seven extremes (a fresh
# operator of the same configuration has the same graph, and the pixels are only values).
VALUE_AND_GRAD = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1)))


@pytest.mark.parametrize("pixel", list(EXTREMES.values()), ids=list(EXTREMES))
@pytest.mark.parametrize("name", OPERATORS)
def test_gradients_to_the_image_and_the_magnitudes_are_finite(name, pixel):
    op = build(name)
    value, (grad_module, grad_image) = VALUE_AND_GRAD(op, image_of(pixel))
    assert np.isfinite(float(value))
    assert np.isfinite(np.asarray(grad_image)).all(), f"{name}: NaN/inf gradient to the image"
    for leaf in jax.tree.leaves(nnx.state(grad_module, nnx.Param)):
        assert np.isfinite(np.asarray(leaf)).all(), f"{name}: NaN/inf gradient to a magnitude"
