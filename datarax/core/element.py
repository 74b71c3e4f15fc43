"""The record type that flows through a pipeline: data plus per-record state."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Element:
    """One record (or, with a leading batch axis on every leaf, a batch of records).

    Attributes:
        data: the record's fields, a dict of arrays (any pytree is allowed as a value).
        state: per-record state carried between stages (for example a mixing weight), a dict of
            arrays; empty for most pipelines.

    Example:
        >>> el = Element({"image": jnp.zeros((2, 2)), "label": jnp.int32(3)})
        >>> el.update_data({"image": el.data["image"] + 1}).data["label"]
        Array(3, dtype=int32)
    """

    data: dict[str, Any]
    state: dict[str, Any] = dataclasses.field(default_factory=dict)

    def update_data(self, updates: Mapping[str, Any]) -> Element:
        """Returns a new Element whose data is this one's with `updates` merged in."""
        if not isinstance(updates, Mapping):
            raise TypeError(
                f"Element.update_data takes a dict of fields, got {type(updates).__name__}; "
                "wrap the value: element.update_data({'image': new_image})"
            )
        return Element({**self.data, **updates}, self.state)

    def update_state(self, updates: Mapping[str, Any]) -> Element:
        """Returns a new Element whose per-record state has `updates` merged in."""
        return Element(self.data, {**self.state, **updates})

    def replace(self, **changes: Any) -> Element:
        return dataclasses.replace(self, **changes)
