"""STFT against librosa; windows against scipy; gradients through silence.

Tolerance: float32 magnitudes agree with librosa to 1e-5 of the spectrogram's peak (both use
float32 FFTs; the rest is rounding order). float64 agrees to 1e-12 of the peak.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal
from on_cpu import float64_on_cpu

from datarax.operators.audio.functional import spectral

librosa = pytest.importorskip("librosa")

SR = 16000
# Jitted once per static configuration: compiling a whole function is several times cheaper
# than running its primitives eagerly on new shapes.
STFT_ARGS = ("n_fft", "hop_length", "win_length", "window_name", "center", "pad_mode")
_stft = jax.jit(spectral.stft, static_argnames=STFT_ARGS)
_magnitude = jax.jit(spectral.stft_magnitude, static_argnames=STFT_ARGS + ("power",))
_multi_scale = jax.jit(spectral.multi_scale_stft_magnitude, static_argnames=("fft_sizes", "overlap", "power", "center"))


def signal(n=4000, dtype=np.float32, seed=0):
    t = np.arange(n) / SR
    noise = np.random.default_rng(seed).standard_normal(n)
    return (0.5 * np.sin(2 * np.pi * 440 * t) + 0.1 * noise).astype(dtype)


STFT_CASES = [
    dict(n_fft=512, hop_length=128),
    dict(n_fft=256, hop_length=64, win_length=200, window="hamming"),
    dict(n_fft=512, hop_length=160, center=False),
    dict(n_fft=256, hop_length=100, pad_mode="reflect"),
]


@pytest.mark.parametrize("kw", STFT_CASES)
def test_stft_magnitude_matches_librosa(kw):
    x = signal()
    ours = dict(kw)
    window = ours.pop("window", "hann")
    expected = np.abs(librosa.stft(x, window=window, **ours))
    got = np.asarray(_magnitude(jnp.asarray(x), window_name=window, **ours))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5 * expected.max(), rtol=0)


def test_complex_stft_matches_librosa_in_float64():
    with float64_on_cpu():
        x = signal(2000, np.float64)
        expected = librosa.stft(x, n_fft=256, hop_length=64)
        got = np.asarray(_stft(jnp.asarray(x), n_fft=256, hop_length=64))
    assert got.dtype == np.complex128
    np.testing.assert_allclose(got, expected, atol=1e-12 * np.abs(expected).max(), rtol=0)


@pytest.mark.parametrize("name,scipy_name", [("hann", "hann"), ("hamming", "hamming"), ("rectangular", "boxcar")])
def test_window_is_scipy_periodic_window(name, scipy_name):
    np.testing.assert_allclose(spectral.window(name, 200), scipy.signal.get_window(scipy_name, 200, fftbins=True),
                               atol=1e-12)
    padded = spectral.window(name, 200, 256)
    assert padded.shape == (256,) and padded[:28].sum() == 0 and padded[228:].sum() == 0


def test_power_two_is_squared_magnitude_and_batched_vmap_matches():
    x = jnp.asarray(np.stack([signal(seed=0), signal(seed=1)]))
    magnitude = _magnitude(x, n_fft=256, hop_length=64)
    power = jax.jit(jax.vmap(lambda w: spectral.stft_magnitude(w, 256, 64, power=2.0)))(x)
    np.testing.assert_allclose(power, magnitude ** 2, rtol=1e-4, atol=1e-6 * float(power.max()))


def test_multi_scale_shapes_match_librosa_frames():
    x = signal(2000)
    outs = _multi_scale(jnp.asarray(x), fft_sizes=(512, 128), overlap=0.75)
    for n_fft, out in zip((512, 128), outs):
        expected = np.abs(librosa.stft(x, n_fft=n_fft, hop_length=n_fft // 4))
        np.testing.assert_allclose(out, expected, atol=1e-5 * expected.max(), rtol=0)


def test_gradient_through_silence_is_finite():
    # Zero-padded frames of a silent signal have exactly-zero bins, where |z| has no derivative.
    x = jnp.zeros(1000).at[600:].set(jnp.sin(jnp.arange(400.0)))
    grad = jax.jit(jax.grad(lambda w: spectral.stft_magnitude(w, 256, 64).sum()))(x)
    assert bool(jnp.all(jnp.isfinite(grad))) and float(jnp.abs(grad).max()) > 0


def test_fft_frequencies_match_librosa():
    np.testing.assert_allclose(spectral.fft_frequencies(SR, 512), librosa.fft_frequencies(sr=SR, n_fft=512))


@pytest.mark.parametrize("call,match", [
    (lambda: spectral.stft(jnp.zeros(1000), n_fft=0), r"n_fft must be a positive int, got 0"),
    (lambda: spectral.stft(jnp.zeros(1000), n_fft=256, win_length=300), r"win_length must be <= n_fft=256, got 300"),
    (lambda: spectral.stft(jnp.zeros(1000), pad_mode="edge"), r"pad_mode must be one of .*'edge'"),
    (lambda: spectral.stft(jnp.zeros(100), n_fft=256, center=False), r"100 samples, fewer than n_fft=256"),
    (lambda: spectral.window("kaiser", 64), r"window must be one of .*'kaiser'"),
    (lambda: spectral.stft_magnitude(jnp.zeros(1000), power=0.0), r"power must be > 0 .*got 0.0"),
    (lambda: spectral.multi_scale_stft_magnitude(jnp.zeros(1000), overlap=1.0),
     r"overlap must lie in \[0, 1\), got 1.0"),
])
def test_errors_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
