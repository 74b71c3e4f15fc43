"""Validating one component table (a source, a stage, a DAG node, a sampler, a callback).

A component is a table with one key naming a registered name or an allowed import path, whose value
holds its parameters: the config dataclass's fields plus the constructor's keyword parameters, each
checked against its type hint. Validation constructs nothing; `ComponentSpec.build()` does.
docs/config.md ("How a component is written") has the rules.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import os
import types
import typing
import zlib
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from datarax.config import files, registry
from datarax.config.allow import AllowList, NotAllowedError
from datarax.config.schema import (
    Path,
    Problems,
    build_dataclass,
    check_keys,
    convert,
    format_path,
    is_table,
    suggestion,
    type_hints,
    type_name,
)

RNGS_KEY = "rngs"
# A `[[stages]]` table names one of these kinds: host stages run first, on the background reader.
STAGE_KINDS = ("host_stage", "operator")
BUILT_IN_KINDS = ("operator", "source", "host_stage", "sampler")


@dataclasses.dataclass
class Context:
    """What validation needs besides the table: where problems go, where files are looked up
    and which modules import paths may name."""

    problems: Problems
    base_dir: str
    seed: int = 0
    top_level: tuple[str, ...] = ()
    allow: AllowList = dataclasses.field(default_factory=AllowList)
    root: dict[str, Any] = dataclasses.field(default_factory=dict)  # the whole loaded configuration
    pipeline_only: bool = False  # tables of packages not loaded (e.g. [trainer]) are not validated

    @property
    def search_dirs(self) -> list[str]:
        return list(dict.fromkeys([os.path.abspath(self.base_dir), os.getcwd()]))

    def resolve_import(self, value: str, path: Path, problems: Problems | None = None) -> Any:
        """The object an allowed import path names, or None after reporting why it cannot be had."""
        problems = self.problems if problems is None else problems
        try:
            return registry.import_object(value, self.search_dirs, self.allow)
        except NotAllowedError as exc:
            problems.add(path, str(exc))
        except (ImportError, AttributeError, ValueError) as exc:
            problems.add(path, f"names {value!r}, which cannot be imported: {exc}")
        except Exception as exc:  # the module raised while importing; show what, keep validating
            problems.add(path, f"names {value!r}, whose module raised {type(exc).__name__} on import: {exc}")
        return None

    def resolve_callable(self, value: str, path: Path, problems: Problems) -> Any:
        obj = self.resolve_import(value, path, problems)
        if obj is not None and not callable(obj):
            problems.add(path, f"names {value!r}, which is {type_name(obj)} ({type(obj).__name__}), not a callable")
            return None
        return obj

    def path_of(self, name: str) -> str:
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(name)))


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
    kind: str = "operator"

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
    if isinstance(value, files.Deferred):
        return value.load()
    if isinstance(value, list) and value and all(isinstance(v, ComponentSpec) for v in value):
        return [v.build() for v in value]
    return value


def _kind_of(cls: Any) -> str | None:
    """The component kind a parameter of class `cls` takes (None: not a component)."""
    if not isinstance(cls, type):
        return None
    from datarax.core.source import DataSourceModule
    from datarax.host.stage import HostStage
    from datarax.samplers.base import Sampler
    from datarax.sources.stream import StreamSourceModule

    if issubclass(cls, (DataSourceModule, StreamSourceModule)):
        return "source"
    if issubclass(cls, HostStage):
        return "host_stage"
    if not issubclass(cls, nnx.Module):
        # A kind registered from above this layer (the training kit's metric writers).
        return next((k for k in registry.KINDS if k not in BUILT_IN_KINDS and registry.is_of_kind(cls, k)), None)
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


def parameters_of(factory: Any) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    """A class's constructor (or a function's) parameters and type hints; ({}, {}) without a signature."""
    target = factory.__init__ if isinstance(factory, type) else factory
    try:
        params = dict(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return {}, {}
    params.pop("self", None)
    return params, type_hints(target)


def _lookup(kinds: Sequence[str], name: str, path: Path, ctx: Context) -> tuple[Any, type | None, str] | None:
    """`(class, its config dataclass, its kind)` for a registered name or an import path of `kinds`."""
    what = "stage" if tuple(kinds) == STAGE_KINDS else kinds[0].replace("_", " ")
    if registry.is_import_path(name):
        obj = ctx.resolve_import(name, path)
        if obj is None:
            return None
        kind = next((k for k in kinds if registry.is_of_kind(obj, k)), None)
        if kind is None:
            found = f"the class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
            bases = " or ".join(b.replace(":", ".") for k in kinds if k in registry.KINDS
                                for b in registry.KINDS[k].bases) or f"a {what} base class"
            article = "an" if what[0] in "aeiou" else "a"
            ctx.problems.add(path, f"names {name!r}, which is {found}, not {article} {what} class; it was not called. "
                                   f"{article.capitalize()} {what} named by import path must be a class deriving from "
                                   f"{bases}")
            return None
        return obj, registry.config_class_of(obj), kind
    listed, broken = [], []
    for kind in kinds:
        entries, ambiguous, failed = registry.discover(kind)
        if name in entries:
            return entries[name].cls, entries[name].config_cls, kind
        if name in ambiguous:
            ctx.problems.add(path, f"is ambiguous: several built-in {kind}s are called {name!r} "
                                   f"({', '.join(ambiguous[name])}); name one by import path instead")
            return None
        listed.append((kind, entries))
        broken.extend(m for m, _ in failed)
    hint = suggestion(name, [n for _, entries in listed for n in entries])
    known = "; ".join(f"built-in {kind.replace('_', ' ')}s: {', '.join(sorted(entries))}" for kind, entries in listed)
    failed_text = f"; modules that failed to import: {', '.join(broken)}" if broken else ""
    ctx.problems.add(path, f"is not a known {what}{hint} ({known}; or name one by import path "
                           f"'package.module:Class'){failed_text}")
    return None


def _misplaced(keys: Sequence[str], path: Path, ctx: Context) -> list[str]:
    """Reports (and returns) the top-level keys among `keys` that landed in the table at `path`."""
    found = [k for k in keys if k in ctx.top_level]
    for key in found:
        ctx.problems.add((*path, key), f"is a top-level key, but it sits in the [{format_path(path)}] table; move it "
                                       "above the first [table] header of the file")
    return found


# Constructor arguments that default to None but that the class cannot do without (as do those a
# class takes by position that are not config fields: `MemorySource(data)`, `MapOperator(fn)`).
REQUIRED = ("tokenizer",)
EXAMPLES = {"operator": "brightness = { max_delta = 0.2 }", "stage": "brightness = { max_delta = 0.2 }",
            "source": "memory = { data = \"pkg.mod:fn\" }", "sampler": "shuffle = { seed = 0 }"}


def component(table: Any, kind: str, path: Path, ctx: Context, *, extra_keys: Sequence[str] = (),
              filled: Sequence[str] = ()) -> ComponentSpec | None:
    """Validates a one-key component table of `kind` at `path`.

    `extra_keys` may sit beside the component key (a DAG node's `inputs`); `filled` are constructor
    parameters the builder supplies (a sampler's `num_records`).
    """
    problems = ctx.problems
    kinds = STAGE_KINDS if kind == "stage" else (kind,)
    example = EXAMPLES.get(kind, "name = { ... }")
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
    found = _lookup(kinds, name, here, ctx)
    if found is None:
        return None
    factory, config_cls, kind = found
    if kind == "source":
        params = files.resolve_paths(params, ctx)
    signature, hints = parameters_of(factory)
    if "config" not in signature:
        config_cls = None
    takes_rngs = RNGS_KEY in signature
    ctor = {n: p for n, p in signature.items()
            if n not in ("config", RNGS_KEY, *filled) and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    config_fields = [f.name for f in dataclasses.fields(config_cls) if f.init] if config_cls else []
    route = files.route_for(factory) if kind == "source" else None
    route_keys = ("files", *route.options) if route is not None else ()
    known = [*config_fields, *ctor, *route_keys, *([RNGS_KEY] if takes_rngs else [])]
    misplaced = _misplaced([k for k in params if k not in known], here, ctx)
    check_keys({k: v for k, v in params.items() if k not in misplaced}, known, here, problems,
               what=f"parameter of {name!r}")
    replaced: tuple[str, ...] = ()
    if route is not None and "files" in params:
        replaced = route.replaces
        for other in [k for k in replaced if k in params]:
            problems.add((*here, other), f"cannot be combined with files: {name!r} reads its "
                                         f"{' and '.join(replaced)} from the files; give one of the two")
        paths = files.expand_files(params["files"], (*here, "files"), ctx)
        options = {k: convert(params[k], str, (*here, k), problems) for k in route.options if k in params}
        if paths is not None:
            factory = files.RouteFactory(factory, route, paths, options, here)
    elif route is not None:
        for k in route.options:
            if k in params:
                problems.add((*here, k), "is an option of files = [...], which is not given")
    kwargs: dict[str, Any] = {}
    for pname, param in ctor.items():
        if pname in config_fields or pname in replaced:
            continue
        if pname not in params:
            if param.default is inspect.Parameter.empty or pname in REQUIRED or \
                    pname in getattr(factory, "positional", ()):
                also = f" (or files = [...], which {name!r} reads it from)" if route is not None and \
                    pname in route.replaces else ""
                problems.add((*here, pname), f"is required by {name!r} but missing{also}")
            continue
        kwargs[pname] = _parameter(params[pname], pname, hints.get(pname, Any), kind, (*here, pname), ctx)
    rngs = None
    if takes_rngs and RNGS_KEY in params:
        rngs = convert(params[RNGS_KEY], int, (*here, RNGS_KEY), problems)
    config = None
    if config_cls is not None:
        config_table = {k: v for k, v in params.items() if k in config_fields}
        config = build_dataclass(config_cls, config_table, here, problems, resolve_callable=ctx.resolve_callable)
    return ComponentSpec(here, name, factory, config, kwargs, rngs, takes_rngs, ctx.seed, kind)


def _parameter(value: Any, name: str, hint: Any, kind: str, path: Path, ctx: Context) -> Any:
    nested = module_hint(hint)
    if nested is not None and nested[0] == "one":
        return component(value, nested[1], path, ctx)
    if nested is not None:
        if not isinstance(value, list):
            ctx.problems.add(path, f"must be an array of {nested[1]} tables, got {value!r}")
            return None
        return [component(v, nested[1], (*path, i), ctx) for i, v in enumerate(value)]
    handled, out = files.object_parameter(kind, name, hint, value, path, ctx)
    if handled:
        return out
    return convert(value, hint, path, ctx.problems, resolve_callable=ctx.resolve_callable)
