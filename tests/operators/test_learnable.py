"""Bounded magnitudes: starting value, bounds, gradients, config resolution and errors."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from on_cpu import float64_on_cpu

from datarax.operators.learnable import (
    Magnitude,
    bounded,
    check_learnable_field,
    inverse_bounded,
    learnable_names,
    magnitudes,
    signed_uniform,
    uniform,
)

RANGES = [(0.2, 0.0, 1.0), (15.0, 0.0, 180.0), (-0.3, -1.0, 1.0), (1e-3, 0.0, 4.0)]


@pytest.mark.parametrize("value,low,high", RANGES)
def test_learnable_magnitude_starts_at_configured_value(value, low, high):
    m = Magnitude(value, low=low, high=high, learnable=True)
    np.testing.assert_allclose(float(m()), value, rtol=1e-5, atol=1e-7)
    assert isinstance(m.raw, nnx.Param)
    # The logit is the closed-form inverse of the sigmoid map.
    fraction = (value - low) / (high - low)
    np.testing.assert_allclose(float(m.raw[...]), math.log(fraction / (1 - fraction)), rtol=1e-5)


@pytest.mark.parametrize("value,low,high", RANGES)
def test_fixed_magnitude_is_a_plain_float_without_params(value, low, high):
    m = Magnitude(value, low=low, high=high)
    assert m() == value and isinstance(m(), float)
    assert not jax.tree.leaves(nnx.state(m, nnx.Param))


def test_bounded_stays_inside_range_for_any_logit():
    raw = jnp.asarray([-1e4, -30.0, 0.0, 30.0, 1e4])
    values = np.asarray(bounded(raw, 0.5, 2.0))
    assert np.all(values >= 0.5) and np.all(values <= 2.0)
    np.testing.assert_allclose(values[2], 1.25)


def test_gradient_matches_sigmoid_derivative():
    m = Magnitude(0.3, high=2.0, learnable=True)
    grad = nnx.grad(lambda mod: mod())(m)
    s = 0.3 / 2.0
    np.testing.assert_allclose(float(grad["raw"][...]), 2.0 * s * (1 - s), rtol=1e-5)


def test_x64_magnitude_is_float64():
    with float64_on_cpu():
        m = Magnitude(0.25, high=1.0, learnable=True)
        assert m.raw[...].dtype == jnp.float64
        np.testing.assert_allclose(float(m()), 0.25, rtol=1e-14)


def test_reparameterised_draws_scale_with_magnitude():
    key = jax.random.key(3)

    @jax.jit
    def draws(magnitude):
        return (signed_uniform(key, 1.0, (1000,)), signed_uniform(key, magnitude, (1000,)),
                jax.grad(lambda m: jnp.sum(signed_uniform(key, m, (1000,))))(magnitude),
                uniform(key, 2.0, 3.0, (1000,)))

    unit, scaled, grad, lo_hi = draws(0.25)
    np.testing.assert_allclose(scaled, 0.25 * unit, rtol=1e-6)
    assert float(jnp.min(unit)) >= -1.0 and float(jnp.max(unit)) < 1.0
    np.testing.assert_allclose(float(grad), float(jnp.sum(unit)), rtol=1e-5)
    assert float(jnp.min(lo_hi)) >= 2.0 and float(jnp.max(lo_hi)) < 3.0


@dataclasses.dataclass(frozen=True)
class _Config:
    degrees: float = 10.0
    translate: float = 0.0
    learnable: object = False


def test_magnitudes_builds_learnable_subset():
    bounds = {"degrees": (0.0, 180.0), "translate": (0.0, 1.0)}
    mags = magnitudes(_Config(learnable=("degrees",)), bounds, owner="AffineConfig")
    assert mags["degrees"].learnable and not mags["translate"].learnable
    np.testing.assert_allclose(float(mags["degrees"]()), 10.0, rtol=1e-5)
    assert mags["translate"]() == 0.0
    assert learnable_names(True, list(bounds), owner="X") == frozenset(bounds)
    assert learnable_names(False, list(bounds), owner="X") == frozenset()
    assert check_learnable_field(["degrees"], "X") == ("degrees",)


ERRORS = [
    (lambda: Magnitude(0.0, high=1.0, learnable=True, name="max_delta"),
     ValueError, r"learnable max_delta must lie strictly inside \(0.0, 1.0\), got 0.0"),
    (lambda: inverse_bounded(1.0, 0.0, 1.0, name="p"), ValueError, r"strictly inside \(0.0, 1.0\), got 1.0"),
    (lambda: Magnitude(2.0, high=1.0, name="sigma"), ValueError, r"sigma must lie in \[0.0, 1.0\], got 2.0"),
    (lambda: Magnitude(float("nan"), high=1.0, name="sigma"), TypeError, r"sigma must be a finite number, got nan"),
    (lambda: learnable_names(("shear",), ["degrees"], owner="RotationConfig"),
     ValueError, r"RotationConfig.learnable names \['shear'\].*choose from \['degrees'\]"),
    (lambda: learnable_names("degrees", ["degrees"], owner="RotationConfig"),
     TypeError, r"RotationConfig.learnable must be True, False or a tuple of field names, got 'degrees'"),
    (lambda: check_learnable_field(1, "BrightnessConfig"),
     TypeError, r"BrightnessConfig.learnable must be True, False or a tuple of field names, got 1"),
    (lambda: magnitudes(_Config(translate=0.0, learnable=True), {"degrees": (0.0, 180.0), "translate": (0.0, 1.0)},
                        owner="AffineConfig"),
     ValueError, r"learnable AffineConfig.translate must lie strictly inside"),
]


@pytest.mark.parametrize("make,error,match", ERRORS)
def test_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


TANH_STARTS = [(0.0, 180.0), (10.0, 180.0), (170.0, 180.0), (0.3, 1.0)]


@pytest.mark.parametrize("value,high", TANH_STARTS)
def test_tanh_magnitude_starts_anywhere_below_its_bound_with_a_gradient(value, high):
    m = Magnitude(value, high=high, learnable=True, parameterisation="tanh")
    np.testing.assert_allclose(float(m()), value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(m.raw[...]), math.atanh(value / high), rtol=1e-6, atol=1e-7)
    grad = float(jax.grad(lambda raw: high * jnp.tanh(raw))(m.raw[...]))
    # Near saturation the derivative 1 - t^2 amplifies tanh's own relative error (about 1e-5 on a
    # TPU, 1e-7 on a CPU) by 2 t^2 / (1 - t^2): 16x at 170 of 180.
    t = value / high
    np.testing.assert_allclose(grad, high * (1 - t**2), rtol=1e-5 * max(1.0, 2 * t**2 / (1 - t**2)))
    assert grad > 0  # at 0 too: the sigmoid's would vanish at its bound
    m.raw[...] = -m.raw[...]  # a negative raw value is the same spread: value() is its size
    np.testing.assert_allclose(float(m.value()), value, rtol=1e-5, atol=1e-6)
    assert abs(float(m())) <= high


TRIANGLE_STARTS = [(0.0, 180.0), (10.0, 180.0), (170.0, 180.0), (180.0, 180.0), (0.3, 1.0)]


@pytest.mark.parametrize("value,high", TRIANGLE_STARTS)
def test_triangle_magnitude_starts_anywhere_up_to_its_bound_with_the_same_gradient(value, high):
    m = Magnitude(value, high=high, learnable=True, parameterisation="triangle")
    np.testing.assert_allclose(float(m()), value, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(float(m.raw[...]), value / high, rtol=1e-7)
    grad = _raw_gradient(m)
    # high everywhere below the bound (tanh's shrinks to 1 - t^2 of it); at the bound the wave turns back.
    assert grad == pytest.approx(high if value < high else -high, rel=1e-6)
    m.raw[...] = -m.raw[...]  # a negative raw value is the same spread
    np.testing.assert_allclose(float(m.value()), value, rtol=1e-6, atol=1e-6)


def _raw_gradient(m: Magnitude) -> float:
    """d m() / d raw, through the module itself."""
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)
    grads = jax.grad(lambda p: nnx.merge(graphdef, p, rest)())(params)
    return float(jax.tree.leaves(grads)[0])


def test_triangle_is_the_reflected_wave_everywhere():
    """Against an independent formula, `(2 / pi) asin(sin(pi r / 2))` in float64: linear on [-1, 1], reflected at
    the bounds, periodic; never outside [-high, high]; its gradient is +-high wherever it is smooth."""
    raws = np.linspace(-7.3, 7.3, 1001)
    raws = raws[np.abs(np.mod(raws + 1.0, 2.0) - 1.0) > 1e-3]  # off the turning points (odd integers)
    m = Magnitude(0.0, high=40.0, learnable=True, parameterisation="triangle")
    values, grads = [], []
    for raw in raws:
        m.raw[...] = jnp.asarray(raw, jnp.float32)
        values.append(float(m()))
        grads.append(_raw_gradient(m))
    reference = 40.0 * (2.0 / np.pi) * np.arcsin(np.sin(np.pi * raws.astype(np.float32).astype(np.float64) / 2.0))
    np.testing.assert_allclose(values, reference, atol=40.0 * 4e-6)
    slope = 40.0 * np.sign(np.cos(np.pi * raws / 2.0))
    np.testing.assert_array_equal(grads, slope)
    assert max(abs(v) for v in values) <= 40.0


@pytest.mark.parametrize("make,match", [
    (lambda: Magnitude(0.5, low=0.1, high=1.0, learnable=True, parameterisation="tanh"), "range starts at 0"),
    (lambda: Magnitude(0.5, low=0.1, high=1.0, learnable=True, parameterisation="triangle"), "range starts at 0"),
    (lambda: Magnitude(181.0, high=180.0, learnable=True, parameterisation="triangle"), r"must lie in \[0.0, 180"),
    (lambda: Magnitude(180.0, high=180.0, learnable=True, parameterisation="tanh"), r"must lie in \[0, 180.0\)"),
    (lambda: Magnitude(1.0, high=2.0, learnable=True, parameterisation="cosine"), "must be one of"),
])
def test_tanh_magnitude_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("kind", ["tanh", "triangle"])
def test_signed_operators_hold_only_spreads_of_stochastic_draws(kind):
    from datarax.operators.audio import GainOperator
    from datarax.operators.image import AffineOperator, CutoutOperator, RotationOperator

    op = AffineOperator(degrees=0.0, translate=0.0, scale=0.0, learnable=("degrees", "translate", "scale"),
                        parameterisation=kind)
    assert {k: float(m.value()) for k, m in op.magnitudes.items() if m.learnable} == {
        "degrees": 0.0, "translate": 0.0, "scale": 0.0}
    assert op.structure().endswith(f"[{kind}]") and kind not in RotationOperator(degrees=5.0).structure()
    with pytest.raises(ValueError, match=r"\['gain_db'\] are learnable too and are not spreads"):
        GainOperator(gain_db=0.0, max_delta_db=3.0, learnable=True, parameterisation=kind, field="audio")
    with pytest.raises(ValueError, match=f"parameterisation='{kind}'\\) needs stochastic=True"):
        RotationOperator(degrees=5.0, learnable=True, parameterisation=kind, stochastic=False)
    with pytest.raises(ValueError, match="its spreads: \\[\\]"):
        CutoutOperator(size=0.2, learnable=True, parameterisation=kind)
    with pytest.raises(ValueError, match="has no learnable magnitude"):
        RotationOperator(degrees=5.0, parameterisation=kind)
