"""TOML configuration: a whole run (source, stages or DAG, sampler, sharding) in one file (docs/config.md).

`load_pipeline(path)` reads, validates and builds; `load_spec(path)` only validates (raising
`ConfigError` with every problem); `check_pipeline(spec)` builds what `datarax validate` checks.
Names are imported on first use, so `datarax.config.schema` does not import JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datarax.config.build import build_pipeline as build_pipeline
    from datarax.config.build import check_pipeline as check_pipeline
    from datarax.config.build import load_pipeline as load_pipeline
    from datarax.config.build import load_spec as load_spec
    from datarax.config.schema import ConfigError as ConfigError
    from datarax.config.spec import RunSpec as RunSpec

_EXPORTS = {"build_pipeline": "datarax.config.build", "check_pipeline": "datarax.config.build",
            "load_pipeline": "datarax.config.build",
            "load_spec": "datarax.config.build", "ConfigError": "datarax.config.schema",
            "RunSpec": "datarax.config.spec"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'datarax.config' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
