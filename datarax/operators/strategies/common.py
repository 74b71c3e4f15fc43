"""Helpers shared by the composition strategies: child checks, field choice, per-record selection."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import describe_value
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule


def check_operators(operators: object, owner: str, *, minimum: int = 1) -> nnx.List:
    """`operators` as an `nnx.List` of operators, with a clear error for anything else."""
    if isinstance(operators, OperatorModule) or not isinstance(operators, Sequence):
        raise TypeError(f"{owner} operators must be a list of operators, got {describe_value(operators)}; "
                        "pass operators=[op_a, op_b]")
    if len(operators) < minimum:
        raise ValueError(f"{owner} needs at least {minimum} operator(s), got {len(operators)}")
    for i, op in enumerate(operators):
        if not isinstance(op, OperatorModule):
            raise TypeError(f"{owner} operators[{i}] must be an operator (an OperatorModule such as "
                            f"ElementOperator), got {describe_value(op)}")
    return nnx.List(list(operators))


def check_fields(fields: object, owner: str) -> tuple[str, ...] | None:
    """Validates a config's `fields` (None or a tuple of field names) and normalises lists."""
    if fields is None:
        return None
    if isinstance(fields, str) or not isinstance(fields, Sequence) or not all(isinstance(f, str) for f in fields):
        raise TypeError(f"{owner}.fields must be None or a tuple of field names, got {fields!r}; "
                        "write fields=('image',) for one field")
    return tuple(fields)


def chosen_fields(data: dict, fields: tuple[str, ...] | None, owner: str) -> tuple[str, ...]:
    """The fields a merge combines: those named, or (None) every floating-point field."""
    if fields is None:
        return tuple(k for k, v in data.items()
                     if all(jnp.issubdtype(leaf.dtype, jnp.inexact) for leaf in jax.tree.leaves(v)))
    missing = [f for f in fields if f not in data]
    if missing:
        raise KeyError(f"{owner} merges fields {missing}, but the branch outputs have fields {sorted(data)}; "
                       f"fix {owner}.fields")
    return fields


def run_all(operators: Sequence[OperatorModule], elements: Element, ctx: BatchContext) -> list[Element]:
    return [op.apply_batch(elements, ctx) for op in operators]


def combine(outputs: Sequence[Element], fields: tuple[str, ...] | None, owner: str,
            merge: Callable[[list], object]) -> Element:
    """Merges `fields` of the branch outputs with `merge(values)`; other fields come from branch 0.

    Per-record state is the union of the branches' states; for a key held by several branches
    the earliest branch wins.
    """
    first = outputs[0].data
    for i, out in enumerate(outputs[1:], start=1):
        if set(out.data) != set(first):
            raise ValueError(f"{owner} branch outputs must have the same fields: branch 0 gives {sorted(first)}, "
                             f"branch {i} gives {sorted(out.data)}; make the branches produce the same fields")
    data = dict(first)
    for name in chosen_fields(first, fields, owner):
        data[name] = merge([out.data[name] for out in outputs])
    state: dict = {}
    for out in reversed(outputs):
        state.update(out.state)
    return Element(data, state)


def _signature(tree) -> list[tuple[str, tuple, str]]:
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return [(jax.tree_util.keystr(p), tuple(x.shape), str(x.dtype)) for p, x in leaves]


def check_same_structure(outputs: Sequence[Element], owner: str) -> None:
    """All outputs must hold the same fields and state with the same shapes and dtypes."""
    first = _signature((outputs[0].data, outputs[0].state))
    for i, out in enumerate(outputs[1:], start=1):
        other = _signature((out.data, out.state))
        if other != first:
            diff = next(((a, b) for a, b in zip(first, other) if a != b), (first, other))
            raise ValueError(
                f"{owner} branches must produce the same fields and state with the same shapes and dtypes "
                f"so one can be chosen per record: branch 0 gives {diff[0]}, branch {i} gives {diff[1]}; "
                "make them agree (for example cast to one dtype)"
            )


def select_records(index: jax.Array, outputs: Sequence[Element]) -> Element:
    """Per record b, the output of branch `index[b]` (int32[B]); gradients flow to the chosen one."""

    def pick(*leaves):
        out = leaves[0]
        for i, leaf in enumerate(leaves[1:], start=1):
            chosen = (index == i).reshape(index.shape + (1,) * (leaf.ndim - 1))
            out = jnp.where(chosen, leaf, out)
        return out

    return jax.tree.map(pick, *outputs)
