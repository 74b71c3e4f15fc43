"""SequentialOperator: operators applied one after another, as one operator.

`trace_sequence` is the one sequential stage loop in datarax: this operator and a linear
pipeline's stage program (`datarax.pipeline.Chain`) both run it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorConfig, OperatorModule
from datarax.operators.strategies.common import check_operators


def trace_sequence(operators: Sequence[OperatorModule], elements: Element, ctx: BatchContext) -> Iterator[Element]:
    """Each operator's output in turn; every operator is applied to the previous one's output."""
    for op in operators:
        elements = op.apply_batch(elements, ctx)
        yield elements


def run_sequence(operators: Sequence[OperatorModule], elements: Element, ctx: BatchContext) -> Element:
    """The last output of `trace_sequence` (`elements` itself when there are no operators)."""
    for elements in trace_sequence(operators, elements, ctx):
        pass
    return elements


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
        return run_sequence(self.operators, elements, ctx)

    def structure(self) -> str:
        return "Sequential[" + ", ".join(op.structure() for op in self.operators) + "]"
