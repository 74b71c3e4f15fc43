"""`recipes.augerino.AffineLieOperator`: Augerino's six-generator affine policy against scipy.

The reference is written here from the paper's description (Benton et al. 2020, eq. 9, and the
reference `UniformAug`), in numpy: `scipy.linalg.expm` of the generator sum, read as the map from
each output position to the input position it samples, in normalised coordinates (-1 and 1 at the
edge pixels' centres), and `scipy.ndimage.map_coordinates` for the bilinear samples.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.ndimage
from flax import nnx

from datarax.operators.image.functional import geometry
from recipes.augerino import (
    AFFINE_GENERATORS,
    AUTHORS_START,
    AffineLieConfig,
    AffineLieOperator,
    AugmentationPolicy,
)

# The generators as the paper lists them, on (x, y, 1): tx, ty (scaled by trans_scale 0.1), rotation,
# uniform scale, stretch, shear.
REFERENCE_GENERATORS = np.zeros((6, 3, 3))
REFERENCE_GENERATORS[0, 0, 2] = REFERENCE_GENERATORS[1, 1, 2] = 0.1
REFERENCE_GENERATORS[2, 0, 1], REFERENCE_GENERATORS[2, 1, 0] = -1.0, 1.0
REFERENCE_GENERATORS[3, 0, 0] = REFERENCE_GENERATORS[3, 1, 1] = 1.0
REFERENCE_GENERATORS[4, 0, 0], REFERENCE_GENERATORS[4, 1, 1] = 1.0, -1.0
REFERENCE_GENERATORS[5, 0, 1] = REFERENCE_GENERATORS[5, 1, 0] = 1.0


def reference_warp(image: np.ndarray, coefficients: np.ndarray, fill: float) -> np.ndarray:
    height, width = image.shape[:2]
    matrix = scipy.linalg.expm(np.tensordot(coefficients, REFERENCE_GENERATORS, axes=1))
    ys, xs = np.mgrid[:height, :width].astype(np.float64)
    unit = np.stack([2 * xs / (width - 1) - 1, 2 * ys / (height - 1) - 1, np.ones_like(xs)])
    src = np.tensordot(matrix, unit, axes=1)
    src_x, src_y = (src[0] + 1) * (width - 1) / 2, (src[1] + 1) * (height - 1) / 2
    return np.stack([scipy.ndimage.map_coordinates(image[..., c].astype(np.float64), [src_y, src_x], order=1,
                                                   mode="grid-constant", cval=fill)
                     for c in range(image.shape[-1])], axis=-1)


def fixed(coefficients, fill: float = 0.0) -> AffineLieOperator:
    """A deterministic operator that applies exactly `coefficients`, given as signed values."""
    op = AffineLieOperator(AffineLieConfig(field="image", stochastic=False, fill=fill,
                                           **{n: abs(float(c)) for n, c in zip(AFFINE_GENERATORS, coefficients)}))
    return op


CASES = {
    **{f"{name}{sign:+d}": np.eye(6)[i] * sign * value
       for i, (name, value) in enumerate(zip(AFFINE_GENERATORS, (2.5, 2.5, 0.7, 0.3, 0.25, 0.2)))
       for sign in (1, -1)},
    "all, small": np.array([0.4, -0.6, 0.2, 0.05, -0.04, 0.03]),
    "all, large": np.array([-3.0, 2.0, -2.4, -0.3, 0.2, -0.25]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_warp_matches_scipy_expm_and_bilinear_sampling(case):
    coefficients = CASES[case]
    rng = np.random.default_rng(0)
    image = rng.random((11, 15, 2)).astype(np.float32)  # not square, two channels: the axes cannot swap unseen
    op = fixed(coefficients, fill=0.25)
    # A fixed operator applies the configured (non-negative) widths; pass the signed coefficients directly.
    got = np.asarray(op.apply(jnp.asarray(image), {"coefficients": jnp.asarray(coefficients, jnp.float32)}))
    np.testing.assert_allclose(got, reference_warp(image, coefficients, 0.25), atol=2e-5)


@pytest.mark.parametrize("radians", [0.3, -0.3, 1.2, -2.9])
def test_rotation_alone_is_geometry_rotate_by_the_angle(radians):
    # On a square image the rotation generator is a true rotation: with y pointing down and the map
    # read output -> input, a positive coefficient turns the content counter-clockwise, datarax's
    # (PIL's, scikit-image's) sense of a positive angle.
    image = np.random.default_rng(1).random((13, 13, 1)).astype(np.float32)
    coefficients = np.array([0, 0, radians, 0, 0, 0], np.float32)
    got = fixed(coefficients).apply(jnp.asarray(image), {"coefficients": jnp.asarray(coefficients)})
    want = geometry.rotate(jnp.asarray(image), math.degrees(radians))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)


def test_the_draws_lie_within_each_width_and_fill_it():
    widths = {"translate_x": 3.0, "translate_y": 0.5, "rotation": 1.0, "scale": 0.2, "stretch": 0.05, "shear": 0.4}
    op = AffineLieOperator(AffineLieConfig(field="image", **widths), rngs=nnx.Rngs(augment=0))
    keys = jax.random.split(jax.random.key(3), 2000)
    draws = np.asarray(jax.vmap(lambda k: op.draw(k, (8, 8, 1))["coefficients"])(keys))
    bound = np.array([widths[n] for n in AFFINE_GENERATORS])
    assert np.all(np.abs(draws) <= bound)
    assert np.all(draws.max(0) > 0.95 * bound) and np.all(draws.min(0) < -0.95 * bound)
    # Independent coordinates: the draws of two generators are uncorrelated.
    assert np.abs(np.corrcoef(draws.T)[np.triu_indices(6, 1)]).max() < 0.1


def test_every_width_gets_a_gradient_through_the_warp():
    image = jnp.asarray(np.random.default_rng(2).random((12, 12, 1)), jnp.float32)
    op = AffineLieOperator(AffineLieConfig(field="image", learnable=True, **{n: 0.2 for n in AFFINE_GENERATORS}),
                           rngs=nnx.Rngs(augment=0))
    weights = jnp.asarray(np.random.default_rng(3).standard_normal(image.shape), jnp.float32)
    graph, params, rest = nnx.split(op, nnx.Param, ...)

    def objective(params):
        model = nnx.merge(graph, params, rest)
        return jnp.sum(weights * model.apply(image, model.draw(jax.random.key(5), image.shape)))

    grads = jax.grad(objective)(params)
    for name in AFFINE_GENERATORS:
        value = grads["magnitudes"][name]["raw"][...]
        assert np.isfinite(value) and abs(float(value)) > 1e-6, name


def test_the_authors_start_and_the_policy_names():
    softplus = np.log1p(np.exp([-5.0, 1.0])) / 2  # the reference's raw widths, read as full widths
    assert AUTHORS_START["rotation"] == pytest.approx(softplus[1], rel=1e-6)
    assert math.degrees(AUTHORS_START["rotation"]) == pytest.approx(37.62, abs=0.01)
    for name in set(AFFINE_GENERATORS) - {"rotation"}:
        assert AUTHORS_START[name] == pytest.approx(softplus[0], rel=1e-6)
    op = AffineLieOperator(AffineLieConfig(field="image", learnable=True, **AUTHORS_START), rngs=nnx.Rngs(augment=0))
    policy = AugmentationPolicy([op], units={f"AffineLie.{n}": 1.0 for n in AFFINE_GENERATORS})
    values = {k: float(v) for k, v in policy.values().items()}
    assert values == pytest.approx({f"AffineLie.{n}": v for n, v in AUTHORS_START.items()}, rel=1e-5)


@pytest.mark.parametrize(("name", "value"), [("rotation", 3.5), ("scale", -0.1), ("translate_x", 10.5)])
def test_a_width_outside_its_bound_is_refused_by_name(name, value):
    with pytest.raises(ValueError, match=name):
        AffineLieConfig(field="image", **{name: value})
