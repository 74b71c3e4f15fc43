"""Checking configuration values against Python type hints, with every problem reported by TOML path.

All problems are collected in one pass before raising, each naming where it is, what was expected
and what was found (`stages[2].brightness.max_delta must be a number, got 'high'`). The expected
types come from the type hints of the classes a configuration instantiates.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from datarax.core.errors import DataraxError

Path = tuple[str | int, ...]
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigError(DataraxError, ValueError):
    """A configuration with one or more problems; `problems` lists them, one line each."""

    def __init__(self, problems: Sequence[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = f"{where}{self.problems[0]}"
        else:
            text = f"{where}{len(self.problems)} problems:\n" + "\n".join(f"  {p}" for p in self.problems)
        super().__init__(text)


def format_path(path: Path) -> str:
    """`("stages", 2, "brightness", "max_delta")` -> `stages[2].brightness.max_delta`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            key = part if _BARE_KEY.match(part) else '"' + part.replace('"', '\\"') + '"'
            text += f".{key}" if text else key
    return text or "(top level)"


class FieldError(DataraxError, ValueError):
    """Raised by a schema dataclass's `__post_init__` to report a problem at one of its fields."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def field_checked(check: Callable[..., Any], **fields: Any) -> Any:
    """`check(**fields)`, with its error ("prefetch must be ...") reported at the field it names."""
    try:
        return check(**fields)
    except (TypeError, ValueError) as exc:
        text = str(exc)
        for name in fields:
            if text.startswith(name + " "):
                raise FieldError(name, text[len(name) + 1:]) from None
        raise FieldError(next(iter(fields)), text) from None


class Problems:
    """Collects problems during validation; `raise_if_any` raises them together."""

    def __init__(self, source: str | None = None):
        self.items: list[str] = []
        self.source = source

    def add(self, path: Path, message: str) -> None:
        self.items.append(f"{format_path(path)} {message}")

    def add_line(self, message: str) -> None:
        """A problem that belongs to no key (a missing file, say)."""
        self.items.append(message)

    def __len__(self) -> int:
        return len(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigError(self.items, self.source)


def closest(name: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice most like `name` (difflib ratio >= `cutoff`), or None."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=cutoff)
    return close[0] if close else None


def suggestion(name: str, choices: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the closest choice, or '' when none is close."""
    close = closest(name, choices)
    return f"; did you mean {close!r}?" if close else ""


def check_keys(table: Mapping[str, Any], known: Iterable[str], path: Path, problems: Problems,
               what: str = "key") -> None:
    """Reports every key of `table` outside `known`, with a 'did you mean' suggestion."""
    known = list(known)
    for key in table:
        if key not in known:
            problems.add((*path, key), f"is not a known {what}{suggestion(key, known)} "
                                       f"(known: {', '.join(sorted(known)) or 'none'})")


def is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


_TOML_TYPES = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
               (Mapping, "a table"), (list, "an array"))


def type_name(value: Any) -> str:
    """The TOML name of a value's type, for messages."""
    return next((name for kind, name in _TOML_TYPES if isinstance(value, kind)), type(value).__name__)


def _args(hint: Any) -> tuple:
    return typing.get_args(hint)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _union_arms(hint: Any) -> list[Any]:
    """A union's arms a TOML value may take, None aside. A union of numbers that lists `bool` among
    them (optax's `Numeric`: `momentum` is `Array | ... | bool | int | float | None`) takes numbers:
    `momentum = true` is a mistake there, not a momentum of 1.0."""
    arms = [a for a in _args(hint) if a is not type(None)]
    if bool in arms and (int in arms or float in arms):
        arms = [a for a in arms if a is not bool]
    return arms


def is_callable_hint(hint: Any) -> bool:
    return hint is Callable or typing.get_origin(hint) is Callable


def describe_hint(hint: Any) -> str:
    """Human words for what a type hint accepts in TOML ('a number', 'a list of strings', ...)."""
    if hint is Any or hint is object:
        return "any value"
    if _is_union(hint):
        arms = _union_arms(hint)
        # Arms a TOML value never is (jax.Array, np.ndarray, complex) say nothing a user can write.
        writable = [a for a in arms if _writable(a)] or arms
        if float in writable:  # an integer is a number too
            writable = [a for a in writable if a is not int]
        return " or ".join(dict.fromkeys(describe_hint(a) for a in writable))
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in _args(hint))
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if is_callable_hint(hint):
        return "an import path 'package.module:function'"
    if origin is tuple:
        args = _args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        return f"a list of {len(args)} items ({', '.join(describe_hint(a) for a in args)})"
    if origin in (list, collections.abc.Sequence) or hint in (list, tuple):
        args = _args(hint)
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin in (dict, collections.abc.Mapping) or hint in (dict, Mapping):
        return "a table"
    if dataclasses.is_dataclass(hint):
        return f"a table of {hint.__name__} fields"
    return f"a {getattr(hint, '__name__', hint)}"


def _writable(hint: Any) -> bool:
    """Whether some TOML value can have this hint's type (for wording a union's choices)."""
    if not isinstance(hint, type):
        return True
    return hint in _SCALARS or hint in (list, tuple, dict) or dataclasses.is_dataclass(hint) or \
        issubclass(hint, (collections.abc.Mapping, collections.abc.Sequence))


