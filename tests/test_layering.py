"""The package's layering: datarax below, the training kit (`datarax.train`) on top; benchmarks and
recipes outside the installed package; no module touching another object's private attributes."""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import json
import pkgutil
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ABOVE = ("datarax.train", "benchmarks", "recipes", "trainers")


def run_python(code: str, cwd: Path = REPO) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_importing_datarax_and_every_subpackage_never_imports_the_kit_the_benchmarks_or_the_recipes():
    out = run_python(f"""
        import importlib, json, pkgutil, sys
        imported = []

        def walk(name):  # pkgutil.walk_packages would import datarax.train to look inside it
            module = importlib.import_module(name)
            imported.append(name)
            for info in pkgutil.iter_modules(getattr(module, "__path__", []), name + "."):
                if info.name != "datarax.train":
                    walk(info.name)

        walk("datarax")
        above = sorted(m for m in sys.modules if m.split(".")[0] in {ABOVE!r}[1:] or m.startswith("datarax.train"))
        print(json.dumps({{"imported": imported, "above": above}}))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    assert len(result["imported"]) > 40  # every subpackage and module was walked
    assert result["above"] == []


def test_without_the_kit_a_trainer_table_says_what_to_import(tmp_path):
    (tmp_path / "run.toml").write_text('[source.memory]\ndata = "x:y"\n[trainer]\nsteps = 1\n')
    out = run_python(f"""
        from datarax.config import ConfigError, load_spec
        try:
            load_spec({str(tmp_path / "run.toml")!r})
        except ConfigError as exc:
            print(exc)
    """)
    assert "trainer is validated by a package that is not loaded" in out and "import datarax.train" in out


def test_load_pipeline_builds_the_pipeline_of_a_trainer_config_without_importing_the_kit(tmp_path):
    """`load_pipeline` builds nothing from [trainer], so it needs no import first (and makes none)."""
    (tmp_path / "job.py").write_text("import numpy as np\ndef data():\n    return {'x': np.arange(6.0)}\n")
    (tmp_path / "run.toml").write_text('allow = ["job"]\nbatch_size = 3\n[source.memory]\ndata = "job:data"\n'
                                       '[trainer]\nmodel = "job:data"\nloss = "job:data"\nsteps = 1\n'
                                       'optimizer = { adam = { learning_rate = 0.1 } }\n')
    out = run_python(f"""
        import sys
        import numpy as np
        from datarax.config import load_pipeline
        pipeline = load_pipeline({str(tmp_path / "run.toml")!r})
        print([np.asarray(b["x"]).tolist() for b in pipeline], "datarax.train" in sys.modules)
    """)
    assert out.strip().splitlines()[-1] == "[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] False"


def test_the_installed_distribution_holds_only_datarax(tmp_path):
    """`pip install .` installs the wheel built here: its only top-level package is `datarax`."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("datarax", "trainers", "recipes", "benchmarks"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = glob.glob(str(tmp_path / "wheel" / "*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        top_level = next(n for n in archive.namelist() if n.endswith(".dist-info/top_level.txt"))
        declared = archive.read(top_level).decode().split()
    assert declared == ["datarax"]
    assert {t for t in tops if not t.endswith(".dist-info")} == {"datarax"}


# Attribute reads of another object's `_private` name that are allowed, each with its reason.
PRIVATE_ACCESS_ALLOWED = {
    # HF `datasets` keeps a Dataset's row mapping after select/shuffle/filter only in `_indices`; the
    # public way to reach the rows, `flatten_indices()`, copies the whole table, which is what
    # HFSource's zero-copy views exist to avoid. Reading it (never writing) is pinned by tests/sources/test_hf.py.
    ("datarax/sources/hf.py", "dataset._indices"),
}


def private_accesses(path: Path) -> list[str]:
    """`x._name` where x is not self/cls (dunder names and `sys._getframe`-style stdlib calls aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or (attr.startswith("__") and attr.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        found.append(f"{ast.unparse(owner)}.{attr}")
    return found


@pytest.mark.parametrize("package", ["datarax"])
def test_no_module_touches_another_objects_private_attributes(package):
    offenders = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for access in private_accesses(path):
            if (rel, access) not in PRIVATE_ACCESS_ALLOWED:
                offenders.append(f"{rel}: {access}")
    assert offenders == []


DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def imported_names(path: Path) -> list[tuple[int, str]]:
    """`(line, module)` of every import in `path`, and of every string literal spelling a dotted
    module path (an import through `importlib` or `runpy` counts too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            found.append((node.lineno, node.value))
    return found


def test_no_arrow_between_datarax_and_the_benchmark_suite_in_either_direction():
    """datarax names no `benchmarks` module (the CLI runs `python -m benchmarks` as a program), and
    the suite uses nothing from `datarax.cli` (it is a user of the library, not of its command line)."""
    offenders = [f"{p.relative_to(REPO)}:{line} names {name}" for p in sorted((REPO / "datarax").rglob("*.py"))
                 for line, name in imported_names(p) if name.split(".")[0] == "benchmarks"]
    offenders += [f"{p.relative_to(REPO)}:{line} imports {name}" for p in sorted((REPO / "benchmarks").rglob("*.py"))
                  for line, name in imported_names(p) if name.startswith("datarax.cli")]
    assert offenders == []


# The ladder, lowest rung first: a module may import its own package and anything on a lower rung,
# never a package on its own rung or above (docs/concepts.md, "Where things live").
LADDER = (
    ("core",),
    ("samplers", "operators", "monitoring", "sharding", "batching", "checkpoint", "typing"),
    ("control", "transforms"),
    ("sources",),
    ("host",),
    ("pipeline",),
    ("",),  # `datarax/__init__.py`, which re-exports `Pipeline`
    ("config",),
    ("train",),
    ("cli",),
)
RUNG = {package: rung for rung, packages in enumerate(LADDER) for package in packages}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((REPO / "datarax").rglob("*.py"))}


def runtime_imports(name: str) -> list[tuple[int, str]]:
    """`(line, module)` of each datarax module `name` imports when it runs: at module level or inside
    a function; imports under `if TYPE_CHECKING:` (for annotations only) never run and are left out.
    `from package import submodule` counts as importing the submodule."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target in MODULES:
                found.append((node.lineno, target))
    return found


def package_of(name: str) -> str:
    """`datarax.sources.hf` -> `sources`; `datarax.batching` -> `batching`; `datarax` -> ``."""
    return name.split(".")[1] if "." in name else ""


def test_every_package_is_on_the_ladder():
    assert sorted({package_of(name) for name in MODULES} - set(RUNG)) == []


def test_no_import_goes_up_the_ladder_or_across_a_rung():
    """core < samplers, operators, monitoring, sharding < control < sources < host < pipeline < config
    < train < cli: a module imports its own package and lower rungs only, at run time."""
    offenders = []
    for name in MODULES:
        own = package_of(name)
        for line, target in runtime_imports(name):
            other = package_of(target)
            if other != own and RUNG.get(other, len(LADDER)) >= RUNG.get(own, len(LADDER)):
                offenders.append(f"{name}:{line} imports {target} ({other or 'datarax'} is not below {own})")
    assert offenders == []


def test_no_import_circle():
    """No two modules import each other, directly or around a loop (type-only imports excepted): a
    loop works only by import order, and breaking it with function-local imports hides it."""
    graph = {name: {t for _, t in runtime_imports(name) if t != name} for name in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert circles == []


def test_no_module_imports_another_packages_private_module_or_name():
    """`datarax.core.fields` is the sources' own business: another package that needs it is
    missing a public function (in `core`, or in the package's public modules)."""
    offenders = []
    for name in MODULES:
        own = package_of(name)
        for line, target in runtime_imports(name):
            if package_of(target) != own and any(part.startswith("_") and part != "__init__"
                                                 for part in target.split(".")):
                offenders.append(f"{name}:{line} imports {target}")
        for node in ast.walk(ast.parse(MODULES[name].read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("datarax") \
                    and package_of(node.module) != own:
                offenders += [f"{name}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert offenders == []


# Public functions and classes defined in two modules under one name, each pair one idea in two forms.
SAME_IDEA = {
    "check_settings": "the checks of a set of settings, batching's and the Trainer's",
    "crop": "functional.batched.crop is functional.geometry.crop for a whole batch at once",
    "translate": "functional.batched.translate is functional.geometry.translate for a whole batch at once",
    "warp_affine": "functional.batched.warp_affine is functional.geometry.warp_affine for a whole batch at once",
    "resized_crop": "functional.batched.resized_crop is functional.geometry.resized_crop for a whole batch at once",
    "resize": "functional.batched.resize is functional.geometry.resize for a whole batch at once",
    "diagnose": "train.metrics.goodput.diagnose is monitoring.ledger.diagnose's verdict with the kit's badput added",
    "resample": "host.audio.resample is the numpy twin of operators.audio.functional.resample, for decoders",
    "check_arguments": "the checks of a constructor's arguments, HFSource's and HFStreamSource's (a private module)",
}


def test_a_public_name_means_one_thing():
    """No two datarax modules define different functions or classes under one public name (a name
    re-exported from its home is one object), unless the pair is one idea listed in SAME_IDEA."""
    import datarax

    homes: dict[str, set[str]] = {}
    for info in pkgutil.walk_packages(datarax.__path__, "datarax."):
        for name, obj in vars(importlib.import_module(info.name)).items():
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)) \
                    and obj.__module__.startswith("datarax."):
                homes.setdefault(name, set()).add(f"{obj.__module__}.{obj.__qualname__}")
    twice = {name: sorted(where) for name, where in homes.items() if len(where) > 1 and name not in SAME_IDEA}
    assert twice == {}, "give each a name of its own, or list the pair in SAME_IDEA with the reason"
