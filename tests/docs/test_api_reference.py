"""The API reference's checks (docs/api.py): every module imports, every backticked name resolves."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_builder():
    spec = importlib.util.spec_from_file_location("datarax_api_reference", REPO / "docs" / "api.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


api = load_builder()


def test_every_module_imports_and_every_reference_resolves():
    problems = api.check()
    assert not problems, "\n".join(map(str, problems))


RESOLVES = [
    ("datarax", True),
    ("datarax.train.Trainer", True),
    ("datarax.train.loop.step.HostMetrics", True),  # a class in a module
    ("datarax.train.Trainer.fit", True),  # a method
    ("datarax.train.loop.precision.GROWTH_INTERVAL", True),  # a constant
    ("datarax.train.checkpointing.checkpointer.RestoredCheckpoint.step", True),  # a field without a default
    ("datarax.train.loop.trainer", True),  # a module below a package whose __all__ leaves it out
    ("datarax.nope", False),
    ("datarax.train.NoSuchTrainer", False),
    ("datarax.train.Trainer.no_such_method", False),
    ("datarax.train.checkpointing.checkpointer.RestoredCheckpoint.step.real", False),
    ("datarax.train.loop.trainer.Trainer.fit.nothing", False),
]


@pytest.mark.parametrize("name, expected", RESOLVES)
def test_resolves_against_a_table(name, expected):
    assert api.resolves(name) is expected


def test_a_made_up_name_is_reported_where_it_is(tmp_path):
    module = tmp_path / "sample.py"
    module.write_text('"""Module docstring naming `datarax.train.Trainer`."""\n\n\n'
                      'def f():\n    """Uses `datarax.train.NoSuchTrainer`\n    and `datarax.nope.gone`."""\n\n\n'
                      'LIMIT = 3\n"""An attribute docstring: `datarax.train.Trainer.fitt`."""\n')
    page = tmp_path / "page.md"
    page.write_text("Prose about `datarax.train.loop.step` and\n`datarax.sources.NoSuchSource`.\n\n"
                    "```python\nimport datarax.not_checked_inside_a_fence\nx = `datarax.nope`\n```\n"
                    "After the fence: `from datarax.nowhere import x`.\n")
    found = [(p.where.rsplit("/", 1)[-1], p.message.split("`")[1]) for p in api.reference_problems([module, page])]
    assert found == [
        ("sample.py:5", "datarax.train.NoSuchTrainer"),
        ("sample.py:6", "datarax.nope.gone"),
        ("sample.py:10", "datarax.train.Trainer.fitt"),
        ("page.md:2", "datarax.sources.NoSuchSource"),
        ("page.md:8", "datarax.nowhere"),
    ]


def test_a_module_that_does_not_import_is_named():
    problems = api.import_problems(["datarax.train", "datarax.train.no_such_module"])
    assert [p.where for p in problems] == ["datarax.train.no_such_module"]
    assert "ModuleNotFoundError" in problems[0].message


def train_modules_with_examples() -> list[str]:
    import datarax.train

    names = [info.name for info in pkgutil.walk_packages(datarax.train.__path__, "datarax.train.")]
    finder = doctest.DocTestFinder()
    return [name for name in names if any(test.examples for test in finder.find(importlib.import_module(name)))]


@pytest.mark.parametrize("name", train_modules_with_examples())
def test_the_training_kits_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example may name a run directory
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0
