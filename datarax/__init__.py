"""datarax: compiled, differentiable, exactly resumable data pipelines for JAX.

`Pipeline` is imported on first use, so `import datarax` (and the `datarax` command's `--help`
and `--version`) does not pay for importing JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from datarax.pipeline.pipeline import Pipeline as Pipeline


def __getattr__(name: str) -> Any:
    if name == "Pipeline":
        from datarax.pipeline.pipeline import Pipeline

        return Pipeline
    raise AttributeError(f"module 'datarax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "Pipeline"])
