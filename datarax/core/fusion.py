"""Keeping XLA:CPU from fusing an image warp into its neighbours.

XLA:CPU does not vectorise a fused loop that contains a gather, so a bilinear warp fused with
its neighbours runs them one scalar at a time (docs/operators.md, "The warp change").
`separately` computes a function as its own XLA computation through `lax.cond` on an
always-true traced predicate; on other backends it calls the function directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np


def separately(fn: Callable[..., Any], token: jax.Array, *operands: Any) -> Any:
    """`fn(*operands)`, compiled as a separate computation on the CPU backend.

    `token` must be a traced boolean scalar that is not batched by an enclosing `vmap` (e.g.
    `ctx.epoch >= 0` in an operator's `apply_batch`); under a `vmap` that batches it, JAX turns
    the conditional into a select and `fn` runs twice. A Python bool token runs `fn` inline.
    """
    if isinstance(token, (bool, np.bool_)) or jax.default_backend() != "cpu":
        return fn(*operands)
    return jax.lax.cond(token, fn, fn, *operands)
