"""Shared by the image operator tests: run an operator on a float batch in one compiled call."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import BatchContext


@nnx.jit(static_argnums=3)
def _apply(op, x, ctx, draw):
    out = op(Element({"image": x}), ctx).data["image"]
    return out, (op.draw_batch(ctx, x.shape[1:]) if draw else None)


def run(op, x):
    """The operator's output on a float batch, and the parameters it drew per record (one compile)."""
    out, params = _apply(op, jnp.asarray(x), BatchContext.for_batch(len(x)), op.key is not None)
    return np.asarray(out), params
