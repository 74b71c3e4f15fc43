"""Mel scale, filterbank, (log-)mel spectrogram and MFCC against librosa; the operators around them.

Tolerances (float32 signals): filterbank weights 1e-6 of the largest weight (librosa rounds its
float64 maths to float32); mel energies 1e-5 of the peak; log-mel 5e-4 dB; MFCC 2e-5 of the
largest coefficient (measured: about 1e-5 dB and 5e-7). On a TPU the filterbank and the DCT are
weighted sums at the precision policy's bound (`datarax.operators.precision`), which the mel and
MFCC tolerances add there (`chip_slack`). The definitions coincide with librosa's defaults (Slaney
mel scale and norm, `power_to_db(ref=1, amin=1e-10, top_db=80)`, orthonormal DCT-II, optional
lifter).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.audio import (
    LogMelConfig,
    LogMelOperator,
    MelSpectrogramConfig,
    MelSpectrogramOperator,
    MFCCConfig,
    MFCCOperator,
    STFTConfig,
    STFTOperator,
)
from datarax.operators.audio.functional import mel
from datarax.operators.precision import WEIGHTED_SUM

librosa = pytest.importorskip("librosa")

SR = 16000
MEL_ARGS = ("sample_rate", "n_fft", "hop_length", "n_mels", "fmin", "fmax", "htk", "norm", "center", "pad_mode")
_mel_spectrogram = jax.jit(mel.mel_spectrogram, static_argnames=MEL_ARGS + ("power",))
_log_mel = jax.jit(mel.log_mel_spectrogram, static_argnames=MEL_ARGS + ("ref", "amin", "top_db"))
_mfcc = jax.jit(mel.mfcc, static_argnames=MEL_ARGS + ("n_mfcc", "top_db", "lifter"))


ON_CPU = jax.default_backend() == "cpu"


def chip_slack(x, n_mfcc=None, lifter=0.0):
    """What the chip's weighted-sum precision may add (0 on a CPU): to mel energies, the bound of
    the peak; to MFCCs of waveform `x`, the DCT's products within the bound of their absolute sum
    and each band's relative error (within the bound) carried through the dB and the DCT."""
    if ON_CPU:
        return 0.0
    power = librosa.feature.melspectrogram(y=x, sr=SR, n_fft=512, hop_length=128, n_mels=40)
    if n_mfcc is None:
        return WEIGHTED_SUM.bound * float(power.max())
    basis = np.abs(mel.dct_matrix(n_mfcc, 40))
    if lifter > 0:
        basis *= np.abs(1.0 + (lifter / 2.0) * np.sin(np.pi * np.arange(1, n_mfcc + 1) / lifter))[:, None]
    db = 10 * np.log10(1 + WEIGHTED_SUM.bound)
    log_mel = np.abs(librosa.power_to_db(power))
    return WEIGHTED_SUM.bound * float(np.max(basis @ log_mel)) + db * float(np.max(basis.sum(1)))


def signal(n=4000, seed=0):
    t = np.arange(n) / SR
    chirp = np.sin(2 * np.pi * (200 + 3000 * t) * t)
    return (0.5 * chirp + 0.05 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("htk", [False, True])
def test_mel_scale_matches_librosa(htk):
    f = np.array([0.0, 40.0, 500.0, 999.0, 1000.0, 1001.0, 4000.0, 8000.0])
    np.testing.assert_allclose(mel.hz_to_mel(f, htk), librosa.hz_to_mel(f, htk=htk), rtol=1e-12)
    m = mel.hz_to_mel(f, htk)
    np.testing.assert_allclose(mel.mel_to_hz(m, htk), f, rtol=1e-12, atol=1e-9)


FILTERBANK_CASES = [
    dict(n_fft=512, n_mels=40),
    dict(n_fft=512, n_mels=64, fmin=50.0, fmax=7000.0, htk=True),
    dict(n_fft=256, n_mels=32, norm=None),
    dict(n_fft=400, n_mels=80, fmin=20.0),
]


@pytest.mark.parametrize("kw", FILTERBANK_CASES)
def test_filterbank_matches_librosa(kw):
    expected = librosa.filters.mel(sr=SR, **kw)
    got = mel.mel_filterbank(SR, **kw)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-6 * expected.max(), rtol=0)


def test_dct_matrix_is_scipy_orthonormal_dct_ii():
    x = np.random.default_rng(0).standard_normal((24, 5))
    np.testing.assert_allclose(mel.dct_matrix(24, 24) @ x, scipy.fft.dct(x, type=2, norm="ortho", axis=0),
                               atol=1e-12)


def test_mel_spectrogram_matches_librosa():
    x = signal()
    expected = librosa.feature.melspectrogram(y=x, sr=SR, n_fft=512, hop_length=128, n_mels=40)
    got = np.asarray(_mel_spectrogram(jnp.asarray(x), SR, 512, 128, 40))
    np.testing.assert_allclose(got, expected, atol=1e-5 * expected.max() + chip_slack(x), rtol=0)


def test_log_mel_matches_librosa_power_to_db():
    x = signal()
    power = librosa.feature.melspectrogram(y=x, sr=SR, n_fft=512, hop_length=128, n_mels=40)
    got = np.asarray(_log_mel(jnp.asarray(x), SR, 512, 128, 40))
    np.testing.assert_allclose(got, librosa.power_to_db(power), atol=5e-4, rtol=0)


