"""`HostMap`: any Python function as a host stage, per record or per batch, on threads or processes.

The function contract, randomness and executors are in docs/sources.md ("Python-heavy host stages").
In worker processes the function must be picklable by reference (a module-level `def`) and a
script must build and iterate its pipeline under `if __name__ == "__main__":`; `executor="auto"`
(the default) runs them where both hold, and threads otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from datarax.control.pool import ThreadPool
from datarax.control.processes import EXECUTORS, BatchesAhead, choose_executor, lease, row_blocks
from datarax.core.checks import (
    check_bool,
    check_choice,
    check_field_name,
    check_int,
    check_positive_int,
    check_seed,
    describe_value,
    field,
    set_field,
)
from datarax.core.construct import resolve_arguments
from datarax.core.fields import batchable
from datarax.host.stage import (
    ON_ERROR,
    BadRecords,
    DecodingStage,
    HostContext,
    Spec,
    executor_suffix,
    record_generator,
)

OutputSpec = tuple[tuple[str, tuple[int, ...], str], ...]  # (field, record shape, dtype)


def output_spec_of(outputs: Any, owner: str = "HostMap outputs") -> OutputSpec:
    """`{"x": ((3,), np.float32), "y": jax.ShapeDtypeStruct((), np.int32)}` as plain data."""
    if isinstance(outputs, tuple) and all(isinstance(o, tuple) and len(o) == 3 for o in outputs):
        outputs = {name: (shape, dtype) for name, shape, dtype in outputs}
    if not isinstance(outputs, Mapping) or not outputs:
        raise TypeError(f"{owner} must be a non-empty dict of field -> (shape, dtype) or jax.ShapeDtypeStruct, "
                        f"got {describe_value(outputs)}; e.g. outputs={{'image': ((64, 64, 3), np.uint8)}}")
    spec = []
    for name, leaf in outputs.items():
        check_field_name(name, f"{owner} field")
        shape, dtype = (leaf.shape, leaf.dtype) if hasattr(leaf, "shape") else leaf
        try:
            shape = tuple(check_int(d, f"{owner}[{name!r}] shape", 0) for d in shape)
            dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"{owner}[{name!r}] must be (shape, dtype) or a jax.ShapeDtypeStruct, got "
                            f"{leaf!r}") from None
        if not batchable(dtype):
            raise TypeError(f"{owner}[{name!r}] has dtype {dtype}; outputs enter the compiled program, so they "
                            "must be numeric or bool arrays")
        spec.append((name, shape, dtype.str))
    return tuple(spec)


@dataclasses.dataclass(frozen=True)
class HostMapConfig:
    """Configuration of `HostMap` (everything but the function, so it stays plain data).

    Attributes:
        outputs: the fields the function returns: a dict of field -> `(shape, dtype)` or
            `jax.ShapeDtypeStruct` (record shapes), normalised to `(field, shape, dtype str)` tuples.
        fields: the input fields the function sees (None: all); in processes only these travel.
        batched: the function takes a block of rows (`fn(batch, rngs)`) instead of one record.
        stochastic: the function draws random numbers from the generator it is given.
        seed: the generators' seed; None: the pipeline's seed.
        on_error: "raise" or "skip" (zeros, `<first output>_ok` False, warned once per record;
            needs `batched=False`).
        executor: "auto" (the default: processes where the function pickles and the script has its
            `if __name__ == "__main__":` guard, else threads; `HostMap.executor` says which and why),
            "threads" (for functions that release the GIL) or "processes" (pure Python).
        num_workers: threads or processes (None: `os.cpu_count()`); it changes no output.
    """

    outputs: OutputSpec
    fields: tuple[str, ...] | None = None
    batched: bool = False
    stochastic: bool = False
    seed: int | None = None
    on_error: str = "raise"
    executor: str = "auto"
    num_workers: int | None = None

    def __post_init__(self):
        set_field(self, "outputs", output_spec_of(self.outputs, "HostMapConfig.outputs"))
        if self.fields is not None:
            fields = (self.fields,) if isinstance(self.fields, str) else self.fields
            if not isinstance(fields, (tuple, list)) or not fields:
                raise TypeError(f"HostMapConfig.fields must be None (all) or a non-empty tuple of field names, got "
                                f"{self.fields!r}")
            set_field(self, "fields", tuple(check_field_name(f, "HostMapConfig.fields") for f in fields))
        check_bool(*field(self, "batched"))
        check_bool(*field(self, "stochastic"))
        check_seed(*field(self, "seed"), allow_none=True)
        check_choice(*field(self, "on_error"), ON_ERROR)
        if self.batched and self.on_error == "skip":
            raise ValueError("HostMapConfig(on_error='skip') zeros the records that fail, but with batched=True a "
                             "failure belongs to a block of rows, not to one record; use batched=False to skip "
                             "records, or on_error='raise'")
        check_choice(*field(self, "executor"), EXECUTORS)
        check_positive_int(*field(self, "num_workers"), allow_none=True, unit="threads or processes")


def function_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


class RecordJob:
    """The work of one block of rows, in a thread or a worker process: `job(task, outputs)` writes
    the rows of `outputs` and returns, per row (per block when batched), None or its exception."""

    def __init__(self, fn: Callable, config: HostMapConfig):
        self.fn, self.config = fn, config
        self.name = function_name(fn)

    def __call__(self, task: tuple, outputs: dict[str, np.ndarray]) -> list[BaseException | None]:
        inputs, ids, epoch, stage, seed = task
        stochastic = self.config.stochastic
        if self.config.batched:
            rngs = [record_generator(seed, stage, epoch, int(r)) for r in ids] if stochastic else None
            return [self._store(lambda: self.fn(inputs, rngs), outputs, slice(None), len(ids))]
        failures = []
        for row in range(len(ids)):
            rng = record_generator(seed, stage, epoch, int(ids[row])) if stochastic else None
            record = {k: v[row] for k, v in inputs.items()}
            # The lambda is called at once, inside this iteration.
            failures.append(self._store(lambda: self.fn(record, rng), outputs, slice(row, row + 1), None))
        return failures

    def _store(self, call: Callable[[], Any], outputs: dict[str, np.ndarray], where: Any,
               rows: int | None) -> BaseException | None:
        try:
            result = call()
            if not isinstance(result, Mapping):
                raise TypeError(f"HostMap function {self.name} must return a dict of arrays, "
                                f"got {describe_value(result)}")
            extra = sorted(set(result) - {name for name, _, _ in self.config.outputs})
            if extra:
                raise ValueError(f"HostMap function {self.name} returned fields {extra} that outputs= does not "
                                 "declare; declare them or leave them out")
            for name, shape, _ in self.config.outputs:
                if name not in result:
                    raise KeyError(f"HostMap function {self.name} did not return field {name!r} of outputs=")
                value = np.asarray(result[name])
                want = shape if rows is None else (rows,) + shape
                if value.shape != want:
                    raise ValueError(f"HostMap function {self.name} returned {name!r} with shape {value.shape}, "
                                     f"outputs= declares {want}; return that shape or change outputs=")
                np.copyto(outputs[name][where], value if rows is not None else value[np.newaxis], casting="same_kind")
        except Exception as exc:  # a record's failure, reported with its record by BadRecords
            return picklable(exc)
        return None


def picklable(exc: BaseException) -> BaseException:
    """`exc`, or a RuntimeError with its text when it cannot travel back from a worker process."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # any exception that does not round-trip
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class HostMap(DecodingStage):
    """A Python function applied on the host to each record (or block of rows) of a batch.

    Args:
        config: everything but the function (or give its fields as keywords: `outputs`,
            `fields`, `batched`, `stochastic`, `seed`, `on_error`, `executor`, `num_workers`).
        fn: `fn(record, rng) -> dict` (or `fn(batch, rngs) -> dict` with `batched=True`); also by position.

    Example:
        >>> stage = HostMap(parse, outputs={"tokens": ((128,), np.int32)}, fields=("text",),
        ...                 executor="processes", num_workers=2)

    Attributes:
        skipped: records replaced by zeros so far (`on_error="skip"`).
    """

    work = "python"
    positional = ("fn",)

    def __init__(self, config: HostMapConfig | None = None, *args: Any,
                 fn: Callable[..., Mapping[str, Any]] | None = None, **settings: Any):
        config, fn = resolve_arguments(HostMapConfig, config, settings, "HostMap", {"fn": fn}, args=args,
                                       positional=self.positional)
        self._setup(fn, config)

    def _setup(self, fn: Callable, config: HostMapConfig) -> None:
        if not callable(fn):
            raise TypeError(f"HostMap fn must be a function fn(record, rng) -> dict of arrays, "
                            f"got {describe_value(fn)}")
        if config.executor == "processes":
            try:
                pickle.loads(pickle.dumps(fn))
            except Exception as exc:  # PicklingError, AttributeError, TypeError: all mean the same
                raise TypeError(
                    f"HostMap fn {function_name(fn)} cannot be sent to worker processes ({type(exc).__name__}: "
                    f"{exc}); define it with `def` at module level in an importable module (not a lambda, a nested "
                    "function or a bound method of an unpicklable object), or use executor='threads'") from None
        self.fn, self.config = fn, config
        self.seed, self.stochastic = config.seed, config.stochastic
        self.num_workers = config.num_workers or os.cpu_count() or 1
        first = config.outputs[0][0]
        self.bad_records = BadRecords(config.on_error, f"HostMap({function_name(fn)})", first,
                                      f"{first}_ok" if config.on_error == "skip" else None,
                                      "Fix the function or the record")
        self.job = RecordJob(fn, config)
        self.pool = ThreadPool(self.num_workers, "datarax-host-map")
        self._batches = None  # in worker processes: the workers' lease and the batches they compute ahead
        self.executor = choose_executor(config.executor, f"HostMap({function_name(fn)})", job=self.job,
                                        workers=self.num_workers)
        if self.executor.executor == "processes":
            # The seed comes with each task: stages that differ only in it share the workers (`lease`).
            shared = dataclasses.replace(config, seed=None, executor="processes", num_workers=None)
            workers = lease(RecordJob(fn, shared), self.num_workers, "datarax-host-map")
            self._batches = BatchesAhead(workers, config.outputs)

    def output_spec(self, input_spec: Spec) -> Spec:
        missing = [f for f in (self.config.fields or ()) if f not in input_spec]
        if missing:
            raise KeyError(f"HostMap fields {missing} are not in the records (fields {sorted(input_spec)}); set "
                           "HostMap(fields=...) to fields the source or an earlier host stage provides")
        spec = {**input_spec}
        spec.update({name: jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for name, shape, dtype in self.config.outputs})
        if self.bad_records.ok_field is not None:
            spec[self.bad_records.ok_field] = jax.ShapeDtypeStruct((), np.bool_)
        return spec

    def label(self) -> str:
        return f"HostMap({getattr(self.fn, '__qualname__', type(self.fn).__name__)})" + executor_suffix(self)

    def structure(self) -> str:
        # The executor and worker count change no output; an unset seed reads as 0 (old fingerprints).
        config = dataclasses.replace(self.config, executor="threads", num_workers=None, seed=self.config.seed or 0)
        return f"HostMap(fn={function_name(self.fn)}, {config})"

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (in worker processes; empty until the first batch, and after close)."""
        return [] if self._batches is None else self._batches.pool.pids

    def __call__(self, batch: dict[str, np.ndarray], ctx: HostContext) -> dict[str, np.ndarray]:
        names = self.config.fields or tuple(batch)
        ids = np.asarray(ctx.record_ids, np.int64)
        seed = ctx.seed_of(self.config.seed)
        count = len(ids)

        def task(low: int, high: int) -> tuple:
            return {k: batch[k][low:high] for k in names}, ids[low:high], int(ctx.epoch), ctx.stage, seed

        outputs = self._allocate(count, ctx)
        if self._batches is None and not self.config.batched:  # a row per task: the pool balances uneven records

            def work(row: int) -> None:
                failure = self.job(task(row, row + 1), {k: v[row:row + 1] for k, v in outputs.items()})[0]
                if failure is not None:
                    raise failure

            return self.decode_rows(batch, ctx, outputs, work)
        chunks = [(low, high, task(low, high)) for low, high in row_blocks(count, self.num_workers)]
        if self._batches is not None:
            results = self._batches.read(object(), lambda: chunks, outputs)
        else:
            results = self.pool.map(lambda chunk: self.job(chunk[2], {k: v[chunk[0]:chunk[1]]
                                                                      for k, v in outputs.items()}), chunks)
        failures: list[BaseException | None] = [None] * count
        for (low, _, _), block in zip(chunks, results):
            failures[low:low + len(block)] = block  # a batched block reports one failure, at its first record
        return self.resolve_rows(batch, ctx, outputs, failures)

    def _allocate(self, count: int, ctx: HostContext) -> dict[str, np.ndarray]:
        return {name: ctx.buffer(name, (count,) + shape, dtype) for name, shape, dtype in self.config.outputs}

    def __getstate__(self) -> dict[str, Any]:
        return {"fn": self.fn, "config": self.config, "bad_records": self.bad_records}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["fn"], state["config"])
        self.bad_records = state["bad_records"]
