"""Operator test fixtures."""

import jax
import pytest

from datarax.operators import lowering


@pytest.fixture
def use_formulation(monkeypatch):
    """`use_formulation("per_record" | "batched")` makes this backend run the operators' per-record
    maths or their batch formulations (`datarax.operators.lowering`) for the rest of the test."""

    def use(name: str) -> None:
        backend = jax.default_backend()
        others = tuple(b for b in lowering.BATCHED_BACKENDS if b != backend)
        monkeypatch.setattr(lowering, "BATCHED_BACKENDS", others + ((backend,) if name == "batched" else ()))

    return use


@pytest.fixture(params=["per_record", "batched"])
def formulation(request, use_formulation):
    """Runs a test with the operators' per-record maths and again with their batch formulations,
    whatever the backend."""
    use_formulation(request.param)
    return request.param
