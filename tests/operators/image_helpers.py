"""Shared by the image operator tests: run an operator on a float batch in one compiled call."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.lowering import batched_here


@nnx.jit(static_argnums=(3, 4))
def _apply(op, x, ctx, draw, batched):  # `batched` keys the trace: the formulation is chosen while tracing
    out = op(Element({"image": x}), ctx).data["image"]
    return out, (op.draw_batch(ctx, x.shape[1:]) if draw else None)


def run(op, x):
    """The operator's output on a float batch, and the parameters it drew per record (one compile)."""
    out, params = _apply(op, jnp.asarray(x), BatchContext.for_batch(len(x)), op.key is not None, batched_here())
    return np.asarray(out), params
