"""`DecodeAudio`: WAV/FLAC/OGG bytes to fixed-length float waveforms, on the host.

Each record's bytes are decoded with libsndfile (`soundfile`), mixed to mono or checked against a
fixed channel count, resampled to `sample_rate`, then cropped or zero-padded to `length` samples.
The output is `(length,)` float32 for mono or `(channels, length)` for a fixed count (time last,
like the audio operators), plus `<field>_length`, the int32 number of valid (unpadded) samples.

Resampling is polyphase (`scipy.signal.resample_poly` with the gcd-reduced `up/down` ratio): a
zero-phase FIR low-pass at the lower of the two Nyquist rates, `20 * max(up, down) + 1` taps of a
Kaiser-windowed sinc (beta 5), scipy's default. A file already at `sample_rate` is not filtered,
and then only the cropped window is read from the file (a seek), so long files stay cheap.

`crop="random"` draws the window's start from the record's generator (`ctx.generator(seed, row)`),
so a record gets the same clip for any batch size, thread count or resume point, and a new one
each epoch; "start" and "center" are deterministic. A clip shorter than `length` is padded with
zeros at the end. libsndfile releases the GIL while decoding, so records decode on a thread pool.

Bad records: `on_error="raise"` raises `RecordError` naming the record (`ctx.where(row)`);
`on_error="skip"` writes zeros, adds a bool `<field>_ok` field (False for skipped records),
counts them in `skipped` and warns once per record. A WAV cut inside its sample data is not an
error: libsndfile decodes the samples present (its length then says how many).

Example:
    >>> stages = [DecodeAudio(field="audio", sample_rate=16000, length=16000, crop="random", seed=0)]
    >>> pipeline = Pipeline(HFSource(HFSourceConfig(encoded=("audio",)), dataset=ds), stages, batch_size=32)
"""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any

import jax
import numpy as np

from datarax.control.pool import ThreadPool
from datarax.core.checks import check_choice, check_field_name, check_int, check_positive_int, field, is_int, require
from datarax.core.construct import resolve_config
from datarax.host.stage import ON_ERROR, BadRecords, HostContext, HostStage, RecordError, Spec, check_encoded_field

_CROPS = ("random", "center", "start")


def _soundfile() -> Any:
    # libsndfile comes with the wheel; the package is the optional part. Not kept on the stage:
    # a module neither copies nor pickles.
    return require("soundfile", owner="DecodeAudio", extra="audio")


@dataclasses.dataclass(frozen=True)
class DecodeAudioConfig:
    """Configuration of `DecodeAudio`.

    Attributes:
        field: the encoded field to decode (one WAV/FLAC/OGG file's bytes per record); the
            waveform replaces it.
        sample_rate: the output rate in Hz; files at another rate are resampled. None keeps each
            file's own rate (then every file should share one).
        length: the output length in samples (at `sample_rate`).
        channels: "mono" averages the channels; an int keeps that many and refuses other files.
        crop: where a longer clip is cut: "random" (per record and epoch), "center" or "start".
        seed: the random crop's seed (with the stage position, epoch and record id).
        num_threads: decoding threads (1 decodes on the reader thread itself).
        on_error: "raise" a `RecordError` on a bad record, or "skip" it (zeros, `<field>_ok`).
    """

    field: str = "audio"
    sample_rate: int | None = 16000
    length: int = 16000
    channels: str | int = "mono"
    crop: str = "random"
    seed: int = 0
    num_threads: int = 4
    on_error: str = "raise"

    def __post_init__(self):
        check_field_name(*field(self, "field"))
        check_positive_int(*field(self, "sample_rate"), allow_none=True, unit="Hz")
        check_positive_int(*field(self, "length"), unit="samples")
        if self.channels != "mono" and not (is_int(self.channels) and self.channels >= 1):
            raise ValueError(f"DecodeAudioConfig.channels must be 'mono' or a positive int (the channel count "
                             f"every file has), got {self.channels!r}")
        check_choice(*field(self, "crop"), _CROPS)
        check_int(*field(self, "seed"), 0)
        check_positive_int(*field(self, "num_threads"))
        check_choice(*field(self, "on_error"), ON_ERROR)


