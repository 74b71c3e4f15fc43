"""Which formulation of an operator's maths a backend runs.

A field operator's maths is written for one record (`apply`) and vmapped over the batch, which
XLA's CPU backend turns into fast loops. On a TPU the same per-record crops, pads, flips and
shifts become gathers, and a small trailing channel axis wastes most of every vector register,
so there the pipeline calls the operator's batch formulation `apply_many` instead: selection and
interpolation matrices on the matrix unit for geometry (`datarax.operators.image.functional.batched`),
the vmapped `apply` for everything else. Draws, keys, outputs (within float rounding; integer
crops and flips exactly) and gradients are those of the per-record form; only the program differs.
Measurements behind the choice: docs/tpu.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp

from datarax.operators.precision import SELECTION, precision_for

# Backends that run `FieldOperator.apply_many`; the others vmap `apply`. GPUs are unmeasured.
BATCHED_BACKENDS = ("tpu",)


def batched_here() -> bool:
    """Whether programs traced now take the operators' batch formulations."""
    return jax.default_backend() in BATCHED_BACKENDS


# A user's per-record function (`ElementOperator`, `MapOperator`) cannot be rewritten by hand, but
# its per-record `lax.dynamic_slice` can: traced once, the slice with computed start indices is
# replaced by one-hot selection products along each sliced axis, which under the batch's `vmap`
# become batched products on the matrix unit instead of a gather. Only axes short enough for a
# one-hot matrix per record are rewritten; anything else runs as written.
MAX_SELECTED_AXIS = 2048
MAX_SELECTION = 1 << 20  # elements of one record's (slice, axis) one-hot matrix
_EXACT_IN_FLOAT32 = ("uint8", "int8", "uint16", "int16")  # integers a float32 product selects exactly
_NONFINITE = (jnp.nan, jnp.inf, -jnp.inf)


def user_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A user's per-record function as the backend runs it: `slices_as_selections(fn)` where
    `batched_here()`, `fn` itself elsewhere."""
    return slices_as_selections(fn) if batched_here() else fn


def slices_as_selections(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with each selectable `lax.dynamic_slice` (in it or in the jitted functions it calls)
    computed as selection products; outputs and gradients are `fn`'s exactly (NaN and infinities
    included: they are carried through the products as codes, never multiplied by zero)."""

    def selection(eqn, invals):
        if eqn.primitive is jax.lax.dynamic_slice_p and _selectable(eqn):
            return [select_slice(invals[0], invals[1:], eqn.params["slice_sizes"])]
        return None

    return rewritten(fn, selection)


# Computes one equation from its input values: its outputs, or None to compute it as traced.
Rule = Callable[[jex.JaxprEqn, list], list | None]


def rewritten(fn: Callable[..., Any], rule: Rule) -> Callable[..., Any]:
    """`fn` traced once and evaluated equation by equation, each equation (in `fn` and in the jitted
    functions it calls) computed by `rule(eqn, input_values)` where that returns a list of outputs,
    and as traced where it returns None."""

    def lowered(*args):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        out = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args), rule)
        return jax.tree.unflatten(jax.tree.structure(shape), out)

    return lowered


def _evaluate(jaxpr: jex.Jaxpr, consts: list, args: list, rule: Rule) -> list:
    env: dict = {}

    def read(var):
        return var.val if isinstance(var, jex.Literal) else env[var]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        invals = [read(var) for var in eqn.invars]
        outvals = rule(eqn, invals)
        if outvals is None and eqn.primitive.name in ("pjit", "jit"):
            inner = eqn.params["jaxpr"]
            outvals = _evaluate(inner.jaxpr, inner.consts, invals, rule)
        elif outvals is None:
            with eqn.ctx.manager:  # as `jax.core.eval_jaxpr` binds an equation
                outvals = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
            outvals = outvals if eqn.primitive.multiple_results else [outvals]
        for var, val in zip(eqn.outvars, outvals):
            if not isinstance(var, jex.DropVar):
                env[var] = val
    return [read(var) for var in jaxpr.outvars]


def _selectable(eqn) -> bool:
    operand, *starts = eqn.invars
    sizes = eqn.params["slice_sizes"]
    dtype = jnp.dtype(operand.aval.dtype)
    if len(starts) != len(sizes) or not (jnp.issubdtype(dtype, jnp.floating) or dtype.name in _EXACT_IN_FLOAT32):
        return False
    cut = [(size, n) for size, n in zip(sizes, operand.aval.shape) if size < n]
    computed = any(not isinstance(start, jex.Literal) for start in starts)
    return bool(cut) and computed and all(n <= MAX_SELECTED_AXIS and size * n <= MAX_SELECTION for size, n in cut)


def select_slice(x: jax.Array, starts: list, sizes: tuple[int, ...]) -> jax.Array:
    """`lax.dynamic_slice(x, starts, sizes)` as one-hot products along each cut axis (starts
    clamped into range as `dynamic_slice` clamps them)."""
    dtype = x.dtype
    floating = jnp.issubdtype(dtype, jnp.floating)
    work = x if floating else x.astype(jnp.float32)
    if floating:  # finite values and a code for each non-finite one (1 NaN, 2 +inf, 3 -inf), selected together
        finite = jnp.isfinite(work)
        code = jnp.where(finite, 0, jnp.where(jnp.isnan(work), 1, jnp.where(work > 0, 2, 3)))
        work = jnp.stack([jnp.where(finite, work, 0), code.astype(work.dtype)])
    lead = int(floating)
    precision = precision_for(SELECTION, dtype)
    for axis, (start, size, n) in enumerate(zip(starts, sizes, x.shape)):
        if size == n:
            continue
        first = jnp.clip(start, 0, n - size)
        rows = ((first + jnp.arange(size))[:, None] == jnp.arange(n)).astype(work.dtype)
        work = jnp.moveaxis(jnp.tensordot(rows, work, axes=[[1], [axis + lead]], precision=precision), 0, axis + lead)
    if not floating:
        return work.astype(dtype)
    values, code = work[0], work[1]
    for value, number in zip(_NONFINITE, (1, 2, 3)):
        values = jnp.where(code == number, jnp.asarray(value, values.dtype), values)
    return values.astype(dtype)
