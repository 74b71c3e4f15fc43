"""ParallelOperator: several operators on the same input, their outputs merged field by field."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from datarax.core.checks import check_choice, field, is_int
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule
from datarax.operators.strategies import merge
from datarax.operators.strategies.common import check_fields, check_operators, combine, run_all


@dataclasses.dataclass(frozen=True)
class ParallelOperatorConfig:
    """Configuration of a `ParallelOperator`.

    Attributes:
        merge: how branch values of a field are combined: `"concat"` (along `axis`), `"stack"`
            (a new branch axis at `axis`), `"sum"`, `"mean"`, or `"dict"` (a dict branch name ->
            value, so the field becomes a nested dict).
        axis: the per-record axis for concat/stack (the batch axis is not counted); defaults
            to -1 for concat and 0 for stack.
        fields: the fields to merge; None merges every floating-point field. Fields not merged
            are taken from the first branch's output.
        names: branch names for `"dict"` (default "0", "1", ...).
    """

    merge: str = "concat"
    axis: int | None = None
    fields: tuple[str, ...] | None = None
    names: tuple[str, ...] | None = None

    def __post_init__(self):
        check_choice(*field(self, "merge"), merge.MERGE_MODES)
        if self.axis is not None and not is_int(self.axis):
            raise TypeError(f"ParallelOperatorConfig.axis must be an int or None, got {self.axis!r}")
        object.__setattr__(self, "fields", check_fields(self.fields, "ParallelOperatorConfig"))
        if self.names is not None:
            object.__setattr__(self, "names", check_fields(self.names, "ParallelOperatorConfig"))


class ParallelOperator(OperatorModule):
    """Runs every operator on the same batch and merges their outputs (see the config).

    Example:
        >>> both = ParallelOperator(ParallelOperatorConfig(merge="concat", fields=("image",)),
        ...                         operators=[augment, normalize])  # channels doubled
    """

    def __init__(self, config: ParallelOperatorConfig | None = None, *, operators: Sequence[OperatorModule],
                 **settings: Any):
        config = resolve_config(ParallelOperatorConfig, config, settings, "ParallelOperator")
        self.config = config
        self.operators = check_operators(operators, "ParallelOperator")
        if config.names is not None and len(config.names) != len(self.operators):
            raise ValueError(f"ParallelOperatorConfig.names has {len(config.names)} names {config.names} for "
                             f"{len(self.operators)} operators; give one name per operator")

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        cfg = self.config
        axis = cfg.axis if cfg.axis is not None else (0 if cfg.merge == "stack" else -1)
        outputs = run_all(self.operators, elements, ctx)
        return combine(outputs, cfg.fields, "ParallelOperatorConfig",
                       lambda values: merge.merge(values, cfg.merge, axis=axis, names=cfg.names))

    def structure(self) -> str:
        return f"Parallel({self.config!r})[" + ", ".join(op.structure() for op in self.operators) + "]"
