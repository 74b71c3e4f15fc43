"""Several training steps with the pipeline inside: gather, stages and steps in one compiled call."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from datarax.batching import batch_indices, num_batches, padded_positions
from datarax.pipeline.pipeline import Pipeline
from datarax.sources.stream import StreamSourceModule
from datarax.train.loop.guardrails import CompileCauses
from datarax.train.loop.step import TimedJit


@dataclasses.dataclass(frozen=True)
class FusedCall:
    """The inputs of one fused call (the stage values, the source arrays, then the sampler's
    parameters and each step's slot among them, or the record indices from the host, then the
    int32[K, 3] metas), how many steps and records it trains on, and the iterator's cursor after it."""

    inputs: tuple
    steps: int
    rows: int
    cursor: tuple[int, int]

    def __len__(self) -> int:
        return self.steps


class FusedSteps:
    """K training steps over a device-resident pipeline in one compiled call, its batches made inside.

    Each step's batch is gathered from the source's device arrays and run through the pipeline's
    stages inside the call (the pipeline's own batch program, traced into it), then trained on, so
    a call has no per-batch host work. The sampler runs inside it too, for all K batches at once
    before the steps (one cycle walk a call, as the pipeline samples a chunk of batches at once);
    a sampler without `device_params` gets its indices from the host, in one vectorised call. The
    batches, their keys and the iterator's position afterwards are those of K `next()` calls.

    Args:
        loader: the pipeline the trainer reads (device-resident, unsharded: `supports`).
        step: `step(values, batch) -> (values, metrics)`, the trainer's one training step.
        steps: K, the steps of a call.
    """

    def __init__(self, loader: Pipeline, step: Callable, steps: int):
        self.loader = loader
        compiled, sampler, batch = loader.compiled, loader.sampler, loader.batch_size
        length = len(sampler)
        offsets = np.arange(batch, dtype=np.int32)
        # The epochs K full batches can span: the parameters of that many epochs go into every call.
        self.num_epochs = min(steps, -(-steps // max(1, num_batches(length, batch, True))) + 1)
        self._params: dict[int, Any] = {}
        # Why a call compiled, from its inputs past the values (no batch to read a short one from).
        self.causes = CompileCauses(0, f"call of {steps} steps, the pipeline inside")

        def train(values, stage_values, arrays, indices, metas):
            def body(carry, x):
                return step(carry, compiled.gather_and_run(stage_values, arrays, *x))

            values, outs = jax.lax.scan(body, values, (indices, metas))
            return values, jax.tree.map(lambda x: x[-1], outs)

        def sampled(values, inputs):
            stage_values, arrays, params, slots, metas = inputs
            params = jax.tree.map(lambda *p: jnp.stack(p)[slots], *params)  # each step's epoch's
            positions = padded_positions(metas[:, :1], offsets[None, :], length, jnp)
            items = jax.vmap(sampler.device_order)(positions, params)
            indices = jax.vmap(sampler.device_expand)(items.astype(jnp.int32), params)
            return train(values, stage_values, arrays, indices, metas)

        self._sampled = TimedJit(sampled, donate_values=True)
        self._given = TimedJit(lambda values, inputs: train(values, *inputs), donate_values=True)

    @staticmethod
    def supports(loader: Pipeline) -> bool:
        """Whether `loader`'s batches can be made inside the training call: its records are on the
        device and its batches are not sharded across processes."""
        return (loader.source.device_arrays() is not None and loader.placement is None
                and not isinstance(loader.source, StreamSourceModule))

    def take(self, iterator, count: int) -> FusedCall | None:
        """The next `count` batches as one call's inputs (the call moves the iterator past them);
        None when one of them is an epoch's short final batch."""
        p = self.loader
        batch = p.batch_size
        upcoming = list(itertools.islice(iterator.upcoming(), count))
        if len(upcoming) < count or any(num_valid != batch for _, _, num_valid in upcoming):
            return None
        metas = np.array([(position, epoch, num_valid) for epoch, position, num_valid in upcoming], np.int32)
        first = upcoming[0][0]
        params = [self._epoch_params(first + slot) for slot in range(self.num_epochs)]
        stage_values, arrays = p.compiled.values(), p.source.device_arrays()
        if any(value is None for value in params):  # a host-only sampler: one call per epoch spanned
            indices = np.concatenate([batch_indices(p.sampler, int(epoch), metas[metas[:, 1] == epoch, 0], batch)
                                      for epoch in np.unique(metas[:, 1])])  # epochs ascend with the steps
            inputs = (stage_values, arrays, indices, metas)
        else:
            inputs = (stage_values, arrays, tuple(params), metas[:, 1] - first, metas)
        epoch, position, num_valid = upcoming[-1]
        return FusedCall(inputs, count, count * batch, (epoch, position + num_valid))

    def _epoch_params(self, epoch: int) -> Any:
        """The sampler's device parameters for `epoch`, kept for the calls that span it."""
        if epoch not in self._params:
            for old in [e for e in self._params if e < epoch - self.num_epochs]:
                del self._params[old]
            self._params[epoch] = self.loader.sampler.device_params(epoch)
        return self._params[epoch]

    def __call__(self, values: list, call: FusedCall, iterator) -> tuple[Any, float]:
        """`((new values, the last step's metrics), compile seconds)`, as `TimedJit` returns; then
        moves `iterator` past the call's batches (a call that fails to trace or compile, a stage's
        error included, leaves it where it was, as `next()` does)."""
        run = self._sampled if len(call.inputs) == 5 else self._given
        out = run(values, call.inputs)
        iterator.seek(*call.cursor)
        return out
