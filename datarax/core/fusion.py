"""Keeping XLA:CPU from fusing an image warp into its neighbours.

XLA fuses elementwise producers and consumers of a gather into one loop, and XLA's CPU backend
does not vectorise a loop that contains a gather. A bilinear warp (rotation, affine, translate:
four gathers per output pixel) then recomputes every upstream colour operation once per tap and
runs every downstream one (noise's inverse normal CDF, a gamma curve) one scalar at a time,
several times slower than the same chain with the warp computed on its own (timings in
docs/benchmarks.md, "Per-stage timings"); `optimization_barrier` does not separate them.

`separately` computes a function as its own XLA computation by passing it through `lax.cond` on
a traced predicate that is always true (both branches are the same function, so the result
never depends on it). On other backends it calls the function directly: there a gather fuses
well, and a conditional can cost a device-to-host synchronisation.
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
