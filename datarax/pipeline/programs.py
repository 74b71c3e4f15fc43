"""The process-wide cache of compiled programs, so a rebuilt pipeline does not compile again.

A pipeline's jitted programs take the stage variables as arguments, so their code depends only on
what `nnx.split` puts in the graph definition (module types, configs, user functions, variable
types and metadata) and on the pipeline's layout (batch size, shapes, sampler, sharding). Two
pipelines that agree on all of that share the same `jax.jit` objects, and with them JAX's traces and
executables; each still passes its own variable values.

A wrong hit would run another pipeline's program without a word, so keys are built by `exact`,
stricter than `==`, which calls `1`, `1.0` and `True` equal and `0.0` equal to `-0.0`, though each
traces to different code (an int constant keeps an integer input integral, a float one promotes
it). Plain immutable data (numbers, strings, tuples, frozen dataclasses such as operator configs)
is compared by type and value; functions by identity, as `jax.jit` keys the function it traces (a
function reading a global that changes later keeps the value of its first trace, in every
pipeline that shares it); anything else (a list, a dict, an array, an object with state of its
own) could change after it was keyed, so a pipeline holding one shares nothing (`Unshared`) and
compiles its own programs, as every pipeline used to.

The cache keeps `PROGRAM_CACHE_SIZE` entries, least recently used out first. An entry holds a
graph definition (with the configs and user functions in it) and its compiled code, never a
pipeline's modules, variable values or source arrays.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import threading
import types
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np
from flax.typing import HashableMapping

from datarax.samplers.base import Sampler

PROGRAM_CACHE_SIZE = 64


class Same:
    """A key part equal only to the same object (held, so its id is never reused while keyed)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return type(other) is Same and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"Same({self.obj!r:.80})"


class Unshared(Exception):
    """Raised by `exact` for a value no key may stand for: the program is built for its pipeline alone."""


_SCALARS = (type(None), bool, int, str, bytes)
_SINGLETONS = (types.FunctionType, types.BuiltinFunctionType, enum.Enum, type(Ellipsis))


def exact(value: Any, unknown: Callable[[Any], Hashable] | None = None) -> Hashable:
    """A hashable key of `value` that equals another's only when both trace to the same code.

    Raises `Unshared` for a value that may change after it is keyed (see the module docstring), or
    keys it by `unknown(value)` when given (`Same`, for a key one owner keeps for itself).

    >>> exact(1) == exact(1.0), exact(0.0) == exact(-0.0), exact((1, "a")) == exact((1, "a"))
    (False, False, True)
    """
    t = type(value)
    if t in _SCALARS:
        return t, value
    if t in (float, complex):
        return t, repr(value)  # tells -0.0 from 0.0; every NaN alike
    if isinstance(value, type):
        return value
    if t is tuple or (isinstance(value, tuple) and hasattr(t, "_fields")):  # a tuple or a NamedTuple
        return t, tuple(exact(v, unknown) for v in value)
    if t is frozenset:
        return t, frozenset(exact(v, unknown) for v in value)
    if t is HashableMapping:  # flax's immutable mapping (module attribute tables, variable metadata)
        return t, tuple(sorted(((exact(k, unknown), exact(v, unknown)) for k, v in value.items()), key=repr))
    if dataclasses.is_dataclass(value) and t.__dataclass_params__.frozen:
        return t, tuple((f.name, exact(getattr(value, f.name), unknown)) for f in dataclasses.fields(value))
    if isinstance(value, np.dtype):
        return t, value.name, value.str
    if isinstance(value, np.generic):
        return t, value.dtype.name, value.tobytes()
    if isinstance(value, jax.tree_util.PyTreeDef):
        data = value.node_data()
        return (t, None if data is None else (data[0], exact(data[1], unknown)),
                tuple(exact(c, unknown) for c in value.children()))
    if isinstance(value, _SINGLETONS):
        return Same(value)
    if isinstance(value, types.MethodType):  # made afresh on every attribute access; reads its object
        return t, exact(value.__self__, unknown), Same(value.__func__)
    if isinstance(value, functools.partial):
        return (t, exact(value.func, unknown), exact(value.args, unknown),
                exact(tuple(sorted(value.keywords.items())), unknown))
    if callable(value) and t.__module__.split(".")[0] in ("jax", "jaxlib"):  # jitted, custom_jvp, jnp ufuncs
        return Same(value)
    if unknown is not None:
        return unknown(value)
    raise Unshared(f"{t.__qualname__} values are keyed by nothing")


def graph_key(graphdef: Any, unknown: Callable[[Any], Hashable] | None = None) -> Hashable:
    """`exact` of an NNX graph definition: its nodes and attributes, in order."""
    return tuple(exact(n, unknown) for n in graphdef.nodes), tuple(exact(a, unknown) for a in graphdef.attributes)


def _defined_by(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in vars(c))


def sampler_key(sampler: Sampler | None) -> Hashable:
    """What a sampler's device code (`device_order`, `device_expand`) depends on.

    A sampler without `device_params` never runs on the device, so any such sampler will do
    (None). The others are keyed by their class and `device_structure()`, trusted only where the
    class that says what the device code reads (`device_structure`, else `structure`) is the
    class that defines that code or one below it: a subclass that changes the code and not the
    description shares with no other sampler (`Unshared`).
    """
    cls = type(sampler)
    if sampler is None or cls.device_params is Sampler.device_params:
        return None
    describer = _defined_by(cls, "device_structure")
    if describer is Sampler:
        describer = _defined_by(cls, "structure")
    for name in ("device_order", "device_expand"):
        if not issubclass(describer, _defined_by(cls, name)):
            raise Unshared(f"{cls.__qualname__}.{name} is not described by {describer.__qualname__}")
    return cls, exact(sampler.device_structure())


class ProgramCache:
    """A bounded least-recently-used map from `exact` keys to built programs; thread-safe.

    `maxsize` 0 keeps nothing: every pipeline builds (and compiles) its own programs.
    """

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.hits = self.misses = self.unshared = 0
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Callable[[], Hashable], build: Callable[[], Any]) -> Any:
        """The entry for `key()`, built by `build()` (which must not compile anything) when absent;
        `build()` alone, kept nowhere, when `key()` raises `Unshared`."""
        try:
            k = (jax.default_backend(), key())  # the backend picks operators' formulations when traced
        except Unshared:
            self.unshared += 1
            return build()
        with self._lock:
            if k in self._entries:
                self._entries.move_to_end(k)
                self.hits += 1
                return self._entries[k]
            self.misses += 1
            value = build()
            if self.maxsize > 0:
                self._entries[k] = value
                while len(self._entries) > self.maxsize:
                    self._entries.popitem(last=False)
            return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


PROGRAMS = ProgramCache(PROGRAM_CACHE_SIZE)
