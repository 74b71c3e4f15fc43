"""Mel filterbank, (log-)mel spectrogram and MFCC, as pure functions following librosa's definitions.

The filterbank is built once in numpy and enters the traced program as a constant; see
docs/operators.md, "Definitions".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from datarax.core.checks import check_positive_int, is_int, is_number
from datarax.operators.audio.functional.spectral import fft_frequencies, stft_magnitude
from datarax.operators.precision import WEIGHTED_SUM, precision_for

MEL_NORMS = ("slaney", None)

# Slaney scale: 3 mels per 200/3 Hz up to 1 kHz, then 27 mels per factor of 6.4.
_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def hz_to_mel(frequencies: np.ndarray | float, htk: bool = False) -> np.ndarray:
    """Hz to mels (Slaney scale, or HTK when `htk=True`)."""
    f = np.asarray(frequencies, dtype=np.float64)
    if htk:
        return 2595.0 * np.log10(1.0 + f / 700.0)
    log_part = _MIN_LOG_MEL + np.log(np.maximum(f, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(f >= _MIN_LOG_HZ, log_part, f / _F_SP)


def mel_to_hz(mels: np.ndarray | float, htk: bool = False) -> np.ndarray:
    """Mels to Hz, the inverse of `hz_to_mel`."""
    m = np.asarray(mels, dtype=np.float64)
    if htk:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    log_part = _MIN_LOG_HZ * np.exp(_LOGSTEP * (np.maximum(m, _MIN_LOG_MEL) - _MIN_LOG_MEL))
    return np.where(m >= _MIN_LOG_MEL, log_part, _F_SP * m)


def mel_filterbank(sample_rate: float, n_fft: int, n_mels: int = 128, fmin: float = 0.0,
                   fmax: float | None = None, htk: bool = False, norm: str | None = "slaney") -> np.ndarray:
    """A `(n_mels, n_fft // 2 + 1)` matrix mapping STFT bins to mel bands.

    Args:
        fmax: highest band edge in Hz; defaults to `sample_rate / 2`.
        htk: use the HTK mel formula instead of the Slaney scale.
        norm: "slaney" (divide each triangle by its width in Hz, constant energy per band) or None.

    Returns:
        A float64 numpy array; apply it as `filterbank @ power_spectrogram`.
    """
    fmax = sample_rate / 2.0 if fmax is None else fmax
    check_mel_settings(sample_rate, n_mels, fmin, fmax, norm)
    bins = fft_frequencies(sample_rate, n_fft)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin, htk), hz_to_mel(fmax, htk), n_mels + 2), htk)
    widths = np.diff(edges)
    offsets = edges[:, None] - bins[None, :]
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    if norm == "slaney":
        weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights


def check_mel_settings(sample_rate: float, n_mels: int, fmin: float, fmax: float, norm: str | None) -> None:
    """Validates filterbank settings with messages that name the argument and the fix."""
    if not sample_rate > 0:
        raise ValueError(f"sample_rate must be > 0 Hz, got {sample_rate!r}")
    check_positive_int(n_mels, "n_mels")
    if not 0.0 <= fmin < fmax <= sample_rate / 2.0:
        raise ValueError(
            f"need 0 <= fmin < fmax <= sample_rate / 2 = {sample_rate / 2.0}, got fmin={fmin!r}, fmax={fmax!r}; "
            "lower fmax to the Nyquist frequency or raise sample_rate"
        )
    if norm not in MEL_NORMS:
        raise ValueError(f"norm must be 'slaney' or None, got {norm!r}")


def mel_spectrogram(x: jax.Array, sample_rate: float, n_fft: int = 512, hop_length: int | None = None,
                    n_mels: int = 128, fmin: float = 0.0, fmax: float | None = None, power: float = 2.0,
                    htk: bool = False, norm: str | None = "slaney", center: bool = True,
                    pad_mode: str = "constant") -> jax.Array:
    """Mel spectrogram `(..., n_mels, n_frames)` of a waveform `(..., T)`.

    `power=2` gives mel-band energies (librosa's default), `power=1` mel-band magnitudes.
    """
    spectrum = stft_magnitude(x, n_fft, hop_length, center=center, pad_mode=pad_mode, power=power)
    fb = mel_filterbank(sample_rate, n_fft, n_mels, fmin, fmax, htk, norm).astype(np.dtype(spectrum.dtype))
    return jnp.einsum("mf,...ft->...mt", fb, spectrum, precision=precision_for(WEIGHTED_SUM, spectrum.dtype))


def power_to_db(power: jax.Array, ref: float | str = 1.0, amin: float = 1e-10,
                top_db: float | None = 80.0) -> jax.Array:
    """Power to decibels, `10 * log10(max(power, amin) / max(ref, amin))`.

    Args:
        power: non-negative power values (for example a mel spectrogram with `power=2`).
        ref: the reference power (0 dB), a number or "max" for the largest value of `power`.
        amin: floor applied before the logarithm.
        top_db: floor the output at `max(output) - top_db`; None for no floor.
    """
    if not amin > 0:
        raise ValueError(f"amin must be > 0, got {amin!r}")
    if top_db is not None and not top_db >= 0:
        raise ValueError(f"top_db must be >= 0 or None, got {top_db!r}")
    if ref == "max":
        ref_value = jnp.max(power)
    elif is_number(ref) and ref > 0:
        ref_value = ref
    else:
        raise ValueError(f"ref must be a positive number or 'max', got {ref!r}")
    db = 10.0 * jnp.log10(jnp.maximum(power, amin)) - 10.0 * jnp.log10(jnp.maximum(ref_value, amin))
    if top_db is not None:
        db = jnp.maximum(db, jnp.max(db) - top_db)
    return db


def log_mel_spectrogram(x: jax.Array, sample_rate: float, n_fft: int = 512, hop_length: int | None = None,
                        n_mels: int = 128, fmin: float = 0.0, fmax: float | None = None, htk: bool = False,
                        norm: str | None = "slaney", ref: float | str = 1.0, amin: float = 1e-10,
                        top_db: float | None = 80.0, center: bool = True, pad_mode: str = "constant") -> jax.Array:
    """Log-mel spectrogram in dB: `power_to_db(mel_spectrogram(x, power=2))`."""
    mel = mel_spectrogram(x, sample_rate, n_fft, hop_length, n_mels, fmin, fmax, 2.0, htk, norm, center, pad_mode)
    return power_to_db(mel, ref, amin, top_db)


def dct_matrix(n_out: int, n_in: int) -> np.ndarray:
    """The orthonormal DCT-II matrix `(n_out, n_in)` (the first `n_out` rows)."""
    k = np.arange(n_out)[:, None]
    n = np.arange(n_in)[None, :]
    basis = np.cos(np.pi * k * (2 * n + 1) / (2 * n_in)) * np.sqrt(2.0 / n_in)
    basis[0] /= np.sqrt(2.0)
    return basis


def mfcc(x: jax.Array, sample_rate: float, n_mfcc: int = 20, n_fft: int = 512, hop_length: int | None = None,
         n_mels: int = 128, fmin: float = 0.0, fmax: float | None = None, htk: bool = False,
         norm: str | None = "slaney", top_db: float | None = 80.0, lifter: float = 0.0,
         center: bool = True, pad_mode: str = "constant") -> jax.Array:
    """Mel-frequency cepstral coefficients `(..., n_mfcc, n_frames)` of a waveform `(..., T)`."""
    if not is_int(n_mfcc) or not 1 <= n_mfcc <= n_mels:
        raise ValueError(f"n_mfcc must be an int in [1, n_mels={n_mels}], got {n_mfcc!r}")
    if not lifter >= 0:
        raise ValueError(f"lifter must be >= 0 (0 turns liftering off), got {lifter!r}")
    log_mel = log_mel_spectrogram(x, sample_rate, n_fft, hop_length, n_mels, fmin, fmax, htk, norm,
                                  top_db=top_db, center=center, pad_mode=pad_mode)
    basis = dct_matrix(n_mfcc, n_mels)
    if lifter > 0:
        basis = basis * (1.0 + (lifter / 2.0) * np.sin(np.pi * np.arange(1, n_mfcc + 1) / lifter))[:, None]
    return jnp.einsum("km,...mt->...kt", basis.astype(np.dtype(log_mel.dtype)), log_mel,
                      precision=precision_for(WEIGHTED_SUM, log_mel.dtype))
