"""Argument checks shared by every config and constructor in datarax.

Each checker takes the value and the name to show (`"GainConfig.gain_db"`, `"window"`), returns
the value (normalised where noted) and raises with a message that names the argument, shows
the value and says what to pass instead. Config dataclasses call them in `__post_init__`
through `field`, which pairs a field's value with its `Class.field` name:

    check_number(*field(self, "max_delta"), 0.0, 1.0)     # "BrightnessConfig.max_delta must be ..."

`bool` is a subclass of `int` in Python, so every int and number check here rejects True and
False explicitly: `batch_size=True` is a mistake, not a batch of one.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from datarax.core.errors import DataraxError

MAX_INT32 = 2**31 - 1  # the largest index, position or epoch an int32 (jax's default int) holds
MAX_SEED = 2**63 - 1
# What JAX keeps a 64-bit integer field in while `jax_enable_x64` is off (it wraps what does not fit).
_NARROWED = {"i": (np.dtype(np.int32), -(2**31), MAX_INT32), "u": (np.dtype(np.uint32), 0, 2**32 - 1)}
X64_FIX = ("turn 64-bit mode on before building the source (jax.config.update('jax_enable_x64', True), or "
           "JAX_ENABLE_X64=1 in the environment), which keeps the field int64")


def describe_value(value: Any) -> str:
    """A short description of a value for error messages: shape and dtype of arrays, else a clipped repr."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None:
        return f"{type(value).__name__}(shape={tuple(shape)}, dtype={dtype})"
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{type(value).__name__} {text}"


def field(config: Any, name: str) -> tuple[Any, str]:
    """`(config.<name>, "ConfigClass.<name>")`: a field's value and the name checkers show."""
    return getattr(config, name), f"{type(config).__name__}.{name}"


def set_field(config: Any, name: str, value: Any) -> None:
    """Stores a normalised value on a frozen dataclass (for use in its `__post_init__`)."""
    object.__setattr__(config, name, value)


def is_int(value: Any) -> bool:
    """True for Python and numpy integers, False for bools."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """True for finite ints and floats (Python or numpy), False for bools."""
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
            and math.isfinite(value))


def _or_none(allow_none: bool) -> str:
    return " or None" if allow_none else ""


def check_int(value: Any, name: str, low: int | None = None, *, high: int | None = None, allow_none: bool = False,
              why: str = "", hint: str = "") -> int | None:
    """An int in `[low, high]` (either end may be open-ended), or None when `allow_none`.

    The message reads "must be an int >= low", "an int in [low, high]" or "an int", then `why`
    (e.g. " (labels are mixed as one-hot vectors)"), the value, and `hint` (e.g. "; e.g. num_classes=10").
    """
    if value is None and allow_none:
        return None
    if low is not None and high is not None:
        expected = f"an int in [{low}, {high}]"
    elif low is not None:
        expected = f"an int >= {low}"
    elif high is not None:
        expected = f"an int <= {high}"
    else:
        expected = "an int"
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {expected}{_or_none(allow_none)}{why}, got {value!r}{hint}")
    return int(value)


def check_positive_int(value: Any, name: str, *, allow_none: bool = False, unit: str = "") -> int | None:
    """An int >= 1 (or None when `allow_none`); `unit` names what it counts, e.g. "samples"."""
    if value is None and allow_none:
        return None
    if not is_int(value) or value < 1:
        unit = f" ({unit})" if unit else ""
        raise ValueError(f"{name} must be a positive int{unit}{_or_none(allow_none)}, got {value!r}")
    return int(value)


def check_number(value: Any, name: str, low: float = -math.inf, high: float = math.inf, *, open_low: bool = False,
                 allow_none: bool = False) -> float | None:
    """A finite number in `[low, high]` (`(low, high]` when `open_low`), or None when `allow_none`.

    Raises TypeError for a non-number, ValueError for a number out of range.
    """
    if value is None and allow_none:
        return None
    interval = f"{'(' if open_low else '['}{low}, {high}]"
    if not is_number(value):
        raise TypeError(f"{name} must be a number in {interval}{_or_none(allow_none)}, got {value!r}")
    if value > high or value < low or (open_low and value == low):
        raise ValueError(f"{name} must be in {interval}, got {value!r}; pick a value in that range")
    return float(value)


def check_seed(value: Any, name: str = "seed", *, allow_none: bool = False) -> int | None:
    """A seed: an int in [0, 2**63 - 1] (or None when `allow_none`). TypeError for a non-int."""
    if value is None and allow_none:
        return None
    if not is_int(value):
        raise TypeError(f"{name} must be an int in [0, 2**63 - 1], got {value!r} ({type(value).__name__})")
    if not 0 <= value <= MAX_SEED:
        raise ValueError(f"{name} must be in [0, 2**63 - 1], got {value}; pick a non-negative seed below 2**63")
    return int(value)


def check_probability(value: Any, name: str) -> float:
    """A number in [0, 1]."""
    if not is_number(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def check_bool(value: Any, name: str, *, allow_none: bool = False) -> bool | None:
    """True or False (or None when `allow_none`); 0, 1 and "yes" are refused."""
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be {'None, ' if allow_none else ''}True or False, got {value!r}")
    return value


def check_choice(value: Any, name: str, choices: Sequence[Any]) -> Any:
    """One of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_field_name(value: Any, name: str, *, allow_none: bool = False) -> str | None:
    """A data field name: a non-empty str (or None when `allow_none`)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty field name{_or_none(allow_none)}, got {value!r}")
    return value


def check_numbers(value: Any, name: str, what: str = "a tuple of numbers") -> tuple[float, ...]:
    """A non-empty tuple (or list, or one number) of finite numbers, returned as a tuple of floats."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not values or not all(is_number(v) for v in values):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return tuple(float(v) for v in values)


