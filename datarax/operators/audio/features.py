"""Feature extractors: STFT magnitude, mel and log-mel spectrograms, MFCC, A-weighted loudness.

Each reads a waveform field (default "audio") and writes a new field (default named after the
feature), so the waveform stays available to later stages. They draw nothing and have no
learnable magnitudes; they are differentiable with respect to the waveform, so gradients flow
through them to earlier learnable stages. Layouts follow librosa: `(..., freq, time)`.

Example:
    >>> log_mel = LogMelOperator(LogMelConfig(sample_rate=16000, n_fft=512, hop_length=160, n_mels=64))
    >>> batch = log_mel(Element({"audio": waves}), ctx)          # adds batch.data["log_mel"]
"""

from __future__ import annotations

import dataclasses

from datarax.core.checks import check_choice, check_int, check_number, field, require_deterministic
from datarax.operators.audio.base import AudioOperator, AudioOperatorConfig
from datarax.operators.audio.functional import loudness, mel, spectral


@dataclasses.dataclass(frozen=True)
class SpectralConfig(AudioOperatorConfig):
    """Settings shared by the feature extractors.

    Attributes:
        n_fft: FFT size (Hann window of this length unless `STFTConfig.win_length` says otherwise).
        hop_length: samples between frames; None for `win_length // 4`.
        center: pad `n_fft // 2` on both sides so frames are centred on their sample.
        pad_mode: "constant" (zeros, librosa >= 0.10) or "reflect".
    """

    n_fft: int = 512
    hop_length: int | None = None
    center: bool = True
    pad_mode: str = "constant"

    def __post_init__(self):
        super().__post_init__()
        require_deterministic(self, "feature extractors draw nothing")
        check_int(*field(self, "n_fft"), 1)
        check_int(*field(self, "hop_length"), 1, allow_none=True)
        check_choice(*field(self, "center"), (True, False))
        check_choice(*field(self, "pad_mode"), spectral.PAD_MODES)


@dataclasses.dataclass(frozen=True)
class STFTConfig(SpectralConfig):
    """Configuration of `STFTOperator`.

    Attributes:
        win_length: window length in samples (<= n_fft); None for n_fft.
        window: "hann", "hamming" or "rectangular".
        power: exponent of the magnitude: 1 for magnitude, 2 for power.
    """

    out_field: str | None = "spectrogram"
    win_length: int | None = None
    window: str = "hann"
    power: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_int(*field(self, "win_length"), 1, allow_none=True)
        check_choice(*field(self, "window"), spectral.WINDOWS)
        check_number(*field(self, "power"), 0.0, 4.0, open_low=True)
        spectral.check_fft_sizes(self.n_fft, self.win_length or self.n_fft, self.hop_length or 1)


class STFTOperator(AudioOperator):
    """`|STFT(x)| ** power`, shape `(..., n_fft // 2 + 1, n_frames)` (librosa's `np.abs(stft)`)."""

    config_class = STFTConfig
    positional = ("n_fft",)

    def apply(self, x, params):
        c = self.config
        return spectral.stft_magnitude(x, c.n_fft, c.hop_length, c.win_length, c.window, c.center, c.pad_mode,
                                       c.power)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MelFeatureConfig(SpectralConfig):
    """Mel filterbank settings shared by mel, log-mel and MFCC configs.

    Attributes:
        sample_rate: the waveform's sampling rate in Hz.
        n_mels: number of mel bands.
        fmin: lowest band edge in Hz.
        fmax: highest band edge in Hz; None for `sample_rate / 2`.
        htk: HTK mel formula instead of the Slaney scale (librosa's default).
        norm: "slaney" (area-normalised triangles, librosa's default) or None.
    """

    sample_rate: int
    n_mels: int = 128
    fmin: float = 0.0
    fmax: float | None = None
    htk: bool = False
    norm: str | None = "slaney"

    def __post_init__(self):
        super().__post_init__()
        check_number(*field(self, "sample_rate"), 0.0, 1e7, open_low=True)
        check_int(*field(self, "n_mels"), 1)
        check_choice(*field(self, "htk"), (True, False))
        fmax = self.sample_rate / 2.0 if self.fmax is None else self.fmax
        mel.check_mel_settings(self.sample_rate, self.n_mels, self.fmin, fmax, self.norm)

    def mel_kwargs(self) -> dict:
        return dict(sample_rate=self.sample_rate, n_fft=self.n_fft, hop_length=self.hop_length, n_mels=self.n_mels,
                    fmin=self.fmin, fmax=self.fmax, htk=self.htk, norm=self.norm, center=self.center,
                    pad_mode=self.pad_mode)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MelSpectrogramConfig(MelFeatureConfig):
    """Configuration of `MelSpectrogramOperator`.

    Attributes:
        power: 2 for mel energies (librosa's default), 1 for mel magnitudes.
    """

    out_field: str | None = "mel"
    power: float = 2.0

    def __post_init__(self):
        super().__post_init__()
        check_number(*field(self, "power"), 0.0, 4.0, open_low=True)