def _plural(hint: Any) -> str:
    words = describe_hint(hint)
    for article in ("an ", "a "):
        if words.startswith(article):
            noun = words[len(article):]
            return noun if noun.endswith("s") or " " in noun else noun + "s"
    return words


_SCALARS = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


class Unconvertible(DataraxError):
    """Internal: a value does not fit a hint (the caller words the problem)."""


def convert(value: Any, hint: Any, path: Path, problems: Problems, *,
            resolve_callable: Callable[[Any, Path, Problems], Any] | None = None) -> Any:
    """`value` checked against `hint` and converted (lists to tuples, ints to floats).

    Adds a problem at `path` and returns None when it does not fit. Hints this module cannot
    express in TOML (arrays, modules) accept nothing; `resolve_callable` turns import-path strings
    into callables for `Callable` hints.
    """
    try:
        return _convert(value, hint, path, problems, resolve_callable)
    except Unconvertible:
        problems.add(path, f"must be {describe_hint(hint)}, got {value!r}")
        return None


def _convert(value, hint, path, problems, resolve_callable):
    if hint is Any or hint is object or isinstance(hint, (str, typing.ForwardRef, typing.TypeVar)):
        return value
    if _is_union(hint):
        near_miss = None
        for arm in _union_arms(hint):
            attempt = Problems()
            try:
                out = _convert(value, arm, path, attempt, resolve_callable)
            except Unconvertible:
                continue
            if not attempt.items:
                return out
            near_miss = near_miss or attempt
        if near_miss is not None:
            # The value had the right shape for an arm but failed inside it (an import path that is
            # refused or missing): that explains more than "must be X or Y".
            problems.items.extend(near_miss.items)
            return None
        raise Unconvertible
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        if value in _args(hint) and not isinstance(value, bool):
            return value
        raise Unconvertible
    if isinstance(hint, type) and hint in _SCALARS:
        # bool is an int subclass in Python, but TOML's true is no number.
        if isinstance(value, _SCALARS[hint]) and (hint is bool or not isinstance(value, bool)):
            return float(value) if hint is float else value
        raise Unconvertible
    if is_callable_hint(hint):
        if resolve_callable is None or not isinstance(value, str):
            raise Unconvertible
        return resolve_callable(value, path, problems)
    if origin in (tuple, list, collections.abc.Sequence) or hint in (tuple, list, Sequence):
        if not isinstance(value, (list, tuple)):
            raise Unconvertible
        args = _args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise Unconvertible
            item_hints = args
        else:
            item_hints = (args[0] if args else Any,) * len(value)
        items = [convert(v, h, (*path, i), problems, resolve_callable=resolve_callable)
                 for i, (v, h) in enumerate(zip(value, item_hints))]
        return items if origin is list or hint is list else tuple(items)
    if origin in (dict, collections.abc.Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise Unconvertible
        args = _args(hint)
        if not args:
            return dict(value)
        return {k: convert(v, args[1], (*path, k), problems, resolve_callable=resolve_callable)
                for k, v in value.items()}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise Unconvertible
        return build_dataclass(hint, value, path, problems, resolve_callable=resolve_callable)
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise Unconvertible


def type_hints(obj: Any) -> dict[str, Any]:
    """`typing.get_type_hints`, falling back to the raw annotations (unresolvable ones accept anything)."""
    try:
        return typing.get_type_hints(obj)
    except Exception:  # a forward reference only importable under TYPE_CHECKING, for example
        return dict(getattr(obj, "__annotations__", {}))


def dataclass_fields(cls: type) -> dict[str, Any]:
    """The init fields of a dataclass with their resolved type hints."""
    hints = type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def required_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)
            if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def build_dataclass(cls: type, table: Mapping[str, Any], path: Path, problems: Problems, *,
                    resolve_callable=None, extra_keys: Iterable[str] = ()) -> Any:
    """An instance of dataclass `cls` from a TOML table, every problem reported at its path.

    Keys in `extra_keys` are allowed in `table` but not passed to `cls` (the caller uses them).
    Errors raised by the dataclass's own `__post_init__` checks are reported at `path`.
    """
    fields = dataclass_fields(cls)
    extra = set(extra_keys)
    check_keys(table, [*fields, *extra], path, problems)
    required = required_fields(cls)
    values, failed = {}, set()
    for name, value in table.items():
        if name in fields:
            before = len(problems)
            values[name] = convert(value, fields[name], (*path, name), problems, resolve_callable=resolve_callable)
            if len(problems) > before:
                failed.add(name)
    for name in required:
        if name not in table:
            problems.add((*path, name), f"is required ({describe_hint(fields[name])}) but missing")
            failed.add(name)
    if failed & set(required):
        return None
    # Fields that failed fall back to their defaults, so the class's own range checks still run
    # on the rest and their problems are reported in the same pass.
    try:
        instance = cls(**{k: v for k, v in values.items() if k not in failed})
    except FieldError as exc:
        if exc.field not in failed:  # else a consequence of the failed value's default, already reported
            problems.add((*path, exc.field), str(exc))
        return None
    except (TypeError, ValueError, KeyError) as exc:
        # Config classes word their errors as "<Class>.<field> must ..."; point at that field.
        named = re.search(rf"\b{re.escape(cls.__name__)}\.(\w+)", str(exc))
        where = (*path, named.group(1)) if named and named.group(1) in fields else path
        problems.add(where, f"is rejected by {cls.__name__}: {exc}")
        return None
    return None if failed else instance
