"""One way to build a source, host stage or operator: a config *or* keyword settings, never both.

Every constructor reads `X(config=None, *, <required data>, rngs=None, **settings)` and turns its
config and settings into one config here, so both spellings give the same object:

    >>> MemorySource(MemorySourceConfig(shuffle=True), data=data)   # a config (TOML files build these)
    >>> MemorySource(shuffle=True, data=data)                       # the same source from settings
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, TypeVar

from datarax.core.checks import describe_value

C = TypeVar("C")


def _article(name: str) -> str:
    return "an" if name[0] in "AEIOU" else "a"


def resolve_config(config_class: type[C], config: Any, settings: dict[str, Any], owner: str, *,
                   accept: type | None = None, exact: bool = False) -> C:
    """The config an `owner(config, **settings)` call describes.

    Args:
        config_class: the owner's config dataclass; built from `settings` when `config` is None.
        config: the config given (or None).
        settings: the keyword settings given (fields of `config_class`).
        owner: the class name shown in errors.
        accept: the type a given config must be an instance of (default `config_class`).
        exact: require `type(config) is config_class` (operators whose configs subclass each other).
    """
    name = config_class.__name__
    if config is None:
        known = {f.name for f in dataclasses.fields(config_class) if f.init}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(f"{owner} got unknown settings {unknown}; its settings are the fields of {name}: "
                            f"{sorted(known)}")
        return config_class(**settings)
    if settings:
        raise TypeError(f"{owner} takes a config or keyword fields, not both; got config={config!r} and "
                        f"{sorted(settings)}: pass {owner}({name}(...)) or {owner}({', '.join(sorted(settings))}=...)")
    ok = type(config) is config_class if exact else isinstance(config, accept or config_class)
    if not ok:
        raise TypeError(f"{owner} config must be {_article(name)} {name}, got {type(config).__name__} "
                        f"({describe_value(config)}); pass {name}(...) or its fields as keywords")
    return config


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """Warns at the user's line: the first frame outside datarax, flax (whose module metaclass calls
    `__init__`) and dataclasses (whose `__init__` calls `__post_init__`)."""
    frame, level = inspect.currentframe().f_back, 2
    while frame is not None and (frame.f_globals.get("__name__", "").split(".")[0] in ("datarax", "flax")
                                 or frame.f_code.co_filename == "<string>"):  # a dataclass's generated __init__
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
