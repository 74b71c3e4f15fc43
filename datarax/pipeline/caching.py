"""CachingIterator: memoise an expensive deterministic prefix of a pipeline's stages.

The first `num_cached_stages` stages run once over every record and their outputs are kept (on
the device when they fit); iteration gathers from the cache and runs only the remaining stages.
Batches and iterator state are the uncached pipeline's (values may differ in the last bit). The
cache is not refreshed when the prefix's parameters change: call `refresh()`. See docs/dag.md.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_int, check_positive_int, describe_value
from datarax.core.operator import StageKey
from datarax.core.source import record_shapes
from datarax.pipeline.chain import Chain
from datarax.pipeline.compiled import CompiledProgram
from datarax.pipeline.iterator import PipelineIterator
from datarax.pipeline.pipeline import Pipeline
from datarax.pipeline.state import CheckpointableIterator, check_state, make_state
from datarax.sources.memory import MemorySource, MemorySourceConfig


def _check_prefix(pipeline: Pipeline, num_cached_stages: object) -> int:
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"CachingIterator needs a datarax Pipeline, got {describe_value(pipeline)}")
    if not isinstance(pipeline.program, Chain):
        raise TypeError(f"CachingIterator caches a prefix of a linear pipeline's stages, but this pipeline's program "
                        f"is a {type(pipeline.program).__name__}; build it with Pipeline(stages=[...])")
    stages = pipeline.program.stages
    k = check_int(num_cached_stages, "num_cached_stages", 1, high=len(stages),
                  why=f" (the pipeline has {len(stages)} stages)")
    for i, stage in enumerate(stages[:k]):
        if nnx.state(stage, StageKey):
            raise ValueError(
                f"stage {i} ({stage.structure()}) is stochastic, so its output cannot be cached: it changes every "
                f"epoch. Cache only the deterministic stages before it (num_cached_stages={i})"
            )
    if np.ndim(pipeline.sampler.indices(np.zeros((1,), np.int64), 0)) != 1:
        raise ValueError(f"CachingIterator caches one output per record, but the sampler "
                         f"{pipeline.sampler.structure()} yields several records per batch row (windows); "
                         "use it without a cache")
    return k


def build_cache(pipeline: Pipeline, program: nnx.Module) -> dict[str, np.ndarray]:
    """`program`'s output for every record, in storage order (one compiled call per batch)."""
    source, batch = pipeline.source, pipeline.batch_size
    compiled = CompiledProgram(program, shapes=record_shapes(source))
    values = compiled.values()
    arrays = source.device_arrays()
    n = len(source)
    parts: list[dict] = []
    for start in range(0, n, batch):
        ids = np.minimum(np.arange(start, start + batch), n - 1).astype(np.int32)
        meta = np.array([start, 0, min(batch, n - start)], np.int32)
        if arrays is None:
            out = compiled.run(values, jax.device_put(source.get_batch(ids)), ids, meta)
        else:
            out = compiled.gather_and_run(values, arrays, ids, meta)
        parts.append(out)
    host = jax.device_get(parts)
    return {k: np.concatenate([p[k] for p in host])[:n] for k in host[0]}


class CachingIterator(CheckpointableIterator):
    """Iterates `pipeline` for `num_epochs` epochs (None: endlessly) with its first stages cached.

    Like `pipeline.epochs(num_epochs)`, it starts at the pipeline's next epoch. The cache is
    built once, on the first `next()` (or `set_state`), by running the first `num_cached_stages`
    stages, which must be deterministic, once over all records.

    Example:
        >>> it = CachingIterator(pipeline, num_cached_stages=1, num_epochs=10)  # stage 0 is decode
        >>> for batch in it:
        ...     train_step(batch)
    """

    def __init__(self, pipeline: Pipeline, *, num_cached_stages: int, num_epochs: int | None = None):
        k = _check_prefix(pipeline, num_cached_stages)
        check_positive_int(num_epochs, "num_epochs", allow_none=True)
        self._pipeline = pipeline
        self._prefix = Chain(list(pipeline.program.stages[:k]))
        self._suffix = list(pipeline.program.stages[k:])
        self._num_epochs = num_epochs
        self._start = pipeline.reserve_epochs(num_epochs)
        self._cache: dict[str, np.ndarray] | None = None
        self._cached: Pipeline | None = None
        self._inner: PipelineIterator | None = None

    def _ensure(self) -> PipelineIterator:
        if self._inner is None:
            self._open(self._start, 0)
        return self._inner

    def _build(self) -> None:
        p = self._pipeline
        self._cache = build_cache(p, self._prefix)
        source = MemorySource(MemorySourceConfig(), data=self._cache)
        self._cached = Pipeline(source, stages=self._suffix, batch_size=p.batch_size, sampler=p.sampler,
                                drop_remainder=p.drop_remainder, prefetch=p.prefetch)

    def _open(self, epoch: int, position: int) -> None:
        """A fresh iterator over the cached pipeline, at (epoch, position)."""
        if self._cached is None:
            self._build()
        remaining = None
        if self._num_epochs is not None:
            remaining = self._start + self._num_epochs - epoch
            if remaining < 1:
                raise ValueError(f"iterator state epoch {epoch} is past this iterator's last epoch "
                                 f"{self._start + self._num_epochs - 1}; make a CachingIterator with more num_epochs")
        # The cached pipeline's own epoch counter is never used: this iterator owns the epochs.
        self._inner = PipelineIterator(self._cached, epoch, remaining, one_epoch=False)
        if position:
            self._inner.seek(epoch, position)

    @property
    def cache(self) -> dict[str, np.ndarray] | None:
        """The cached prefix outputs (record i in row i), or None before the first batch."""
        return self._cache

    def __next__(self) -> dict:
        return next(self._ensure())

    def get_state(self) -> dict[str, Any]:
        """The uncached pipeline's iterator state at this point (interchangeable with it)."""
        p = self._pipeline
        epoch, position = (self._start, 0) if self._inner is None else self._inner.cursor
        return make_state(epoch=epoch, position=position, fingerprint=p.fingerprint, num_records=len(p.source),
                          batch_size=p.batch_size)

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from `state` (from this iterator or a plain iterator of the same pipeline)."""
        p = self._pipeline
        epoch, position = check_state(state, fingerprint=p.fingerprint, num_records=len(p.source),
                                      batch_size=p.batch_size, epoch_length=len(p.sampler))
        self.close()
        self._open(epoch, position)

    def refresh(self) -> None:
        """Rebuilds the cache (after the cached stages' parameters changed), keeping the position."""
        state = self.get_state()
        self.close()
        self._cache = self._cached = None
        self._open(state["epoch"], state["position"])

    def close(self) -> None:
        """Stops background prefetching (idempotent); the cache is kept."""
        if self._inner is not None:
            self._inner.close()
