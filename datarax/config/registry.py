"""Names for the built-in classes a configuration can use, discovered from the packages that hold them.

Each concrete operator, source, host stage and sampler gets a snake_case name from its class name
with the kind's suffix dropped (`BrightnessOperator` -> "brightness", `MemorySource` -> "memory",
`DecodeImage` -> "decode_image"). Anything else is named by an allowed import path.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import pkgutil
import re
import sys
from collections.abc import Sequence
from typing import Any

from flax import nnx

from datarax.config.allow import AllowList
from datarax.config.schema import type_hints

_SNAKE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
IMPORT_PATH_HELP = "write it as 'package.module:function' (a module importable from the config's directory or sys.path)"


@dataclasses.dataclass(frozen=True)
class Entry:
    """A configurable class: its registered name, the class and its config dataclass (or None)."""

    name: str
    cls: type
    config_cls: type | None


@dataclasses.dataclass(frozen=True)
class Kind:
    """One family of configurable classes and where to find them.

    Attributes:
        name: the kind's name in messages ("operator", "source", ...).
        packages: packages (walked with their subpackages) or single modules holding the classes.
        base: the base class as "module:Class", or several when the kind has more than one root
            (a source is a random-access `DataSourceModule` or a `StreamSourceModule`).
        suffixes: class-name suffixes dropped from registered names.
    """

    name: str
    packages: tuple[str, ...]
    base: str | tuple[str, ...]
    suffixes: tuple[str, ...]

    @property
    def bases(self) -> tuple[str, ...]:
        return (self.base,) if isinstance(self.base, str) else tuple(self.base)


KINDS = {
    "operator": Kind("operator", ("datarax.operators",), "datarax.core.operator:OperatorModule", ("Operator", "Node")),
    "source": Kind("source", ("datarax.sources",),
                   ("datarax.core.source:DataSourceModule", "datarax.sources.stream:StreamSourceModule"), ("Source",)),
    "host_stage": Kind("host_stage", ("datarax.host",), "datarax.host.stage:HostStage", ()),
    "sampler": Kind("sampler", ("datarax.samplers",), "datarax.samplers.base:Sampler", ("Sampler",)),
}


def register_kind(kind: Kind) -> None:
    """Adds a family of configurable classes that lives above the configuration layer.

    The training kit (`datarax.train`) registers its `callback` kind when it is imported, so this
    module never names the kit.
    """
    if KINDS.get(kind.name, kind) != kind:
        raise ValueError(f"kind {kind.name!r} is already registered as {KINDS[kind.name]}")
    KINDS[kind.name] = kind
    discover.cache_clear()


def snake_name(class_name: str, suffixes: Sequence[str] = ()) -> str:
    """`RandomResizedCropOperator` -> `random_resized_crop` (dropping the first matching suffix)."""
    for suffix in suffixes:
        if class_name.endswith(suffix) and class_name != suffix:
            class_name = class_name[: -len(suffix)]
            break
    return _SNAKE.sub("_", class_name).lower()


def config_class_of(cls: type) -> type | None:
    """The config dataclass of a class: its `config_class`, else `<Name>Config`, `<Stem>Config` or
    `<Stem>OperatorConfig` in its module, else the hint of its constructor's `config`; or None."""
    declared = getattr(cls, "config_class", None)
    if isinstance(declared, type) and dataclasses.is_dataclass(declared):
        return declared
    module = sys.modules.get(cls.__module__)
    stem = cls.__name__
    for suffix in ("Operator", "Source", "Sampler", "Node"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    for candidate in (f"{cls.__name__}Config", f"{stem}Config", f"{stem}OperatorConfig"):
        found = getattr(module, candidate, None)
        if isinstance(found, type) and dataclasses.is_dataclass(found):
            return found
    hint = type_hints(cls.__init__).get("config")
    for arm in (hint, *getattr(hint, "__args__", ())):
        if isinstance(arm, type) and dataclasses.is_dataclass(arm):
            return arm
    return None


def _import_bases(kind: Kind) -> tuple[type, ...]:
    bases = []
    for spec in kind.bases:
        module, _, attr = spec.partition(":")
        bases.append(getattr(importlib.import_module(module), attr))
    return tuple(bases)


def _modules(package: str) -> tuple[list[Any], list[tuple[str, str]]]:
    """Every module under `package` (imported; a plain module is itself), and (module, error) for
    those that failed to import."""
    root = importlib.import_module(package)
    modules, failed = [root], []
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), package + "."):
        try:
            modules.append(importlib.import_module(info.name))
        except Exception as exc:  # an optional dependency missing: report it, keep the rest usable
            failed.append((info.name, f"{type(exc).__name__}: {exc}"))
    return modules, failed


def _wanted(obj: Any, module_name: str, base: tuple[type, ...], suffixes: Sequence[str]) -> bool:
    if not isinstance(obj, type) or obj in base or obj.__module__ != module_name or obj.__name__.startswith("_"):
        return False
    if inspect.isabstract(obj):
        return False
    if issubclass(obj, base):
        return True
    # Batch-level DAG nodes are plain NNX modules named `...Node`.
    return "Node" in suffixes and obj.__name__.endswith("Node") and issubclass(obj, nnx.Module)