class MelSpectrogramOperator(AudioOperator):
    """Mel spectrogram `(..., n_mels, n_frames)` (librosa `feature.melspectrogram`)."""

    config_class = MelSpectrogramConfig
    positional = ("sample_rate",)

    def apply(self, x, params):
        return mel.mel_spectrogram(x, power=self.config.power, **self.config.mel_kwargs())


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogMelConfig(MelFeatureConfig):
    """Configuration of `LogMelOperator` (see `mel.power_to_db`).

    Attributes:
        ref: the 0 dB reference power, a number or "max".
        amin: power floor before the logarithm.
        top_db: floor at `max - top_db` dB per record; None for no floor.
    """

    out_field: str | None = "log_mel"
    ref: float | str = 1.0
    amin: float = 1e-10
    top_db: float | None = 80.0

    def __post_init__(self):
        super().__post_init__()
        if self.ref != "max":
            check_number(*field(self, "ref"), 0.0, float("inf"), open_low=True)
        check_number(*field(self, "amin"), 0.0, 1.0, open_low=True)
        check_number(*field(self, "top_db"), 0.0, 1e4, allow_none=True)


class LogMelOperator(AudioOperator):
    """Log-mel spectrogram in dB: librosa `power_to_db(feature.melspectrogram(...))`."""

    config_class = LogMelConfig

    def apply(self, x, params):
        c = self.config
        return mel.log_mel_spectrogram(x, ref=c.ref, amin=c.amin, top_db=c.top_db, **c.mel_kwargs())


@dataclasses.dataclass(frozen=True, kw_only=True)
class MFCCConfig(MelFeatureConfig):
    """Configuration of `MFCCOperator`.

    Attributes:
        n_mfcc: number of coefficients kept (<= n_mels).
        top_db: log-mel floor as in `LogMelConfig`.
        lifter: cepstral liftering coefficient; 0 for none.
    """

    out_field: str | None = "mfcc"
    n_mfcc: int = 20
    top_db: float | None = 80.0
    lifter: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_int(*field(self, "n_mfcc"), 1)
        if self.n_mfcc > self.n_mels:
            raise ValueError(f"MFCCConfig.n_mfcc must be <= n_mels={self.n_mels}, got {self.n_mfcc}; "
                             "lower n_mfcc or raise n_mels")
        check_number(*field(self, "top_db"), 0.0, 1e4, allow_none=True)
        check_number(*field(self, "lifter"), 0.0, 1e4)


class MFCCOperator(AudioOperator):
    """MFCC `(..., n_mfcc, n_frames)`: orthonormal DCT-II of the log-mel (librosa `feature.mfcc`)."""

    config_class = MFCCConfig
    positional = ("sample_rate",)

    def apply(self, x, params):
        c = self.config
        return mel.mfcc(x, n_mfcc=c.n_mfcc, top_db=c.top_db, lifter=c.lifter, **c.mel_kwargs())


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoudnessConfig(SpectralConfig):
    """Configuration of `LoudnessOperator` (see `loudness.a_weighted_loudness`).

    Attributes:
        sample_rate: the waveform's sampling rate in Hz.
        average: "power" (A-weighted mean power) or "db" (DDSP's mean of A-weighted dB).
        ref_db: level subtracted from the result.
        range_db: floor at `-range_db`.
        amin: power floor before the logarithm.
    """

    sample_rate: int
    out_field: str | None = "loudness"
    average: str = "power"
    ref_db: float = 0.0
    range_db: float = 80.0
    amin: float = 1e-10

    def __post_init__(self):
        super().__post_init__()
        check_number(*field(self, "sample_rate"), 0.0, 1e7, open_low=True)
        check_choice(*field(self, "average"), loudness.AVERAGES)
        check_number(*field(self, "ref_db"), -1e4, 1e4)
        check_number(*field(self, "range_db"), 0.0, 1e4, open_low=True)
        check_number(*field(self, "amin"), 0.0, 1.0, open_low=True)


class LoudnessOperator(AudioOperator):
    """Frame-wise A-weighted loudness in dB, shape `(..., n_frames)`."""

    config_class = LoudnessConfig

    def apply(self, x, params):
        c = self.config
        return loudness.a_weighted_loudness(x, c.sample_rate, c.n_fft, c.hop_length, c.average, c.ref_db,
                                            c.range_db, c.amin, c.center, c.pad_mode)
