"""One jitted program per batch: gather (when device-resident) + every stage, fused.

The stage modules' variables are read on every call (a list of arrays, a few microseconds), so
parameters a training step updates in place are always the ones used, without paying for a
full NNX graph traversal per batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import BatchContext, describe
from datarax.core.source import gather_device


class InconsistentOutputError(ValueError):
    """A stage produced output whose structure or batch size does not fit the batch."""


def run_program(program: nnx.Module, data: dict, ctx: BatchContext) -> dict:
    """Runs a stage program on a batch dict and checks what comes out."""
    batch_size = ctx.record_ids.shape[0]
    out = program(Element(dict(data), {}), ctx)
    if not isinstance(out, Element):
        raise InconsistentOutputError(
            f"the pipeline's stages must produce an Element, got {describe(out)}; a stage returned "
            "the wrong type"
        )
    for path, leaf in jax.tree_util.tree_leaves_with_path(out.data):
        shape = getattr(leaf, "shape", ())
        if len(shape) == 0 or shape[0] != batch_size:
            raise InconsistentOutputError(
                f"stage output field data{jax.tree_util.keystr(path)} has shape {tuple(shape)}, but the "
                f"batch has {batch_size} records; every output field needs a leading axis of "
                f"{batch_size} (use a per-record operator, or keep the batch axis in a batch-level one)"
            )
    return out.data


def make_context(record_ids: jax.Array, epoch: jax.Array, num_valid: jax.Array) -> BatchContext:
    ids = record_ids if record_ids.ndim == 1 else record_ids[:, 0]
    mask = jnp.arange(ids.shape[0]) < num_valid
    return BatchContext(ids.astype(jnp.int32), jnp.asarray(epoch, jnp.int32), mask)


class CompiledProgram:
    """The jitted batch functions of one pipeline (built once).

    Each takes `meta = int32[3] = (start, epoch, num_valid)`, one small array rather than three
    Python scalars, to keep per-call dispatch cheap.
    """

    def __init__(self, program: nnx.Module, sampler=None, epoch_length: int = 0, batch_size: int = 0):
        self._graphdef, state = nnx.split(program)
        self._paths = [p for p, _ in nnx.to_flat_state(state)]
        by_path = {p: v for p, v in nnx.iter_graph(program) if isinstance(v, nnx.Variable)}
        self._variables = [by_path[p] for p in self._paths]

        def transform(values, data, indices, meta):
            module = nnx.merge(self._graphdef, nnx.from_flat_state(list(zip(self._paths, values))))
            return run_program(module, data, make_context(indices, meta[1], meta[2]))

        def gather_transform(values, arrays, indices, meta):
            return transform(values, gather_device(arrays, indices), indices, meta)

        def sample_gather_transform(values, arrays, params, meta):
            positions = jnp.minimum(meta[0] + jnp.arange(batch_size, dtype=jnp.int32), epoch_length - 1)
            return gather_transform(values, arrays, sampler.device_indices(positions, params), meta)

        self._transform = jax.jit(transform)
        self._gather_transform = jax.jit(gather_transform)
        self._sample_gather_transform = jax.jit(sample_gather_transform)

    def values(self) -> list:
        return [v.get_value() for v in self._variables]

    def transform(self, data, indices, meta):
        """Stages only, on a batch already on the device."""
        return self._transform(self.values(), data, indices, meta)

    def gather_transform(self, arrays, indices, meta):
        """Device gather + stages, one program (indices computed on the host)."""
        return self._gather_transform(self.values(), arrays, indices, meta)

    def sample_gather_transform(self, arrays, params, meta):
        """Sampling + device gather + stages, one program."""
        return self._sample_gather_transform(self.values(), arrays, params, meta)
