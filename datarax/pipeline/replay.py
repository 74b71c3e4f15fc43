"""Replaying one batch: its records, where each came from, what every stochastic stage drew for it,
and the batch itself, rebuilt bitwise from `(epoch, position)` alone.

A batch is a pure function of the pipeline and its cursor: the sampler's keyed permutation gives
the records, and every stage draws from `fold_in(fold_in(stage_key, epoch), record_id)` (host
stages from a Philox generator keyed the same way). So the batch that started at `position` of
`epoch` is made again by moving an iterator there (`seek`) and taking one batch: no batch before
it is read. `Pipeline.replay` and `Trainer.replay` return a `ReplayedBatch`;
`datarax replay RUN_DIR --step N` does it for a configured run (docs/troubleshooting.md).

A stream (a source without random access) cannot be replayed this way: its batch at a position is
only reached by reading the stream up to it. `ReplayError` says so, as it does for a position past
the epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.batching import padded_positions
from datarax.core.checks import MAX_INT32, check_int
from datarax.core.errors import DataraxError, printable
from datarax.core.operator import OperatorModule, StageKey
from datarax.core.source import gather_device, record_shapes
from datarax.host.stage import HostStageSource
from datarax.pipeline.compiled import make_context, run_program
from datarax.pipeline.programs import Unshared, graph_key
from datarax.sources.stream import StreamSourceModule


class ReplayError(DataraxError, ValueError):
    """A batch that cannot be rebuilt exactly; the message says why and what to do instead."""


@dataclasses.dataclass(frozen=True)
class ReplayedBatch:
    """One batch rebuilt from its cursor.

    Attributes:
        epoch: the epoch the batch belongs to.
        position: where it starts in the epoch.
        num_valid: its records (fewer than the batch size for an epoch's short final batch).
        record_ids: int64, one per row of `batch` (a window of ids per row for a windowed sampler).
        origins: each row's record and where it came from (`source.describe_record`: a file, a row
            of a file, a shard, a component of a mixture).
        draws: `{stage label: {parameter: per-row values}}` for every stochastic stage, host stages
            first; None for a stage that cannot name its draws (a user function's generator).
        batch: the batch exactly as iterating the pipeline returned it, as host numpy arrays.
    """

    epoch: int
    position: int
    num_valid: int
    record_ids: np.ndarray
    origins: list[str]
    draws: dict[str, dict[str, np.ndarray] | None]
    batch: dict[str, np.ndarray]

    def records(self) -> list[dict[str, Any]]:
        """One JSON-able dict per row: `row`, `record_id`, `origin` and `draws` (`{stage: {name: value}}`)."""
        out = []
        for row, origin in enumerate(self.origins):
            drawn = {stage: None if values is None else {k: np.asarray(v[row]).tolist() for k, v in values.items()}
                     for stage, values in self.draws.items()}
            out.append({"row": row, "record_id": np.asarray(self.record_ids[row]).tolist(), "origin": origin,
                        "draws": drawn})
        return out

    def nonfinite(self) -> dict[int, list[str]]:
        """`{row: ["image: 3 of 3072 values not finite", ...]}` for the rows of `batch` holding NaN or
        infinity in a floating field (the pipeline's output, checked here and nowhere on the hot path)."""
        found: dict[int, list[str]] = {}
        for name, values in sorted(self.batch.items()):
            if not np.issubdtype(values.dtype, np.floating) or values.ndim == 0:
                continue
            bad = ~np.isfinite(values.reshape(len(values), -1))
            for row in np.nonzero(bad.any(axis=1))[0]:
                found.setdefault(int(row), []).append(
                    f"{name}: {int(bad[row].sum())} of {bad.shape[1]} values not finite")
        return found


def check_replayable(pipeline: Any) -> None:
    """Raises `ReplayError` for a pipeline whose batches cannot be rebuilt from a cursor (a stream)."""
    source = pipeline.source
    if isinstance(source, StreamSourceModule):
        raise ReplayError(
            f"this pipeline reads {type(source).__name__}, a stream without random access: its batch at a "
            "position is only reached by reading the stream from the epoch's start, so it cannot be rebuilt "
            "alone (and a stream re-read later may hold other data). To replay batches, read the data through a "
            "random-access source (e.g. an ArrayRecordSource, ShardedSource or HFSource over the same files)")


def host_numpy(tree: dict[str, Any]) -> dict[str, np.ndarray]:
    """A batch's arrays on the host; a global array spread over processes is gathered whole."""
    def fetch(x):
        if getattr(x, "is_fully_addressable", True):
            return np.asarray(jax.device_get(x))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return {k: fetch(v) for k, v in tree.items()}


def replay_batch(pipeline: Any, epoch: int, position: int) -> ReplayedBatch:
    """The batch of `pipeline` that starts at `position` of `epoch`, rebuilt (see `Pipeline.replay`)."""
    check_replayable(pipeline)
    check_int(epoch, "epoch", 0, high=MAX_INT32)
    length, size = len(pipeline.sampler), pipeline.batch_size
    check_int(position, "position", 0, high=max(0, length - 1), why=f" (a batch start in an epoch of {length} records)")
    num_valid = min(size, length - position)
    if pipeline.drop_remainder and num_valid < size:
        raise ReplayError(f"position {position} starts the epoch's short final batch of {num_valid} records, which "
                          f"this pipeline drops (drop_remainder=True), so no step received it")
    iterator = pipeline.epochs(None)
    try:
        iterator.seek(epoch, position)
        batch = host_numpy(next(iterator))
    finally:
        iterator.close()
    rows = len(next(iter(batch.values())))
    positions = padded_positions(position, np.arange(size), length)
    ids = np.asarray(pipeline.sampler.indices(positions, epoch), np.int64)
    first = ids if ids.ndim == 1 else ids[:, 0]
    source = pipeline.source
    origins = [printable(source.describe_record(int(i))) for i in first[:rows]]
    draws: dict[str, dict[str, np.ndarray] | None] = {}
    if isinstance(source, HostStageSource):
        for label, drawn in source.draws(ids, epoch):
            draws[label] = None if drawn is None else {
                k: v.reshape(ids.shape + v.shape[1:])[:rows] for k, v in drawn.items()}
    for label, drawn in stage_draws(pipeline, ids, epoch, num_valid).items():
        draws[label] = {k: v[:rows] for k, v in drawn.items()}
    return ReplayedBatch(epoch, position, num_valid, ids[:rows], origins, draws, batch)


def stage_draws(pipeline: Any, ids: np.ndarray, epoch: int, num_valid: int) -> dict[str, dict[str, np.ndarray]]:
    """`{stage label: draws}` of every stage of the pipeline's program that draws something for the
    records `ids` (one full batch, padding included) in `epoch`: `OperatorModule.draws` on the input
    each stage received, collected by running the program once more (jitted, on this batch only)."""
    source = pipeline.source
    arrays = source.device_arrays()
    if arrays is not None:
        data = gather_device(arrays, jnp.asarray(ids, jnp.int32), record_shapes(source))
    else:
        data = source.read(ids, int(epoch))
    graphdef, state = nnx.split(pipeline.program)
    drawn = draws_program(graphdef)(state, data, jnp.asarray(ids, jnp.int32), jnp.asarray(epoch, jnp.int32),
                                    jnp.asarray(num_valid, jnp.int32))
    return {label: {k: np.asarray(v) for k, v in values.items()} for label, values in jax.device_get(drawn).items()}


_DRAWS_PROGRAMS: dict[Any, Any] = {}
MAX_DRAWS_PROGRAMS = 16


def draws_program(graphdef: Any) -> Any:
    """The jitted `(state, data, record_ids, epoch, num_valid) -> {label: draws}` of a program's graph,
    kept by its exact key (`datarax.pipeline.programs.graph_key`) so replaying several batches of one
    pipeline compiles once; a graph holding a value that cannot be keyed compiles every time."""
    try:
        key = graph_key(graphdef)
    except Unshared:
        return make_draws_program(graphdef)
    program = _DRAWS_PROGRAMS.get(key)
    if program is None:
        while len(_DRAWS_PROGRAMS) >= MAX_DRAWS_PROGRAMS:
            _DRAWS_PROGRAMS.pop(next(iter(_DRAWS_PROGRAMS)))
        program = _DRAWS_PROGRAMS[key] = make_draws_program(graphdef)
    return program


def make_draws_program(graphdef: Any) -> Any:

    def run(state, data, record_ids, epoch, num_valid):
        module = nnx.merge(graphdef, state)
        ctx = make_context(record_ids, epoch, num_valid)
        with recorded_calls(module) as calls:
            run_program(module, data, ctx)
        out: dict[str, dict[str, jax.Array]] = {}
        for label, op, elements, call_ctx in calls:
            drawn = op.draws(elements, call_ctx)
            # Draws of a stage called on a sub-batch (its own context) are not one per row of the batch.
            if drawn and call_ctx.record_ids.shape == ctx.record_ids.shape:
                out[label] = drawn
        return out

    return jax.jit(run)


def stage_label(path: tuple, module: Any) -> str:
    """`stages[1] RandomCropOperator`, `nodes.crop RotationOperator`: a stage's place in its program."""
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    return f"{text} {type(module).__name__}".strip()


@contextlib.contextmanager
def recorded_calls(program: nnx.Module) -> Iterator[list[tuple[str, OperatorModule, Any, Any]]]:
    """Inside the block, every operator of `program` (nested ones included) logs `(label, operator,
    input, ctx)` when it runs. Meant for a merged copy of a program inside a trace: the operators'
    `apply_batch` is wrapped on the instances for the block's duration."""
    calls: list[tuple[str, OperatorModule, Any, Any]] = []
    wrapped = []
    for path, node in nnx.iter_graph(program):
        if not isinstance(node, OperatorModule) or "apply_batch" in vars(node):
            continue
        label, apply = stage_label(path, node), node.apply_batch

        def logged(elements, ctx, label=label, node=node, apply=apply):
            calls.append((label, node, elements, ctx))
            return apply(elements, ctx)

        vars(node)["apply_batch"] = logged
        wrapped.append(node)
    try:
        yield calls
    finally:
        for node in wrapped:
            vars(node).pop("apply_batch", None)


def draw_keys(pipeline: Any) -> str:
    """A digest of what the pipeline's draws are keyed by beyond its fingerprint: every stage key's
    data and the host stages' seed. Two pipelines with equal fingerprints and equal `draw_keys`
    draw the same for every record."""
    digest = hashlib.sha256(str(getattr(pipeline, "seed", 0)).encode())
    state = nnx.state(pipeline.program, StageKey)
    for path, variable in sorted(nnx.to_flat_state(state), key=lambda item: tuple(map(str, item[0]))):
        digest.update("/".join(map(str, path)).encode())
        digest.update(np.asarray(variable.get_value(), np.uint32).tobytes())
    return digest.hexdigest()[:16]
