"""Merge functions: how the outputs of parallel branches become one value per field.

Each takes the branch values of one field (a list of batched arrays, or pytrees of them) and
returns one value. Axes are counted per record (the batch axis is not counted), so `axis=-1`
joins channels and `stack` puts the branch axis right after the batch axis.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

MERGE_MODES = ("concat", "stack", "sum", "mean", "dict")
REDUCTIONS = ("mean", "sum", "max", "min")


def _batch_axis(axis: int) -> int:
    """A per-record axis as an axis of the batched array."""
    return axis if axis < 0 else axis + 1


def concat(values: Sequence, axis: int = -1):
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=_batch_axis(axis)), *values)


def stack(values: Sequence, axis: int = 0):
    return jax.tree.map(lambda *xs: jnp.stack(xs, axis=_batch_axis(axis)), *values)


def reduce(values: Sequence, how: str):
    """Elementwise mean, sum, max or min over the branches."""
    if how == "mean":
        return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]) / len(xs), *values)
    if how == "sum":
        return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *values)
    op = {"max": jnp.maximum, "min": jnp.minimum}[how]

    def fold(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = op(out, x)
        return out

    return jax.tree.map(fold, *values)


def weighted_sum(values: Sequence, weights: jax.Array):
    """`sum_i weights[i] * values[i]`; weights are cast to each leaf's dtype."""

    def mix(*xs):
        w = weights.astype(xs[0].dtype)
        return sum((w[i] * x for i, x in enumerate(xs[1:], start=1)), w[0] * xs[0])

    return jax.tree.map(mix, *values)


def as_dict(values: Sequence, names: Sequence[str]) -> dict:
    return dict(zip(names, values))


def merge(values: Sequence, mode: str, *, axis: int = -1, names: Sequence[str] | None = None):
    """Merges one field's branch values by `mode` (one of `MERGE_MODES`)."""
    if mode == "concat":
        return concat(values, axis)
    if mode == "stack":
        return stack(values, axis)
    if mode in ("sum", "mean"):
        return reduce(values, mode)
    if mode == "dict":
        return as_dict(values, names if names is not None else [str(i) for i in range(len(values))])
    raise ValueError(f"merge mode must be one of {MERGE_MODES}, got {mode!r}")

