"""SequentialOperator: operators applied one after another, as one operator."""

from __future__ import annotations

from collections.abc import Sequence

from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorConfig, OperatorModule
from datarax.operators.strategies.common import check_operators


class SequentialOperator(OperatorModule):
    """Applies `operators` in order; each sees the previous one's output.

    Useful to treat a chain as a single unit: one branch of a `ParallelOperator`, one DAG node.

    Example:
        >>> op = SequentialOperator(operators=[normalize, augment])
    """

    def __init__(self, *, operators: Sequence[OperatorModule]):
        self.config = OperatorConfig()
        self.operators = check_operators(operators, "SequentialOperator")

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        for op in self.operators:
            elements = op.apply_batch(elements, ctx)
        return elements

    def structure(self) -> str:
        return "Sequential[" + ", ".join(op.structure() for op in self.operators) + "]"