@functools.lru_cache(maxsize=None)
def discover(kind: str) -> tuple[dict[str, Entry], dict[str, list[str]], tuple[tuple[str, str], ...]]:
    """(name -> Entry, ambiguous name -> qualified class names, modules that failed to import)."""
    if kind not in KINDS:
        return {}, {}, ((kind, f"no package that provides {kind}s is loaded (for callbacks: import datarax.train)"),)
    spec = KINDS[kind]
    try:
        base = _import_bases(spec)
    except ImportError as exc:
        return {}, {}, ((", ".join(spec.bases), f"{type(exc).__name__}: {exc}"),)
    found: dict[str, list[Entry]] = {}
    failed: list[tuple[str, str]] = []
    for package in spec.packages:
        modules, errors = _modules(package)
        failed.extend(errors)
        for module in modules:
            for obj in vars(module).values():
                if _wanted(obj, module.__name__, base, spec.suffixes):
                    entry = Entry(snake_name(obj.__name__, spec.suffixes), obj, config_class_of(obj))
                    found.setdefault(entry.name, []).append(entry)
    entries = {name: e[0] for name, e in found.items() if len(e) == 1}
    ambiguous = {name: [f"{x.cls.__module__}:{x.cls.__name__}" for x in e] for name, e in found.items() if len(e) > 1}
    return entries, ambiguous, tuple(failed)


def names(kind: str) -> list[str]:
    """The registered names of a kind, sorted."""
    return sorted(discover(kind)[0])


def is_import_path(text: str) -> bool:
    return ":" in text


def is_of_kind(obj: Any, kind: str) -> bool:
    """Whether `obj` is a class deriving from the kind's base (for operators, any NNX module); never a
    function."""
    if kind not in KINDS or not isinstance(obj, type):
        return False
    try:
        bases = _import_bases(KINDS[kind])
    except ImportError:
        return False
    return issubclass(obj, bases) or ("Node" in KINDS[kind].suffixes and issubclass(obj, nnx.Module))


def import_object(spec: str, search_dirs: Sequence[str] = (), allow: AllowList | None = None) -> Any:
    """The object at `package.module:attribute` (attribute may be dotted).

    The module is imported from `sys.path`, then from `search_dirs` (`sys.path` is left as it was).

    Args:
        spec: the import path.
        search_dirs: folders to look in after `sys.path`.
        allow: when given, the module and the object's defining module must be on it; None trusts
            the caller (code, not a configuration file).

    Raises:
        NotAllowedError: `allow` does not permit the module or the object (a ValueError).
        ImportError: the module cannot be imported (its message says which and why).
        AttributeError: the module has no such attribute.
        ValueError: `spec` is not of the form `package.module:attribute`.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"import path {spec!r} is not of the form 'package.module:attribute'; {IMPORT_PATH_HELP}")
    if allow is not None:
        allow.check_module(spec, module_name)
    module = _import_module(module_name, search_dirs)
    obj, via = module, module_name
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))
            from datarax.config.schema import suggestion

            raise AttributeError(f"{via!r} has no attribute {part!r}{suggestion(part, public)}"
                                 if obj is not module else
                                 f"module {module_name!r} has no attribute {attr!r}{suggestion(part, public)}")
        obj, via = getattr(obj, part), f"{via}.{part}"
        if allow is not None:
            allow.check_object(spec, obj, via)
    return obj


def import_module(name: str, search_dirs: Sequence[str] = (), allow: AllowList | None = None) -> Any:
    """Imports module `name` for its side effects (a configuration's `imports = [...]`), from `sys.path`
    or `search_dirs`, when `allow` permits it (checked before the import)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"names {name!r}, which is not a module name such as 'mypkg.fs' (an import path's "
                         "'package.module' part, without ':attribute')")
    if allow is not None:
        allow.check_module(name, name)
    return _import_module(name, search_dirs)


def _import_module(name: str, search_dirs: Sequence[str]):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if not _missing_is(name, exc):
            raise
        first_error = exc
    for directory in search_dirs:
        directory = os.path.abspath(directory)
        if directory in sys.path:
            continue
        # On sys.path only while importing (the module's own imports of its siblings work), then
        # removed: a configuration must not change where the rest of the process imports from.
        sys.path.insert(0, directory)
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not _missing_is(name, exc):
                raise
        finally:
            if directory in sys.path:
                sys.path.remove(directory)
    where = ", ".join(search_dirs) or "no other folder"
    raise ModuleNotFoundError(f"{first_error} (looked on sys.path and in {where})",
                              name=first_error.name) from None


def _missing_is(name: str, exc: ModuleNotFoundError) -> bool:
    """Whether the module not found is `name` itself (or a parent), not something it imports."""
    missing = exc.name or ""
    return name == missing or name.startswith(missing + ".")
