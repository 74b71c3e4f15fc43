"""Public types: the record type and the batch type."""

from typing import Any

from datarax.core.element import Element as Element

Batch = dict[str, Any]
"""A batch: a dict (pytree) of arrays, every leaf with a leading batch axis."""
