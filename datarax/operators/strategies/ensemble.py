"""EnsembleOperator: several operators on the same input, reduced elementwise (mean/sum/max/min)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from datarax.core.checks import check_choice, field
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule
from datarax.operators.strategies import merge
from datarax.operators.strategies.common import check_fields, check_operators, combine, run_all


@dataclasses.dataclass(frozen=True)
class EnsembleOperatorConfig:
    """Configuration of an `EnsembleOperator`.

    Attributes:
        reduce: `"mean"`, `"sum"`, `"max"` or `"min"` over the branches, elementwise.
        fields: the fields to reduce; None reduces every floating-point field. Other fields are
            taken from the first branch's output.
    """

    reduce: str = "mean"
    fields: tuple[str, ...] | None = None

    def __post_init__(self):
        check_choice(*field(self, "reduce"), merge.REDUCTIONS)
        object.__setattr__(self, "fields", check_fields(self.fields, "EnsembleOperatorConfig"))


class EnsembleOperator(OperatorModule):
    """Runs every operator on the same batch and reduces their outputs elementwise.

    All operators must produce the reduced fields with the same shapes.

    Example:
        >>> avg = EnsembleOperator(EnsembleOperatorConfig(reduce="mean"), operators=[blur, sharpen])
    """

    def __init__(self, config: EnsembleOperatorConfig | None = None, *, operators: Sequence[OperatorModule],
                 **settings: Any):
        config = resolve_config(EnsembleOperatorConfig, config, settings, "EnsembleOperator")
        self.config = config
        self.operators = check_operators(operators, "EnsembleOperator")

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        outputs = run_all(self.operators, elements, ctx)
        return combine(outputs, self.config.fields, "EnsembleOperatorConfig",
                       lambda values: merge.reduce(values, self.config.reduce))

    def structure(self) -> str:
        return f"Ensemble({self.config!r})[" + ", ".join(op.structure() for op in self.operators) + "]"