def crop_offset(available: int, length: int, crop: str, rng: np.random.Generator | None) -> int:
    """The first sample of the `length`-sample window cut from `available` samples."""
    spare = available - length
    if spare <= 0:
        return 0
    if crop == "start":
        return 0
    if crop == "center":
        return spare // 2
    return int(rng.integers(0, spare + 1))


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """`samples` (frames first) from `rate` to `target` Hz with scipy's polyphase filter, as float32."""
    from scipy.signal import resample_poly

    g = math.gcd(rate, target)
    return resample_poly(samples, target // g, rate // g, axis=0).astype(np.float32, copy=False)


class DecodeAudio(HostStage):
    """Decodes encoded audio records into fixed-length float32 waveforms (see the module docstring).

    Args:
        config: the stage's settings; or pass them as keywords (`DecodeAudio(length=16000)`).
    """

    work = "decode"

    def __init__(self, config: DecodeAudioConfig | None = None, **settings: Any):
        self.config = config = resolve_config(DecodeAudioConfig, config, settings, "DecodeAudio")
        self.seed = config.seed
        self.stochastic = config.crop == "random"
        _soundfile()
        self.pool = ThreadPool(config.num_threads, "DecodeAudio")
        ok_field = f"{config.field}_ok" if config.on_error == "skip" else None
        self.bad_records = BadRecords(config.on_error, "DecodeAudio", config.field, ok_field,
                                      "Remove or replace the file (corrupt, truncated or not audio)")

    @property
    def skipped(self) -> int:
        """Records replaced by zeros so far (`on_error="skip"`)."""
        return self.bad_records.skipped

    def _shape(self) -> tuple[int, ...]:
        c = self.config
        return (c.length,) if c.channels == "mono" else (c.channels, c.length)

    def output_spec(self, input_spec: Spec) -> Spec:
        name = self.config.field
        check_encoded_field(input_spec, name, "DecodeAudio", holds="encoded audio (bytes)",
                            decoded_fix="read the column as bytes (HFSourceConfig(encoded=(...)) or "
                                        "ArrayRecordSourceConfig(encoded=...))")
        spec = {**input_spec, name: jax.ShapeDtypeStruct(self._shape(), np.float32),
                f"{name}_length": jax.ShapeDtypeStruct((), np.int32)}
        if self.config.on_error == "skip":
            spec[f"{name}_ok"] = jax.ShapeDtypeStruct((), np.bool_)
        return spec

    def _decode(self, data: Any, ctx: HostContext, row: int, out: np.ndarray) -> int:
        """Writes one record's waveform into `out` (zeroed) and returns its valid length."""
        c = self.config
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise RecordError(f"DecodeAudio: {ctx.where(row)} holds {type(data).__name__}, not the bytes of an "
                              "audio file")
        sf = _soundfile()
        try:
            with sf.SoundFile(io.BytesIO(data)) as f:
                rate, channels, frames = f.samplerate, f.channels, f.frames
                if c.channels != "mono" and channels != c.channels:
                    raise RecordError(f"DecodeAudio: {ctx.where(row)} has {channels} channels, but channels="
                                      f"{c.channels}; pass channels='mono' to mix them down, or the right count")
                rng = ctx.generator(self.seed, row) if self.stochastic else None
                if c.sample_rate is None or rate == c.sample_rate:
                    start = crop_offset(frames, c.length, c.crop, rng)
                    f.seek(start)
                    samples = f.read(min(c.length, frames), dtype="float32", always_2d=True)
                else:
                    samples = f.read(dtype="float32", always_2d=True)
        except RecordError:
            raise
        except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
            raise RecordError(f"DecodeAudio: {ctx.where(row)} is not a readable audio file ({exc})") from None
        if c.channels == "mono":
            samples = samples.mean(axis=1, keepdims=True, dtype=np.float32)
        if c.sample_rate is not None and rate != c.sample_rate:
            samples = resample(samples, rate, c.sample_rate)
            start = crop_offset(len(samples), c.length, c.crop, rng)
            samples = samples[start:start + c.length]
        valid = len(samples)
        out.reshape(-1, c.length)[:, :valid] = samples.T
        return valid

    def __call__(self, batch: dict[str, np.ndarray], ctx: HostContext) -> dict[str, np.ndarray]:
        c = self.config
        records = batch[c.field].reshape(-1)
        waves = np.zeros((len(records),) + self._shape(), np.float32)
        lengths = np.zeros(len(records), np.int32)

        def work(row: int) -> None:
            lengths[row] = self._decode(records[row], ctx, row, waves[row])

        return self.decode_rows(batch, ctx, {c.field: waves, f"{c.field}_length": lengths}, work, RecordError)

    def structure(self) -> str:
        # The thread count changes how fast records decode, never what they decode to, so a state
        # saved with one count restores with another: it is left out of the fingerprint.
        settings = {k: v for k, v in dataclasses.asdict(self.config).items() if k != "num_threads"}
        return "DecodeAudio(" + ", ".join(f"{k}={v!r}" for k, v in settings.items()) + ")"
