"""Host stages: decode encoded records (image/audio bytes, text) to fixed-shape numpy arrays on
the background reader, before the compiled program. Randomness is keyed by record, epoch and stage
position (docs/concepts.md); a stage whose `seed` is None takes the pipeline's seed.

    >>> pipeline = Pipeline(ImageFolderSource(root=root), [DecodeImage(size=128, crop="random_resized"),
    ...                                               HorizontalFlipOperator(...)], batch_size=64)
"""

from __future__ import annotations

import abc
import dataclasses
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import numpy as np

from datarax.core.errors import DataraxError, DataraxWarning, RecordError, record_origin
from datarax.core.fields import ENCODED, Spec
from datarax.core.source import DataSourceModule
from datarax.monitoring.stages import WORK, StageTimes
from datarax.samplers.base import Sampler
from datarax.samplers.keyed import keyed_generator
from datarax.samplers.simple import default_sampler


def record_generator(seed: int, stage: int, epoch: int, record_id: int) -> np.random.Generator:
    """The Philox generator of one record in one epoch for one host stage (`keyed_generator`)."""
    return keyed_generator(seed, stage, epoch, record_id)


@dataclasses.dataclass(frozen=True)
class HostContext:
    """What a host stage knows about the batch it transforms.

    Attributes:
        record_ids: the batch's record ids (int64, one per row; padding rows repeat a record).
        epoch: the epoch the batch belongs to.
        stage: the stage's position among the pipeline's host stages (part of its random key).
        describe_record: names a record's origin for error messages (a path, a row of a file).
        seed: the pipeline's seed, for a stage that sets none of its own.
        out: the pipeline's reused batch buffers (one row per record), when this stage's outputs go
            straight into them; `buffer` hands them out.
    """

    record_ids: np.ndarray
    epoch: int
    stage: int = 0
    describe_record: Callable[[int], str] = lambda record_id: f"record {record_id}"
    seed: int = 0
    out: dict[str, np.ndarray] | None = None

    def buffer(self, name: str, shape: tuple[int, ...], dtype: Any, *, zeros: bool = False) -> np.ndarray:
        """An array for the output field `name`: the reused batch buffer when it has this shape and
        dtype (so the stage writes the batch's final copy), else a new one."""
        target = None if self.out is None else self.out.get(name)
        if target is None or target.shape != tuple(shape) or target.dtype != np.dtype(dtype):
            return np.zeros(shape, dtype) if zeros else np.empty(shape, dtype)
        if zeros:
            target.fill(0)
        return target

    def seed_of(self, stage_seed: int | None) -> int:
        """A stage's own seed, or the pipeline's when it has none."""
        return self.seed if stage_seed is None else stage_seed

    def generator(self, seed: int | None, row: int) -> np.random.Generator:
        """The generator of row `row`'s record (see `record_generator`); `seed` None: the pipeline's."""
        return record_generator(self.seed_of(seed), self.stage, self.epoch, int(self.record_ids[row]))

    def where(self, row: int) -> str:
        """`record 17 (photos/cat/001.jpg)`: the row's record and its origin, for errors."""
        return record_origin(int(self.record_ids[row]), self.describe_record)


class Refusal(DataraxError, ValueError):
    """A decoder's refusal of one record before decoding it (over budget, empty, unmappable); the
    message continues the record's name and says the fix. `decode_rows` makes it a `RecordError`."""


class SkippedRecordWarning(DataraxWarning):
    """A host stage replaced a record it could not decode by zeros (`on_error="skip"`)."""


ON_ERROR = ("raise", "skip")


