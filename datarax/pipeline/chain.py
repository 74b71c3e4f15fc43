"""The stage program of a linear pipeline: stages applied one after another."""

from __future__ import annotations

from collections.abc import Sequence

from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule, describe


def check_stage(stage: object, where: str) -> OperatorModule:
    if not isinstance(stage, OperatorModule):
        raise TypeError(
            f"{where} must be an operator (an OperatorModule such as ElementOperator), got "
            f"{describe(stage)}; wrap a function with ElementOperator(ElementOperatorConfig(), fn=...)"
        )
    return stage


class Chain(nnx.Module):
    """Applies `stages` in order. Every stage program has this interface:

    `__call__(elements, ctx) -> Element` on a batched Element, and `structure() -> str`.
    """

    def __init__(self, stages: Sequence[OperatorModule]):
        if isinstance(stages, OperatorModule) or not isinstance(stages, Sequence):
            raise TypeError(f"stages must be a list of operators, got {describe(stages)}; pass stages=[op, ...]")
        self.stages = nnx.List([check_stage(s, f"stages[{i}]") for i, s in enumerate(stages)])

    def __call__(self, elements: Element, ctx: BatchContext) -> Element:
        for stage in self.stages:
            elements = stage.apply_batch(elements, ctx)
        return elements

    def structure(self) -> str:
        return "Chain[" + ", ".join(s.structure() for s in self.stages) + "]"
