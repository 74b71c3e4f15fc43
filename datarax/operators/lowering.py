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

import jax

# Backends that run `FieldOperator.apply_many`; the others vmap `apply`. GPUs are unmeasured.
BATCHED_BACKENDS = ("tpu",)


def batched_here() -> bool:
    """Whether programs traced now take the operators' batch formulations."""
    return jax.default_backend() in BATCHED_BACKENDS