def check_size(value: Any, name: str) -> tuple[int, int]:
    """An image size: one positive int (a square) or a (height, width) pair, returned as a pair."""
    size = (value, value) if is_int(value) else value
    if isinstance(size, list):
        size = tuple(size)
    if not isinstance(size, tuple) or len(size) != 2 or not all(is_int(s) and s > 0 for s in size):
        raise ValueError(f"{name} must be a positive int or a (height, width) pair of positive ints, got {value!r}")
    return (int(size[0]), int(size[1]))


def check_range(value: Any, name: str, low: float, high: float) -> tuple[float, float]:
    """A pair `(a, b)` of numbers with `low < a <= b <= high`, returned as floats."""
    pair = tuple(value) if isinstance(value, (tuple, list)) else None
    if (pair is None or len(pair) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in pair)
            or not low < pair[0] <= pair[1] <= high):
        raise ValueError(f"{name} must be a pair (a, b) with {low} < a <= b <= {high}, got {value!r}")
    return (float(pair[0]), float(pair[1]))


def require_stochastic(config: Any, reason: str = "has nothing to do: this operator only exists to draw random "
                                                  "parameters per record") -> None:
    """For operators that only exist to draw random parameters per record (noise, crops, masks)."""
    if not config.stochastic:
        raise ValueError(f"{type(config).__name__}(stochastic=False) {reason}; leave stochastic=True")


def require_deterministic(config: Any, reason: str) -> None:
    """For operators that draw nothing; `reason` says why, e.g. "PCEN draws nothing"."""
    if config.stochastic:
        raise ValueError(f"{type(config).__name__}(stochastic=True): {reason}; leave stochastic=False")


class IntegerRangeError(DataraxError, ValueError):
    """A 64-bit integer field holds a value that JAX, without 64-bit mode, would wrap into 32 bits."""


def x64_enabled() -> bool:
    """Whether JAX keeps 64-bit integers (`jax_enable_x64`)."""
    import jax

    return bool(jax.config.jax_enable_x64)


def narrowed_dtype(dtype: Any) -> np.dtype | None:
    """The 32-bit dtype JAX turns a 64-bit integer dtype into while 64-bit mode is off; None when
    JAX keeps `dtype` as it is."""
    dtype = np.dtype(dtype)
    if dtype.kind not in _NARROWED or dtype.itemsize != 8 or x64_enabled():
        return None
    return _NARROWED[dtype.kind][0]


def check_int_range(values: Any, owner: str, name: str, *, fix: str,
                    where: Callable[[int], str] | None = None) -> None:
    """Refuses a 64-bit integer array holding a value outside the 32 bits JAX would keep it in.

    Without `jax_enable_x64` JAX stores int64 as int32 (uint64 as uint32) and wraps what does not
    fit: an id of 2**40 becomes 0, silently. Values that fit pass (they become 32-bit exactly), and
    nothing is checked under 64-bit mode, where the field stays 64-bit. The message names `owner`,
    the field `name`, the value, the record (`where(row)`, row along the first axis) and two fixes:
    64-bit mode, or `fix` (the owner's own way to cast or leave the field out).
    """
    arr = np.asarray(values)
    narrow = narrowed_dtype(arr.dtype)
    if narrow is None or arr.size == 0:
        return
    _, low, high = _NARROWED[arr.dtype.kind]
    if arr.min() >= low and arr.max() <= high:
        return
    flat = arr.reshape(-1)
    first = int(np.flatnonzero((flat < low) | (flat > high))[0])
    value = flat[first]
    row = first // max(1, flat.size // max(1, len(arr))) if arr.ndim else 0
    at = f" ({where(row)})" if where is not None else ""
    raise IntegerRangeError(
        f"{owner} field {name!r} holds {int(value)}{at}, outside {narrow} ({low} to {high}): without 64-bit mode JAX "
        f"keeps {arr.dtype} as {narrow} and would silently wrap it to {int(value.astype(narrow))}. Fix: {X64_FIX}; "
        f"or {fix}")


def require(module: str, *, owner: str, extra: str, package: str | None = None) -> Any:
    """Imports an optional dependency, or fails naming the owner, the package and the pip extra:
    "HFSource needs the `datasets` package: pip install 'datarax[data]'"."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{owner} needs the `{package or module.split('.')[0]}` package: "
                          f"pip install 'datarax[{extra}]'") from exc
