"""One way to build a source, host stage or operator: a config *or* settings, never both.

Every constructor reads `X(config=None, *args, <required data>, rngs=None, **settings)` (`*args`
where the class takes settings by position) and turns its arguments into one config here, so
every spelling gives the same object:

    >>> MemorySource(MemorySourceConfig(shuffle=True), data=data)   # a config (TOML files build these)
    >>> MemorySource(data, shuffle=True)                            # the same source from settings
    >>> RandomCropOperator(32, padding=4, rngs=nnx.Rngs(0))         # == RandomCropOperator(size=32, padding=4, ...)

A class's `positional` names its principal settings: what a torchvision, torchaudio, grain or tfds
user passes first, where datarax's setting means the same (`RandomCrop(32)`, `Normalize(mean, std)`,
`ImageFolderSource(root)`, `DecodeImage(224)`). A first positional value that is a dataclass
instance is the config; other values fill `positional` in order, and any beyond it are refused
with the keyword call spelled out.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import warnings
from typing import Any, TypeVar

from datarax.core.checks import describe_value

C = TypeVar("C")


def _article(name: str) -> str:
    return "an" if name[0] in "AEIOU" else "a"


def resolve_config(config_class: type[C], config: Any, settings: dict[str, Any], owner: str, *,
                   args: tuple = (), positional: tuple[str, ...] = (), accept: type | None = None,
                   exact: bool = False) -> C:
    """The config an `owner(config, *args, **settings)` call describes.

    Args:
        config_class: the owner's config dataclass; built from `settings` when `config` is None.
        config: the first positional (or `config=`) value, or None.
        settings: the keyword settings given (fields of `config_class`).
        owner: the class name shown in errors.
        args: the positional values after `config`.
        positional: the owner's principal settings, fields of `config_class` that may come by position.
        accept: the type a given config must be an instance of (default `config_class`).
        exact: require `type(config) is config_class` (operators whose configs subclass each other).
    """
    return resolve_arguments(config_class, config, settings, owner, {}, args=args, positional=positional,
                             accept=accept, exact=exact)[0]


def resolve_arguments(config_class: type[C], config: Any, settings: dict[str, Any], owner: str,
                      named: dict[str, Any], *, args: tuple = (), positional: tuple[str, ...] = (),
                      accept: type | None = None, exact: bool = False) -> tuple[Any, ...]:
    """`(config, *named values)`: `resolve_config` for a constructor whose principal setting is one of
    its own required arguments (`MemorySource(data)`, `ArrayRecordSource(paths)`), not a config field.

    Args:
        named: the constructor's required arguments by name, None where not given as a keyword;
            a name in `positional` may be filled by position instead.
        config_class, config, settings, owner, args, positional, accept, exact: as in `resolve_config`.
    """
    name = config_class.__name__
    values = list(args)
    slot = config is not None and not (dataclasses.is_dataclass(config) and not isinstance(config, type))
    if slot:  # not a config: the first principal setting
        values.insert(0, config)
        config = None
    if len(values) > len(positional):
        wrong = f"{owner} config must be {_article(name)} {name}, got {describe_value(values[0])}; " if slot and \
            not positional else ""
        raise TypeError(wrong + _by_keyword(config_class, owner, positional, values, settings, named))
    settings, named = dict(settings), dict(named)
    for key, value in zip(positional, values):
        if named.get(key) is not None or key in settings:
            given = named[key] if key in named else settings[key]
            raise TypeError(f"{owner} got multiple values for {key}: {describe_value(value)} by position and "
                            f"{describe_value(given)} as {key}=; pass it once")
        (named if key in named else settings)[key] = value
    if config is not None:
        if settings:
            keywords = ", ".join(f"{key}=..." for key in sorted(settings))
            raise TypeError(f"{owner} takes a config or keyword fields, not both; got config={config!r} and "
                            f"{sorted(settings)}: pass {owner}({name}(...)) or {owner}({keywords})")
        ok = type(config) is config_class if exact else isinstance(config, accept or config_class)
        if not ok:
            raise TypeError(f"{owner} config must be {_article(name)} {name}, got {type(config).__name__} "
                            f"({describe_value(config)}); pass {name}(...) or its fields as keywords")
    missing = [key for key, value in named.items() if value is None]
    if missing:
        how = f"{owner}({missing[0]})" if missing[0] in positional else f"{owner}({missing[0]}=...)"
        raise TypeError(f"{owner} needs {' and '.join(missing)}: pass {how}")
    if config is None:
        known = {f.name for f in dataclasses.fields(config_class) if f.init}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(f"{owner} got unknown settings {unknown}; its settings are the fields of {name}: "
                            f"{sorted(known)}")
        config = config_class(**settings)
    return (config, *named.values())


def settings_order(config_class: type) -> list[str]:
    """The config's settings, those its own class declares first, then its bases' (each in declaration order):
    the order a positional call's values are read in when spelling it with keywords."""
    chain = [c for c in reversed(config_class.__mro__) if dataclasses.is_dataclass(c)]

    def introduced(name: str) -> int:
        return next(i for i, c in enumerate(chain) if name in inspect.get_annotations(c))

    fields = [f.name for f in dataclasses.fields(config_class) if f.init]
    return sorted(fields, key=lambda n: -introduced(n))


def _value(value: Any) -> str:
    """`value` as Python source when it is a short literal, else `...`."""
    text = repr(value)
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return "..."
    return text if len(text) <= 40 else "..."


def _by_keyword(config_class: type, owner: str, positional: tuple[str, ...], values: list[Any],
                settings: dict[str, Any], named: dict[str, Any]) -> str:
    """The refusal of extra positional values, with the call spelled by keyword."""
    taken = set(positional) | set(settings) | {k for k, v in named.items() if v is not None}
    names = list(positional) + [n for n in settings_order(config_class) if n not in taken]
    words = [f"{key}={_value(value)}" for key, value in zip(names, values)]
    words += [f"{key}={_value(value)}" for key, value in settings.items()]
    words += [f"{key}={_value(value)}" for key, value in named.items() if value is not None]
    extra = len(values) - len(names)
    more = f" ({extra} more value(s) than {config_class.__name__} has settings)" if extra > 0 else ""
    if not positional:
        return f"{owner} takes no settings by position; pass them as keywords: {owner}({', '.join(words)}){more}"
    return (f"{owner} takes only {' and '.join(positional)} by position; pass the rest as keywords: "
            f"{owner}({', '.join(words)}){more}")


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """Warns at the user's line: the first frame outside datarax, flax (whose module metaclass calls
    `__init__`) and dataclasses (whose `__init__` calls `__post_init__`)."""
    frame, level = inspect.currentframe().f_back, 2
    while frame is not None and (frame.f_globals.get("__name__", "").split(".")[0] in ("datarax", "flax")
                                 or frame.f_code.co_filename == "<string>"):  # a dataclass's generated __init__
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
