"""SplitField: route a subset of a record's fields (optionally through an operator)."""

from __future__ import annotations

import dataclasses
from typing import Any

from datarax.core.checks import describe_value
from datarax.core.construct import resolve_config
from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule
from datarax.operators.strategies.common import check_fields


@dataclasses.dataclass(frozen=True)
class SplitFieldConfig:
    """Configuration of a `SplitField`.

    Attributes:
        fields: the fields routed (a tuple of field names, at least one).
    """

    fields: tuple[str, ...] = ()

    def __post_init__(self):
        fields = check_fields(self.fields, "SplitFieldConfig")
        if not fields:
            raise ValueError("SplitFieldConfig.fields must name at least one field, got (); "
                             "write SplitFieldConfig(fields=('image',))")
        object.__setattr__(self, "fields", fields)


class SplitField(OperatorModule):
    """Routes `fields` of each record.

    Without an operator it keeps only those fields (per-record state is kept), so in a DAG a
    branch can work on, say, the image alone. With `operator=` it sends only those fields
    through the operator and puts its output back beside the untouched fields, so an operator
    never sees (or needs to know about) the others.

    Example:
        >>> images_only = SplitField(SplitFieldConfig(fields=("image",)))
        >>> augment_image = SplitField(SplitFieldConfig(fields=("image",)), operator=augmenter)
    """

    def __init__(self, config: SplitFieldConfig | None = None, *, operator: OperatorModule | None = None,
                 **settings: Any):
        config = resolve_config(SplitFieldConfig, config, settings, "SplitField")
        if operator is not None and not isinstance(operator, OperatorModule):
            raise TypeError(f"SplitField operator must be an operator (an OperatorModule) or None, "
                            f"got {describe_value(operator)}")
        self.config = config
        self.operator = operator

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        fields = self.config.fields
        missing = [f for f in fields if f not in elements.data]
        if missing:
            raise KeyError(f"SplitField routes fields {missing}, but the records have fields "
                           f"{sorted(elements.data)}; fix SplitFieldConfig.fields")
        routed = elements.replace(data={f: elements.data[f] for f in fields})
        if self.operator is None:
            return routed
        out = self.operator.apply_batch(routed, ctx)
        rest = {k: v for k, v in elements.data.items() if k not in fields}
        return Element({**rest, **out.data}, out.state)

    def structure(self) -> str:
        inner = "" if self.operator is None else f"[{self.operator.structure()}]"
        return f"SplitField({self.config!r}){inner}"
