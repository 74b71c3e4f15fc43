"""Validating one component table (a source, a stage, a DAG node, a sampler, a callback).

A component is a table with one key naming what to build, whose value holds its parameters:

    [[stages]]
    brightness = { max_delta = 0.3, rngs = 7 }

The name is a registered name (see `datarax.config.registry`) or an import path
(`"mypkg.ops:MyOperator"`) into a module the user allowed (`datarax.config.allow`); a class named
by import path must be of the table's kind (an operator class for a stage), checked before it
is called. Parameters are the fields of the class's config dataclass plus the
keyword parameters of its constructor, each checked against its type hint:

* a `Callable` parameter takes an import path (`fn = "mypkg.transforms:augment"`);
* an operator parameter (`operator`, `operators`, `branches`) takes nested component tables;
* a source's `data` takes an import path (a function returning a dict of arrays, or the dict
  itself), a `.npz` file, or a table `{field = "file.npy"}`; files are read with
  `allow_pickle=False`;
* `rngs = N` seeds the component's `nnx.Rngs(N)` (when its constructor takes `rngs`).

Validation imports the allowed modules the table names but constructs nothing;
`ComponentSpec.build()` does.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import os
import types
import typing
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.config import registry
from datarax.config.allow import AllowList, NotAllowedError
from datarax.config.schema import (ConfigError, Path, Problems, build_dataclass, check_keys, convert, format_path,
                                   is_table, suggestion, type_hints, type_name)

RNGS_KEY = "rngs"
DATA_HELP = ("an import path 'package.module:function' (returning a dict of arrays), a .npz file, or a table "
             "of field = \"file.npy\"")


@dataclasses.dataclass
class Context:
    """What validation needs besides the table: where problems go, where files are looked up
    and which modules import paths may name."""

    problems: Problems
    base_dir: str
    seed: int = 0
    top_level: tuple[str, ...] = ()
    allow: AllowList = dataclasses.field(default_factory=AllowList)

    @property
    def search_dirs(self) -> list[str]:
        return list(dict.fromkeys([os.path.abspath(self.base_dir), os.getcwd()]))

    def resolve_import(self, value: str, path: Path, problems: Problems | None = None) -> Any:
        """The object an allowed import path names, or None after reporting why it cannot be had."""
        return resolve_import(value, path, self.problems if problems is None else problems, self.search_dirs,
                              self.allow)

    def resolve_callable(self, value: str, path: Path, problems: Problems) -> Any:
        obj = self.resolve_import(value, path, problems)
        if obj is not None and not callable(obj):
            problems.add(path, f"names {value!r}, which is {type_name(obj)} ({type(obj).__name__}), not a callable")
            return None
        return obj

    def path_of(self, name: str) -> str:
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(name)))


def resolve_import(value: str, path: Path, problems: Problems, search_dirs: Sequence[str],
                   allow: AllowList) -> Any:
    """The object an import path names, or None after reporting why it cannot be had."""
    try:
        return registry.import_object(value, search_dirs, allow)
    except NotAllowedError as exc:
        problems.add(path, str(exc))
    except (ImportError, AttributeError, ValueError) as exc:
        problems.add(path, f"names {value!r}, which cannot be imported: {exc}")
    except Exception as exc:  # the module raised while importing; show what, keep validating
        problems.add(path, f"names {value!r}, whose module raised {type(exc).__name__} on import: {exc}")
    return None


@dataclasses.dataclass
class DataSpec:
    """Where a source's arrays come from (see the module docstring)."""

    path: Path
    kind: str  # "import" (a callable or a mapping), "npz" (a path) or "npy" ({field: path})
    target: Any

    def load(self) -> Mapping[str, Any]:
        """The arrays; an unreadable file raises `ConfigError` naming it and its TOML key."""
        if self.kind == "npz":
            return read_array_file(self.target, self.path, lambda f: {k: f[k] for k in f.files})
        if self.kind == "npy":
            return {k: read_array_file(p, (*self.path, k)) for k, p in self.target.items()}
        data = self.target() if callable(self.target) else self.target
        if not isinstance(data, Mapping):
            raise TypeError(f"{format_path(self.path)} must give a dict of arrays, but its callable returned "
                            f"{type(data).__name__}; return {{'field': array, ...}}")
        return data


def read_array_file(file: str, path: Path, take: Callable[[Any], Any] | None = None) -> Any:
    """`np.load(file, allow_pickle=False)` (then `take(archive)` for a .npz, closed after), or a
    `ConfigError` naming the TOML key at `path` and the file when it cannot be read."""
    kind = "a .npz archive" if take is not None else "a .npy array"
    where = f"{format_path(path)} names {os.path.basename(file)!r} ({file}), which"
    if os.path.getsize(file) == 0:
        raise ConfigError([f"{where} is empty (0 bytes); write it again with np.save/np.savez"])
    try:
        loaded = np.load(file, allow_pickle=False)
        if take is None:
            return loaded
        with loaded:
            return take(loaded)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        # allow_pickle=False refuses anything that is not an array file, as "pickled data".
        reason = "numpy could only read it by unpickling, which a configuration never does" \
            if "pickle" in str(exc) else f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        writer = "np.savez" if take is not None else "np.save"
        raise ConfigError([f"{where} cannot be read as {kind}: {reason}; check that it is the file {writer} wrote"]) \
            from exc


