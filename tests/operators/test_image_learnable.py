"""Every learnable magnitude of the per-record image operators: its gradient is finite, non-zero
and matches central finite differences in float64 on a tiny case (2 records of 5x6x3).

The loss is `sum(weights * output)` with fixed random weights. Finite differences move the
magnitude's raw logit by +-1e-6; the operators are piecewise smooth (clipping, bilinear
sampling, box coverage), and on generic inputs no kink lies that close, so rtol is 1e-5.
MixUp and CutMix are checked in test_image_mix.py.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from on_cpu import float64_on_cpu

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.image import (
    AffineConfig,
    AffineOperator,
    BrightnessConfig,
    BrightnessOperator,
    ContrastConfig,
    ContrastOperator,
    CutoutConfig,
    CutoutOperator,
    GammaConfig,
    GammaOperator,
    GaussianBlurConfig,
    GaussianBlurOperator,
    GaussianNoiseConfig,
    GaussianNoiseOperator,
    HueConfig,
    HueOperator,
    RandomResizedCropConfig,
    RandomResizedCropOperator,
    RotationConfig,
    RotationOperator,
    SaturationConfig,
    SaturationOperator,
    SolarizeConfig,
    SolarizeOperator,
    TranslateConfig,
    TranslateOperator,
)

SHAPE = (2, 5, 6, 3)
CASES = [
    (BrightnessOperator, BrightnessConfig(max_delta=0.3, learnable=True)),
    (ContrastOperator, ContrastConfig(max_delta=0.3, learnable=True)),
    (SaturationOperator, SaturationConfig(max_delta=0.3, learnable=True)),
    (HueOperator, HueConfig(max_delta=0.2, learnable=True)),
    (GammaOperator, GammaConfig(max_log_gamma=0.5, learnable=True)),
    (SolarizeOperator, SolarizeConfig(threshold=0.5, softness=0.1, learnable=True)),
    (RandomResizedCropOperator, RandomResizedCropConfig(size=4, scale=(0.3, 0.7), ratio=(0.8, 1.25), learnable=True)),
    (AffineOperator, AffineConfig(degrees=20.0, translate=0.1, scale=0.2, shear=10.0, fill=0.5, learnable=True)),
    (RotationOperator, RotationConfig(degrees=30.0, fill=0.5, learnable=True)),
    (TranslateOperator, TranslateConfig(translate=0.2, fill=0.5, learnable=True)),
    (GaussianNoiseOperator, GaussianNoiseConfig(sigma=0.1, learnable=True)),
    (GaussianBlurOperator, GaussianBlurConfig(sigma=1.0, kernel_size=3, learnable=True)),
    (CutoutOperator, CutoutConfig(size=0.4, fill=0.5, learnable=True)),
]


@nnx.jit
def loss_and_grad(op, images, weights, ctx):
    def loss(module):
        return jnp.sum(module(Element({"image": images}), ctx).data["image"] * weights)

    return nnx.value_and_grad(loss)(op)


@pytest.mark.parametrize("op_class,config", CASES, ids=[c[0].__name__ for c in CASES])
def test_magnitude_gradients_match_finite_differences(op_class, config):
    with float64_on_cpu():
        rng = np.random.default_rng(0)
        images = jnp.asarray(rng.uniform(0.05, 0.95, SHAPE))
        op = op_class(config, rngs=nnx.Rngs(1))
        ctx = BatchContext.for_batch(2)
        size = getattr(config, "size", SHAPE[1:3]) if op_class is RandomResizedCropOperator else SHAPE[1:3]
        weights = jnp.asarray(rng.normal(size=(SHAPE[0], *size, SHAPE[3])))
        _, grads = loss_and_grad(op, images, weights, ctx)
        names = list(op_class.bounds)
        assert names and all(op.magnitudes[n].learnable for n in names)
        h = 1e-6
        for name in names:
            grad = float(grads["magnitudes"][name]["raw"][...])
            assert np.isfinite(grad) and grad != 0, f"{op_class.__name__}.{name}: gradient {grad}"
            raw = op.magnitudes[name].raw
            start = raw[...]
            raw[...] = start + h
            up, _ = loss_and_grad(op, images, weights, ctx)
            raw[...] = start - h
            down, _ = loss_and_grad(op, images, weights, ctx)
            raw[...] = start
            fd = (float(up) - float(down)) / (2 * h)
            np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-9, err_msg=f"{op_class.__name__}.{name}")
