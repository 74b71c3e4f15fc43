"""`separately`: same values as the inline computation, a real separate computation on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax.core.element import Element
from datarax.core.fusion import separately
from datarax.core.operator import BatchContext, PerRecordOperator
from datarax.operators import precision
from datarax.operators.image import (
    AffineConfig,
    AffineOperator,
    RotationConfig,
    RotationOperator,
    TranslateConfig,
    TranslateOperator,
)


def f(x, y):
    return jnp.sin(x) * y + jnp.exp(-x)


def test_values_and_gradients_equal_the_inline_function():
    x, y = jnp.linspace(-2, 2, 50), jnp.float32(1.5)
    for token in (jnp.asarray(True), True):
        out = jax.jit(lambda x, y: separately(f, jnp.asarray(x[0] < 100), x, y))(x, y)
        np.testing.assert_allclose(out, f(x, y), rtol=1e-6)
        grad = jax.grad(lambda y: separately(f, token, x, y).sum())(y)
        np.testing.assert_allclose(grad, jax.grad(lambda y: f(x, y).sum())(y), rtol=1e-6)


def test_on_cpu_the_function_is_its_own_computation_and_inline_elsewhere():
    text = jax.jit(lambda x, e: separately(f, e >= 0, x, 2.0)).lower(jnp.ones(8), 0).as_text()
    assert ("stablehlo.case" in text) == (jax.default_backend() == "cpu")
    inline = jax.jit(lambda x: separately(f, True, x, 2.0)).lower(jnp.ones(8)).as_text()
    assert "stablehlo.case" not in inline


def test_a_batched_token_under_vmap_still_gives_the_function():
    x = jnp.arange(12.0).reshape(3, 4)
    out = jax.vmap(lambda row: separately(f, row[0] >= 0, row, 2.0))(x)
    np.testing.assert_allclose(out, f(x, 2.0), rtol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: RotationOperator(RotationConfig(degrees=30.0), rngs=nnx.Rngs(0)),
    lambda: AffineOperator(AffineConfig(degrees=10.0, translate=0.1, scale=0.1, shear=5.0), rngs=nnx.Rngs(1)),
    lambda: TranslateOperator(TranslateConfig(translate=0.2), rngs=nnx.Rngs(2)),
])
def test_separated_warp_operators_equal_their_per_record_path(make):
    """The warp operators' CPU path (one conditional) gives the plain vmapped path's images.

    Elsewhere both are the inline products: on a TPU each interpolation is a weighted sum at the
    precision policy's bound (of values in [0, 1], weights summing to 1), so the two paths' sums
    may differ by twice it (2-3e-5 measured on a v5e)."""
    op = make()
    assert type(op).separate_on_cpu
    images = jnp.asarray(np.random.default_rng(0).random((5, 12, 10, 3)), jnp.float32)
    ctx = BatchContext(jnp.arange(5, dtype=jnp.int32) * 7, jnp.asarray(3, jnp.int32), jnp.ones(5, bool))
    element = Element({"image": images}, {})
    separated = jax.jit(lambda el, c: op.apply_batch(el, c).data["image"])(element, ctx)
    plain = jax.jit(lambda el, c: PerRecordOperator.apply_batch(op, el, c).data["image"])(element, ctx)
    tuned = jax.default_backend() in precision.TUNED_BACKENDS
    np.testing.assert_allclose(separated, plain, atol=2 * precision.WEIGHTED_SUM.bound if tuned else 1e-6)
    assert not np.allclose(separated, images)  # the warp did something
