"""The stage program of a linear pipeline: stages applied one after another."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from flax import nnx

from datarax.core.checks import describe_value
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule
from datarax.operators.strategies.sequential import run_sequence, trace_sequence


def check_stage(stage: object, where: str) -> OperatorModule:
    if not isinstance(stage, OperatorModule):
        raise TypeError(
            f"{where} must be an operator (an OperatorModule such as ElementOperator), got "
            f"{describe_value(stage)}; wrap a function with ElementOperator(ElementOperatorConfig(), fn=...)"
        )
    return stage


class Chain(nnx.Module):
    """Applies `stages` in order. Every stage program (this, `DagProgram`) has this interface:

    `__call__(elements, ctx) -> Element` on a batched Element; `trace(elements, ctx)`, which
    yields `(name, module, output)` for every stage in the order they run, the last output
    being `__call__`'s; and `structure() -> str`.

    Example:
        >>> chain = Chain([normalize, augment])
        >>> [name for name, _, _ in chain.trace(Element(batch), ctx)]
        ['0', '1']
    """

    def __init__(self, stages: Sequence[OperatorModule]):
        if isinstance(stages, OperatorModule) or not isinstance(stages, Sequence):
            raise TypeError(f"stages must be a list of operators, got {describe_value(stages)}; pass stages=[op, ...]")
        self.stages = nnx.List([check_stage(s, f"stages[{i}]") for i, s in enumerate(stages)])

    def __call__(self, elements: Element, ctx: BatchContext) -> Element:
        return run_sequence(self.stages, elements, ctx)

    def trace(self, elements: Element, ctx: BatchContext) -> Iterator[tuple[str, nnx.Module, Element]]:
        """`(index as a str, stage, its output)` for every stage, in order."""
        outputs = trace_sequence(self.stages, elements, ctx)
        for i, (stage, out) in enumerate(zip(self.stages, outputs)):
            yield str(i), stage, out

    def structure(self) -> str:
        return "Chain[" + ", ".join(s.structure() for s in self.stages) + "]"