class BadRecords:
    """What a decoding stage does with records it cannot decode (`on_error`).

    `"raise"` raises the first failure as a `RecordError` naming the record; `"skip"` writes zeros,
    sets `ok_field` False, counts it in `skipped` and warns once per record (`SkippedRecordWarning`).
    """

    def __init__(self, on_error: str, stage: str, field: str, ok_field: str | None, fix: str):
        self.on_error, self.stage, self.field, self.ok_field, self.fix = on_error, stage, field, ok_field, fix
        self.skipped = 0
        self.warned: set[int] = set()
        self._lock = threading.Lock()

    def resolve(self, failures: Sequence[BaseException | None], ctx: HostContext,
                outputs: Sequence[np.ndarray]) -> np.ndarray | None:
        """Handles the batch's failures; returns the `ok` flags under "skip" (None under "raise")."""
        ok = np.ones(len(failures), np.bool_) if self.on_error == "skip" else None
        for row, exc in enumerate(failures):
            if exc is None:
                continue
            # A RecordError already names the record and its fix; a decoder's own error gets both.
            own = isinstance(exc, RecordError)
            message = str(exc) if own else \
                f"{self.stage} could not decode {ctx.where(row)} in field {self.field!r}: {type(exc).__name__}: {exc}"
            if ok is None:
                fix = "" if own else f". {self.fix}"
                raise RecordError(f"{message}{fix}; or pass on_error='skip' to replace bad records by zeros flagged "
                                  f"in '{self.field}_ok'") from exc
            for out in outputs:
                out[row] = 0
            ok[row] = False
            record_id = int(ctx.record_ids[row])
            with self._lock:
                self.skipped += 1
                first = record_id not in self.warned
                self.warned.add(record_id)
            if first:
                warnings.warn(f"{message}; skipped (zeros, '{self.ok_field}' False)", SkippedRecordWarning,
                              stacklevel=3)
        return ok

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class HostStage(abc.ABC):
    """Abstract base of host stages.

    Subclasses implement `output_spec` and `__call__`; `stochastic` stages draw only from
    `ctx.generator(self.seed, row)`. `work` (one of `datarax.monitoring.stages.WORK`) orders the
    remedies a goodput report suggests when the stage is the slowest part.
    """

    seed: int | None = None
    stochastic: bool = False
    work: str = "other"
    # The settings a constructor takes by position, in order (`datarax.core.construct`).
    positional: ClassVar[tuple[str, ...]] = ()
    # The encoded field this stage reads from file references itself (in its worker processes): at the
    # head of the stages, a source with `read_references` then hands it references, not bytes.
    reads_files: str | None = None

    @abc.abstractmethod
    def output_spec(self, input_spec: Spec) -> Spec:
        """The spec of one output record, given one input record's (no batch axis)."""

    @abc.abstractmethod
    def __call__(self, batch: dict[str, np.ndarray], ctx: HostContext) -> dict[str, np.ndarray]:
        """Transforms a batch of records (each field with a leading batch axis)."""

    def structure(self) -> str:
        """Identifies the stage in iterator fingerprints."""
        return f"{type(self).__name__}({getattr(self, 'config', '')})"

    def label(self) -> str:
        """The stage's short name in timing reports: the class name, and the executor it runs on
        where it chose one (`DecodeImage [processes]`)."""
        return type(self).__name__ + executor_suffix(self)

    def close(self) -> None:
        """Releases threads or files the stage holds (idempotent)."""
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()

    def held_bytes(self) -> int:
        """Memory the stage may hold while it works beyond the batch it returns (its decode budget)."""
        return 0

    def draws(self, batch: dict[str, np.ndarray], ctx: HostContext) -> dict[str, np.ndarray] | None:
        """What this stage draws at random for each record of `batch` under `ctx`, as `__call__` draws
        it (each value with a leading batch axis), for looking back at a batch
        (`datarax.pipeline.replay`); never on the hot path.

        `{}` for a deterministic stage; None for a stochastic one that cannot name its draws (a
        user function drawing from its generator). `DecodeImage` reports its crop boxes.
        """
        return None if self.stochastic else {}

    def ahead(self, batch: dict[str, np.ndarray], ctx: HostContext) -> None:
        """The input of the batch after the one the stage is called on next (file references: see
        `reads_files`); a stage that works ahead may start on it, the others ignore it."""


