"""Whole-epoch scan: many training steps, data pipeline included, in one compiled call.

For a device-resident source, `ScanRunner` compiles K steps of
`gather -> pipeline stages -> train_step(*modules, batch)` into one `jax.lax.scan`. The result
equals the per-step loop step for step (same records, keys and update order; values may differ
in the last bit), and the iterator is left in the state the loop would leave. See docs/dag.md.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.batching import batch_indices
from datarax.core.checks import check_bool, check_int, describe_value
from datarax.core.operator import BatchContext
from datarax.core.source import gather_device, record_shapes
from datarax.pipeline.compiled import make_context, run_program
from datarax.pipeline.iterator import PipelineIterator
from datarax.pipeline.programs import PROGRAMS, Owners, Same, Unshared, exact, graph_key

if TYPE_CHECKING:
    from datarax.pipeline.pipeline import Pipeline


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScanBatch:
    """What a `raw=True` train step receives: the gathered batch, before any stage ran.

    Attributes:
        data: the source fields of the batch (field -> batched array).
        ctx: the batch's record ids, epoch and mask.
    """

    data: dict[str, jax.Array]
    ctx: BatchContext

    def transform(self, program: nnx.Module) -> dict[str, jax.Array]:
        """Runs a stage program (pass `pipeline.program` as one of the runner's modules) on the batch."""
        return run_program(program, self.data, self.ctx)


def _chunks(steps: list[tuple[int, int, int]], batch_size: int, k: int) -> list[list[tuple[int, int, int]]]:
    """Runs of up to k full batches of one epoch; a short batch is a chunk of its own."""
    chunks: list[list] = []
    for step in steps:
        last = chunks[-1] if chunks else None
        if (step[2] == batch_size and last and len(last) < k and last[-1][2] == batch_size
                and last[-1][0] == step[0]):
            last.append(step)
        else:
            chunks.append([step])
    return chunks


class ScanRunner:
    """Runs `train_step` over a pipeline iterator, `steps_per_call` steps per compiled call.

    A call never crosses an epoch boundary, so `steps_per_call=len(pipeline)` runs one epoch
    per call. The chunk's record indices are computed on the host in one vectorised sampler
    call and passed in (sampling inside the scan was slower on GPU: the Feistel cycle-walk is a
    while loop per step).

    Args:
        train_step: `train_step(*modules, batch) -> outputs` written as for an `nnx.jit` loop:
            it may update the modules in place (e.g. `optimizer.update(model, grads)`) and
            returns a pytree of arrays (metrics). `batch` is the pipeline's output dict, or a
            `ScanBatch` when `raw=True`.
        steps_per_call: K, the steps compiled into one scan (e.g. `len(pipeline)` for a whole
            epoch). Larger K means fewer dispatches and a longer compile.
        raw: give the step the gathered batch (`ScanBatch`) instead of the pipeline's output,
            so it can run the stages itself, inside its own `nnx.grad`, and train them jointly
            with the model: pass `pipeline.program` as one of the modules and call
            `batch.transform(program)` in the loss.

    Example:
        >>> def train_step(model, optimizer, batch):
        ...     loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
        ...     optimizer.update(model, grads)
        ...     return loss
        >>> runner = ScanRunner(train_step, steps_per_call=len(pipeline))
        >>> losses = runner.run(iter(pipeline), model, optimizer)  # one epoch, one call
    """

    def __init__(self, train_step: Callable[..., Any], *, steps_per_call: int, raw: bool = False):
        if not callable(train_step):
            raise TypeError(f"train_step must be callable, got {describe_value(train_step)}")
        check_int(steps_per_call, "steps_per_call", 1)
        check_bool(raw, "raw")
        self.train_step = train_step
        self.steps_per_call = steps_per_call
        self.raw = raw
        self._own: dict = {}  # functions no other runner may share (`_functions`)

    def _functions(self, graphdef, shapes: dict[str, tuple[int, ...]]) -> _Functions:
        """The compiled functions for this module structure, step and record shapes, from the
        process-wide cache (`datarax.pipeline.programs`): another runner of the same step over
        modules of the same structure reuses them, each with its own values."""
        def key(unknown=None):
            return ("scan", graph_key(graphdef, unknown), exact(self.train_step, unknown), self.raw,
                    exact(tuple(sorted(shapes.items()))))

        def build():
            return _Functions(self.raw, shapes)

        try:
            shared = key()
        except Unshared:
            # The modules hold a value no shared key may stand for (a list, an object with state of
            # its own): this runner alone keeps the functions, for those same objects.
            own = key(Same)
            if own not in self._own:
                self._own[own] = build()
            return self._own[own]
        return PROGRAMS.get(lambda: shared, build)

    def run(self, iterator: PipelineIterator, *modules: nnx.Pytree, num_steps: int | None = None) -> Any:
        """Runs the step over the iterator's next batches and returns its outputs, stacked per step.

        Args:
            iterator: a pipeline iterator (e.g. `iter(pipeline)` for one epoch) over a
                device-resident source; it is advanced as a Python loop would advance it.
            *modules: the NNX objects (modules, optimizers) the step takes before the batch,
                updated in place.
            num_steps: how many steps to run; None runs until the iterator ends.

        Returns:
            The step's outputs with a leading axis of one entry per step run (None when no
            step ran).
        """
        p = _check_run(iterator, modules, num_steps)
        if getattr(p, "sharding", None) is not None:
            raise ValueError("ScanRunner runs unsharded batches, but this pipeline has sharding="
                             f"{p.sharding!r}; scan an unsharded pipeline, or iterate the sharded one step by step")
        arrays = p.source.device_arrays()
        carried = (p.program, *modules)
        graphdef, state = nnx.split(carried)
        fns = self._functions(graphdef, record_shapes(p.source))
        tracing = _Tracing(graphdef, self.train_step)  # what the functions trace with during this run
        fns.owners.add(tracing)
        chunks = _chunks(list(itertools.islice(iterator.upcoming(), num_steps)), p.batch_size, self.steps_per_call)
        full = next((c for c in chunks if c[0][2] == p.batch_size), None)
        short = next((c for c in chunks if c[0][2] < p.batch_size), None)
        if full and short:
            fns.check_output_shapes(state, arrays, self._host_inputs(p, full[:1]), self._host_inputs(p, short))
        outputs = []
        for chunk in chunks:
            epoch, position, num_valid = chunk[-1]
            if num_valid < p.batch_size:
                idx, meta = self._host_inputs(p, chunk)
                state, out = fns.short(state, arrays, idx[0], meta[0], num_valid=num_valid)
                out = jax.tree.map(lambda x: x[None], out)
            else:
                state, out = self._scan_chunk(fns, p, state, arrays, chunk)
            nnx.update(carried, state)
            iterator.seek(epoch, position + num_valid)
            outputs.append(out)
        return _stack(outputs) if outputs else None

    def _host_inputs(self, p: Pipeline, chunk: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
        meta = np.array([(pos, e, n) for e, pos, n in chunk], np.int32)  # the pipeline's meta layout
        return batch_indices(p.sampler, chunk[0][0], meta[:, 0], p.batch_size), meta

    def _scan_chunk(self, fns: _Functions, p: Pipeline, state, arrays, chunk: list[tuple[int, int, int]]):
        # Every call scans exactly K steps, so a remainder chunk of any length reuses one compiled
        # program (the one taking `valid`); its padding steps repeat the last step and are skipped.
        k = self.steps_per_call
        padded = chunk + [chunk[-1]] * (k - len(chunk))
        valid = None if len(chunk) == k else np.arange(k) < len(chunk)
        idx, meta = self._host_inputs(p, padded)
        state, out = fns.scan(state, arrays, idx, meta, valid)
        return state, (out if len(chunk) == k else jax.tree.map(lambda x: x[:len(chunk)], out))


@dataclasses.dataclass(eq=False)  # kept in a WeakSet: hashed by identity
class _Tracing:
    """A run's graph definition and step, which its `_Functions` trace with while the run lasts."""

    graphdef: Any
    train_step: Callable


class _Functions:
    """The traced step and its jitted forms for one module structure, tracing with one of their
    live `owners` (`_Tracing`), so that shared functions keep no run's step or modules alive."""

    def __init__(self, raw: bool, shapes: dict[str, tuple[int, ...]]):
        self.owners = owners = Owners()

        def step(state, arrays, idx, meta, num_valid=None):
            tracing = owners.any()
            program, *modules = nnx.merge(tracing.graphdef, state)
            data = gather_device(arrays, idx, shapes, mode="clip")
            ctx = make_context(idx, meta[1], meta[2])
            if raw:
                if num_valid is not None:
                    data = jax.tree.map(lambda x: x[:num_valid], data)
                    ctx = BatchContext(ctx.record_ids[:num_valid], ctx.epoch, ctx.mask[:num_valid])
                batch = ScanBatch(data, ctx)
            else:
                batch = run_program(program, data, ctx)
                if num_valid is not None:
                    batch = jax.tree.map(lambda x: x[:num_valid], batch)
            out = tracing.train_step(*modules, batch)
            return nnx.split((program, *modules))[1], out

        def scan(state, arrays, idx, meta, valid):
            def body(carry, x):
                return step(carry, arrays, x[2], x[0])

            def padded_body(carry, x):
                def run(c):
                    return body(c, x)
                out_spec = jax.eval_shape(run, carry)[1]
                def skip(c):
                    return (c, jax.tree.map(lambda o: jnp.zeros(o.shape, o.dtype), out_spec))
                return jax.lax.cond(x[1], run, skip, carry)

            # A full chunk runs without the per-step cond, so the step stays one straight-line body.
            return jax.lax.scan(body if valid is None else padded_body, state, (meta, valid, idx))

        self.step = step
        self.scan = jax.jit(scan)
        self.short = jax.jit(step, static_argnames="num_valid")

    def check_output_shapes(self, state, arrays, full: tuple, short: tuple) -> None:
        """Fails before running anything when the short batch would change the step's output shapes."""
        def spec(out):
            return [(x.shape, str(x.dtype)) for x in jax.tree.leaves(out[1])]
        num_valid = int(short[1][0][2])
        # Through the jitted step: its traces are kept, so the next run over this structure skips them.
        full_spec = spec(jax.eval_shape(self.short, state, arrays, full[0][0], full[1][0]))
        short_spec = spec(jax.eval_shape(self.short, state, arrays, short[0][0], short[1][0], num_valid=num_valid))
        if full_spec != short_spec:
            raise ValueError(
                f"train_step outputs change shape between steps ({full_spec} for a full batch, {short_spec} for the "
                f"final short batch of {num_valid} records), so they cannot be stacked per step. Return per-batch "
                "reductions (e.g. the mean loss), or build the pipeline with drop_remainder=True"
            )


def _check_run(iterator, modules, num_steps) -> Pipeline:
    if not isinstance(iterator, PipelineIterator):
        raise TypeError(f"iterator must be a PipelineIterator (iter(pipeline) or pipeline.epochs(n)), "
                        f"got {describe_value(iterator)}")
    p = iterator.pipeline
    if p.source.device_arrays() is None:
        raise ValueError("ScanRunner needs a device-resident source (the whole epoch's data is gathered inside "
                         "the compiled scan), but this pipeline's source is host-resident; use "
                         "MemorySourceConfig(device_resident=True), or the per-step loop")
    check_int(num_steps, "num_steps", 0, allow_none=True, why=" (until the iterator ends)")
    if num_steps is None and iterator.end_epoch is None:
        raise ValueError("this iterator is endless (pipeline.epochs(None)), so run() needs num_steps=...; or "
                         "iterate one epoch with iter(pipeline)")
    for i, m in enumerate(modules):
        if not isinstance(m, nnx.Pytree):
            raise TypeError(f"modules[{i}] must be an NNX object (an nnx.Module or nnx.Optimizer), got "
                            f"{describe_value(m)}; pass the batch-independent arguments as modules")
    return p


def _stack(outputs: list) -> Any:
    """Per-chunk outputs joined along the step axis."""
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *outputs) if len(outputs) > 1 else outputs[0]


def scan_epoch(pipeline: Pipeline, train_step: Callable[..., Any], *modules: nnx.Pytree,
               steps_per_call: int | None = None, raw: bool = False) -> Any:
    """Runs `train_step` over the pipeline's next epoch in scanned chunks; returns per-step outputs.

    `steps_per_call=None` scans the whole epoch in one call. The compiled scan is reused by the
    next call with the same `train_step` function over modules of the same structure.
    """
    runner = ScanRunner(train_step, steps_per_call=steps_per_call or max(len(pipeline), 1), raw=raw)
    return runner.run(iter(pipeline), *modules)
