"""MapOperator: a function applied to every array leaf of a record, or of the chosen fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax import nnx

from datarax.core.construct import resolve_arguments
from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator
from datarax.operators.element import accepts_key, fn_name
from datarax.operators.lowering import user_code


@dataclasses.dataclass(frozen=True)
class MapOperatorConfig(OperatorConfig):
    """Configuration of a `MapOperator`.

    Attributes:
        fields: which fields to transform: None for all of them, a tuple of field names, or a
            nested dict mirroring `element.data` whose present keys mark the fields (values are
            ignored unless they are dicts, which select inside that field).
    """

    fields: tuple[str, ...] | Mapping[str, Any] | None = None

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.fields, list):
            object.__setattr__(self, "fields", tuple(self.fields))
        if self.fields is not None and not isinstance(self.fields, (tuple, Mapping)):
            raise TypeError(f"MapOperatorConfig.fields must be None, a tuple of field names or a dict, "
                            f"got {self.fields!r}")
        if isinstance(self.fields, tuple) and not all(isinstance(n, str) for n in self.fields):
            raise TypeError(f"MapOperatorConfig.fields names must be strings, got {self.fields!r}")

    def __hash__(self):
        return hash((self.stochastic, self.stream_name, repr(self.fields)))


def _select(data: Any, mask: Any, path: str, fn: Callable[[Any, str], Any]) -> Any:
    if mask is None:
        return jax.tree_util.tree_map_with_path(lambda p, x: fn(x, path + jax.tree_util.keystr(p)), data)
    if not isinstance(data, Mapping):
        raise ValueError(f"MapOperator fields selects inside {path or 'data'}, which is not a dict")
    out = dict(data)
    for name, sub in mask.items():
        if name not in data:
            raise KeyError(f"MapOperator fields names field {path}[{name!r}], but the record has "
                           f"fields {sorted(data)}; fix MapOperatorConfig.fields")
        out[name] = _select(data[name], sub if isinstance(sub, Mapping) else None, f"{path}[{name!r}]", fn)
    return out


class MapOperator(PerRecordOperator):
    """Applies `fn(leaf, key) -> leaf` to each selected array leaf of every record.

    A stochastic MapOperator gives each leaf its own key (the record key folded with the leaf's
    position in the tree), so fields are augmented independently but reproducibly.

    Example:
        >>> op = MapOperator(lambda x, key=None: x / 255.0, fields=("image",))
    """

    positional = ("fn",)

    def __init__(self, config: MapOperatorConfig | None = None, *args: Any, fn: Callable[..., Any] | None = None,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config, fn = resolve_arguments(MapOperatorConfig, config, settings, "MapOperator", {"fn": fn}, args=args,
                                       positional=self.positional)
        self._takes_key = accepts_key(fn, "MapOperator")
        if config.stochastic and not self._takes_key:
            raise TypeError(f"MapOperator is stochastic but fn {fn_name(fn)} takes no key; define fn(x, key)")
        self.fn = fn
        self._init_rng(config, rngs)

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        counter = iter(range(1 << 30))

        def leaf(x, _path):
            if not self._takes_key:
                return self.fn(x)
            return self.fn(x, None if key is None else jax.random.fold_in(key, next(counter)))

        fields = self.config.fields
        mask = dict.fromkeys(fields) if isinstance(fields, tuple) else fields
        return element.replace(data=_select(element.data, mask, "", leaf))

    def per_record(self) -> Callable[[Element, jax.Array | None], Element]:
        return user_code(self.apply_element)

    def structure(self) -> str:
        return f"MapOperator({self.config!r}, fn={fn_name(self.fn)})"
