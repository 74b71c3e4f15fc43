"""Pipeline: a source, a sampler and a stage program, compiled into one program per batch."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.batching import (
    DISPATCH_AHEAD,
    check_settings,
    num_batches,
    resolve_batches_per_dispatch,
)
from datarax.control.producers import READ
from datarax.control.retry import NO_RETRY, RetryPolicy
from datarax.core.checks import check_int, check_positive_int, describe_value
from datarax.core.operator import BatchContext, OperatorModule, distinct_stage_keys
from datarax.core.source import DataSourceModule, record_shapes, seed_from_rngs
from datarax.host.stage import HostStageSource, check_numeric, split_host_stages
from datarax.monitoring.stages import StageTimes
from datarax.pipeline.chain import Chain
from datarax.pipeline.compiled import MAX_CHUNK_BATCHES, CompiledProgram, run_program
from datarax.pipeline.iterator import PipelineIterator
from datarax.pipeline.replay import ReplayedBatch, replay_batch
from datarax.pipeline.state import Epochs, fingerprint
from datarax.samplers.base import Sampler
from datarax.samplers.simple import default_sampler
from datarax.sharding.mesh import DataSharding
from datarax.sharding.placement import BatchPlacement
from datarax.sources.stream import StreamSourceModule


class LiveReaders:
    """A pipeline's background readers (`Prefetcher`s) whose threads still run, held weakly: one
    of an abandoned iterator lives on until its thread ends, so `Pipeline.close` can wait for it.
    A copied or unpickled pipeline starts with none."""

    def __init__(self):
        self._readers: weakref.WeakSet = weakref.WeakSet()

    def add(self, reader: Any) -> None:
        self._readers.add(reader)

    def __iter__(self):
        return iter(list(self._readers))

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __deepcopy__(self, memo: dict) -> LiveReaders:
        return LiveReaders()


def compile_stages(pipeline: Pipeline) -> CompiledProgram:
    """The jitted batch programs over `pipeline`'s own stages, sampler and layout."""
    return CompiledProgram(pipeline.program, pipeline.sampler, len(pipeline.sampler), pipeline.batch_size,
                           pipeline.placement, record_shapes(pipeline.source))


