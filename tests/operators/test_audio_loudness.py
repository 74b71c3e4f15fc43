"""A-weighting against librosa.A_weighting; frame loudness against a numpy computation on librosa's STFT.

Tolerances: the weighting curve agrees with librosa to 1e-9 dB (same constants, float64);
frame loudness (float32) to 1e-3 dB.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.audio import LoudnessConfig, LoudnessOperator
from datarax.operators.audio.functional import loudness

librosa = pytest.importorskip("librosa")

SR = 16000
_loudness = jax.jit(loudness.a_weighted_loudness, static_argnames=("sample_rate", "n_fft", "hop_length", "average"))


def signal(n=4000, seed=0):
    t = np.arange(n) / SR
    envelope = np.linspace(0.0, 1.0, n)
    tones = np.sin(2 * np.pi * 100 * t) + 0.3 * np.sin(2 * np.pi * 2500 * t)
    return (envelope * tones + 0.01 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def reference(x, average, n_fft=512, hop=128, ref_db=0.0, range_db=80.0, amin=1e-10):
    power = np.abs(librosa.stft(x.astype(np.float64), n_fft=n_fft, hop_length=hop)) ** 2
    with np.errstate(divide="ignore"):  # librosa takes log10(0) at the DC bin before flooring it
        weights = librosa.A_weighting(librosa.fft_frequencies(sr=SR, n_fft=n_fft))[:, None]
    if average == "power":
        level = 10 * np.log10(np.maximum(np.mean(10 ** (weights / 10) * power, axis=0), amin)) - ref_db
        return np.maximum(level, -range_db)
    bins = 10 * np.log10(np.maximum(power, amin)) + weights - ref_db
    return np.mean(np.maximum(bins, -range_db), axis=0)


def test_a_weighting_matches_librosa():
    f = np.concatenate([[0.0, 10.0, 1000.0], librosa.fft_frequencies(sr=44100, n_fft=256)])
    with np.errstate(divide="ignore"):
        expected = librosa.A_weighting(f)
    np.testing.assert_allclose(loudness.a_weighting_db(f), expected, atol=1e-9)
    np.testing.assert_allclose(loudness.a_weighting_db(np.array([1000.0])), 0.0, atol=0.01)


@pytest.mark.parametrize("average", ["power", "db"])
def test_frame_loudness_matches_reference(average):
    x = signal()
    got = np.asarray(_loudness(jnp.asarray(x), sample_rate=SR, n_fft=512, hop_length=128, average=average))
    np.testing.assert_allclose(got, reference(x, average), atol=1e-3)


def test_louder_signal_is_louder_by_its_gain_in_db():
    x = signal()
    quiet = np.asarray(_loudness(jnp.asarray(x), sample_rate=SR, n_fft=512, hop_length=128, average="power"))
    loud = np.asarray(_loudness(jnp.asarray(2 * x), sample_rate=SR, n_fft=512, hop_length=128, average="power"))
    active = quiet > -70
    np.testing.assert_allclose((loud - quiet)[active], 20 * np.log10(2), atol=1e-3)


def test_operator_writes_loudness_field():
    x = np.stack([signal(seed=0), signal(seed=1)])
    op = LoudnessOperator(LoudnessConfig(sample_rate=SR, n_fft=512, hop_length=128, average="db", ref_db=10.0))
    out = jax.jit(lambda el: op(el, BatchContext.for_batch(2)))(Element({"audio": jnp.asarray(x)}))
    for i in range(2):
        np.testing.assert_allclose(out.data["loudness"][i], reference(x[i], "db", ref_db=10.0), atol=1e-3)


@pytest.mark.parametrize("call,error,match", [
    (lambda: LoudnessConfig(sample_rate=SR, average="rms"), ValueError,
     r"LoudnessConfig.average must be one of .*'rms'"),
    (lambda: LoudnessConfig(sample_rate=0), ValueError, r"LoudnessConfig.sample_rate must be in \(0.0, 10000000.0\], "
                                                        r"got 0"),
    (lambda: LoudnessConfig(sample_rate=SR, range_db=0.0), ValueError, r"LoudnessConfig.range_db must be in \(0.0"),
    (lambda: loudness.a_weighted_loudness(jnp.zeros(1000), SR, average="mean"), ValueError, r"average must be one of "
                                                                                            r".*'mean'"),
    (lambda: loudness.a_weighted_loudness(jnp.zeros(1000), 0.0), ValueError, r"sample_rate must be > 0 Hz, got 0.0"),
    (lambda: loudness.a_weighted_loudness(jnp.zeros(1000), SR, amin=0.0), ValueError, r"range_db and amin must be > "
                                                                                      r"0, .*amin=0.0"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
