"""Short-time Fourier transform of 1-D waveforms, as pure JAX functions, laid out as librosa's.

The output is `(..., n_fft // 2 + 1, n_frames)`; shapes depend only on static arguments, and
the magnitude has a zero (not NaN) gradient where a bin is zero. See docs/operators.md,
"Definitions".

Example:
    >>> stft_magnitude(x, n_fft=512, hop_length=128).shape
    (257, 32)
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from datarax.core.checks import check_positive_int
from datarax.operators.audio.functional.waveform import safe_sqrt

WINDOWS = ("hann", "hamming", "rectangular")
PAD_MODES = ("constant", "reflect")


def window(name: str, win_length: int, n_fft: int | None = None) -> np.ndarray:
    """A periodic ("fftbins") window of `win_length` samples, zero-padded centrally to `n_fft`.

    Args:
        name: "hann", "hamming" or "rectangular".
        win_length: window length in samples.
        n_fft: total length; defaults to `win_length`. Must be >= `win_length`.

    Returns:
        A float64 numpy array of length `n_fft` (a static constant for the traced program).
    """
    n_fft = win_length if n_fft is None else n_fft
    check_fft_sizes(n_fft, win_length, hop_length=1)
    n = np.arange(win_length)
    if name == "hann":
        w = 0.5 - 0.5 * np.cos(2 * np.pi * n / win_length)
    elif name == "hamming":
        w = 0.54 - 0.46 * np.cos(2 * np.pi * n / win_length)
    elif name == "rectangular":
        w = np.ones(win_length)
    else:
        raise ValueError(f"window must be one of {WINDOWS}, got {name!r}")
    left = (n_fft - win_length) // 2
    return np.pad(w, (left, n_fft - win_length - left))


def check_fft_sizes(n_fft: int, win_length: int, hop_length: int) -> None:
    """Validates STFT sizes with messages that name the argument and the fix."""
    for name, value in (("n_fft", n_fft), ("win_length", win_length), ("hop_length", hop_length)):
        check_positive_int(value, name)
    if win_length > n_fft:
        raise ValueError(f"win_length must be <= n_fft={n_fft}, got {win_length}; lower win_length or raise n_fft")


def num_frames(num_samples: int, n_fft: int, hop_length: int, center: bool = True) -> int:
    """How many STFT frames a signal of `num_samples` samples gives."""
    padded = num_samples + 2 * (n_fft // 2) if center else num_samples
    if padded < n_fft:
        raise ValueError(
            f"the signal has {num_samples} samples, fewer than n_fft={n_fft} (center={center}); "
            "use a longer signal, a smaller n_fft, or center=True"
        )
    return 1 + (padded - n_fft) // hop_length


def frame(x: jax.Array, frame_length: int, hop_length: int) -> jax.Array:
    """Overlapping frames of the last axis: `(..., T)` -> `(..., n_frames, frame_length)`."""
    count = 1 + (x.shape[-1] - frame_length) // hop_length
    index = np.arange(count)[:, None] * hop_length + np.arange(frame_length)[None, :]
    return x[..., index]


def stft(x: jax.Array, n_fft: int = 512, hop_length: int | None = None, win_length: int | None = None,
         window_name: str = "hann", center: bool = True, pad_mode: str = "constant") -> jax.Array:
    """The complex STFT of the last axis of `x`.

    Args:
        x: waveform `(..., T)`, real.
        n_fft: FFT size; the output has `n_fft // 2 + 1` frequency bins.
        hop_length: samples between frames; defaults to `win_length // 4`.
        win_length: window length; defaults to `n_fft`.
        window_name: "hann", "hamming" or "rectangular".
        center: pad `n_fft // 2` samples on both sides so frame `t` is centred on sample
            `t * hop_length`.
        pad_mode: "constant" (zeros) or "reflect", used when `center=True`.

    Returns:
        Complex array `(..., n_fft // 2 + 1, n_frames)`.
    """
    win_length = n_fft if win_length is None else win_length
    hop_length = win_length // 4 if hop_length is None else hop_length
    check_fft_sizes(n_fft, win_length, hop_length)
    if pad_mode not in PAD_MODES:
        raise ValueError(f"pad_mode must be one of {PAD_MODES}, got {pad_mode!r}")
    num_frames(x.shape[-1], n_fft, hop_length, center)
    if center:
        pad = [(0, 0)] * (x.ndim - 1) + [(n_fft // 2, n_fft // 2)]
        x = jnp.pad(x, pad, mode=pad_mode)
    w = window(window_name, win_length, n_fft).astype(np.dtype(jnp.result_type(x.dtype, jnp.float32)))
    frames = frame(x, n_fft, hop_length) * w
    return jnp.swapaxes(jnp.fft.rfft(frames, axis=-1), -1, -2)


def safe_abs(z: jax.Array) -> jax.Array:
    """`|z|` with a zero gradient (instead of NaN) where `z == 0`; NaN stays NaN."""
    return safe_sqrt(jnp.real(z) ** 2 + jnp.imag(z) ** 2)


def stft_magnitude(x: jax.Array, n_fft: int = 512, hop_length: int | None = None, win_length: int | None = None,
                   window_name: str = "hann", center: bool = True, pad_mode: str = "constant",
                   power: float = 1.0) -> jax.Array:
    """`|STFT(x)| ** power`: the magnitude (power=1) or power (power=2) spectrogram.

    Arguments are those of `stft`; the result is real, `(..., n_fft // 2 + 1, n_frames)`.
    """
    if not power > 0:
        raise ValueError(f"power must be > 0 (1 for magnitude, 2 for power), got {power!r}")
    z = stft(x, n_fft, hop_length, win_length, window_name, center, pad_mode)
    if power == 2.0:
        return jnp.real(z) ** 2 + jnp.imag(z) ** 2
    magnitude = safe_abs(z)
    return magnitude if power == 1.0 else magnitude ** power


def multi_scale_stft_magnitude(x: jax.Array, fft_sizes: Sequence[int] = (2048, 1024, 512, 256, 128, 64),
                               overlap: float = 0.75, power: float = 1.0, center: bool = True) -> tuple[jax.Array, ...]:
    """Magnitude spectrograms at several FFT sizes, as used by multi-scale spectral losses.

    Each scale uses a Hann window of its FFT size and a hop of `n_fft * (1 - overlap)`.

    Returns:
        One array per FFT size, in the order given.
    """
    if not 0.0 <= overlap < 1.0:
        raise ValueError(f"overlap must lie in [0, 1), got {overlap!r}")
    return tuple(
        stft_magnitude(x, n, hop_length=max(1, int(round(n * (1.0 - overlap)))), center=center, power=power)
        for n in fft_sizes
    )


def fft_frequencies(sample_rate: float, n_fft: int) -> np.ndarray:
    """The centre frequency in Hz of each of the `n_fft // 2 + 1` STFT bins."""
    return np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