class DecodingStage(HostStage):
    """Abstract base of the stages that decode record by record on a thread pool (`pool`), with
    `bad_records` for the records that fail and, for the decoders, a memory `budget`."""

    pool: Any
    bad_records: BadRecords
    budget: Any = None
    _batches: Any = None  # in worker processes: the workers' lease and the batches they compute ahead

    def close(self) -> None:
        """Stops the threads, or gives the worker processes back (the pool's last user stops them),
        and frees the shared memory; a later batch starts them again."""
        self.pool.close()
        if self._batches is not None:
            self._batches.close()

    def __getstate__(self) -> dict[str, Any]:
        # Threads, processes and modules do not copy or pickle: a copy builds its own from the config.
        return {"config": self.config, "bad_records": self.bad_records}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["config"])
        self.bad_records = state["bad_records"]

    @property
    def skipped(self) -> int:
        """Records replaced by zeros so far (`on_error="skip"`; once per batch a record is read in)."""
        return self.bad_records.skipped

    def held_bytes(self) -> int:
        """The most memory the stage's decodes hold at once: its budget, `max_decode_bytes`."""
        return 0 if self.budget is None else self.budget.limit

    def decode_rows(self, batch: dict[str, np.ndarray], ctx: HostContext, outputs: dict[str, np.ndarray],
                    work: Callable[[int], None], catch: type[BaseException] | tuple = Exception, *,
                    inline: bool = False) -> dict[str, np.ndarray]:
        """Runs `work(row)` for every row of `outputs` on the pool (`inline=True`: on this thread), then
        `resolve_rows`. A `Refusal` becomes a `RecordError` naming the row's record."""

        def guarded(row: int) -> BaseException | None:
            try:
                work(row)
            except Refusal as exc:
                return RecordError(f"{self.bad_records.stage}: {ctx.where(row)} {exc}")
            except catch as exc:  # decoders raise many kinds for bad bytes; all name the record
                return exc
            return None

        count = len(next(iter(outputs.values())))
        failures = [guarded(row) for row in range(count)] if inline else self.pool.map(guarded, range(count))
        return self.resolve_rows(batch, ctx, outputs, failures)

    def resolve_rows(self, batch: dict[str, np.ndarray], ctx: HostContext, outputs: dict[str, np.ndarray],
                     failures: Sequence[BaseException | None]) -> dict[str, np.ndarray]:
        """`batch` with `outputs` added, failed rows resolved through `bad_records`."""
        ok = self.bad_records.resolve(failures, ctx, list(outputs.values()))
        result = {**batch, **outputs}
        if ok is not None:
            result[self.bad_records.ok_field] = ok
        return result


def executor_suffix(stage: Any) -> str:
    """` [processes]` or ` [threads]` for a stage that chose an executor (`choose_executor`), else ""."""
    choice = getattr(stage, "executor", None)
    return f" [{choice.executor}]" if hasattr(choice, "executor") else ""


def check_encoded_field(spec: Spec, name: str, stage: str, *, holds: str, decoded_fix: str) -> None:
    """A decoding stage's input field must exist and be encoded (one object per record).

    Args:
        holds: what the field should hold, e.g. "encoded images (bytes)".
        decoded_fix: what to do when it already holds arrays.
    """
    if name not in spec:
        raise KeyError(f"{stage} field {name!r} is not in the records (fields {sorted(spec)}); set {stage}(field=...) "
                       f"to the one holding {holds}")
    if spec[name].dtype != ENCODED or spec[name].shape != ():
        raise TypeError(f"{stage} field {name!r} must hold {holds}, one per record, got {spec[name].dtype} "
                        f"{tuple(spec[name].shape)}; {decoded_fix}")


def check_numeric(spec: Spec, what: str) -> None:
    """Every field of `spec` must be fixed-shape numeric: encoded fields need a host stage."""
    for name, leaf in spec.items():
        if leaf.dtype == ENCODED:
            raise TypeError(f"{what} field {name!r} holds encoded records (bytes or text), which cannot enter the "
                            "compiled program; decode it first with a host stage at the head of `stages`, e.g. "
                            "DecodeImage(field=...), DecodeAudio(field=...) or Tokenize(field=...)")


