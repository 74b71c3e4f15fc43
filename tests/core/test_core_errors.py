"""Every exception and warning class datarax defines sits under `DataraxError` / `DataraxWarning`,
and the one thread pool is the only user of `ThreadPoolExecutor`."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import datarax
from datarax.core.errors import DataraxError, DataraxWarning

PACKAGE = Path(datarax.__file__).parent


def datarax_modules():
    names = ["datarax"]
    for info in pkgutil.walk_packages(datarax.__path__, "datarax."):
        names.append(info.name)
    return names


def defined_classes():
    found = []
    for name in datarax_modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # an optional extra that is not installed
            if exc.name and exc.name.split(".")[0] == "datarax":
                raise
            continue
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == name and issubclass(value, BaseException):
                found.append(value)
    return found


def test_the_walk_covers_the_kit_and_finds_the_errors():
    classes = {cls.__module__ + "." + cls.__qualname__ for cls in defined_classes()}
    assert any(name.startswith("datarax.train.") for name in classes)
    assert len(classes) > 20


@pytest.mark.parametrize("cls", defined_classes(), ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_exception_class_derives_from_datarax_error(cls):
    assert issubclass(cls, DataraxError)
    if issubclass(cls, Warning):
        assert issubclass(cls, DataraxWarning)


def test_errors_keep_the_builtin_base_callers_catch():
    from datarax.config import ConfigError
    from datarax.core.errors import CorruptFileError, RecordError

    for cls in (ConfigError, CorruptFileError, RecordError):
        assert issubclass(cls, ValueError)


def test_no_thread_pool_executor_outside_the_pool():
    users = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                   if re.search(r"\bThreadPoolExecutor\b", path.read_text()))
    assert users in ([], ["control/pool.py"])
