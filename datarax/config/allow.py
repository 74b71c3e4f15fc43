"""Which of the user's own modules a configuration may name by import path (`package.module:attribute`).

An entry allows that module and its submodules; nothing else is importable (the standard library
included), checked before anything is imported, and the named object must be defined in an allowed
module. docs/config.md ("What datarax guarantees") has the rules.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
from collections.abc import Iterable
from typing import Any

from datarax.core.errors import DataraxError

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class NotAllowedError(DataraxError, ValueError):
    """An import path outside the allow-list (raised before its module is imported)."""


@dataclasses.dataclass(frozen=True)
class AllowList:
    """Module names (each with its submodules) that a configuration may import from.

    Attributes:
        modules: dotted module names, e.g. `("mypkg", "experiments.transforms")`.
    """

    modules: tuple[str, ...] = ()

    def __post_init__(self):
        for name in self.modules:
            if not isinstance(name, str) or not _MODULE_NAME.match(name):
                raise ValueError(f"allow entries must be module names such as 'mypkg' or 'mypkg.ops', got "
                                 f"{name!r}")

    def extended(self, more: Iterable[str]) -> AllowList:
        """This list plus `more` (duplicates dropped, order kept)."""
        return AllowList(tuple(dict.fromkeys([*self.modules, *more])))

    def permits(self, module: str) -> bool:
        """Whether `module` is one of the allowed modules or inside one."""
        return any(module == name or module.startswith(name + ".") for name in self.modules)

    def check_module(self, spec: str, module: str) -> None:
        """Raises `NotAllowedError` unless `module` (named by `spec`) is allowed."""
        if not self.permits(module):
            top = module.split(".")[0]
            raise NotAllowedError(f"names {spec!r}, whose module {module!r} is not allowed: a configuration imports "
                                  f"only registered names and the modules you allow{self._listed()}; if you trust "
                                  f"{top!r}, add allow = [{top!r}] at the top of the file (or pass --allow {top}, "
                                  f"or allow=[{top!r}] from Python)")

    def check_object(self, spec: str, obj: Any, via: str) -> None:
        """Raises `NotAllowedError` if `obj`, reached as `via`, is a module or was defined outside the list.

        An allowed module's namespace also holds what it imported (`os`, `numpy.save`); those are
        not the user's code and are refused like a direct import path to them.
        """
        if isinstance(obj, types.ModuleType):
            if not self.permits(obj.__name__):
                self.check_module(spec, obj.__name__)
            return
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            return  # an instance (a dict of arrays, a functools.partial): made by the allowed module's own code
        home = getattr(obj, "__module__", None)
        if isinstance(home, str) and not self.permits(home):
            top = home.split(".")[0]
            raise NotAllowedError(f"names {spec!r}, but {via!r} is defined in {home!r}, which is not allowed (an "
                                  f"allowed module does not lend out what it imports); name your own function, or "
                                  f"if you trust {top!r}, add it to allow")

    def _listed(self) -> str:
        return f" (allowed here: {', '.join(self.modules)})" if self.modules else " (none are allowed here)"
