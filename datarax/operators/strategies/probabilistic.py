"""ProbabilisticOperator: apply an operator to each record with probability p."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import check_probability, describe_value, field
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import (
    BatchContext,
    OperatorConfig,
    OperatorModule,
    record_keys,
    stage_key_from_rngs,
)
from datarax.operators.strategies.common import check_same_structure, select_records


@dataclasses.dataclass(frozen=True)
class ProbabilisticOperatorConfig:
    """Configuration of a `ProbabilisticOperator`.

    Attributes:
        probability: the chance that a record is transformed, in [0, 1].
        stream_name: the `nnx.Rngs` stream of the per-record coin (`"augment"` when None).
    """

    probability: float = 0.5
    stream_name: str | None = None

    def __post_init__(self):
        check_probability(*field(self, "probability"))
        OperatorConfig(stochastic=True, stream_name=self.stream_name)  # validates stream_name


class ProbabilisticOperator(OperatorModule):
    """Applies `operator` to each record with probability `p`, and passes it through otherwise.

    The coin is drawn per record by record identity, so a record gets the same decision in a
    given epoch whatever batch it sits in. The operator must keep the record's fields, shapes
    and dtypes (the untouched records are returned as they came).

    Example:
        >>> maybe_blur = ProbabilisticOperator(ProbabilisticOperatorConfig(probability=0.3),
        ...                                    operator=blur, rngs=nnx.Rngs(0))
    """

    def __init__(self, config: ProbabilisticOperatorConfig | None = None, *, operator: OperatorModule,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(ProbabilisticOperatorConfig, config, settings, "ProbabilisticOperator")
        if not isinstance(operator, OperatorModule):
            raise TypeError(f"ProbabilisticOperator operator must be an operator (an OperatorModule such as "
                            f"ElementOperator), got {describe_value(operator)}")
        self.config = config
        self.operator = operator
        self.key = stage_key_from_rngs("ProbabilisticOperator",
                                       OperatorConfig(stochastic=True, stream_name=config.stream_name), rngs)

    def applied(self, ctx: BatchContext) -> jax.Array:
        """bool[B]: which records are transformed."""
        draws = jax.vmap(jax.random.uniform)(record_keys(self.key, ctx))
        return draws < self.config.probability

    def draws(self, elements: Element, ctx: BatchContext) -> dict[str, jax.Array]:
        """`{"applied": bool[B]}`: the coin of every record (the operator's own draws are its own)."""
        return {"applied": self.applied(ctx)}

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        transformed = self.operator.apply_batch(elements, ctx)
        outputs = [elements, transformed]
        check_same_structure(outputs, "ProbabilisticOperator (input vs. operator output)")
        return select_records(self.applied(ctx).astype(jnp.int32), outputs)

    def structure(self) -> str:
        return f"Probabilistic({self.config!r})[{self.operator.structure()}]"
