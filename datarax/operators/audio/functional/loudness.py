"""A-weighted loudness per STFT frame, as a pure function (see docs/operators.md, "Definitions")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from datarax.operators.audio.functional.spectral import fft_frequencies, stft_magnitude

AVERAGES = ("power", "db")
_A_CONSTANTS = np.array([12194.217, 20.598997, 107.65265, 737.86223]) ** 2


def a_weighting_db(frequencies: np.ndarray, min_db: float | None = -80.0) -> np.ndarray:
    """The A-weighting in dB at each frequency (Hz), floored at `min_db` (None: no floor)."""
    f_sq = np.asarray(frequencies, dtype=np.float64) ** 2
    with np.errstate(divide="ignore"):
        weights = 2.0 + 20.0 * (
            np.log10(_A_CONSTANTS[0]) + 2.0 * np.log10(f_sq) - np.log10(f_sq + _A_CONSTANTS[0])
            - np.log10(f_sq + _A_CONSTANTS[1]) - 0.5 * np.log10(f_sq + _A_CONSTANTS[2])
            - 0.5 * np.log10(f_sq + _A_CONSTANTS[3])
        )
    return weights if min_db is None else np.maximum(min_db, weights)


def a_weighted_loudness(x: jax.Array, sample_rate: float, n_fft: int = 512, hop_length: int | None = None,
                        average: str = "power", ref_db: float = 0.0, range_db: float = 80.0,
                        amin: float = 1e-10, center: bool = True, pad_mode: str = "constant") -> jax.Array:
    """Frame-wise A-weighted loudness in dB of a waveform `(..., T)`.

    `n_fft` (a Hann window of that length), `hop_length` (default `n_fft // 4`), `center` and
    `pad_mode` are as in `stft`.

    Args:
        average: "power" (A-weighted mean power) or "db" (DDSP's mean of A-weighted dB); see
            docs/operators.md, "Definitions".
        ref_db: level subtracted from the result (0 dB means unit power).
        range_db: floor of the result (and, for "db", of each bin) at `-range_db`.
        amin: power floor before the logarithm.

    Returns:
        `(..., n_frames)` loudness in dB.
    """
    if average not in AVERAGES:
        raise ValueError(f"average must be one of {AVERAGES}, got {average!r}")
    if not sample_rate > 0:
        raise ValueError(f"sample_rate must be > 0 Hz, got {sample_rate!r}")
    if not range_db > 0 or not amin > 0:
        raise ValueError(f"range_db and amin must be > 0, got range_db={range_db!r}, amin={amin!r}")
    power = stft_magnitude(x, n_fft, hop_length, center=center, pad_mode=pad_mode, power=2.0)
    weights_db = a_weighting_db(fft_frequencies(sample_rate, n_fft))[:, None]
    if average == "power":
        weights = (10.0 ** (weights_db / 10.0)).astype(np.dtype(power.dtype))
        level = 10.0 * jnp.log10(jnp.maximum(jnp.mean(weights * power, axis=-2), amin))
        return jnp.maximum(level - ref_db, -range_db)
    bins_db = 10.0 * jnp.log10(jnp.maximum(power, amin)) + weights_db.astype(np.dtype(power.dtype)) - ref_db
    return jnp.mean(jnp.maximum(bins_db, -range_db), axis=-2)