class HostStageSource(DataSourceModule):
    """A random-access source followed by host stages: the pipeline's view of both.

    `Pipeline` builds one when its `stages` begin with host stages; `read` adds the time of the
    source's read and of each stage to `times` (a `StageTimes` on `clock`) for the goodput report.
    """

    def __init__(self, source: DataSourceModule, stages: Sequence[HostStage], *,
                 clock: Callable[[], float] = time.perf_counter, seed: int = 0):
        if not isinstance(source, DataSourceModule):
            raise TypeError(f"host stages need a random-access source (a DataSourceModule), got "
                            f"{type(source).__name__}; streams are decoded by their own reader")
        if not stages:
            raise ValueError("HostStageSource needs at least one host stage")
        self.source = source
        self.stages = tuple(stages)
        self.seed = seed  # the pipeline's: stages without a seed of their own draw from it
        spec = source.element_spec()
        for i, stage in enumerate(self.stages):
            if not isinstance(stage, HostStage):
                raise TypeError(f"host stage {i} must be a HostStage, got {type(stage).__name__}")
            spec = stage.output_spec(dict(spec))
        check_numeric(spec, "after the host stages,")
        self._spec = spec
        self._references = (self.stages[0].reads_files is not None and hasattr(source, "read_references")
                            and self.stages[0].reads_files == getattr(source, "field", None))
        self.times = StageTimes(clock)
        labels = [stage.label() for stage in self.stages]
        # Two stages of one kind get their position, so their times stay apart.
        self._labels = [f"{label}#{i}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]
        # Named spans in a `jax.profiler` trace; ~0.5 us each when no trace is active.
        self._trace_names = [f"datarax/host_stage/{label}" for label in self._labels]
        for stage in self.stages:
            if stage.work not in WORK:
                raise ValueError(f"{type(stage).__name__}.work must be one of {WORK}, got {stage.work!r}")

    def __len__(self) -> int:
        return len(self.source)

    def element_spec(self) -> Spec:
        return dict(self._spec)

    def sampler(self) -> Sampler:
        return default_sampler(self.source)

    def describe_record(self, record_id: int) -> str:
        return self.source.describe_record(record_id)

    def read(self, indices: np.ndarray, epoch: int, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The host stages' output for the records at `indices` in `epoch`.

        Each distinct record is read and decoded once; repeated rows (padding, sampler repeats) copy
        its first row.
        """
        ids = np.asarray(indices, np.int64)
        distinct, rows = first_rows(ids.reshape(-1))
        times, count = self.times, len(distinct)
        with times.measure("source read", records=count, work="read"):
            if self._references:  # the first stage reads the files where it decodes them
                batch = self.source.read_references(distinct)
            else:  # `read`, not `get_batch`: a source that prefetches by the epoch's order sees it here too.
                batch = self.source.read(distinct, int(epoch))
        # The last stage decodes straight into `out` when every row is a distinct record.
        direct = None if out is None or count < ids.size else flat_views(out, ids.shape)
        for i, stage in enumerate(self.stages):
            last = direct if i == len(self.stages) - 1 else None
            with times.measure(self._labels[i], records=count, work=stage.work), \
                    jax.profiler.TraceAnnotation(self._trace_names[i]):
                batch = stage(batch, HostContext(distinct, int(epoch), i, self.source.describe_record, self.seed, last))
        written = {k for k, v in batch.items() if direct is not None and v is direct.get(k)}
        if count < ids.size:
            batch = {k: v[rows] for k, v in batch.items()}
        batch = {k: v.reshape(ids.shape + v.shape[1:]) for k, v in batch.items()}
        if out is None:
            return batch
        for k, v in batch.items():
            if k not in written:
                np.copyto(out[k], v)
        return out

    def draws(self, indices: np.ndarray, epoch: int) -> list[tuple[str, dict[str, np.ndarray] | None]]:
        """`(label, draws)` of every stochastic host stage for the records at `indices` (int[B]) in
        `epoch` (label `host[i] DecodeImage`: its place among the host stages and its class):
        `HostStage.draws` with one row per index. Reads and runs the stages as `read` does
        (for looking back at a batch, never on the hot path)."""
        ids = np.asarray(indices, np.int64).reshape(-1)
        distinct, rows = first_rows(ids)
        batch = self.source.read(distinct, int(epoch))
        out = []
        for i, stage in enumerate(self.stages):
            ctx = HostContext(distinct, int(epoch), i, self.source.describe_record, self.seed)
            if stage.stochastic:
                drawn = stage.draws(batch, ctx)
                out.append((f"host[{i}] {type(stage).__name__}",
                            None if drawn is None else {k: v[rows] for k, v in drawn.items()}))
            if i < len(self.stages) - 1:
                batch = stage(batch, ctx)
        return out

    def upcoming(self, indices: np.ndarray, epoch: int) -> None:
        self.source.upcoming(indices, epoch)
        if self._references:  # references cost no read: the first stage may start decoding them
            distinct, _ = first_rows(np.asarray(indices, np.int64).reshape(-1))
            ctx = HostContext(distinct, int(epoch), 0, self.source.describe_record, self.seed)
            self.stages[0].ahead(self.source.read_references(distinct), ctx)

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        stochastic = [type(s).__name__ for s in self.stages if s.stochastic]
        if stochastic:
            raise TypeError(f"host stages {stochastic} are stochastic, so a batch depends on its epoch: "
                            "call read(indices, epoch, out)")
        return self.read(indices, 0, out)

    def structure(self) -> str:
        def one(stage: HostStage) -> str:  # a stage drawing from the pipeline's seed: that seed (0 read as before)
            drawn = stage.stochastic and getattr(stage, "seed", None) is None and self.seed != 0
            return stage.structure() + (f" [pipeline seed {self.seed}]" if drawn else "")

        return f"{self.source.structure()} -> " + " -> ".join(one(s) for s in self.stages)

    def close(self) -> None:
        """Closes the host stages and the source they read (their threads and files)."""
        for stage in self.stages:
            stage.close()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


def flat_views(out: dict[str, np.ndarray], lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    """`out`'s contiguous buffers viewed with their `lead` axes as one row axis (others left out)."""
    count = int(np.prod(lead))
    return {k: v.reshape((count,) + v.shape[len(lead):]) for k, v in out.items()
            if v.shape[:len(lead)] == tuple(lead) and v.flags.c_contiguous}


def first_rows(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(distinct, rows)`: the distinct ids in order of first appearance, and `rows` with `distinct[rows] == ids`.

    >>> first_rows(np.array([7, 3, 7, 9, 9]))
    (array([7, 3, 9]), array([0, 1, 0, 2, 2]))
    """
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first)  # unique sorts by value; keep the batch's own order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return ids[first[order]], rank[inverse.reshape(-1)]


def split_host_stages(source: Any, stages: Sequence[Any], seed: int = 0) -> tuple[Any, list[Any]]:
    """`(source, device stages)`: leading host stages folded into a `HostStageSource` (whose
    stages without a seed of their own draw from `seed`)."""
    if not isinstance(stages, (list, tuple)):
        return source, stages  # not a sequence: the stage chain reports it
    stages = list(stages)
    count = 0
    while count < len(stages) and isinstance(stages[count], HostStage):
        count += 1
    late = [i for i, s in enumerate(stages) if i >= count and isinstance(s, HostStage)]
    if late:
        raise ValueError(f"stages[{late[0]}] ({type(stages[late[0]]).__name__}) is a host stage after a device "
                         "stage; host stages run before the compiled program, so put them first")
    if count:
        source = HostStageSource(source, stages[:count], seed=seed)
    return source, stages[count:]
