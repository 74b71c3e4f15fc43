"""Colour operators against PIL and scikit-image on fixed inputs.

Tolerances: PIL works on uint8. Its blend truncates the result to a whole level (up to 1 level
off) after rounding the grey image it blends with (contrast: the mean level; saturation: the
luma image; up to half a level times |1 - factor| <= 0.5 level here), so enhance comparisons allow
1.5/255; luma conversion and solarize round once and allow 1/255.
scikit-image works in float64, so those comparisons allow 1e-5 (our float32 arithmetic).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from image_helpers import run
from PIL import Image, ImageEnhance, ImageOps
from skimage import color as skcolor
from skimage import exposure

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.image import (
    BrightnessConfig,
    BrightnessOperator,
    ContrastConfig,
    ContrastOperator,
    GammaConfig,
    GammaOperator,
    GrayscaleConfig,
    GrayscaleOperator,
    HueConfig,
    HueOperator,
    NormalizeConfig,
    NormalizeOperator,
    SaturationConfig,
    SaturationOperator,
    SolarizeConfig,
    SolarizeOperator,
    StandardizeConfig,
    StandardizeOperator,
)
from datarax.operators.precision import WEIGHTED_SUM

PIL_ATOL = 1.0 / 255 + 1e-6
ENHANCE_ATOL = 1.5 / 255 + 1e-6
FLOAT_ATOL = 1e-5
BATCH, SIZE = 4, 8


def uint8_images(seed=0, channels=3):
    return np.random.default_rng(seed).integers(0, 256, (BATCH, SIZE, SIZE, channels), dtype=np.uint8)


ENHANCE = [(BrightnessOperator, BrightnessConfig, ImageEnhance.Brightness),
           (ContrastOperator, ContrastConfig, ImageEnhance.Contrast),
           (SaturationOperator, SaturationConfig, ImageEnhance.Color)]


@pytest.mark.parametrize("op_class,config_class,pil_enhance", ENHANCE)
def test_enhance_matches_pil_per_record(op_class, config_class, pil_enhance):
    images = uint8_images()
    op = op_class(config_class(max_delta=0.6), rngs=nnx.Rngs(1))
    out, params = run(op, images.astype(np.float32) / 255)
    factors = np.asarray(params["factor"])
    assert np.all(np.abs(factors - 1) <= 0.6) and np.ptp(factors) > 0
    for i, factor in enumerate(factors):
        ref = np.asarray(pil_enhance(Image.fromarray(images[i])).enhance(float(factor)), np.float32) / 255
        np.testing.assert_allclose(out[i], ref, atol=ENHANCE_ATOL)


@pytest.mark.parametrize("op_class,config_class,pil_enhance", ENHANCE)
def test_enhance_fixed_when_not_stochastic(op_class, config_class, pil_enhance):
    images = uint8_images(1)
    out, _ = run(op_class(config_class(max_delta=0.3, stochastic=False)), images.astype(np.float32) / 255)
    for i in range(BATCH):
        ref = np.asarray(pil_enhance(Image.fromarray(images[i])).enhance(1.3), np.float32) / 255
        np.testing.assert_allclose(out[i], ref, atol=ENHANCE_ATOL)


def test_contrast_single_channel_blends_with_mean_intensity():
    x = uint8_images(2, channels=1).astype(np.float32) / 255
    out, _ = run(ContrastOperator(ContrastConfig(max_delta=0.5, stochastic=False)), x)
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(out, np.clip(mean + 1.5 * (x - mean), 0, 1), atol=1e-6)


def test_hue_matches_skimage_hsv_round_trip():
    x = np.random.default_rng(3).random((BATCH, SIZE, SIZE, 3)).astype(np.float32)
    x[0, :2] = 0.5  # grey pixels: hue undefined, must stay grey
    out, params = run(HueOperator(HueConfig(max_delta=0.5), rngs=nnx.Rngs(0)), x)
    for i, shift in enumerate(np.asarray(params["shift"])):
        hsv = skcolor.rgb2hsv(x[i].astype(np.float64))
        hsv[..., 0] = (hsv[..., 0] + shift) % 1.0
        np.testing.assert_allclose(out[i], skcolor.hsv2rgb(hsv), atol=FLOAT_ATOL)


def test_gamma_matches_skimage():
    x = np.random.default_rng(4).random((BATCH, SIZE, SIZE, 3)).astype(np.float32)
    x[0, 0, 0] = 0.0
    out, params = run(GammaOperator(GammaConfig(max_log_gamma=1.0, gain=0.9), rngs=nnx.Rngs(0)), x)
    gammas = np.asarray(params["gamma"])
    # `x ** gamma` is exp(gamma * log x): a TPU's float32 log and exp are a few ulp off (2.7e-5 measured on a v5e)
    atol = FLOAT_ATOL if jax.default_backend() == "cpu" else 5e-5
    assert np.all((gammas >= np.exp(-1) - 1e-6) & (gammas <= np.e + 1e-6))
    for i, gamma in enumerate(gammas):
        np.testing.assert_allclose(out[i], exposure.adjust_gamma(x[i].astype(np.float64), gamma, 0.9), atol=atol)


@pytest.mark.parametrize("keep_channels", [True, False])
def test_grayscale_matches_pil_convert_l(keep_channels):
    images = uint8_images(5)
    out, _ = run(GrayscaleOperator(GrayscaleConfig(keep_channels=keep_channels)), images.astype(np.float32) / 255)
    assert out.shape[-1] == (3 if keep_channels else 1)
    for i in range(BATCH):
        ref = np.asarray(Image.fromarray(images[i]).convert("L"), np.float32)[..., None] / 255
        np.testing.assert_allclose(out[i], np.broadcast_to(ref, out[i].shape), atol=PIL_ATOL)


def test_random_grayscale_converts_exactly_the_drawn_records():
    x = np.random.default_rng(6).random((16, 4, 4, 3)).astype(np.float32)
    out, params = run(GrayscaleOperator(GrayscaleConfig(p=0.5, stochastic=True), rngs=nnx.Rngs(0)), x)
    chosen = np.asarray(params["apply"])
    assert 0 < chosen.sum() < 16
    luma = (x @ np.array([0.299, 0.587, 0.114], np.float32))[..., None]
    expected = np.where(chosen[:, None, None, None], np.broadcast_to(luma, x.shape), x)
    # On a TPU the luma is a weighted sum at the precision policy's bound (datarax.operators.precision).
    np.testing.assert_allclose(out, expected, atol=1e-6 if jax.default_backend() == "cpu" else WEIGHTED_SUM.bound)


def test_solarize_matches_pil():
    images = uint8_images(7)
    out, _ = run(SolarizeOperator(SolarizeConfig(threshold=128 / 255)), images.astype(np.float32) / 255)
    for i in range(BATCH):
        ref = np.asarray(ImageOps.solarize(Image.fromarray(images[i]), threshold=128), np.float32) / 255
        np.testing.assert_allclose(out[i], ref, atol=1e-6)


def test_soft_solarize_is_sigmoid_blend_and_tends_to_hard():
    x = np.random.default_rng(8).random((BATCH, SIZE, SIZE, 3)).astype(np.float32)
    soft, _ = run(SolarizeOperator(SolarizeConfig(threshold=0.4, softness=0.05)), x)
    weight = 1 / (1 + np.exp(-(x - 0.4) / 0.05))
    np.testing.assert_allclose(soft, x + weight * (1 - 2 * x), atol=1e-6)
    sharp, _ = run(SolarizeOperator(SolarizeConfig(threshold=0.4, softness=1e-5)), x)
    away = np.abs(x - 0.4) > 1e-3
    np.testing.assert_allclose(sharp[away], np.where(x >= 0.4, 1 - x, x)[away], atol=1e-6)


def test_normalize_and_standardize_match_numpy():
    x = np.random.default_rng(9).random((BATCH, SIZE, SIZE, 3)).astype(np.float32)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    out, _ = run(NormalizeOperator(NormalizeConfig(mean=mean, std=std)), x)
    np.testing.assert_allclose(out, (x - np.array(mean)) / np.array(std), rtol=1e-5, atol=1e-6)
    x[0] = 0.25  # a flat image: the std floor 1/sqrt(N) keeps it finite
    out, _ = run(StandardizeOperator(StandardizeConfig()), x)
    flat = x.reshape(BATCH, -1)
    ref_std = np.maximum(flat.std(axis=1), 1 / np.sqrt(flat.shape[1]))
    np.testing.assert_allclose(out.reshape(BATCH, -1), (flat - flat.mean(1, keepdims=True)) / ref_std[:, None],
                               atol=1e-5)


ERRORS = [
    (lambda: BrightnessConfig(max_delta=1.5), ValueError,
     r"BrightnessConfig.max_delta must be in \[0.0, 1.0\], got 1.5"),
    (lambda: ContrastConfig(max_delta="big"), TypeError, r"ContrastConfig.max_delta must be a number in \[0.0, 1.0\]"),
    (lambda: HueConfig(max_delta=0.6), ValueError, r"HueConfig.max_delta must be in \[0.0, 0.5\], got 0.6"),
    (lambda: GammaConfig(gain=0.0), ValueError, r"GammaConfig.gain must be in \(0.0, 10.0\], got 0.0"),
    (lambda: GrayscaleConfig(keep_channels=False, stochastic=True), ValueError,
     r"keep_channels=False\) changes the channel count"),
    (lambda: SolarizeConfig(learnable=True), ValueError, r"needs softness > 0"),
    (lambda: NormalizeConfig(mean=(0.5,), std=(0.0,)), ValueError, r"std > 0, got mean=\(0.5,\), std=\(0.0,\)"),
    (lambda: NormalizeConfig(mean="x"), ValueError, r"NormalizeConfig.mean must be a tuple of numbers"),
    (lambda: BrightnessConfig(field=""), ValueError, r"BrightnessConfig.field must be a non-empty field name"),
    (lambda: BrightnessOperator(ContrastConfig()), TypeError, r"BrightnessOperator config must be a BrightnessConfig"),
]


@pytest.mark.parametrize("make,error,match", ERRORS)
def test_config_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


RUN_ERRORS = [
    (BrightnessOperator(BrightnessConfig(stochastic=False, field="img")), {"image": np.zeros((1, 4, 4, 3), np.float32)},
     KeyError, r"reads field 'img', but the record has fields \['image'\]"),
    (BrightnessOperator(BrightnessConfig(stochastic=False)), {"image": np.zeros((1, 4, 4, 3), np.uint8)},
     TypeError, r"expects a float image in \[0, 1\] in field 'image', got dtype uint8"),
    (BrightnessOperator(BrightnessConfig(stochastic=False)), {"image": np.zeros((1, 4, 4), np.float32)},
     ValueError, r"one HWC image per record"),
    (SaturationOperator(SaturationConfig(stochastic=False)), {"image": np.zeros((1, 4, 4, 1), np.float32)},
     ValueError, r"SaturationOperator needs 3-channel \(RGB\) images, got shape \(4, 4, 1\)"),
    (NormalizeOperator(NormalizeConfig()), {"image": np.zeros((1, 4, 4, 2), np.float32)},
     ValueError, r"3 channel statistics but the image has 2 channels"),
]


@pytest.mark.parametrize("op,data,error,match", RUN_ERRORS)
def test_run_errors(op, data, error, match):
    with pytest.raises(error, match=match):
        op(Element({k: jnp.asarray(v) for k, v in data.items()}), BatchContext.for_batch(1))


def test_draw_batch_on_deterministic_operator_names_the_fix():
    with pytest.raises(ValueError, match=r"BrightnessOperator is not stochastic: call draw\(None, shape\)"):
        BrightnessOperator(BrightnessConfig(stochastic=False)).draw_batch(BatchContext.for_batch(1), (4, 4, 3))


def test_out_field_keeps_the_input_field():
    image = jnp.full((1, 4, 4, 3), 0.5)
    op = BrightnessOperator(BrightnessConfig(max_delta=0.2, stochastic=False, out_field="bright"))
    out = op(Element({"image": image}), BatchContext.for_batch(1))
    np.testing.assert_allclose(np.asarray(out.data["image"]), 0.5)
    np.testing.assert_allclose(np.asarray(out.data["bright"]), 0.6, rtol=1e-6)
