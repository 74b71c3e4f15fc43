"""ElementOperator: a user function on one record, vmapped over the batch."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from datarax.core.checks import describe_value
from datarax.core.construct import resolve_arguments
from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator
from datarax.operators.lowering import user_code


@dataclasses.dataclass(frozen=True)
class ElementOperatorConfig(OperatorConfig):
    """Configuration of an `ElementOperator` (see `OperatorConfig`)."""


def accepts_key(fn: Callable, owner: str) -> bool:
    """Whether `fn` takes a second positional argument (the record key)."""
    if not callable(fn):
        raise TypeError(f"{owner} fn must be callable, got {describe_value(fn)}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def fn_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def takes_key(fn: Callable, config: OperatorConfig, owner: str, role: str) -> bool:
    """Whether `fn` takes the record key; a stochastic `config` requires that it does."""
    takes = accepts_key(fn, owner if role == "fn" else f"{owner} {role}")
    if config.stochastic and not takes:
        raise TypeError(f"{owner} is stochastic but {role} {fn_name(fn)} takes no key argument; "
                        f"define it as {role}(element, key)")
    return takes


def call_user_fn(fn: Callable, element: Element, key: jax.Array | None, with_key: bool, owner: str,
                 config_name: str) -> object:
    """`fn(element, key)` (or `fn(element)`), turning two common mistakes into messages that say the fix:
    a field name the record does not have, and a key used by a deterministic operator's function."""
    try:
        return fn(element, key) if with_key else fn(element)
    except KeyError as exc:
        missing = exc.args[0] if len(exc.args) == 1 else None
        if isinstance(missing, str) and isinstance(element.data, dict) and missing not in element.data:
            raise KeyError(f"{owner} fn {fn_name(fn)} reads field {missing!r}, but the record has fields "
                           f"{sorted(element.data)}; check the name in your function") from exc
        raise
    except TypeError as exc:
        if key is None and "PRNG key" in str(exc):
            raise TypeError(f"{owner} fn {fn_name(fn)} used its key, but the operator is deterministic, so the key "
                            f"is None; set {config_name}(stochastic=True) and give the operator rngs=nnx.Rngs(seed)"
                            ) from exc
        raise


class ElementOperator(PerRecordOperator):
    """Applies `fn(element, key) -> element` to every record of a batch.

    `key` is the record's own key (see `datarax.core.operator`) for a stochastic operator, and
    None for a deterministic one; a deterministic `fn` may also take the element alone.

    Example:
        >>> def scale(element, key=None):
        ...     return element.update_data({"x": element.data["x"] * 2})
        >>> op = ElementOperator(scale)
    """

    positional = ("fn",)

    def __init__(self, config: ElementOperatorConfig | None = None, *args: Any,
                 fn: Callable[..., Element] | None = None, rngs: nnx.Rngs | None = None, **settings: Any):
        config, fn = resolve_arguments(ElementOperatorConfig, config, settings, "ElementOperator", {"fn": fn},
                                       args=args, positional=self.positional, accept=OperatorConfig)
        self._takes_key = takes_key(fn, config, "ElementOperator", "fn")
        self.fn = fn
        self._init_rng(config, rngs)

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        out = call_user_fn(self.fn, element, key, self._takes_key, "ElementOperator", "ElementOperatorConfig")
        if not isinstance(out, Element):
            raise TypeError(
                f"ElementOperator fn {fn_name(self.fn)} must return an Element, got {describe_value(out)}; "
                "return element.update_data({...})"
            )
        return out

    def per_record(self) -> Callable[[Element, jax.Array | None], Element]:
        return user_code(self.apply_element)

    def structure(self) -> str:
        return f"ElementOperator({self.config!r}, fn={fn_name(self.fn)})"
