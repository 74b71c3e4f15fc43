"""Noise, blur, cutout and patch dropout against numpy and scikit-image on fixed inputs.

Tolerances: scikit-image's Gaussian filter runs in float64, so blur allows 1e-5 (our float32
arithmetic; on a TPU each of its two passes may add the precision policy's bound for a weighted
sum). The numpy references for noise, cutout and patch dropout compute the same quantities
independently in float64 and allow 1e-6.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from image_helpers import run
from skimage import filters as skfilters

from datarax.operators.image import (
    CutoutConfig,
    CutoutOperator,
    GaussianBlurConfig,
    GaussianBlurOperator,
    GaussianNoiseConfig,
    GaussianNoiseOperator,
    PatchDropoutConfig,
    PatchDropoutOperator,
)
from datarax.operators.image.functional import filters
from datarax.operators.precision import WEIGHTED_SUM

BATCH = 4


def images(seed=0, shape=(BATCH, 10, 12, 2)):
    return np.random.default_rng(seed).random(shape).astype(np.float32)


def test_gaussian_noise_adds_sigma_times_the_record_normal_draw():
    x = images(1, (BATCH, 16, 16, 3))
    op = GaussianNoiseOperator(GaussianNoiseConfig(sigma=0.1, clip=False), rngs=nnx.Rngs(0))
    out, params = run(op, x)
    normals = np.asarray(params["noise"], np.float64)
    np.testing.assert_allclose(out, x + 0.1 * normals, atol=1e-6)
    # The draws are standard normal, so the added noise has mean 0 and std sigma.
    noise = (out - x).ravel()
    assert abs(noise.mean()) < 0.01 and abs(noise.std() - 0.1) < 0.01
    clipped = np.asarray(filters.gaussian_noise(jnp.asarray(x), jnp.asarray(normals, jnp.float32), 0.5))
    np.testing.assert_allclose(clipped, np.clip(x + 0.5 * normals, 0, 1), atol=1e-6)


@pytest.mark.parametrize("kernel_size", [3, 7])
def test_gaussian_blur_matches_skimage(kernel_size):
    x = images(2)
    radius = kernel_size // 2
    op = GaussianBlurOperator(GaussianBlurConfig(sigma=2.0, min_sigma=0.3, kernel_size=kernel_size), rngs=nnx.Rngs(1))
    out, params = run(op, x)
    for i, sigma in enumerate(np.asarray(params["sigma"], np.float64)):
        assert 0.3 <= sigma <= 2.0
        # skimage's radius is int(truncate * sigma + 0.5): truncate = radius / sigma gives ours.
        ref = skfilters.gaussian(x[i].astype(np.float64), sigma=sigma, mode="reflect", truncate=radius / sigma,
                                 channel_axis=-1, preserve_range=True)
        np.testing.assert_allclose(out[i], ref, atol=1e-5 if jax.default_backend() == "cpu" else
                                   1e-5 + 2 * WEIGHTED_SUM.bound)


def coverage_reference(shape, centers, side):
    """Per-pixel area covered by the union of square holes, by explicit interval overlaps."""
    keep = np.ones(shape)
    for cy, cx in centers:
        for i in range(shape[0]):
            for j in range(shape[1]):
                oy = max(0.0, min(i + 1, cy + side / 2) - max(i, cy - side / 2))
                ox = max(0.0, min(j + 1, cx + side / 2) - max(j, cx - side / 2))
                keep[i, j] *= 1 - oy * ox
    return 1 - keep


def test_cutout_matches_area_coverage_reference():
    x = images(3)
    op = CutoutOperator(CutoutConfig(size=0.35, num_holes=2, fill=0.5), rngs=nnx.Rngs(2))
    out, params = run(op, x)
    for i in range(BATCH):
        centers = np.asarray(params["centers"][i], np.float64)
        assert np.all(centers >= 0) and np.all(centers <= [10, 12])
        mask = coverage_reference((10, 12), centers, 0.35 * 10)[..., None]
        np.testing.assert_allclose(out[i], x[i] * (1 - mask) + 0.5 * mask, atol=1e-6)


def test_cutout_on_pixel_edges_equals_the_hard_numpy_hole():
    x = images(4)[0]
    out = filters.cutout(jnp.asarray(x), jnp.asarray([[4.0, 6.0]]), 4.0, fill=0.0)
    ref = x.copy()
    ref[2:6, 4:8] = 0.0
    np.testing.assert_array_equal(np.asarray(out), ref)


def test_patch_dropout_matches_numpy_grid():
    x = images(5, (8, 10, 12, 1))
    out, params = run(PatchDropoutOperator(PatchDropoutConfig(patch_size=4, p=0.3, fill=0.25), rngs=nnx.Rngs(3)), x)
    dropped = np.asarray(params["dropped"])
    assert dropped.shape == (8, 3, 3) and 0 < dropped.mean() < 1
    for i in range(8):
        ref = x[i].copy()
        for r, c in zip(*np.nonzero(dropped[i])):
            ref[r * 4:(r + 1) * 4, c * 4:(c + 1) * 4] = 0.25
        np.testing.assert_array_equal(out[i], ref)


ERRORS = [
    (lambda: GaussianNoiseConfig(stochastic=False), ValueError, r"GaussianNoiseConfig\(stochastic=False\) has nothing"),
    (lambda: GaussianNoiseConfig(sigma=-0.1), ValueError, r"GaussianNoiseConfig.sigma must be in \[0.0, 1.0\]"),
    (lambda: GaussianBlurConfig(kernel_size=4), ValueError, r"kernel_size must be odd .*got 4"),
    (lambda: GaussianBlurConfig(kernel_size=0), ValueError,
     r"GaussianBlurConfig.kernel_size must be an int >= 1, got 0"),
    (lambda: GaussianBlurConfig(sigma=0.0), ValueError, r"GaussianBlurConfig.sigma must be in \(0.0, 4.0\], got 0.0"),
    (lambda: CutoutConfig(num_holes=0), ValueError, r"CutoutConfig.num_holes must be an int >= 1, got 0"),
    (lambda: PatchDropoutConfig(patch_size=2.5), ValueError, r"PatchDropoutConfig.patch_size must be an int >= 1"),
    (lambda: filters.gaussian_blur(jnp.zeros((4, 4, 1)), 1.0, 4), ValueError,
     r"radius 4 must be smaller than the image height and width \(4, 4\)"),
    (lambda: filters.patch_grid_mask((8, 8), 4, jnp.zeros((3, 2), bool)), ValueError,
     r"dropped must have shape \(2, 2\) for an image of \(8, 8\) and patch_size 4, got \(3, 2\)"),
]


@pytest.mark.parametrize("make,error,match", ERRORS)
def test_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()
