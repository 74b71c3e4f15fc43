"""Operator test fixtures."""

import jax
import pytest

from datarax.operators import lowering


@pytest.fixture(params=["per_record", "batched"])
def formulation(request, monkeypatch):
    """Runs a test with the operators' per-record maths and again with their batch formulations
    (`datarax.operators.lowering`), whatever the backend."""
    backend = jax.default_backend()
    others = tuple(b for b in lowering.BATCHED_BACKENDS if b != backend)
    monkeypatch.setattr(lowering, "BATCHED_BACKENDS", others + ((backend,) if request.param == "batched" else ()))
    return request.param