class Pipeline(nnx.Module, Epochs):
    """A data pipeline whose stages are NNX modules, fused into one jitted program per batch.

    Iterating the pipeline yields one epoch; iterating again yields the next epoch (new order,
    new augmentation). `pipeline.epochs(n)` streams n epochs (None: endlessly) as one iterator.
    The final short batch is kept unless `drop_remainder=True`; it runs padded to the full batch
    shape (no recompilation) and is sliced to its real size.

    Args:
        source: a random-access source (e.g. `MemorySource`).
        stages: operators applied in order (ignored when `program` is given). Host stages
            (`datarax.host`, e.g. `DecodeImage`) come first: they run on the background reader
            before the compiled program and turn encoded records into fixed-shape arrays.
        batch_size: records per batch.
        rngs: the seed (stream "augment", else "default") of every stochastic host stage that
            sets no `seed` of its own. None: seed 0. Shuffling is keyed by the source's seed and
            each device stage's key by its own `rngs`.
        sampler: which records make up each epoch; defaults to the source's (shuffled when the
            source is configured with `shuffle=True`).
        drop_remainder: drop the final short batch of each epoch.
        prefetch: batches a host-resident source prepares ahead on a background thread.
        dispatch_ahead: batches of a device-resident source kept dispatched (queued, not waited
            on) behind the one returned, one batch of device memory each; they are dispatched
            again if a stage's variables change first. 0: dispatch each batch when asked for.
        batches_per_dispatch: batches of a device-resident source computed by one dispatched
            program, handed out one by one (same batches, keys and resume points). None: 8 on a
            TPU (at most 64 MiB of output), 1 elsewhere; sharded pipelines use 1.
        program: a stage program (e.g. a DAG) to use instead of a linear chain of `stages`.
        sharding: lay each batch out over a device mesh as global `jax.Array`s
            (`datarax.sharding.DataSharding`); `batch_size` is then global, and final short
            batches keep the full shape with a validity mask field.
        retry_policy: how a host-resident source's reader retries a read that raised `OSError`
            (`datarax.control.retry`). None: the error reaches `next()`, and the next `next()`
            reads that batch again.

    Example:
        >>> pipeline = Pipeline(source=source, stages=[normalize], batch_size=32)
        >>> for batch in pipeline:
        ...     train_step(batch)
    """

    def __init__(self, source: DataSourceModule, stages: Sequence[OperatorModule] = (), batch_size: int = 32,
                 rngs: nnx.Rngs | None = None, *, sampler: Sampler | None = None, drop_remainder: bool = False,
                 prefetch: int = 2, program: nnx.Module | None = None, sharding: DataSharding | None = None,
                 retry_policy: RetryPolicy | None = None, dispatch_ahead: int = DISPATCH_AHEAD,
                 batches_per_dispatch: int | None = None):
        if not isinstance(source, (DataSourceModule, StreamSourceModule)):
            raise TypeError(f"source must be a DataSourceModule such as MemorySource, got {describe_value(source)} "
                            "(or a StreamSourceModule for a stream)")
        if isinstance(source, StreamSourceModule) and (sampler is not None or sharding is not None):
            raise TypeError(f"{type(source).__name__} is a stream, read in order on one process: sampler and "
                            f"sharding must be None, got sampler={describe_value(sampler)}, "
                            f"sharding={describe_value(sharding)}; "
                            "shuffle with the source's own config, and give each process its own stream")
        self.batch_size, prefetch = check_settings(batch_size=batch_size, drop_remainder=drop_remainder,
                                                   prefetch=prefetch, dispatch_ahead=dispatch_ahead)
        check_int(batches_per_dispatch, "batches_per_dispatch", 1, high=MAX_CHUNK_BATCHES, allow_none=True,
                  why=" (batches computed by one dispatched program)", hint="; None picks the backend's default")
        if sampler is not None and not isinstance(sampler, Sampler):
            raise TypeError(f"sampler must be a datarax Sampler, got {describe_value(sampler)}")
        if rngs is not None and not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"rngs must be an nnx.Rngs (e.g. nnx.Rngs(0)) or None, got {describe_value(rngs)}")
        # The host stages' seed: drawn once, so the same rngs give the same crops on every host.
        self.seed = seed_from_rngs(None, rngs, "augment")
        source, stages = split_host_stages(source, stages, self.seed)
        check_numeric(source.element_spec(), f"{type(source).__name__}'s")
        self.source = source
        self.sampler = default_sampler(source) if sampler is None else sampler
        self.program = Chain(stages) if program is None else program
        distinct_stage_keys(self.program)
        self.drop_remainder = drop_remainder
        if drop_remainder and len(self.sampler) < self.batch_size:
            raise ValueError(
                f"drop_remainder=True with batch_size={self.batch_size} but an epoch has only "
                f"{len(self.sampler)} records, so every batch would be dropped; use a batch_size <= "
                f"{len(self.sampler)} or drop_remainder=False"
            )
        self.prefetch = prefetch
        self.dispatch_ahead = int(dispatch_ahead)
        self._requested_per_dispatch = batches_per_dispatch
        if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
            raise TypeError(f"retry_policy must be a datarax.pipeline.RetryPolicy or None, "
                            f"got {describe_value(retry_policy)}")
        # Not part of the fingerprint: retries change when a batch arrives, never what it holds.
        self.retry_policy = NO_RETRY if retry_policy is None else retry_policy
        # The fingerprint leaves the sharding out on purpose: the stream is the same on any layout.
        self.sharding = sharding
        self.placement = None if sharding is None else BatchPlacement(sharding, self.batch_size, drop_remainder)
        self.compiled = compile_stages(self)
        # What the fingerprint hashes, kept so that a mismatch can name the part that differs.
        self.structure_parts = {
            "source": source.structure(), "sampler": self.sampler.structure(), "num_records": len(source),
            "batch_size": self.batch_size, "drop_remainder": drop_remainder, "stages": self.program.structure(),
        }
        self.fingerprint = fingerprint(self.structure_parts)
        # The background reader's time per part (source read, host stages, copy to device).
        self.reader_times = StageTimes()
        self._readers = LiveReaders()  # the background readers `close` stops
        out = self.compiled.output_spec(*self.input_spec())
        self._output_spec = out if self.placement is None else self.placement.global_spec(out)
        # Not part of the fingerprint either: it changes when a batch is computed, never what it holds.
        batch_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(self._output_spec))
        self.batches_per_dispatch = 1 if sharding is not None else resolve_batches_per_dispatch(
            batches_per_dispatch, batch_bytes, jax.default_backend())

    def __deepcopy__(self, memo=None) -> Pipeline:
        # NNX copies an attribute that is no graph node (the compiled programs) apart from the
        # graph, so the copy's programs would read the variables of a stage copy nobody trains.
        copied = super().__deepcopy__(memo)
        copied.compiled = compile_stages(copied)
        return copied

    @classmethod
    def from_dag(cls, *, source: DataSourceModule, nodes: dict, edges: dict, sink: str, batch_size: int,
                 rngs: nnx.Rngs | None = None, host_stages: Sequence[Any] = (), **kwargs: Any) -> Pipeline:
        """A pipeline whose stages form a DAG; see `datarax.pipeline.dag.DagProgram`.

        `host_stages` (e.g. a `DecodeImage`) run before the DAG, on the background reader.
        """
        from datarax.pipeline.dag import DagProgram

        return cls(source, host_stages, batch_size=batch_size, rngs=rngs, program=DagProgram(nodes, edges, sink),
                   **kwargs)

    def reader_timings(self) -> list[dict]:
        """Seconds, calls and records per part of the background reader so far, in reader order.

        The parts are `"source read"`, each host stage (by its `label()`; the source read then
        counts the source alone) and `"copy to device"`, each with its kind of `work` (see
        `datarax.monitoring.stages`). Empty for a device-resident source, which has no reader.

        Example:
            >>> [p["name"] for p in pipeline.reader_timings()]  # doctest: +SKIP
            ['source read', 'DecodeImage', 'copy to device']
        """
        parts = self.reader_times.snapshot()
        if isinstance(self.source, HostStageSource):
            inner = self.source.times.snapshot()
            parts = [q for p in parts for q in (inner if p["name"] == READ else [p])]
        return parts

    @property
    def stages(self) -> Sequence[nnx.Module]:
        return self.program.stages if isinstance(self.program, Chain) else ()

    def input_spec(self) -> tuple[dict, jax.ShapeDtypeStruct]:
        """`(batch, record_ids)` as the stages receive them, as `jax.ShapeDtypeStruct`s.

        The batch is this process's rows of a full batch, as the sampler lays them out (a window
        axis after the batch axis for a windowed sampler); `record_ids` is int32 of the same
        leading shape.
        """
        spec = self.source.element_spec()
        idx_shape = self.sampler.indices(np.zeros(self.compiled.rows.shape, np.int64), 0).shape
        batch = {k: jax.ShapeDtypeStruct(idx_shape + tuple(v.shape), v.dtype) for k, v in spec.items()}
        return batch, jax.ShapeDtypeStruct(idx_shape, jnp.int32)

    def output_spec(self) -> dict:
        """Shapes and dtypes of a full batch (a dict of `jax.ShapeDtypeStruct`)."""
        return self._output_spec

    def __len__(self) -> int:
        """Batches per epoch."""
        if isinstance(self.source, StreamSourceModule) and self.source.num_records() is None:
            raise TypeError(f"this pipeline reads {type(self.source).__name__}, a stream of unknown length, so it "
                            "has no len(); iterate it instead")
        return num_batches(len(self.sampler), self.batch_size, self.drop_remainder)

    def __iter__(self) -> PipelineIterator:
        return PipelineIterator(self, self.reserve_epochs(1), 1, one_epoch=True)

    def epochs(self, num_epochs: int | None = None) -> PipelineIterator:
        """One iterator over `num_epochs` epochs from the next one (None: endless)."""
        check_positive_int(num_epochs, "num_epochs", allow_none=True)
        return PipelineIterator(self, self.reserve_epochs(num_epochs), num_epochs, one_epoch=False)

    def replay(self, epoch: int, position: int) -> ReplayedBatch:
        """The batch that starts at `position` of `epoch`, rebuilt bitwise without reading any batch
        before it: its record ids, where each came from, what every stochastic stage drew for each
        record, and the batch as iterating returns it (`datarax.pipeline.replay.ReplayedBatch`).

        Raises `ReplayError` for a stream source (no random access) or a batch this pipeline never
        yields (the short final batch under `drop_remainder=True`).

        Example:
            >>> replayed = pipeline.replay(epoch=1, position=64)  # doctest: +SKIP
            >>> replayed.origins[0], replayed.draws["stages[0] RandomCropOperator"]["offset"][0]  # doctest: +SKIP
        """
        return replay_batch(self, epoch, position)

    def track_reader(self, reader: Any) -> None:
        """Registers an iterator's background reader (a `Prefetcher`), which `close` stops and waits for."""
        self._readers.add(reader)

    def close(self) -> None:
        """Stops the threads the source and its host stages hold and waits for them; idempotent.

        Most sources start their threads again on the next read; `ArrayRecordSource` cannot be read
        after `close`. A pipeline dropped without `close()` releases them once it is collected.

        Example:
            >>> with Pipeline(source, [DecodeImage(size=64)], batch_size=32) as pipeline:
            ...     batch = next(iter(pipeline))
        """
        for reader in self._readers:  # first: a running reader would start the pools again
            reader.close()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def raw_loader(self, *, ids_key: str = "record_ids", epoch_key: str = "epoch") -> Pipeline:
        """A pipeline over the same source, sampler and batching that yields untransformed batches.

        Each batch is the source's records (no stages applied) plus `ids_key` (int32[B], the
        record ids) and `epoch_key` (int32[B], the epoch): the `BatchContext` this pipeline
        would use for the same batch. A training step can then run this pipeline's stages inside
        its gradient, so their `nnx.Param`s train with the model::

            loader = pipeline.raw_loader()
            for raw in loader.epochs(None):
                ids, epoch = raw.pop("record_ids"), raw.pop("epoch")
                # inside nnx.grad: batch = pipeline.transform(raw, record_ids=ids, epoch=epoch[0])

        `pipeline.transform(...)` there returns exactly the batch iterating this pipeline gives.
        The loader's iterator is the one to checkpoint (its state has its own fingerprint). Not
        for sharded pipelines (`transform` runs on the unsharded batch).
        """
        from datarax.pipeline.raw import ContextStage

        if self.sharding is not None:
            raise ValueError("raw_loader() gives unsharded batches for pipeline.transform, but this pipeline was "
                             "built with sharding=...; build the pipeline without sharding to train its stages")
        return Pipeline(self.source, [ContextStage(ids_key, epoch_key)], self.batch_size, sampler=self.sampler,
                        drop_remainder=self.drop_remainder, prefetch=self.prefetch, retry_policy=self.retry_policy,
                        dispatch_ahead=self.dispatch_ahead, batches_per_dispatch=self._requested_per_dispatch)

    def transform(self, batch: dict, *, record_ids: Any = None, epoch: Any = 0) -> dict:
        """Runs the stages (everything after the gather) on an already loaded batch.

        Uses the modules directly, so it can be called inside a user's `nnx.jit`/`nnx.grad` step
        and gradients reach the stages' parameters. `record_ids` default to 0..B-1.
        """
        size = jax.tree.leaves(batch)[0].shape[0]
        ids = jnp.arange(size, dtype=jnp.int32) if record_ids is None else jnp.asarray(record_ids, jnp.int32)
        ctx = BatchContext(ids, jnp.asarray(epoch, jnp.int32), jnp.ones((size,), bool))
        return run_program(self.program, batch, ctx)
