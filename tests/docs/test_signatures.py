"""Every call of a datarax class or function shown in the docs' Python blocks matches its signature."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
# A table row that describes another library's API (a peer's settings) is not checked against ours.
OTHER_LIBRARIES = re.compile(r"torchvision|torch\.|tf\.|PIL|Pillow|librosa|grain\.|DataLoader")
SPAN = re.compile(r"`([A-Za-z_][\w.]*\([^`]*\))`")


def public_api() -> dict[str, object]:
    """Public classes and functions of datarax by name (a name defined in two places is left out)."""
    found: dict[str, set] = {}
    import datarax

    for info in pkgutil.walk_packages(datarax.__path__, "datarax."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", "").startswith("datarax."):
                found.setdefault(name, set()).add(obj)
    return {name: next(iter(objs)) for name, objs in found.items() if len(objs) == 1}


def python_blocks(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        code = textwrap.dedent(match.group(1))
        if ">>>" in code:
            code = "\n".join(line[4:] for line in code.splitlines() if line.startswith((">>> ", "... ")))
        blocks.append((text[:match.start()].count("\n") + 2, code))
    return blocks


def table_signatures(path: Path) -> list[tuple[int, ast.Call]]:
    """`Name(arg, key=value)` spans in table rows: the docs' signature listings."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("|") or OTHER_LIBRARIES.search(line):
            continue
        for span in SPAN.findall(line):
            try:
                node = ast.parse(span, mode="eval").body
            except SyntaxError:
                continue
            if isinstance(node, ast.Call):
                out.append((number, node))
    return out


def required_but_optional(call: ast.Call, obj: object) -> list[str]:
    """A listing that shows an argument bare (required) where the code gives it a default."""
    try:
        params = [p for p in inspect.signature(obj).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []
    return [f"{obj.__qualname__} shows {params[i].name!r} as required, but it defaults to {params[i].default!r}"
            for i, arg in enumerate(call.args) if i < len(params) and isinstance(arg, ast.Name)
            and params[i].default is not inspect.Parameter.empty]


def wrong_defaults(call: ast.Call, obj: object) -> list[str]:
    """A listing's `name=value` must show the code's default when the value is a literal."""
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return []
    out = []
    for kw in call.keywords:
        if kw.arg in params and params[kw.arg].default is not inspect.Parameter.empty:
            try:
                shown = ast.literal_eval(kw.value)
            except ValueError:
                continue
            if shown != params[kw.arg].default:
                out.append(f"{obj.__qualname__} shows {kw.arg}={shown!r}, "
                           f"but the default is {params[kw.arg].default!r}")
    return out


def problems_in(call: ast.Call, obj: object) -> list[str]:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    params = signature.parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return []
    named = {p.name for p in params.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    out = [f"keyword {kw.arg!r} is not a parameter of {obj.__qualname__}{signature}"
           for kw in call.keywords if kw.arg is not None and kw.arg not in named]
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    starred = any(isinstance(a, ast.Starred) for a in call.args)
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params.values())
    if not starred and not variadic and len(call.args) > len(positional):
        out.append(f"{len(call.args)} positional arguments, {obj.__qualname__}{signature} takes {len(positional)}")
    return out


API = public_api()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_calls_in_the_docs_match_the_code(path):
    problems = []
    for line, code in python_blocks(path):
        try:
            tree = ast.parse(code)
        except SyntaxError as exc:
            problems.append(f"{path.name}:{line}: a python block that does not parse: {exc}")
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else None
            if name in API:
                problems += [f"{path.name}:{line + node.lineno - 1}: {p}" for p in problems_in(node, API[name])]
    for line, node in table_signatures(path):
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if name in API and name[0].isupper():  # classes: a lower-case span in a table may be another library's
            problems += [f"{path.name}:{line}: {p}" for p in problems_in(node, API[name])
                         + required_but_optional(node, API[name]) + wrong_defaults(node, API[name])]
    assert problems == []
