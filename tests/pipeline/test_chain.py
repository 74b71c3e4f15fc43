"""The linear stage program: `Chain.__call__` and `Chain.trace` against the stages run by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from datarax.core.operator import BatchContext
from datarax.operators import ElementOperator
from datarax.operators.strategies import SequentialOperator
from datarax.pipeline import Chain
from datarax.typing import Element


def affine(scale, shift=0.0):
    return ElementOperator(fn=lambda el: el.update_data({"x": el.data["x"] * scale + shift}))


@pytest.mark.parametrize("num_stages", [0, 1, 3])
def test_chain_trace_yields_each_stage_output_as_running_the_stages_by_hand(num_stages):
    stages = [affine(2.0, 1.0), affine(-1.0), affine(0.5, 3.0)][:num_stages]
    chain = Chain(stages)
    ctx = BatchContext.for_batch(4)
    source = Element({"x": jnp.arange(12.0).reshape(4, 3)})
    by_hand, elements = [], source
    for stage in stages:
        elements = stage.apply_batch(elements, ctx)
        by_hand.append(elements)
    traced = list(chain.trace(source, ctx))
    assert [(name, module) for name, module, _ in traced] == [(str(i), s) for i, s in enumerate(chain.stages)]
    for (_, _, out), want in zip(traced, by_hand, strict=True):
        np.testing.assert_array_equal(np.asarray(out.data["x"]), np.asarray(want.data["x"]))
    # The chain's output is the last stage's (the source batch when there are none), as is a
    # SequentialOperator's over the same stages: one loop runs both.
    np.testing.assert_array_equal(np.asarray(chain(source, ctx).data["x"]), np.asarray(elements.data["x"]))
    if stages:
        sequential = SequentialOperator(operators=stages).apply_batch(source, ctx)
        np.testing.assert_array_equal(np.asarray(sequential.data["x"]), np.asarray(elements.data["x"]))
