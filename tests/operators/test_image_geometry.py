"""Geometry operators against numpy (flips, crops), PIL (resize, resized crop) and scikit-image
(rotation, affine, translate) on fixed inputs.

Flips, crops, resizing and translation run in both formulations (`formulation` fixture: per
record, and the batch formulation a TPU runs). Tolerances: numpy references are exact (atol 0).
PIL is run in float mode ("F") per channel and scikit-image in float64, so both allow 1e-5 (our
float32 arithmetic); on a TPU each of an image's two resampling passes may add the precision
policy's bound for a weighted sum (`datarax.operators.precision`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from image_helpers import run
from PIL import Image
from skimage import transform as sktransform

from datarax.operators.image import (
    AffineConfig,
    AffineOperator,
    HorizontalFlipConfig,
    HorizontalFlipOperator,
    RandomCropConfig,
    RandomCropOperator,
    RandomResizedCropConfig,
    RandomResizedCropOperator,
    ResizeConfig,
    ResizeOperator,
    RotationConfig,
    RotationOperator,
    TranslateConfig,
    TranslateOperator,
    VerticalFlipConfig,
    VerticalFlipOperator,
)
from datarax.operators.precision import WEIGHTED_SUM

ATOL = 1e-5 if jax.default_backend() == "cpu" else 1e-5 + 2 * WEIGHTED_SUM.bound
BATCH = 4


def images(seed=0, shape=(BATCH, 9, 12, 2)):
    return np.random.default_rng(seed).random(shape).astype(np.float32)


def pil_resize(channel, size, box=None):
    """PIL bilinear resize of one float channel to size (height, width)."""
    return np.asarray(Image.fromarray(channel, mode="F").resize((size[1], size[0]), Image.BILINEAR, box=box))


@pytest.mark.parametrize("op_class,config_class,np_flip", [(HorizontalFlipOperator, HorizontalFlipConfig, np.fliplr),
                                                           (VerticalFlipOperator, VerticalFlipConfig, np.flipud)])
def test_flips_match_numpy(op_class, config_class, np_flip, formulation):
    x = images(1, (16, 5, 6, 3))
    out, params = run(op_class(config_class(p=0.5), rngs=nnx.Rngs(0)), x)
    chosen = np.asarray(params["apply"])
    assert 0 < chosen.sum() < len(x)
    for i in range(len(x)):
        np.testing.assert_array_equal(out[i], np_flip(x[i]) if chosen[i] else x[i])
    fixed = op_class(config_class(stochastic=False))
    np.testing.assert_array_equal(fixed.apply(jnp.asarray(x[0]), fixed.draw(None, x.shape[1:])), np_flip(x[0]))


# "edge" and "symmetric" reach jnp.pad the same way as "reflect"; two modes keep compile time down
# (the batch formulation's index maps are swept over every mode in test_image_batched.py).
@pytest.mark.parametrize("pad_mode", ["constant", "reflect"])
def test_random_crop_matches_numpy_pad_and_slice(pad_mode, formulation):
    x = images(2)
    config = RandomCropConfig(size=(7, 10), padding=3, pad_mode=pad_mode, fill=0.5)
    out, params = run(RandomCropOperator(config, rngs=nnx.Rngs(3)), x)
    kwargs = {"constant_values": 0.5} if pad_mode == "constant" else {}
    for i, (top, left) in enumerate(zip(np.asarray(params["top"]), np.asarray(params["left"]))):
        assert 0 <= top <= 9 + 6 - 7 and 0 <= left <= 12 + 6 - 10
        padded = np.pad(x[i], ((3, 3), (3, 3), (0, 0)), mode=pad_mode, **kwargs)
        np.testing.assert_array_equal(out[i], padded[top:top + 7, left:left + 10])


def test_random_crop_offsets_cover_the_range_and_centre_crop_when_fixed(formulation):
    x = images(3, (64, 6, 6, 1))
    _, params = run(RandomCropOperator(RandomCropConfig(size=4, padding=1), rngs=nnx.Rngs(0)), x)
    assert set(np.asarray(params["top"]).tolist()) == {0, 1, 2, 3, 4}  # 6 + 2 * 1 - 4 + 1 offsets
    centred = RandomCropOperator(RandomCropConfig(size=4, stochastic=False))
    out = centred.apply(jnp.asarray(x[0]), centred.draw(None, x.shape[1:]))
    np.testing.assert_array_equal(out, x[0, 1:5, 1:5])


@pytest.mark.parametrize("size", [(5, 7), (20, 10)])
def test_resize_matches_pil_bilinear(size, formulation):
    x = images(4)
    out, _ = run(ResizeOperator(ResizeConfig(size=size)), x)
    for i in range(BATCH):
        ref = np.stack([pil_resize(x[i, ..., c], size) for c in range(x.shape[-1])], axis=-1)
        np.testing.assert_allclose(out[i], ref, atol=ATOL)


def test_random_resized_crop_matches_pil_box_resize(formulation):
    size = (6, 6)  # boxes of 4.6 to 9.8 pixels a side: both enlarged and shrunk
    x = images(5, (8, 9, 12, 2))
    config = RandomResizedCropConfig(size=size, scale=(0.2, 0.9), ratio=(0.5, 2.0))
    out, params = run(RandomResizedCropOperator(config, rngs=nnx.Rngs(1)), x)
    boxes = np.asarray(params["box"], np.float64)
    for i, (top, left, h, w) in enumerate(boxes):
        assert 0 <= top and top + h <= 9 + 1e-4 and 0 <= left and left + w <= 12 + 1e-4
        assert h * w <= 0.9 * 9 * 12 * (1 + 1e-5)
        unclamped = h < 9 - 1e-4 and w < 12 - 1e-4
        if unclamped:
            assert 0.2 * 9 * 12 * (1 - 1e-5) <= h * w and 0.5 - 1e-4 <= w / h <= 2.0 + 1e-4
        box = (float(left), float(top), float(left + w), float(top + h))
        ref = np.stack([pil_resize(x[i, ..., c], size, box) for c in range(2)], axis=-1)
        np.testing.assert_allclose(out[i], ref, atol=ATOL)


def test_rotation_matches_skimage():
    fill = 0.7
    x = images(6)
    out, params = run(RotationOperator(RotationConfig(degrees=90.0, fill=fill), rngs=nnx.Rngs(2)), x)
    for i, angle in enumerate(np.asarray(params["angle"])):
        ref = sktransform.rotate(x[i].astype(np.float64), float(angle), order=1, mode="constant", cval=fill)
        np.testing.assert_allclose(out[i], ref, atol=ATOL)
    fixed, _ = run(RotationOperator(RotationConfig(degrees=30.0, stochastic=False)), x[:1])
    np.testing.assert_allclose(fixed[0], sktransform.rotate(x[0].astype(np.float64), 30.0, order=1), atol=ATOL)


def forward_affine(angle, dx, dy, scale, shear, center):
    """The forward (source -> output) 3x3 matrix, composed independently in numpy."""
    def move(tx, ty):
        return np.array([[1, 0, tx], [0, 1, ty], [0, 0, 1.0]])
    t = np.deg2rad(angle)
    rot = np.array([[np.cos(t), np.sin(t), 0], [-np.sin(t), np.cos(t), 0], [0, 0, 1]])
    shear_m = np.array([[1, np.tan(np.deg2rad(shear)), 0], [0, 1, 0], [0, 0, 1]])
    zoom = np.diag([scale, scale, 1.0])
    cx, cy = center
    return move(cx + dx, cy + dy) @ rot @ shear_m @ zoom @ move(-cx, -cy)


def test_affine_matches_skimage_warp():
    x = images(7)
    config = AffineConfig(degrees=40.0, translate=0.2, scale=0.3, shear=20.0, fill=0.25)
    out, params = run(AffineOperator(config, rngs=nnx.Rngs(4)), x)
    center = ((12 - 1) / 2, (9 - 1) / 2)
    for i in range(BATCH):
        p = {k: float(v[i]) for k, v in params.items()}
        assert abs(p["angle"]) <= 40 and abs(p["dx"]) <= 0.2 * 12 and abs(p["dy"]) <= 0.2 * 9
        assert abs(p["scale"] - 1) <= 0.3 and abs(p["shear"]) <= 20
        forward = forward_affine(p["angle"], p["dx"], p["dy"], p["scale"], p["shear"], center)
        inverse = sktransform.ProjectiveTransform(matrix=np.linalg.inv(forward))
        ref = sktransform.warp(x[i].astype(np.float64), inverse, order=1, mode="constant", cval=0.25)
        np.testing.assert_allclose(out[i], ref, atol=ATOL)


def test_translate_matches_skimage_and_integer_shift_matches_numpy(formulation):
    x = images(8)
    out, params = run(TranslateOperator(TranslateConfig(translate=0.3), rngs=nnx.Rngs(5)), x)
    for i in range(BATCH):
        dx, dy = float(params["dx"][i]), float(params["dy"][i])
        shift = sktransform.EuclideanTransform(translation=(-dx, -dy))
        ref = sktransform.warp(x[i].astype(np.float64), shift, order=1, mode="constant", cval=0.0)
        np.testing.assert_allclose(out[i], ref, atol=ATOL)
    op = TranslateOperator(TranslateConfig(translate=0.5, stochastic=False, fill=0.5))
    out, _ = run(op, x[:1])  # shifts right by 6 and down by 4.5: check the whole-pixel axis
    shifted_x = np.full_like(x[0], 0.5)
    shifted_x[:, 6:] = x[0][:, :6]
    np.testing.assert_allclose(out[0][5:, :], (0.5 * shifted_x[:4] + 0.5 * shifted_x[1:5]), atol=ATOL)


ERRORS = [
    (lambda: RandomCropConfig(size=(0, 4)), ValueError,
     r"RandomCropConfig.size must be a positive int or a \(height, width\)"),
    (lambda: RandomCropConfig(padding=-1), ValueError, r"RandomCropConfig.padding must be an int >= 0, got -1"),
    (lambda: RandomCropConfig(pad_mode="wrap"), ValueError, r"pad_mode must be one of .*got 'wrap'"),
    (lambda: RandomResizedCropConfig(scale=(0.5, 0.2)), ValueError,
     r"scale must be a pair \(a, b\) with 0.0 < a <= b <= 1.0"),
    (lambda: RandomResizedCropConfig(stochastic=False), ValueError, r"stochastic=False\) has nothing to do"),
    (lambda: RotationConfig(degrees=200.0), ValueError, r"RotationConfig.degrees must be in \[0.0, 180.0\], got 200.0"),
    (lambda: AffineConfig(scale=0.95), ValueError, r"AffineConfig.scale must be in \[0.0, 0.9\], got 0.95"),
    (lambda: HorizontalFlipConfig(p=1.5), ValueError, r"HorizontalFlipConfig.p must be in \[0.0, 1.0\], got 1.5"),
    (lambda: AffineOperator(AffineConfig(degrees=10.0, learnable=True), rngs=nnx.Rngs(0)), ValueError,
     r"learnable AffineConfig.translate must lie strictly inside"),
    (lambda: HorizontalFlipOperator(HorizontalFlipConfig(learnable=True), rngs=nnx.Rngs(0)), ValueError,
     r"HorizontalFlipConfig\(learnable=True\): HorizontalFlipOperator has no continuous magnitude"),
    (lambda: RandomCropOperator(RandomCropConfig(learnable=("padding",)), rngs=nnx.Rngs(0)), ValueError,
     r"RandomCropConfig.learnable names \['padding'\], which are not learnable magnitudes"),
]


@pytest.mark.parametrize("make,error,match", ERRORS)
def test_config_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_crop_larger_than_padded_image_names_the_fix():
    op = RandomCropOperator(RandomCropConfig(size=12, padding=1), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"size \(12, 12\) is larger than the padded image \(11, 11\); lower size"):
        run(op, images(0, (1, 9, 9, 1)))