@dataclasses.dataclass
class ComponentSpec:
    """A validated component: what to construct, with what, and its default randomness."""

    path: Path
    name: str
    factory: Any
    config: Any
    kwargs: dict[str, Any]
    rngs: int | None
    takes_rngs: bool
    seed: int = 0

    def make_rngs(self) -> nnx.Rngs:
        """`nnx.Rngs(rngs)` when set, else keyed by the config seed and this component's TOML path."""
        if self.rngs is not None:
            return nnx.Rngs(self.rngs)
        where = zlib.crc32(format_path(self.path).encode())
        return nnx.Rngs(jax.random.fold_in(jax.random.key(self.seed), where))

    def build(self, **extra: Any) -> Any:
        """Constructs the component (nested components and data first)."""
        kwargs = {k: _build_value(v) for k, v in self.kwargs.items()}
        kwargs.update(extra)
        if self.config is not None:
            kwargs["config"] = self.config
        if self.takes_rngs:
            kwargs["rngs"] = self.make_rngs()
        return self.factory(**kwargs)


def _build_value(value: Any) -> Any:
    if isinstance(value, ComponentSpec):
        return value.build()
    if isinstance(value, DataSpec):
        return value.load()
    if isinstance(value, list) and value and all(isinstance(v, ComponentSpec) for v in value):
        return [v.build() for v in value]
    return value


def _kind_of(cls: Any) -> str | None:
    """The component kind a parameter of class `cls` takes (None: not a module)."""
    if not isinstance(cls, type) or not issubclass(cls, nnx.Module):
        return None
    from datarax.core.source import DataSourceModule
    from datarax.samplers.base import Sampler

    if issubclass(cls, DataSourceModule):
        return "source"
    return "sampler" if issubclass(cls, Sampler) else "operator"


def module_hint(hint: Any) -> tuple[str, str] | None:
    """("one" | "many", kind) for a parameter holding module(s), else None."""
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for arm in arms:
        if _kind_of(arm):
            return "one", _kind_of(arm)
        args = typing.get_args(arm)
        if typing.get_origin(arm) in (list, tuple, collections.abc.Sequence) and args and _kind_of(args[0]):
            return "many", _kind_of(args[0])
    return None


