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

The cache keeps `PROGRAM_CACHE_SIZE` entries, least recently used out first. An entry never holds
a pipeline's modules, variable values or arrays, nor its user functions: a key holds functions
weakly (`Same`), an entry is dropped once one of them is gone (a `lambda` made for one pipeline
lives and dies with it, and with it any array it closed over and JAX baked into the programs),
and the programs trace with the graph definition of a live pipeline using them (`Owners`).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import threading
import types
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np
from flax.typing import HashableMapping

from datarax.core.errors import DataraxError
from datarax.operators.lowering import batched_here
from datarax.samplers.base import Sampler

PROGRAM_CACHE_SIZE = 64


class Same:
    """A key part equal only to the same live object, held weakly where it can be (builtins and
    singletons that cannot are immortal anyway), so a key never keeps a user's function alive."""

    __slots__ = ("_id", "_ref")

    def __init__(self, obj: Any):
        self._id = id(obj)
        try:
            self._ref = weakref.ref(obj)
        except TypeError:
            self._ref = lambda: obj

    @property
    def obj(self) -> Any:
        """The object, or None once it is gone."""
        return self._ref()

    @property
    def weak(self) -> bool:
        """Whether the object is held weakly."""
        return isinstance(self._ref, weakref.ref)

    def __eq__(self, other: object) -> bool:
        mine = self._ref()
        return type(other) is Same and hash(other) == self._id and mine is not None and other.obj is mine

    def __hash__(self) -> int:
        return self._id

    def __repr__(self) -> str:
        return f"Same({self.obj!r:.80})"


def held_weakly(key: Any) -> list:
    """The live objects a key's `Same` parts hold weakly."""
    if isinstance(key, Same):
        obj = key.obj
        return [obj] if key.weak and obj is not None else []
    if isinstance(key, (tuple, frozenset)):
        return [obj for part in key for obj in held_weakly(part)]
    return []


class Owners:
    """The live users of shared programs, each holding what the programs trace with (a graph
    definition, a step function). The programs hold these only through their users, so a dropped
    pipeline's user functions are not kept alive by programs another pipeline shares; every user
    is interchangeable (their keys are equal), and the one calling is always among them."""

    def __init__(self):
        self._owners: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()  # a pipeline built on one thread while another traces

    def add(self, owner: Any) -> None:
        with self._lock:
            self._owners.add(owner)

    def any(self) -> Any:
        with self._lock:
            for owner in self._owners:
                return owner
        raise RuntimeError("these shared programs were called with no live pipeline using them; call them "
                           "through a pipeline's `compiled` (or a ScanRunner) that is still referenced")


class Unshared(DataraxError):
    """Raised by `exact` for a value no key may stand for: the program is built for its pipeline alone
    (caught inside datarax; it never reaches a user)."""


_SCALARS = (type(None), bool, int, str, bytes)
_BY_IDENTITY = (types.FunctionType, types.BuiltinFunctionType, enum.Enum, type(Ellipsis))


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
    if isinstance(value, _BY_IDENTITY):
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

    `maxsize` 0 keeps nothing: every pipeline builds (and compiles) its own programs. An entry is
    dropped once an object its key holds weakly is gone (no key can equal its key again): at
    once, or at the next lookup when the cache is busy then.
    """

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.hits = self.misses = self.unshared = 0
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._finalizers: dict = {}
        self._dead: list = []  # keys whose entries a finalizer could not drop at once
        self._lock = threading.Lock()

    def get(self, key: Callable[[], Hashable], build: Callable[[], Any]) -> Any:
        """The entry for `key()`, built by `build()` (which must not compile anything) when absent;
        `build()` alone, kept nowhere, when `key()` raises `Unshared`."""
        try:
            # What a trace reads besides the key: the backend (precisions) and the operators'
            # formulation (`lowering.batched_here`, which a test or a GPU run may switch).
            k = (jax.default_backend(), batched_here(), key())
        except Unshared:
            self.unshared += 1
            return build()
        with self._lock:
            self._purge()
            if k in self._entries:
                self._entries.move_to_end(k)
                self.hits += 1
                return self._entries[k]
            self.misses += 1
            value = build()
            if self.maxsize > 0:
                self._entries[k] = value
                self._finalizers[k] = [weakref.finalize(obj, self._gone, k) for obj in held_weakly(k)]
                while len(self._entries) > self.maxsize:
                    self._forget(next(iter(self._entries)))
            return value

    def _gone(self, k: Hashable) -> None:
        # A finalizer runs wherever the object happens to die, maybe inside this cache's own
        # calls on this thread: it drops the entry only if it can take the lock without waiting.
        self._dead.append(k)
        if self._lock.acquire(blocking=False):
            try:
                self._purge()
            finally:
                self._lock.release()

    def _purge(self) -> None:
        while self._dead:
            self._forget(self._dead.pop())

    def _forget(self, k: Hashable) -> None:
        # Dictionaries find a key by identity before equality, so a key whose object is gone is
        # still found here (it equals nothing else).
        self._entries.pop(k, None)
        for finalizer in self._finalizers.pop(k, ()):
            finalizer.detach()

    def clear(self) -> None:
        with self._lock:
            for k in list(self._entries):
                self._forget(k)
            self._dead.clear()

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._entries)


PROGRAMS = ProgramCache(PROGRAM_CACHE_SIZE)
