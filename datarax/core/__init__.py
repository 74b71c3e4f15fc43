"""Base types and contracts: records, operators, sources, checks and errors.

The types are imported on first use, so the modules without JAX (`datarax.core.errors`,
`datarax.core.checks`) stay cheap to import (the `datarax` command's `--help` uses them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datarax.core.element import Element as Element
    from datarax.core.operator import BatchContext as BatchContext
    from datarax.core.operator import OperatorConfig as OperatorConfig
    from datarax.core.operator import OperatorModule as OperatorModule
    from datarax.core.operator import PerRecordOperator as PerRecordOperator
    from datarax.core.source import DataSourceModule as DataSourceModule

_HOMES = {"Element": "element", "BatchContext": "operator", "OperatorConfig": "operator",
          "OperatorModule": "operator", "PerRecordOperator": "operator", "DataSourceModule": "source"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"datarax.core.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'datarax.core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
