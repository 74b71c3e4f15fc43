"""`DecodeAudio`: WAV/FLAC/OGG bytes to fixed-length float waveforms, on the host.

Each record is decoded with `soundfile` in worker processes or on threads (`executor`), mixed
to mono (or checked against a channel count), resampled to `sample_rate` and cropped or
zero-padded to `length`: `(length,)` float32 for mono or `(channels, length)`, plus
`<field>_length` (int32 valid samples). Only the samples the crop window needs are read;
docs/sources.md ("Audio") has the details.

Example:
    >>> stages = [DecodeAudio(field="audio", sample_rate=16000, length=16000, crop="random", seed=0)]
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
from typing import Any

import jax
import numpy as np

from datarax.control.budget import MemoryBudget, default_budget, human
from datarax.control.pool import ThreadPool
from datarax.control.processes import EXECUTORS, BatchesAhead, choose_executor, lease, row_blocks
from datarax.core.checks import check_choice, check_field_name, check_positive_int, check_seed, field, is_int, require
from datarax.core.construct import resolve_config
from datarax.host.stage import (
    ON_ERROR,
    BadRecords,
    DecodingStage,
    HostContext,
    RecordError,
    Refusal,
    Spec,
    check_encoded_field,
)
from datarax.samplers.keyed import rekeyed_generator

_CROPS = ("random", "center", "start")
_BUFFER = re.compile(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


def _soundfile() -> Any:
    # libsndfile comes with the wheel; the package is the optional part. Not kept on the stage:
    # a module neither copies nor pickles.
    return require("soundfile", owner="DecodeAudio", extra="audio")


@dataclasses.dataclass(frozen=True)
class DecodeAudioConfig:
    """Configuration of `DecodeAudio`.

    Attributes:
        field: the encoded field to decode; the waveform replaces it.
        sample_rate: the output rate in Hz; files at another rate are resampled. None keeps each
            file's own rate (then every file should share one).
        length: the output length in samples (at `sample_rate`).
        channels: "mono" averages the channels; an int keeps that many and refuses other files.
        crop: where a longer clip is cut: "random" (per record and epoch), "center" or "start".
        seed: the random crop's seed; None: the pipeline's seed.
        num_threads: decoding threads or worker processes (1 thread decodes on the reader thread
            itself); it changes no output.
        on_error: "raise" a `RecordError` on a bad record, or "skip" it (zeros, `<field>_ok`).
        max_decode_bytes: the memory the concurrent decodes may hold at once (None: a quarter of
            host memory, at most 8 GiB); a record that needs more alone is refused as a bad record.
        executor: "auto" (the default: worker processes where they can start, see
            `datarax.control.processes.choose_executor`; `DecodeAudio.executor` says which and why),
            "threads" or "processes". The same output and fingerprint either way.
    """

    field: str = "audio"
    sample_rate: int | None = 16000
    length: int = 16000
    channels: str | int = "mono"
    crop: str = "random"
    seed: int | None = None
    num_threads: int = 4
    on_error: str = "raise"
    max_decode_bytes: int | None = None
    executor: str = "auto"

    def __post_init__(self):
        check_field_name(*field(self, "field"))
        check_positive_int(*field(self, "sample_rate"), allow_none=True, unit="Hz")
        check_positive_int(*field(self, "length"), unit="samples")
        if self.channels != "mono" and not (is_int(self.channels) and self.channels >= 1):
            raise ValueError(f"DecodeAudioConfig.channels must be 'mono' or a positive int (the channel count "
                             f"every file has), got {self.channels!r}")
        check_choice(*field(self, "crop"), _CROPS)
        check_seed(*field(self, "seed"), allow_none=True)
        check_positive_int(*field(self, "num_threads"))
        check_choice(*field(self, "on_error"), ON_ERROR)
        check_positive_int(*field(self, "max_decode_bytes"), allow_none=True, unit="bytes")
        check_choice(*field(self, "executor"), EXECUTORS)


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


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """What to read of a file and what to keep: `count` frames from frame `first`, resampled
    (when `up`/`down` is not 1/1), then `valid` samples from `offset` of the result."""

    first: int
    count: int
    up: int
    down: int
    offset: int
    valid: int

    def working_bytes(self, channels: int, mono: bool) -> int:
        """The most the decode holds at once: the float32 frames read (and their mono mix), and
        when resampling scipy's float64 copy, its filter (`20 * max(up, down) + 1` taps, a few
        arrays of them while it is designed) and the float64 output with its float32 copy."""
        kept = 1 if mono else channels
        read = self.count * (channels + mono) * 4
        if self.up == self.down == 1:
            return read
        taps = 20 * max(self.up, self.down) + 1
        out = (self.count * self.up + taps) // self.down + 1
        return read + self.count * kept * 8 + 4 * taps * 8 + out * kept * 12


def read_plan(frames: int, rate: int, target: int | None, length: int, crop: str,
              rng: np.random.Generator | None) -> ReadPlan:
    """The window of a `frames`-frame file at `rate` Hz that gives its `length`-sample clip at `target` Hz.

    The start is drawn on the resampled length; the window reaches the filter's `10 * max(up, down)`
    taps either side, from a multiple of `down`, so resampling it gives the whole file's samples.
    """
    if target is None or rate == target:
        start = crop_offset(frames, length, crop, rng)
        return ReadPlan(start, max(0, min(length, frames - start)), 1, 1, 0, max(0, min(length, frames - start)))
    g = math.gcd(rate, target)
    up, down = target // g, rate // g
    total = -(-frames * up // down)
    start = crop_offset(total, length, crop, rng)
    valid = max(0, min(length, total - start))
    reach = 10 * max(up, down) // up + 2
    first = max(0, (start * down // up - reach) // down * down)
    last = min(frames, -(-(start + valid) * down // up) + reach)
    return ReadPlan(first, max(0, last - first), up, down, start - first * up // down, valid)


class DecodeAudio(DecodingStage):
    """Decodes encoded audio records into fixed-length float32 waveforms (see the module docstring).

    Args:
        config: the stage's settings; or pass them as keywords (`DecodeAudio(length=16000)`).
    """

    work = "decode"

    def __init__(self, config: DecodeAudioConfig | None = None, **settings: Any):
        self._setup(resolve_config(DecodeAudioConfig, config, settings, "DecodeAudio"))

    def _setup(self, config: DecodeAudioConfig) -> None:
        self.config = config
        self.seed = config.seed
        self.stochastic = config.crop == "random"
        _soundfile()
        self.pool = ThreadPool(config.num_threads, "DecodeAudio")
        limit = config.max_decode_bytes or default_budget()
        ok_field = f"{config.field}_ok" if config.on_error == "skip" else None
        self.bad_records = BadRecords(config.on_error, "DecodeAudio", config.field, ok_field,
                                      "Remove or replace the file (corrupt, truncated or not audio)")
        self.executor = choose_executor(config.executor, "DecodeAudio", workers=config.num_threads)
        self._batches = None  # in worker processes: the workers' lease and the batches they decode
        if self.executor.executor == "processes":
            workers = lease(AudioJob(config), config.num_threads, "datarax-decode-audio", (limit, "DecodeAudio"))
            self.budget: MemoryBudget = workers.shared
            outputs = [(config.field, self._shape(), "float32"), (f"{config.field}_length", (), "int32")]
            self._batches = BatchesAhead(workers, outputs)
        else:
            self.budget = MemoryBudget(limit, "DecodeAudio")

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (in worker processes; empty until the first batch, and after close)."""
        return [] if self._batches is None else self._batches.pool.pids

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

    def decode_into(self, data: Any, ctx: HostContext, row: int, out: np.ndarray) -> int:
        """Writes one record's waveform into `out` (zeroed) and returns its valid length."""
        c = self.config
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise RecordError(f"DecodeAudio: {ctx.where(row)} holds {type(data).__name__}, not the bytes of an "
                              "audio file")
        if len(data) == 0:
            raise RecordError(f"DecodeAudio: {ctx.where(row)} is an empty file (0 bytes); remove or replace it")
        sf = _soundfile()
        mono = c.channels == "mono"
        try:
            with sf.SoundFile(io.BytesIO(data)) as f:
                rate, channels, frames = f.samplerate, f.channels, f.frames
                if not mono and channels != c.channels:
                    raise RecordError(f"DecodeAudio: {ctx.where(row)} has {channels} channels, but channels="
                                      f"{c.channels}; pass channels='mono' to mix them down, or the right count")
                rng = rekeyed_generator(ctx.seed_of(self.seed), ctx.stage, ctx.epoch, int(ctx.record_ids[row])) \
                    if self.stochastic else None
                plan = read_plan(frames, rate, c.sample_rate, c.length, c.crop, rng)
                needed = plan.working_bytes(channels, mono)
                if not self.budget.fits(needed):
                    raise Refusal(f"needs about {human(needed)} to decode ({channels} channel(s) at {rate:,} Hz, "
                                  f"{plan.count:,} frames read{self._resampled(plan)}), more than the stage's "
                                  f"max_decode_bytes={self.budget.limit:,} ({human(self.budget.limit)}); raise "
                                  "DecodeAudio(max_decode_bytes=...) if the host has the memory, or remove the file")
                with self.budget.reserve(needed):
                    f.seek(plan.first)
                    samples = f.read(plan.count, dtype="float32", always_2d=True)
                    if mono:
                        samples = samples.mean(axis=1, keepdims=True, dtype=np.float32)
                    if plan.up != plan.down:
                        samples = resample(samples, rate, c.sample_rate)
                    samples = samples[plan.offset:plan.offset + plan.valid]
        except (RecordError, Refusal):
            raise
        except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
            # soundfile names its in-memory buffer (<_io.BytesIO object at 0x...>), not the record
            reason = _BUFFER.sub("the record's bytes", str(exc))
            raise RecordError(f"DecodeAudio: {ctx.where(row)} is not a readable audio file ({reason})") from None
        valid = len(samples)
        out.reshape(-1, c.length)[:, :valid] = samples.T
        return valid

    def _resampled(self, plan: ReadPlan) -> str:
        if plan.up == plan.down:
            return ""
        return f", resampled by {plan.up}/{plan.down} with a {20 * max(plan.up, plan.down) + 1:,}-tap filter"

    def __call__(self, batch: dict[str, np.ndarray], ctx: HostContext) -> dict[str, np.ndarray]:
        c = self.config
        records = batch[c.field].reshape(-1)
        waves = ctx.buffer(c.field, (len(records),) + self._shape(), np.float32, zeros=True)
        lengths = ctx.buffer(f"{c.field}_length", (len(records),), np.int32, zeros=True)

        outputs = {c.field: waves, f"{c.field}_length": lengths}
        if self._batches is not None:
            return self._in_processes(batch, records, ctx, outputs)

        def work(row: int) -> None:
            lengths[row] = self.decode_into(records[row], ctx, row, waves[row])

        return self.decode_rows(batch, ctx, outputs, work, RecordError)

    def _in_processes(self, batch: dict[str, np.ndarray], records: np.ndarray, ctx: HostContext,
                      outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch decoded by the worker processes into shared memory, then copied into `outputs`;
        each chunk carries its records' origins, so an error names the record as on threads."""
        ids, seed = np.asarray(ctx.record_ids, np.int64), ctx.seed_of(self.seed)

        def chunks() -> list[tuple[int, int, tuple]]:
            return [(low, high, (list(records[low:high]), ids[low:high], int(ctx.epoch), ctx.stage, seed,
                                 [ctx.describe_record(int(i)) for i in ids[low:high]]))
                    for low, high in row_blocks(len(records), self.config.num_threads)]

        failures: list[BaseException | None] = []
        for block in self._batches.read(object(), chunks, outputs):
            failures.extend(block)
        return self.resolve_rows(batch, ctx, outputs, failures)

    def structure(self) -> str:
        # Threads and the memory budget change no output; an unset seed reads as 0 (old fingerprints).
        settings = {k: v for k, v in dataclasses.asdict(self.config).items()
                    if k not in ("num_threads", "max_decode_bytes", "executor")} | {"seed": self.config.seed or 0}
        return "DecodeAudio(" + ", ".join(f"{k}={v!r}" for k, v in settings.items()) + ")"


class AudioJob:
    """A worker process's part of a batch (`DecodeAudio` in worker processes): decode each record
    into its row of the shared outputs and return each row's None or `RecordError` (named with the
    origin the parent sent)."""

    def __init__(self, config: DecodeAudioConfig):
        # The seed comes with each task: stages that differ only in it share the workers (`lease`).
        self.config = dataclasses.replace(config, executor="threads", num_threads=1, seed=None)
        self.stage: DecodeAudio | None = None
        self.budget: Any = None

    def attach(self, budget: Any) -> None:
        self.budget = budget

    def __call__(self, task: tuple, outputs: dict[str, np.ndarray]) -> list[BaseException | None]:
        if self.stage is None:
            self.stage = DecodeAudio(self.config)
            if self.budget is not None:  # the stage's one budget, shared by all its workers
                self.stage.budget = self.budget
        records, ids, epoch, stage, seed, origins = task
        names = dict(zip((int(i) for i in ids), origins))
        ctx = HostContext(ids, epoch, stage, lambda record_id: names[int(record_id)], seed)
        field = self.config.field
        waves, lengths = outputs[field], outputs[f"{field}_length"]
        failures: list[BaseException | None] = []
        for row in range(len(records)):
            waves[row] = 0  # the shared rows hold the batch before
            lengths[row] = 0
            try:
                lengths[row] = self.stage.decode_into(records[row], ctx, row, waves[row])
                failures.append(None)
            except Refusal as exc:
                failures.append(RecordError(f"DecodeAudio: {ctx.where(row)} {exc}"))
            except RecordError as exc:
                failures.append(exc)
        return failures