def _signature(factory: Any) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    target = factory.__init__ if isinstance(factory, type) else factory
    try:
        params = dict(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return {}, {}
    params.pop("self", None)
    return params, type_hints(target)


def _lookup(kind: str, name: str, path: Path, ctx: Context) -> tuple[Any, type | None] | None:
    if registry.is_import_path(name):
        obj = ctx.resolve_import(name, path)
        if obj is None:
            return None
        if not registry.is_of_kind(obj, kind):
            what = f"the class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
            base = registry.KINDS[kind].base.replace(":", ".") if kind in registry.KINDS else f"a {kind} base class"
            article = "an" if kind[0] in "aeiou" else "a"
            ctx.problems.add(path, f"names {name!r}, which is {what}, not {article} {kind} class; it was not called. "
                                   f"{article.capitalize()} {kind} named by import path must be a class deriving from "
                                   f"{base}")
            return None
        return obj, registry.config_class_of(obj)
    entries, ambiguous, failed = registry.discover(kind)
    if name in entries:
        return entries[name].cls, entries[name].config_cls
    if name in ambiguous:
        ctx.problems.add(path, f"is ambiguous: several built-in {kind}s are called {name!r} "
                               f"({', '.join(ambiguous[name])}); name one by import path instead")
        return None
    hint = suggestion(name, entries)
    broken = f"; modules that failed to import: {', '.join(m for m, _ in failed)}" if failed else ""
    ctx.problems.add(path, f"is not a known {kind}{hint} (built-in {kind}s: {', '.join(sorted(entries))}; "
                           f"or name one by import path 'package.module:Class'){broken}")
    return None


def _misplaced(keys: Sequence[str], path: Path, ctx: Context) -> list[str]:
    """Reports (and returns) the top-level keys among `keys`, which sit in the table at `path`.

    A top-level key written after a [table] header lands in that table: the commonest TOML slip.
    """
    found = [k for k in keys if k in ctx.top_level]
    for key in found:
        ctx.problems.add((*path, key), f"is a top-level key, but it sits in the [{format_path(path)}] table; move it "
                                       "above the first [table] header of the file")
    return found


def component(table: Any, kind: str, path: Path, ctx: Context, *, extra_keys: Sequence[str] = (),
              filled: Sequence[str] = ()) -> ComponentSpec | None:
    """Validates a one-key component table of `kind` at `path`.

    `extra_keys` may sit beside the component key (a DAG node's `inputs`); `filled` are
    constructor parameters the builder supplies itself (a sampler's `num_records`).
    """
    problems = ctx.problems
    example = {"operator": "brightness = { max_delta = 0.2 }", "source": "memory = { data = \"pkg.mod:fn\" }",
               "sampler": "shuffle = { seed = 0 }"}.get(kind, "name = { ... }")
    if not is_table(table):
        problems.add(path, f"must be a table naming one {kind}, e.g. {example}; got {table!r}")
        return None
    misplaced = _misplaced([k for k in table if k not in extra_keys and not is_table(table[k])], path, ctx)
    keys = [k for k in table if k not in extra_keys and k not in misplaced]
    if len(keys) != 1:
        got = f"keys {keys}" if keys else "no key"
        problems.add(path, f"must name exactly one {kind} (a table with one key, e.g. {example}), got {got}")
        return None
    name = keys[0]
    params = table[name]
    here = (*path, name)
    if not is_table(params):
        problems.add(here, f"must be a table of parameters (use {{}} for none), got {params!r}")
        return None
    found = _lookup(kind, name, here, ctx)
    if found is None:
        return None
    factory, config_cls = found
    signature, hints = _signature(factory)
    if "config" not in signature:
        config_cls = None
    takes_rngs = RNGS_KEY in signature
    ctor = {n: p for n, p in signature.items()
            if n not in ("config", RNGS_KEY, *filled) and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    config_fields = [f.name for f in dataclasses.fields(config_cls) if f.init] if config_cls else []
    known = [*config_fields, *ctor, *([RNGS_KEY] if takes_rngs else [])]
    misplaced = _misplaced([k for k in params if k not in known], here, ctx)
    check_keys({k: v for k, v in params.items() if k not in misplaced}, known, here, problems,
               what=f"parameter of {name!r}")
    kwargs: dict[str, Any] = {}
    for pname, param in ctor.items():
        if pname in config_fields:
            continue
        if pname not in params:
            if param.default is inspect.Parameter.empty:
                problems.add((*here, pname), f"is required by {name!r} but missing")
            continue
        kwargs[pname] = _parameter(params[pname], pname, hints.get(pname, Any), kind, (*here, pname), ctx)
    rngs = None
    if takes_rngs and RNGS_KEY in params:
        rngs = convert(params[RNGS_KEY], int, (*here, RNGS_KEY), problems)
    config = None
    if config_cls is not None:
        config_table = {k: v for k, v in params.items() if k in config_fields}
        config = build_dataclass(config_cls, config_table, here, problems, resolve_callable=ctx.resolve_callable)
    return ComponentSpec(here, name, factory, config, kwargs, rngs, takes_rngs, ctx.seed)


def _parameter(value: Any, name: str, hint: Any, kind: str, path: Path, ctx: Context) -> Any:
    nested = module_hint(hint)
    if nested is not None and nested[0] == "one":
        return component(value, nested[1], path, ctx)
    if nested is not None:
        if not isinstance(value, list):
            ctx.problems.add(path, f"must be an array of {nested[1]} tables, got {value!r}")
            return None
        return [component(v, nested[1], (*path, i), ctx) for i, v in enumerate(value)]
    if kind == "source" and name == "data":
        return data_spec(value, path, ctx)
    return convert(value, hint, path, ctx.problems, resolve_callable=ctx.resolve_callable)


def data_spec(value: Any, path: Path, ctx: Context) -> DataSpec | None:
    """A source's `data`: an import path, a .npz file, or a table of .npy files."""
    problems = ctx.problems
    if isinstance(value, str) and registry.is_import_path(value) and not value.endswith((".npz", ".npy")):
        target = ctx.resolve_import(value, path)
        if target is None:
            return None
        if not (callable(target) or isinstance(target, Mapping)):
            problems.add(path, f"names {value!r}, which is {type(target).__name__}; name a function returning a "
                               "dict of arrays (or the dict itself)")
            return None
        return DataSpec(path, "import", target)
    if isinstance(value, str):
        if value.endswith(".npy"):
            problems.add(path, f"names one array file {value!r}; a source needs named fields: write "
                               f"data = {{ x = {value!r} }} or save them together in a .npz")
            return None
        if not value.endswith(".npz"):
            problems.add(path, f"must be {DATA_HELP}, got {value!r}")
            return None
        found = _existing(value, path, ctx)
        return DataSpec(path, "npz", found) if found else None
    if is_table(value):
        files = {}
        for field, file in value.items():
            if not isinstance(file, str) or not file.endswith(".npy"):
                problems.add((*path, field), f"must be the path of a .npy file, got {file!r}")
                continue
            found = _existing(file, (*path, field), ctx)
            if found:
                files[field] = found
        return DataSpec(path, "npy", files) if len(files) == len(value) and files else None
    problems.add(path, f"must be {DATA_HELP}, got {value!r}")
    return None


def _existing(name: str, path: Path, ctx: Context) -> str | None:
    full = ctx.path_of(name)
    if not os.path.isfile(full):
        ctx.problems.add(path, f"names {name!r}, which does not exist (looked for {full}; relative paths are "
                               "relative to the config file)")
        return None
    return full
