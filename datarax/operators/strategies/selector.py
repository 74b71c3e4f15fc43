"""SelectorOperator: each record goes through one of N operators, drawn at random per record."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import check_bool, field, is_number
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorConfig, OperatorModule, record_keys, stage_key_from_rngs
from datarax.operators.strategies import merge
from datarax.operators.strategies.common import check_operators, check_same_structure, run_all, select_records


@dataclasses.dataclass(frozen=True)
class SelectorOperatorConfig:
    """Configuration of a `SelectorOperator`.

    Attributes:
        probabilities: the chance of each operator (normalised to sum to one); None: uniform.
        learnable: hold the choice logits as an `nnx.Param` (initialised to log(probabilities)).
        stream_name: the `nnx.Rngs` stream of the per-record draw (`"augment"` when None).
    """

    probabilities: tuple[float, ...] | None = None
    learnable: bool = False
    stream_name: str | None = None

    def __post_init__(self):
        if self.probabilities is not None:
            probs = self.probabilities
            if isinstance(probs, (str, bytes)) or not isinstance(probs, Sequence) or not all(
                    is_number(p) and p > 0 for p in probs):
                raise ValueError(f"SelectorOperatorConfig.probabilities must be None or a tuple of numbers > 0, "
                                 f"got {probs!r}")
            object.__setattr__(self, "probabilities", tuple(float(p) for p in probs))
        check_bool(*field(self, "learnable"))
        OperatorConfig(stochastic=True, stream_name=self.stream_name)  # validates stream_name


class SelectorOperator(OperatorModule):
    """Transforms each record with one operator chosen from `operators` at random.

    The choice is drawn per record by record identity (`categorical(key(record), logits)`), so a
    record gets the same choice in a given epoch whatever batch it sits in. All operators must
    produce the same fields, shapes and dtypes.

    With `learnable=True` the output carries a straight-through gradient for the logits: its
    value is exactly the chosen operator's output, and its gradient with respect to the logits
    is that of the softmax-weighted mixture `sum_i softmax(logits)_i * output_i` (floating-point
    fields only). The discrete choice itself has no gradient.

    Example:
        >>> one_of = SelectorOperator(SelectorOperatorConfig(probabilities=(0.7, 0.3)),
        ...                           operators=[crop, rotate], rngs=nnx.Rngs(0))
    """

    def __init__(self, config: SelectorOperatorConfig | None = None, *, operators: Sequence[OperatorModule],
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(SelectorOperatorConfig, config, settings, "SelectorOperator")
        self.config = config
        self.operators = check_operators(operators, "SelectorOperator", minimum=2)
        count = len(self.operators)
        probs = config.probabilities if config.probabilities is not None else (1.0,) * count
        if len(probs) != count:
            raise ValueError(f"SelectorOperatorConfig.probabilities has {len(probs)} entries {probs} for {count} "
                             "operators; give one per operator")
        logits = tuple(math.log(p / sum(probs)) for p in probs)
        self.logits = nnx.Param(jnp.asarray(logits)) if config.learnable else None
        self._fixed_logits = None if config.learnable else logits
        self.key = stage_key_from_rngs("SelectorOperator",
                                       OperatorConfig(stochastic=True, stream_name=config.stream_name), rngs)

    def current_logits(self) -> jax.Array:
        return self.logits[...] if self.logits is not None else jnp.asarray(self._fixed_logits)

    def choices(self, ctx: BatchContext) -> jax.Array:
        """int32[B]: the operator index of every record."""
        logits = jax.lax.stop_gradient(self.current_logits())
        return jax.vmap(lambda k: jax.random.categorical(k, logits))(record_keys(self.key, ctx)).astype(jnp.int32)

    def draws(self, elements: Element, ctx: BatchContext) -> dict[str, jax.Array]:
        """`{"choice": int32[B]}`: the operator each record went through."""
        return {"choice": self.choices(ctx)}

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        outputs = run_all(self.operators, elements, ctx)
        check_same_structure(outputs, "SelectorOperator")
        hard = select_records(self.choices(ctx), outputs)
        if self.logits is None:
            return hard
        weights = jax.nn.softmax(self.logits[...])

        def straight_through(hard_leaf, *leaves):
            if not jnp.issubdtype(hard_leaf.dtype, jnp.inexact):
                return hard_leaf
            soft = merge.weighted_sum(leaves, weights)
            return hard_leaf + (soft - jax.lax.stop_gradient(soft))

        return jax.tree.map(straight_through, hard, *outputs)

    def structure(self) -> str:
        return f"Selector({self.config!r})[" + ", ".join(op.structure() for op in self.operators) + "]"
