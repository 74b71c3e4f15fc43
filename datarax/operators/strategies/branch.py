"""BranchOperator: a per-record router picks which of several operators transforms each record."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import describe_value
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import (
    BatchContext,
    OperatorConfig,
    OperatorModule,
    record_keys,
    stage_key_from_rngs,
)
from datarax.operators.element import fn_name, takes_key
from datarax.operators.strategies.common import check_operators, check_same_structure, run_all, select_records


@dataclasses.dataclass(frozen=True)
class BranchOperatorConfig(OperatorConfig):
    """Configuration of a `BranchOperator`.

    `stochastic=True` gives the router a per-record key (`router(element, key)`), drawn by
    record identity like any stochastic operator's.
    """


class BranchOperator(OperatorModule):
    """Sends each record through the branch its router picks.

    `router(element) -> int` (or `router(element, key)` when stochastic) runs per record and
    returns a branch index; indices outside `[0, len(branches))` are clipped into it (a jitted
    program cannot raise on data). Every branch runs on the whole batch and each record keeps
    its chosen branch's output, so all branches must produce the same fields, shapes and
    dtypes. Gradients reach the chosen branch's parameters, record by record.

    Example:
        >>> by_label = BranchOperator(router=lambda el: el.data["label"] % 2,
        ...                           branches=[keep, flip])
    """

    def __init__(self, config: BranchOperatorConfig | None = None, *, router: Callable[..., jax.Array],
                 branches: Sequence[OperatorModule], rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(BranchOperatorConfig, config, settings, "BranchOperator", accept=OperatorConfig)
        self._takes_key = takes_key(router, config, "BranchOperator", "router")
        self.config = config
        self.router = router
        self.branches = check_operators(branches, "BranchOperator branches", minimum=2)
        self.key = stage_key_from_rngs("BranchOperator", config, rngs)

    def route(self, elements: Element, ctx: BatchContext) -> jax.Array:
        """The branch index of every record, int32[B]."""
        if self.key is None:
            index = jax.vmap(lambda el: self.router(el) if not self._takes_key else self.router(el, None))(elements)
        else:
            index = jax.vmap(self.router)(elements, record_keys(self.key, ctx))
        index = jnp.asarray(index)
        if index.shape != ctx.record_ids.shape or not (jnp.issubdtype(index.dtype, jnp.integer) or index.dtype == bool):
            raise TypeError(f"BranchOperator router {fn_name(self.router)} must return one integer per record, "
                            f"got {describe_value(index)} for a batch of {ctx.record_ids.shape[0]}")
        return jnp.clip(index.astype(jnp.int32), 0, len(self.branches) - 1)

    def draws(self, elements: Element, ctx: BatchContext) -> dict[str, jax.Array]:
        """`{"branch": int32[B]}` for a router that draws (one that takes a key); else empty."""
        return {} if self.key is None else {"branch": self.route(elements, ctx)}

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        index = self.route(elements, ctx)
        outputs = run_all(self.branches, elements, ctx)
        check_same_structure(outputs, "BranchOperator")
        return select_records(index, outputs)

    def structure(self) -> str:
        return (f"Branch({self.config!r}, router={fn_name(self.router)})["
                + ", ".join(op.structure() for op in self.branches) + "]")
