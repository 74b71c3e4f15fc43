"""RebatchNode: differentiable regrouping of a batch, (N, ...) <-> (N/g, g, ...)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from datarax.core.checks import check_bool, check_int, field
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule


@dataclasses.dataclass(frozen=True)
class RebatchNodeConfig:
    """Configuration of a `RebatchNode`.

    Attributes:
        group_size: records per group, g >= 1.
        inverse: undo a grouping: (M, g, ...) -> (M*g, ...).
    """

    group_size: int = 1
    inverse: bool = False

    def __post_init__(self):
        check_int(*field(self, "group_size"), 1)
        check_bool(*field(self, "inverse"))


class RebatchNode(OperatorModule):
    """Regroups every field and state leaf: (N, ...) -> (N/g, g, ...), or back with `inverse=True`.

    A reshape, so gradients pass through unchanged. Between a grouping and its inverse, nodes
    see groups as records: a plain DAG module can, for example, normalise within each group
    or mix the records of a group. Per-record operators must not run on grouped batches (the
    batch context still describes N records). Inside a pipeline the batch size is fixed (a final
    short batch runs padded), so N is the pipeline's batch_size.

    Example:
        >>> group = RebatchNode(RebatchNodeConfig(group_size=4))                # (32, ...) -> (8, 4, ...)
        >>> ungroup = RebatchNode(RebatchNodeConfig(group_size=4, inverse=True))  # and back
    """

    def __init__(self, config: RebatchNodeConfig | None = None, **settings: Any):
        config = resolve_config(RebatchNodeConfig, config, settings, "RebatchNode")
        self.config = config

    def _group(self, path, x: jax.Array) -> jax.Array:
        g = self.config.group_size
        if x.ndim == 0 or x.shape[0] % g:
            raise ValueError(
                f"RebatchNode cannot split {jax.tree_util.keystr(path)} of shape {tuple(x.shape)} into groups of "
                f"group_size={g}: the leading axis {x.shape[0] if x.ndim else '(none)'} is not a multiple of {g}; "
                f"use a batch_size divisible by {g} or change RebatchNodeConfig.group_size"
            )
        return x.reshape((x.shape[0] // g, g) + x.shape[1:])

    def _ungroup(self, path, x: jax.Array) -> jax.Array:
        g = self.config.group_size
        if x.ndim < 2 or x.shape[1] != g:
            raise ValueError(
                f"RebatchNode(inverse=True) expects {jax.tree_util.keystr(path)} grouped as (M, {g}, ...), got shape "
                f"{tuple(x.shape)}; match RebatchNodeConfig.group_size to the grouping node's"
            )
        return x.reshape((x.shape[0] * g,) + x.shape[2:])

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        fn = self._ungroup if self.config.inverse else self._group
        return jax.tree_util.tree_map_with_path(fn, elements)

    def structure(self) -> str:
        return f"RebatchNode({self.config!r})"
