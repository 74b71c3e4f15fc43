"""Waveform functions and operators against numpy/scipy computations.

Tolerances: gain, shifts (also fractional, also on long signals) and crop/pad agree with numpy
to float32 rounding (2e-6); the measured
SNR after `add_noise` equals the target to 1e-3 dB; resampling agrees with
`scipy.signal.resample_poly` (same Kaiser-sinc filter) to 1e-5 of the peak in float32 and 1e-12
in float64.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal
from flax import nnx
from on_cpu import float64_on_cpu

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.audio import (
    AddNoiseConfig,
    AddNoiseOperator,
    CropPadConfig,
    CropPadOperator,
    GainConfig,
    GainOperator,
    ResampleConfig,
    ResampleOperator,
    TimeShiftConfig,
    TimeShiftOperator,
)
from datarax.operators.audio.functional import resample, waveform

_gain = jax.jit(waveform.apply_gain)
_add_noise = jax.jit(waveform.add_noise)
_shift = jax.jit(waveform.time_shift, static_argnames=("mode",))
_crop_or_pad = jax.jit(waveform.crop_or_pad, static_argnames=("length",))


def wave(n=2000, seed=0, batch=None):
    shape = (n,) if batch is None else (batch, n)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("gain_db", [-12.0, 0.0, 6.0])
def test_gain_scales_by_db(gain_db):
    x = wave()
    # a TPU's float32 `10**x` is a few ulp off the correctly rounded value (2.5e-6 measured on a v5e)
    rtol = 1e-6 if jax.default_backend() == "cpu" else 5e-6
    np.testing.assert_allclose(_gain(jnp.asarray(x), gain_db), x * 10 ** (gain_db / 20), rtol=rtol)


@pytest.mark.parametrize("snr_db", [-5.0, 10.0, 30.0])
def test_noise_hits_the_target_snr(snr_db):
    x, noise = wave(seed=0), wave(seed=1)
    y = np.asarray(_add_noise(jnp.asarray(x), jnp.asarray(noise), snr_db), np.float64)
    added = y - x
    np.testing.assert_allclose(10 * np.log10(np.mean(x.astype(np.float64) ** 2) / np.mean(added ** 2)), snr_db,
                               atol=1e-3)
    assert np.corrcoef(added, noise)[0, 1] > 0.999999


def test_noise_on_silence_stays_silent_with_finite_gradient():
    grad = jax.jit(jax.grad(lambda s: waveform.add_noise(jnp.zeros(16), jnp.ones(16), s).sum()))(10.0)
    np.testing.assert_array_equal(_add_noise(jnp.zeros(16), jnp.ones(16), 10.0), np.zeros(16))
    assert np.isfinite(grad)


SHIFT_CASES = [(3, "wrap"), (-5, "wrap"), (0, "zero"), (7, "zero"), (-4, "zero")]


@pytest.mark.parametrize("shift,mode", SHIFT_CASES)
def test_integer_shift_is_exact(shift, mode):
    x = wave(50)
    expected = np.roll(x, shift)
    if mode == "zero" and shift > 0:
        expected[:shift] = 0
    elif mode == "zero" and shift < 0:
        expected[shift:] = 0
    np.testing.assert_allclose(_shift(jnp.asarray(x), float(shift), mode), expected, atol=1e-6)


@pytest.mark.parametrize("shift,length", [(2.25, 50), (-3.6, 50), (1234.7, 20000)])
def test_fractional_shift_is_linear_interpolation(shift, length):
    x = wave(length)
    n = np.arange(length)
    # The signal is zero outside [0, length), so interpolate on the zero-extended signal; the
    # shift is the float32 value the function receives.
    expected = np.interp(n - float(np.float32(shift)), np.arange(-1, length + 1), np.pad(x, 1), left=0.0, right=0.0)
    np.testing.assert_allclose(_shift(jnp.asarray(x), shift, "zero"), expected, atol=2e-6)


CROP_CASES = [(100, 60, 0), (100, 60, 40), (100, 60, 17), (60, 100, 0), (60, 100, 40), (60, 100, 13), (50, 50, 0)]


@pytest.mark.parametrize("total,length,offset", CROP_CASES)
def test_crop_or_pad_matches_slicing(total, length, offset):
    x = wave(total)
    if total >= length:
        expected = x[offset:offset + length]
    else:
        expected = np.zeros(length, np.float32)
        expected[offset:offset + total] = x
    np.testing.assert_array_equal(_crop_or_pad(jnp.asarray(x), length, offset), expected)


RESAMPLE_CASES = [(16000, 8000), (8000, 16000), (16000, 22050), (48000, 16000), (8000, 8000)]
_resample = jax.jit(resample.resample, static_argnums=(1, 2))


@pytest.mark.parametrize("orig,target", RESAMPLE_CASES)
def test_resample_matches_scipy_resample_poly(orig, target):
    x = wave(999 if orig != 48000 else 3001)
    up, down = resample.rational_factors(orig, target)
    expected = scipy.signal.resample_poly(x.astype(np.float64), up, down)
    got = np.asarray(_resample(jnp.asarray(x), orig, target))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5 * np.abs(expected).max(), rtol=0)


def test_resample_float64_and_batched_match_scipy():
    with float64_on_cpu():
        x = np.random.default_rng(0).standard_normal((3, 800))
        got = np.asarray(jax.jit(jax.vmap(lambda w: resample.resample(w, 16000, 22050)))(jnp.asarray(x)))
    np.testing.assert_allclose(got, scipy.signal.resample_poly(x, 441, 320, axis=-1), atol=1e-12)


def test_operators_on_a_batch():
    x = jnp.asarray(wave(2000, batch=4))
    ctx = BatchContext.for_batch(4)
    ops = {
        "gain": GainOperator(GainConfig(gain_db=-6.0, stochastic=False)),
        "random_gain": GainOperator(GainConfig(gain_db=-6.0, max_delta_db=3.0), rngs=nnx.Rngs(0)),
        "noise": AddNoiseOperator(AddNoiseConfig(snr_db=20.0, max_delta_db=0.0), rngs=nnx.Rngs(1)),
        "shift": TimeShiftOperator(TimeShiftConfig(shift=0.01, stochastic=False, mode="wrap")),
        "crop": CropPadOperator(CropPadConfig(length=1500), rngs=nnx.Rngs(2)),
        "pad": CropPadOperator(CropPadConfig(length=2100, stochastic=False)),
        "resample": ResampleOperator(ResampleConfig(orig_rate=16000, target_rate=8000, out_field="audio_8k")),
    }
    # One compiled program for all of them: cheaper than compiling each separately.
    out = jax.jit(lambda a: {name: op(Element({"audio": a}), ctx).data for name, op in ops.items()})(x)
    x = np.asarray(x)
    np.testing.assert_allclose(out["gain"]["audio"], x * 10 ** (-6 / 20), rtol=1e-6)

    ratio_db = 20 * np.log10(np.asarray(out["random_gain"]["audio"])[:, 0] / x[:, 0])
    assert np.all(np.abs(ratio_db + 6.0) <= 3.0 + 1e-4) and np.ptp(ratio_db) > 0

    added = np.asarray(out["noise"]["audio"], np.float64) - x
    snr = 10 * np.log10(np.mean(x.astype(np.float64) ** 2, -1) / np.mean(added ** 2, -1))
    np.testing.assert_allclose(snr, 20.0, atol=1e-2)

    np.testing.assert_allclose(out["shift"]["audio"], np.roll(x, 20, axis=-1), atol=1e-5)

    for row, cropped in zip(x, np.asarray(out["crop"]["audio"])):
        starts = [s for s in range(501) if np.array_equal(row[s:s + 1500], cropped)]
        assert len(starts) == 1
    np.testing.assert_array_equal(out["pad"]["audio"][:, 50:2050], x)

    np.testing.assert_allclose(out["resample"]["audio_8k"], scipy.signal.resample_poly(x, 1, 2, axis=-1),
                               atol=1e-5 * float(np.abs(x).max()))
    np.testing.assert_array_equal(out["resample"]["audio"], x)


@pytest.mark.parametrize("call,error,match", [
    (lambda: GainConfig(gain_db=70.0), ValueError, r"GainConfig.gain_db must be in \[-60.0, 60.0\], got 70.0"),
    (lambda: GainConfig(max_delta_db="3"), TypeError, r"GainConfig.max_delta_db must be a number .*got '3'"),
    (lambda: AddNoiseConfig(stochastic=False), ValueError, r"AddNoiseConfig\(stochastic=False\) has nothing to do"),
    (lambda: TimeShiftConfig(mode="reflect"), ValueError, r"TimeShiftConfig.mode must be one of .*'reflect'"),
    (lambda: CropPadConfig(length=0), ValueError, r"CropPadConfig.length must be an int >= 1, got 0"),
    (lambda: CropPadConfig(length=10, align="end"), ValueError, r"CropPadConfig.align must be one of .*'end'"),
    (lambda: ResampleConfig(orig_rate=16000, target_rate=0), ValueError, r"target_rate must be a positive int \(Hz\), "
                                                                         r"got 0"),
    (lambda: ResampleConfig(orig_rate=16000, target_rate=8000, stochastic=True), ValueError,
     r"ResampleConfig\(stochastic=True\): resampling draws nothing"),
    (lambda: GainConfig(field=""), ValueError, r"GainConfig.field must be a non-empty field name, got ''"),
    (lambda: GainConfig(out_field=""), ValueError, r"GainConfig.out_field must be a non-empty field name or None"),
    (lambda: GainOperator(GainConfig(stochastic=False, learnable=("max_delta_db",))), ValueError,
     r"GainConfig.learnable names \['max_delta_db'\], which are not learnable magnitudes"),
    (lambda: GainOperator(AddNoiseConfig()), TypeError,
     r"GainOperator config must be a GainConfig, got AddNoiseConfig"),
    (lambda: GainOperator(GainConfig(max_delta_db=0.0, learnable=True), rngs=nnx.Rngs(0)), ValueError,
     r"learnable GainConfig.max_delta_db must lie strictly inside \(0.0, 60.0\), got 0.0"),
    (lambda: waveform.time_shift(jnp.zeros(4), 1.0, "edge"), ValueError, r"mode must be one of .*'edge'"),
    (lambda: waveform.crop_or_pad(jnp.zeros(4), 0, 0), ValueError, r"length must be a positive int \(samples\), got 0"),
    (lambda: waveform.add_noise(jnp.zeros(4), jnp.zeros(5), 0.0), ValueError, r"noise must have the signal's shape "
                                                                              r"\(4,\), got \(5,\)"),
    (lambda: waveform.aligned_offset(10, 5, "middle"), ValueError, r"align must be one of .*'middle'"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_operator_rejects_missing_field_and_integer_audio():
    gain = GainOperator(GainConfig(stochastic=False))
    ctx = BatchContext.for_batch(2)
    with pytest.raises(KeyError, match=r"GainOperator reads field 'audio', but the record has fields \['wav'\]"):
        gain(Element({"wav": jnp.zeros((2, 8))}), ctx)
    with pytest.raises(TypeError, match=r"expects a float array in field 'audio', got dtype int16; convert first"):
        gain(Element({"audio": jnp.zeros((2, 8), jnp.int16)}), ctx)
    with pytest.raises(ValueError, match=r"expects field 'audio' to hold one waveform \(..., time\) per record, "
                                         r".*\(time,\) array"):
        gain(Element({"audio": jnp.zeros((2,))}), ctx)
