"""Several training steps with the pipeline inside: gather, stages and steps in one compiled call."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from datarax.batching import padded_positions
from datarax.pipeline.pipeline import Pipeline
from datarax.sources.stream import StreamSourceModule
from datarax.train.loop.step import TimedJit


@dataclasses.dataclass(frozen=True)
class FusedCall:
    """The inputs of one fused call: `(stage values, source arrays, int32[K, B] record indices,
    int32[K, 3] metas)`, and how many steps and records it trains on."""

    inputs: tuple
    steps: int
    rows: int

    def __len__(self) -> int:
        return self.steps


class FusedSteps:
    """K training steps over a device-resident pipeline in one compiled call, its batches made inside.

    Each step's batch is gathered from the source's device arrays and run through the pipeline's
    stages inside the call (the pipeline's own batch program, traced into it), then trained on, so
    a call is one dispatch with no per-batch host work: the host computes the call's record indices
    in one vectorised sampler call, as `datarax.pipeline.ScanRunner` does. The batches, their keys
    and the iterator's position afterwards are those of K `next()` calls.

    Args:
        loader: the pipeline the trainer reads (device-resident, unsharded: `supports`).
        step: `step(values, batch) -> (values, metrics)`, the trainer's one training step.
    """

    def __init__(self, loader: Pipeline, step: Callable):
        self.loader = loader
        compiled = loader.compiled

        def steps(values, inputs):
            stage_values, arrays, indices, metas = inputs

            def body(carry, x):
                return step(carry, compiled.gather_and_run(stage_values, arrays, *x))

            values, outs = jax.lax.scan(body, values, (indices, metas))
            return values, jax.tree.map(lambda x: x[-1], outs)

        self._steps = TimedJit(steps, donate_values=True)

    @staticmethod
    def supports(loader: Pipeline) -> bool:
        """Whether `loader`'s batches can be made inside the training call: its records are on the
        device and its batches are not sharded across processes."""
        return (loader.source.device_arrays() is not None and loader.placement is None
                and not isinstance(loader.source, StreamSourceModule))

    def take(self, iterator, count: int) -> FusedCall | None:
        """The next `count` batches as one call's inputs, the iterator moved past them; None (the
        iterator untouched) when one of them is an epoch's short final batch."""
        p = self.loader
        batch = p.batch_size
        upcoming = list(itertools.islice(iterator.upcoming(), count))
        if len(upcoming) < count or any(num_valid != batch for _, _, num_valid in upcoming):
            return None
        metas = np.array([(position, epoch, num_valid) for epoch, position, num_valid in upcoming], np.int32)
        indices = np.empty((count, batch), np.int32)
        for epoch in np.unique(metas[:, 1]):  # a call may cross into the next epoch
            rows = metas[:, 1] == epoch
            positions = padded_positions(metas[rows, :1], np.arange(batch), len(p.sampler))
            indices[rows] = p.sampler.indices(positions.reshape(-1), int(epoch)).reshape(-1, batch)
        epoch, position, num_valid = upcoming[-1]
        iterator.seek(epoch, position + num_valid)
        return FusedCall((p.compiled.values(), p.source.device_arrays(), indices, metas), count, count * batch)

    def __call__(self, values: list, call: FusedCall) -> tuple[Any, float]:
        """`((new values, the last step's metrics), compile seconds)`, as `TimedJit` returns."""
        return self._steps(values, call.inputs)
