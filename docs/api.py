"""Builds the API reference: HTML from the docstrings of `datarax` (pdoc), after checking every reference.

From a checkout, with the `docs` extra installed (`pip install -e ".[docs]"`):

    python docs/api.py [OUTDIR]      # check, then write the HTML into OUTDIR (default build/api)
    python docs/api.py --check       # the checks alone, without rendering

The checks fail the build, each problem named with its file and line:

* every module of the package imports (datarax imports its optional dependencies lazily, so the
  reference needs none of the extras);
* every dotted `datarax.` name inside backticks, in a docstring of the package or in README.md and
  docs/*.md (but the changelog, which lists names that moved away), names a module or an attribute
  that exists (a class, function, constant, method or dataclass field);
* loading and rendering the modules raises no warning.

Nothing is fetched over the network: pdoc's pages carry their own styles and search index.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import pkgutil
import re
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "datarax"
DEFAULT_OUT = REPO / "build" / "api"
# A dotted name of the package, as it appears inside a code span.
REFERENCE = re.compile(rf"\b{PACKAGE}(?:\.[A-Za-z_]\w*)+")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.S | re.M)
# Pages whose names are not references: the changelog lists the paths that moved away, by design.
NOT_REFERENCES = ("changelog.md",)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing that fails the build: where it is and what is wrong."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def module_names(package: str = PACKAGE) -> list[str]:
    """The package and every module under it, in import order (parents first)."""
    root = importlib.import_module(package)
    return [package] + sorted(info.name for info in pkgutil.walk_packages(root.__path__, f"{package}."))


def import_problems(names: list[str]) -> list[Problem]:
    """A problem for each module that does not import, with the exception it raised."""
    problems = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any failure is a module the reference cannot show
            problems.append(Problem(name, f"does not import: {type(exc).__name__}: {exc}"))
    return problems


def _fields(cls: type) -> set[str]:
    """Attribute names a class declares without a class-level value (dataclass fields, annotations)."""
    names = set(getattr(cls, "__dataclass_fields__", {}))
    for klass in cls.__mro__:
        names.update(vars(klass).get("__annotations__", {}))
    return names


def resolves(name: str) -> bool:
    """Whether dotted `name` is a module, or an attribute reached from the longest module prefix."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not f"{module_name}.".startswith(f"{exc.name}."):
                raise  # a module that exists but imports something missing: import_problems names it
            continue
        break
    else:
        return False
    rest = parts[split:]
    for i, attr in enumerate(rest):
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif isinstance(obj, type) and attr in _fields(obj) and i == len(rest) - 1:
            return True
        else:
            return False
    return True


def _docstrings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(first line, text) of every docstring in a module: the module's, its classes' and functions'
    (nested ones too), and attribute docstrings (a string right after an assignment)."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        previous = None
        for index, statement in enumerate(node.body):
            is_string = (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                         and isinstance(statement.value.value, str))
            if is_string and (index == 0 or isinstance(previous, (ast.Assign, ast.AnnAssign))):
                yield statement.lineno, statement.value.value
            previous = statement


def _spans(text: str) -> Iterator[tuple[int, str]]:
    """(line offset, content) of each inline code span of `text`."""
    for match in CODE_SPAN.finditer(text):
        yield text.count("\n", 0, match.start()), match.group(2)


def references(paths: list[Path]) -> Iterator[tuple[str, str]]:
    """(where, dotted name) of every backticked package name in the docstrings of Python files and in
    the prose of Markdown files (fenced code blocks left out: they run as code, not as references)."""
    for path in paths:
        text = path.read_text(encoding="utf-8")
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        if path.suffix == ".py":
            chunks = sorted(_docstrings(ast.parse(text, str(path))))
        else:
            blanked = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
            chunks = [(1, blanked)]
        for first_line, chunk in chunks:
            for offset, span in _spans(chunk):
                for name in REFERENCE.findall(span):
                    yield f"{shown}:{first_line + offset}", name


def source_files() -> list[Path]:
    """The package's Python files, README.md and docs/*.md (but `NOT_REFERENCES`)."""
    pages = [page for page in sorted((REPO / "docs").glob("*.md")) if page.name not in NOT_REFERENCES]
    return sorted((REPO / PACKAGE).rglob("*.py")) + [REPO / "README.md"] + pages


def reference_problems(paths: list[Path]) -> list[Problem]:
    """A problem for each backticked package name in `paths` that names nothing."""
    known: dict[str, bool] = {}
    problems = []
    for where, name in references(paths):
        if name not in known:
            known[name] = resolves(name)
        if not known[name]:
            problems.append(Problem(where, f"`{name}` names no module or attribute of {PACKAGE}; "
                                           "correct the name or drop the backticks"))
    return problems


def _warning_problems(caught: list[warnings.WarningMessage]) -> list[Problem]:
    return [Problem(f"{w.filename}:{w.lineno}", f"{w.category.__name__}: {w.message}") for w in caught]


def check() -> list[Problem]:
    """Every module imports, every reference resolves, and neither raises a warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problems = import_problems(module_names())
        problems += reference_problems(source_files())
    return problems + _warning_problems(caught)


def _place_named_tuple_constructors(names: list[str]) -> None:
    """Gives each NamedTuple's generated `__new__` its class's module.

    `collections.namedtuple` compiles `__new__` in a namespace of its own, so pdoc cannot resolve the
    string annotations (`from __future__ import annotations`) of its parameters there and warns.
    """
    for name in names:
        for obj in vars(sys.modules[name]).values():
            if (isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")
                    and obj.__module__ == name and obj.__new__.__module__ != name):
                obj.__new__.__module__ = name


def render(out: Path) -> list[Problem]:
    """Writes the HTML reference of the package into `out`; the warnings raised on the way."""
    import pdoc.doc
    import pdoc.render

    names = [name for name in module_names() if not any(part.startswith("_") for part in name.split("."))]
    _place_named_tuple_constructors(names)
    pdoc.render.configure(docformat="google", footer_text=f"{PACKAGE} API reference")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Every public module by name, each package listing all of its own: pdoc's walk stops at a
        # package's `__all__`, which lists names for `import *`, not the submodules a reader looks up.
        modules = {name: pdoc.doc.Module.from_name(name) for name in names}
        for name, module in modules.items():
            module.__dict__["submodules"] = [modules[child] for child in names if child.rpartition(".")[0] == name]
        for name, module in modules.items():
            page = out / f"{name.replace('.', '/')}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(pdoc.render.html_module(module, modules), encoding="utf-8")
        (out / "index.html").write_text(pdoc.render.html_index(modules), encoding="utf-8")
        (out / "search.js").write_text(pdoc.render.search_index(modules), encoding="utf-8")
    return _warning_problems(caught)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT,
                        help=f"where the HTML goes (default {DEFAULT_OUT.relative_to(REPO)})")
    parser.add_argument("--check", action="store_true", help="run the checks only, write nothing")
    args = parser.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # this checkout's package, whatever is installed
    began = time.perf_counter()
    problems = check()
    if not problems and not args.check:
        problems = render(args.out)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"API reference: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    done = "checked" if args.check else f"written to {args.out / 'index.html'}"
    print(f"API reference {done} ({time.perf_counter() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