@pytest.mark.parametrize("kw", [dict(ref="max", top_db=60.0), dict(top_db=None, amin=1e-6), dict(ref=0.5, top_db=0.0)])
def test_power_to_db_matches_librosa(kw):
    power = np.exp(4 * np.random.default_rng(0).standard_normal((16, 9))).astype(np.float32)
    power[3, 4] = 0.0
    ref = kw.get("ref", 1.0)
    expected = librosa.power_to_db(power, ref=np.max if ref == "max" else ref, amin=kw.get("amin", 1e-10),
                                   top_db=kw.get("top_db", 80.0))
    got = jax.jit(mel.power_to_db, static_argnames=("ref", "amin", "top_db"))(jnp.asarray(power), **kw)
    np.testing.assert_allclose(got, expected, atol=5e-4, rtol=0)


def test_mfcc_with_lifter_matches_librosa():
    # lifter=0 (the default) is compared through MFCCOperator below.
    x = signal()
    expected = librosa.feature.mfcc(y=x, sr=SR, n_mfcc=13, n_fft=512, hop_length=128, n_mels=40, lifter=22)
    got = np.asarray(_mfcc(jnp.asarray(x), SR, 13, 512, 128, 40, lifter=22.0))
    np.testing.assert_allclose(got, expected, atol=2e-5 * np.abs(expected).max() + chip_slack(x, 13, 22.0), rtol=0)


def test_operators_write_their_own_fields_and_keep_the_waveform():
    waves = np.stack([signal(seed=0), signal(seed=1)])
    element = Element({"audio": jnp.asarray(waves)})
    ctx = BatchContext.for_batch(2)
    common = dict(sample_rate=SR, n_fft=512, hop_length=128, n_mels=40)
    ops = [STFTOperator(STFTConfig(n_fft=512, hop_length=128)), MelSpectrogramOperator(MelSpectrogramConfig(**common)),
           LogMelOperator(LogMelConfig(**common)), MFCCOperator(MFCCConfig(n_mfcc=13, **common))]

    @jax.jit
    def run(element):
        for op in ops:
            element = op(element, ctx)
        return element

    element = run(element)
    np.testing.assert_array_equal(element.data["audio"], waves)
    for i in range(2):
        expected = librosa.feature.mfcc(y=waves[i], sr=SR, n_mfcc=13, n_fft=512, hop_length=128, n_mels=40)
        np.testing.assert_allclose(element.data["mfcc"][i], expected,
                                   atol=2e-5 * np.abs(expected).max() + chip_slack(waves[i], 13))
        expected = np.abs(librosa.stft(waves[i], n_fft=512, hop_length=128))
        np.testing.assert_allclose(element.data["spectrogram"][i], expected, atol=1e-5 * expected.max())
    assert element.data["mel"].shape == element.data["log_mel"].shape == (2, 40, 32)


@pytest.mark.parametrize("call,error,match", [
    (lambda: mel.mel_filterbank(SR, 512, fmax=9000.0), ValueError, r"fmax=9000.0; lower fmax to the Nyquist"),
    (lambda: mel.mel_filterbank(SR, 512, n_mels=0), ValueError, r"n_mels must be a positive int, got 0"),
    (lambda: mel.mel_filterbank(SR, 512, norm="l2"), ValueError, r"norm must be 'slaney' or None, got 'l2'"),
    (lambda: mel.mel_filterbank(-1.0, 512), ValueError, r"sample_rate must be > 0 Hz, got -1.0"),
    (lambda: mel.power_to_db(jnp.ones(3), ref="min"), ValueError, r"ref must be a positive number or 'max', got 'min'"),
    (lambda: mel.power_to_db(jnp.ones(3), amin=0.0), ValueError, r"amin must be > 0, got 0.0"),
    (lambda: mel.power_to_db(jnp.ones(3), top_db=-1.0), ValueError, r"top_db must be >= 0 or None, got -1.0"),
    (lambda: mel.mfcc(jnp.zeros(4000), SR, n_mfcc=50, n_mels=40), ValueError, r"n_mfcc must be an int in \[1, "
                                                                              r"n_mels=40\], got 50"),
    (lambda: mel.mfcc(jnp.zeros(4000), SR, lifter=-1.0), ValueError, r"lifter must be >= 0 .*got -1.0"),
    (lambda: MFCCConfig(sample_rate=SR, n_mels=10, n_mfcc=20), ValueError, r"n_mfcc must be <= n_mels=10, got 20; "
                                                                           r"lower n_mfcc"),
    (lambda: LogMelConfig(sample_rate=SR, ref=0.0), ValueError, r"LogMelConfig.ref must be in \(0.0, inf\], got 0.0"),
    (lambda: LogMelConfig(sample_rate=SR, stochastic=True), ValueError, r"LogMelConfig\(stochastic=True\): feature "
                                                                        r"extractors draw nothing"),
    (lambda: MelSpectrogramConfig(sample_rate=SR, fmin=100.0, fmax=50.0), ValueError, r"fmin=100.0, fmax=50.0"),
    (lambda: STFTConfig(n_fft=256, win_length=512), ValueError, r"win_length must be <= n_fft=256, got 512"),
    (lambda: STFTConfig(window="blackman"), ValueError, r"STFTConfig.window must be one of .*'blackman'"),
    (lambda: STFTConfig(hop_length=0), ValueError, r"STFTConfig.hop_length must be an int >= 1 or None, got 0"),
    (lambda: STFTConfig(learnable=True) and STFTOperator(STFTConfig(learnable=True)), ValueError,
     r"STFTConfig\(learnable=True\): STFTOperator has no continuous magnitude to learn here .*; leave learnable=False"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
