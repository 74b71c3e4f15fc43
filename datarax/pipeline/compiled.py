"""One jitted program per batch: gather (when device-resident) + every stage, fused.

The stage modules' variables are read on every call as a flat list of arrays, so parameters a
training step updates in place are always the ones used, without a full NNX graph traversal per
batch.
"""

from __future__ import annotations

import copy
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.batching import num_batches, padded_positions
from datarax.core.checks import describe_value
from datarax.core.element import Element
from datarax.core.errors import DataraxError
from datarax.core.operator import BatchContext, planned_record_keys
from datarax.core.source import gather_device
from datarax.pipeline.programs import PROGRAMS, Owners, exact, graph_key, sampler_key
from datarax.samplers.base import Sampler

# Record positions sampled per chunk (at most): 256 KiB of int32, enough that the sampling
# program's dispatch (and its loop's round trips on a GPU) is spread over many batches.
CHUNK_IDS = 65_536
MAX_CHUNK_BATCHES = 64  # and at most this many batches (one output of the sampling program each)


class InconsistentOutputError(DataraxError, ValueError):
    """A stage produced output whose structure or batch size does not fit the batch."""


def run_program(program: nnx.Module, data: dict, ctx: BatchContext) -> dict:
    """Runs a stage program on a batch dict and checks what comes out."""
    batch_size = ctx.record_ids.shape[0]
    with planned_record_keys(program, ctx):
        out = program(Element(dict(data), {}), ctx)
    if not isinstance(out, Element):
        raise InconsistentOutputError(
            f"the pipeline's stages must produce an Element, got {describe_value(out)}; a stage returned "
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


def make_context(record_ids: jax.Array, epoch: jax.Array, num_valid: jax.Array,
                 rows: jax.Array | None = None) -> BatchContext:
    """`rows`: the rows of the global batch these records are (default: all of them, in order)."""
    ids = record_ids if record_ids.ndim == 1 else record_ids[:, 0]
    mask = (jnp.arange(ids.shape[0]) if rows is None else jnp.asarray(rows)) < num_valid
    return BatchContext(ids.astype(jnp.int32), jnp.asarray(epoch, jnp.int32), mask)


def stage_functions(owners: Owners, paths: tuple, rows: np.ndarray | None, mask_key: str | None,
                    shapes: dict | None) -> tuple:
    """`run(values, data, indices, meta)` and `gather_and_run(values, arrays, indices, meta)`, to
    be jitted: the stages on a batch, traced with the graph definition of one of `owners`."""

    def run(values, data, indices, meta):
        module = nnx.merge(owners.any().graphdef, nnx.from_flat_state(list(zip(paths, values))))
        ctx = make_context(indices, meta[1], meta[2], rows)
        out = run_program(module, data, ctx)
        if mask_key is not None:
            if mask_key in out:
                raise ValueError(f"the pipeline's output already has a field {mask_key!r}, the name DataSharding "
                                 "gives its padding mask; pass DataSharding(mask_key='<another name>')")
            out = {**out, mask_key: ctx.mask}
        return out

    def gather_and_run(values, arrays, indices, meta):
        return run(values, gather_device(arrays, indices, shapes), indices, meta)

    return run, gather_and_run


class StagePrograms:
    """The jitted programs of a stage program over batches already sampled, shared by the
    pipelines of one key (`shared_programs`): built from the key's parts only, they trace with
    the graph definition of one of their `owners` (the `CompiledProgram`s using them), so they
    never hold a pipeline's modules, variable values, arrays or user functions."""

    def __init__(self, paths: tuple, rows: np.ndarray | None, mask_key: str | None, local_sharding,
                 shapes: dict | None):
        self.owners = Owners()
        run, gather_and_run = stage_functions(self.owners, paths, rows, mask_key, shapes)
        jit = jax.jit if local_sharding is None else functools.partial(jax.jit, out_shardings=local_sharding)
        self.run = jit(run)
        self.gather_and_run = jit(gather_and_run)


class SampledPrograms:
    """The jitted programs that sample a device-resident pipeline's batches and run its stages on
    them, shared like `StagePrograms` (with owners of their own: no entry relies on another)."""

    def __init__(self, paths: tuple, rows: np.ndarray | None, mask_key: str | None, shapes: dict | None, sampler,
                 epoch_length: int, batch_size: int, num_rows: int, placement_shardings: tuple | None):
        local_sharding, replicated = placement_shardings or (None, None)
        self.owners = Owners()
        _, gather_and_run = stage_functions(self.owners, paths, rows, mask_key, shapes)

        def replicate(x):
            # Every device samples all of the process's rows (a few integer ops) rather than its own:
            # a sharded cycle-walk loop would all-reduce its exit test on every iteration, and
            # collectives in a data step that runs ahead of the train step can deadlock XLA:CPU's
            # thread pool (seen on 2 cores with 2 fake devices).
            return x if replicated is None else jax.lax.with_sharding_constraint(x, replicated)

        # Sampling runs in its own program, `chunk_batches` batches at a time: a shuffle's cycle
        # walk is a loop whose trip count depends on the data, and on a GPU every trip of such a
        # loop is a device-to-host round trip. Outside the per-batch program it costs those round
        # trips once per chunk, and the per-batch program has no loop. The sampling program
        # returns one small array per batch, so a batch's program takes its inputs as they are:
        # indexing a whole chunk inside it (a slot argument) let XLA:CPU fuse that index into the
        # gathers and cost tens of microseconds a batch (docs/benchmarks.md, `overhead`).
        length = max(1, epoch_length)
        per_epoch = num_batches(length, max(1, batch_size), drop_remainder=False)
        self.chunk_batches = chunk_batches = max(1, min(MAX_CHUNK_BATCHES, -(-CHUNK_IDS // max(1, num_rows)),
                                                        per_epoch))
        offsets = np.arange(num_rows, dtype=np.int32) if rows is None else rows

        def sample_chunk(params, metas):
            positions = padded_positions(metas[:, :1], offsets[None, :], length, jnp)
            items = sampler.device_order(replicate(positions), params).astype(jnp.int32)
            table = jnp.concatenate([metas, items], axis=1)
            return [replicate(table[k]) for k in range(chunk_batches)]

        def expand_gather_and_run(values, arrays, params, row):
            return gather_and_run(values, arrays, replicate(sampler.device_expand(row[3:], params)), row[:3])

        # A scan, not a vmap over the batches: a vmap multiplies every intermediate by the count,
        # and XLA:TPU then ran out of scoped vector memory compiling 8 CIFAR batches of selection
        # matrices (seen on a v5e); the scan's body is the one-batch program.

        def expand_gather_and_run_many(values, arrays, params, rows):
            def body(carry, row):
                return carry, expand_gather_and_run(values, arrays, params, row)

            _, outs = jax.lax.scan(body, None, jnp.stack(rows))
            return [jax.tree.map(lambda x, k=k: x[k], outs) for k in range(len(rows))]

        jit = jax.jit if local_sharding is None else functools.partial(jax.jit, out_shardings=local_sharding)
        self.sample_chunk = jax.jit(sample_chunk)
        self.expand_gather_and_run = jit(expand_gather_and_run)
        self.expand_gather_and_run_many = jit(expand_gather_and_run_many)


def shared_programs(graphdef, paths: tuple, sampler, epoch_length: int, batch_size: int, placement,
                    shapes: dict | None) -> tuple[StagePrograms, SampledPrograms]:
    """A pipeline's programs from the process-wide cache (`datarax.pipeline.programs`), built on a miss.

    The stage programs are keyed by everything their code reads: the exact graph definition and
    variable paths, the batch's rows, the sharding and mask field, the record shapes. The sampling
    programs add the sampler's key and the epoch length. The shardings compare as JAX's own caches
    compare them (mesh, spec, memory kind).
    """
    rows = None if placement is None else placement.rows.astype(np.int32)  # numpy: a literal in the program
    mask_key = None if placement is None else placement.mask_key
    shardings = None if placement is None else (placement.local_sharding, placement.replicated)

    @functools.cache
    def stage_key():
        return ("stages", graph_key(graphdef), exact(paths), int(batch_size),
                exact(None if rows is None else tuple(rows.tolist())), exact(mask_key), shardings,
                exact(None if shapes is None else tuple(sorted(shapes.items()))))

    stages = PROGRAMS.get(stage_key, lambda: StagePrograms(paths, rows, mask_key,
                                                             None if shardings is None else shardings[0], shapes))

    def sampled_programs():
        # The entry keeps its own copy of the sampler as keyed, never the pipeline's (which may
        # change); a sampler without device code is never called in a program, so none at all.
        device = sampler is not None and type(sampler).device_params is not Sampler.device_params
        num_rows = batch_size if rows is None else len(rows)
        return SampledPrograms(paths, rows, mask_key, shapes, copy.deepcopy(sampler) if device else None,
                               epoch_length, batch_size, num_rows, shardings)

    sampled = PROGRAMS.get(lambda: ("sampled", stage_key(), sampler_key(sampler), int(epoch_length)),
                           sampled_programs)
    return stages, sampled


class CompiledProgram:
    """The jitted batch programs of one pipeline, called directly (no wrappers):

    - `run(values, data, indices, meta)`: the stages on a batch already on the device;
    - `gather_and_run(values, arrays, indices, meta)`: device gather + stages, indices from the host;
    - `sample_chunk(params, metas)`: the sampler (`Sampler.device_order`) for `chunk_batches`
      batches at once, one `int32[3 + rows] = (start, epoch, num_valid, items...)` row each;
    - `expand_gather_and_run(values, arrays, params, row)`: one batch of a sampled chunk;
    - `expand_gather_and_run_many(values, arrays, params, rows)`: several such batches in one
      `lax.scan` (the pipeline's `batches_per_dispatch`; docs/tpu.md), one output each.

    `values` are the stage variables; `meta = int32[3] = (start, epoch, num_valid)`. With a
    `placement` the programs compute only this process's `rows` of each global batch and add the
    validity field `placement.mask_key` when it is set. The programs come from the process-wide
    cache (`datarax.pipeline.programs`): a pipeline built again with the same stages, layout and
    sampler reuses the compiled code, with its own values. A copy or pickle looks them up again.
    """

    def __init__(self, program: nnx.Module, sampler=None, epoch_length: int = 0, batch_size: int = 0,
                 placement=None, shapes: dict | None = None):
        self._built_from = dict(program=program, sampler=sampler, epoch_length=epoch_length, batch_size=batch_size,
                                placement=placement, shapes=shapes)
        self.graphdef, state = nnx.split(program)
        paths = tuple(p for p, _ in nnx.to_flat_state(state))
        by_path = {p: v for p, v in nnx.iter_graph(program) if isinstance(v, nnx.Variable)}
        self._variables = [by_path[p] for p in paths]
        self.rows = np.arange(batch_size, dtype=np.int64) if placement is None else placement.rows
        stages, sampled = shared_programs(self.graphdef, paths, sampler, epoch_length, batch_size, placement, shapes)
        for programs in (stages, sampled):  # they trace with this graph definition while this pipeline lives
            programs.owners.add(self)
        self.chunk_batches = sampled.chunk_batches
        self.run, self.gather_and_run = stages.run, stages.gather_and_run
        self.sample_chunk = sampled.sample_chunk
        self.expand_gather_and_run = sampled.expand_gather_and_run
        self.expand_gather_and_run_many = sampled.expand_gather_and_run_many

    def __getstate__(self) -> dict:
        return self._built_from

    def __setstate__(self, built_from: dict) -> None:
        self.__init__(**built_from)

    def values(self) -> list:
        """The stage variables' current values, as the programs take them."""
        return list(map(nnx.Variable.get_raw_value, self._variables))

    def output_spec(self, data: dict, indices: jax.ShapeDtypeStruct) -> dict:
        """What `run` returns for a batch of these shapes, traced abstractly (nothing compiled or run)."""
        meta = jax.ShapeDtypeStruct((3,), jnp.int32)
        return jax.eval_shape(self.run, self.values(), data, indices, meta)
