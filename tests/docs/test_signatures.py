"""Every call of a datarax class or function shown in the docs' Python blocks matches its signature."""

from __future__ import annotations

import ast
import dataclasses
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


def signature_of(obj: object) -> inspect.Signature:
    """A function's signature, or a class's constructor's without `self` (an NNX module's own
    signature is its metaclass's `(*args, **kwargs)`)."""
    if not inspect.isclass(obj) or obj.__init__ is object.__init__:
        return inspect.signature(obj)
    signature = inspect.signature(obj.__init__)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def required_but_optional(call: ast.Call, obj: object) -> list[str]:
    """A listing that shows an argument bare (required) where the code gives it a default."""
    try:
        params = [p for p in signature_of(obj).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []
    return [f"{obj.__qualname__} shows {params[i].name!r} as required, but it defaults to {params[i].default!r}"
            for i, arg in enumerate(call.args) if i < len(params) and isinstance(arg, ast.Name)
            and params[i].default is not inspect.Parameter.empty]


def wrong_defaults(call: ast.Call, obj: object) -> list[str]:
    """A listing's `name=value` must show the code's default when the value is a literal; a span
    with `...` in it is an example call (`Pipeline(..., drop_remainder=True)`), not a listing."""
    if any(isinstance(node, ast.Constant) and node.value is Ellipsis for node in ast.walk(call)):
        return []
    try:
        params = signature_of(obj).parameters
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


def config_of(cls: type) -> type | None:
    """The config dataclass a class's constructor resolves its settings into (`datarax.core.construct`)."""
    found = getattr(cls, "config_class", None)
    if isinstance(found, type):
        return found
    hint = inspect.signature(cls.__init__).parameters.get("config")
    if hint is None or not isinstance(hint.annotation, str):
        return None
    module = importlib.import_module(cls.__module__)
    found = vars(module).get(hint.annotation.split("|")[0].strip())
    return found if dataclasses.is_dataclass(found) else None


def looks_like_a_config(node: ast.expr) -> bool:
    """`XConfig(...)`, `config`, `cfg`: an argument the reader sees is a config object."""
    if isinstance(node, ast.Call):
        node = node.func
    names = []
    while isinstance(node, ast.Attribute):  # `BertConfig.from_hf(...)`, `spec.config`
        names.append(node.attr)
        node = node.value
    names += [node.id] if isinstance(node, ast.Name) else []
    return any(n.endswith("Config") or "config" in n.lower() or n == "cfg" for n in names)


def settings_problems(call: ast.Call, cls: type, config: type, params: dict) -> list[str]:
    """A call of a class built from a config or settings (`datarax.core.construct`): keywords are the
    config's fields or the constructor's own, a config comes with no fields, and only the class's
    principal settings come by position (after a config, only those that are not its fields)."""
    fields = {f.name for f in dataclasses.fields(config) if f.init}
    own = {name for name, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    out = [f"keyword {kw.arg!r} is neither a field of {config.__name__} nor a parameter of {cls.__name__}"
           for kw in call.keywords if kw.arg is not None and kw.arg not in fields | own]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(kw.arg is None for kw in call.keywords):
        return out
    positional = getattr(cls, "positional", ())
    given_config = bool(call.args) and looks_like_a_config(call.args[0]) or \
        any(kw.arg == "config" for kw in call.keywords)
    if given_config:
        fields_given = sorted(kw.arg for kw in call.keywords if kw.arg in fields and kw.arg not in own)
        if fields_given:
            out.append(f"{cls.__name__} is given a config and its fields {fields_given}; pass one or the other")
        positional = tuple(n for n in positional if n not in fields)
    values = len(call.args) - (given_config and bool(call.args) and looks_like_a_config(call.args[0]))
    if values > len(positional):
        takes = " and ".join(positional) or "no setting"
        out.append(f"{len(call.args)} positional arguments, {cls.__name__} takes {takes} by position"
                   + (" after its config" if given_config else ""))
    return out


def problems_in(call: ast.Call, obj: object) -> list[str]:
    try:
        signature = signature_of(obj)
    except (TypeError, ValueError):
        return []
    params = signature.parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        config = config_of(obj) if inspect.isclass(obj) else None
        if config is None:
            return []
        return settings_problems(call, obj, config, params)
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


# (a call in a doc, what the check says of it): settings of classes built through `datarax.core.construct`.
CALLS = [
    ("RandomCrop(32, padding=4, rngs=nnx.Rngs(0))", []),
    ("RandomCrop(RandomCropConfig(size=32), rngs=rngs)", []),
    ("MemorySource(MemorySourceConfig(shuffle=True), data)", []),
    ("ImageFolderSource(root, shuffle=True)", []),
    ("RandomCrop(32, 4)", ["2 positional arguments, RandomCropOperator takes size by position"]),
    ("ImageFolderSource(cfg, root)",
     ["2 positional arguments, ImageFolderSource takes no setting by position after its config"]),
    ("RandomCrop(size=32, paddin=4)",
     ["keyword 'paddin' is neither a field of RandomCropConfig nor a parameter of RandomCropOperator"]),
    ("RandomCrop(RandomCropConfig(), padding=3)",
     ["RandomCropOperator is given a config and its fields ['padding']; pass one or the other"]),
]


@pytest.mark.parametrize("code, expected", CALLS)
def test_calls_of_config_built_classes_are_checked_against_their_settings(code, expected):
    call = ast.parse(code, mode="eval").body
    assert problems_in(call, API[call.func.id]) == expected
