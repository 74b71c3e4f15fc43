"""WeightedParallelOperator: a weighted sum of several operators' outputs, weights fixed or learned."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import check_bool, field, is_number
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule
from datarax.operators.strategies import merge
from datarax.operators.strategies.common import check_fields, check_operators, combine, run_all


@dataclasses.dataclass(frozen=True)
class WeightedParallelOperatorConfig:
    """Configuration of a `WeightedParallelOperator`.

    Attributes:
        weights: one weight per operator; None means equal weights (1/K each).
        learnable: learn the weights. They are then held as `nnx.Param` logits and read as
            `softmax(logits)` (positive, summing to one), starting at `weights` normalised to
            sum to one. Fixed weights are used exactly as given.
        fields: the fields to mix; None mixes every floating-point field. Other fields are taken
            from the first branch's output.
    """

    weights: tuple[float, ...] | None = None
    learnable: bool = False
    fields: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.weights is not None:
            if isinstance(self.weights, (str, bytes)) or not isinstance(self.weights, Sequence) or not all(
                    is_number(w) for w in self.weights):
                raise TypeError(f"WeightedParallelOperatorConfig.weights must be None or a tuple of finite numbers, "
                                f"got {self.weights!r}")
            object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
            if self.learnable and min(self.weights) <= 0:
                raise ValueError(f"WeightedParallelOperatorConfig.weights must all be > 0 when learnable=True (they "
                                 f"start a softmax), got {self.weights!r}")
        check_bool(*field(self, "learnable"))
        object.__setattr__(self, "fields", check_fields(self.fields, "WeightedParallelOperatorConfig"))


class WeightedParallelOperator(OperatorModule):
    """Runs every operator on the same batch and returns `sum_i w_i * output_i` per field.

    With `learnable=True` the weights are `softmax(self.logits)`, an `nnx.Param`, so a training
    step can learn how much each branch contributes.

    Example:
        >>> mix = WeightedParallelOperator(WeightedParallelOperatorConfig(learnable=True),
        ...                                operators=[augment_a, augment_b])
    """

    def __init__(self, config: WeightedParallelOperatorConfig | None = None, *,
                 operators: Sequence[OperatorModule], **settings: Any):
        config = resolve_config(WeightedParallelOperatorConfig, config, settings, "WeightedParallelOperator")
        self.config = config
        self.operators = check_operators(operators, "WeightedParallelOperator")
        count = len(self.operators)
        weights = config.weights if config.weights is not None else (1.0 / count,) * count
        if len(weights) != count:
            raise ValueError(f"WeightedParallelOperatorConfig.weights has {len(weights)} weights {weights} for "
                             f"{count} operators; give one weight per operator")
        total = sum(weights)
        self.logits = nnx.Param(jnp.log(jnp.asarray([w / total for w in weights]))) if config.learnable else None
        self._fixed = None if config.learnable else weights

    def weights(self) -> jax.Array:
        """The current weights (softmax of the logits when learnable)."""
        return jnp.asarray(self._fixed) if self.logits is None else jax.nn.softmax(self.logits[...])

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        outputs = run_all(self.operators, elements, ctx)
        weights = self.weights()
        return combine(outputs, self.config.fields, "WeightedParallelOperatorConfig",
                       lambda values: merge.weighted_sum(values, weights))

    def structure(self) -> str:
        return f"WeightedParallel({self.config!r})[" + ", ".join(op.structure() for op in self.operators) + "]"
