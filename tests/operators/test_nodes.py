"""SplitField and RebatchNode: routing, regrouping, gradients, use inside a DAG, error messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.operator import BatchContext
from datarax.operators import ElementOperator
from datarax.operators.nodes import RebatchNode, RebatchNodeConfig, SplitField, SplitFieldConfig
from datarax.sources import MemorySource
from datarax.typing import Element

X = np.arange(24, dtype=np.float32).reshape(8, 3)
Y = np.arange(8, dtype=np.int32)
CTX = BatchContext.for_batch(8)


def batch():
    return Element({"x": jnp.asarray(X), "y": jnp.asarray(Y)}, {"w": jnp.arange(8.0)})


def test_split_field_keeps_only_routed_fields_and_state():
    out = SplitField(SplitFieldConfig(fields=("x",))).apply_batch(batch(), CTX)
    assert sorted(out.data) == ["x"]
    np.testing.assert_array_equal(out.data["x"], X)
    np.testing.assert_array_equal(out.state["w"], np.arange(8.0))


def test_split_field_with_operator_sees_only_its_fields():
    seen = []

    def double(el):
        seen.append(sorted(el.data))
        return el.update_data({"x": el.data["x"] * 2})

    out = SplitField(SplitFieldConfig(fields=["x"]), operator=ElementOperator(fn=double)).apply_batch(batch(), CTX)
    assert seen == [["x"]]
    np.testing.assert_array_equal(out.data["x"], X * 2)
    np.testing.assert_array_equal(out.data["y"], Y)


@pytest.mark.parametrize("g", [1, 2, 4, 8])
def test_rebatch_groups_and_inverse_restores(g):
    grouped = RebatchNode(RebatchNodeConfig(group_size=g)).apply_batch(batch(), CTX)
    np.testing.assert_array_equal(grouped.data["x"], X.reshape(8 // g, g, 3))
    np.testing.assert_array_equal(grouped.state["w"], np.arange(8.0).reshape(8 // g, g))
    back = RebatchNode(RebatchNodeConfig(group_size=g, inverse=True)).apply_batch(grouped, CTX)
    np.testing.assert_array_equal(back.data["x"], X)
    np.testing.assert_array_equal(back.data["y"], Y)


def test_rebatch_is_differentiable():
    def loss(x):
        grouped = RebatchNode(RebatchNodeConfig(group_size=4)).apply_batch(Element({"x": x}), CTX)
        return jnp.sum(jnp.mean(grouped.data["x"], axis=1) ** 2)

    x = jnp.asarray(X)
    means = X.reshape(2, 4, 3).mean(axis=1)
    want = np.repeat(2 * means / 4, 4, axis=0)  # d/dx of sum(mean_g(x)^2)
    np.testing.assert_allclose(jax.grad(loss)(x), want, rtol=1e-6)


class GroupCenter(nnx.Module):
    """Subtracts each group's mean: a batch-level node between a grouping and its inverse."""

    def __call__(self, data):
        return {"x": data["x"] - data["x"].mean(axis=1, keepdims=True), "y": data["y"]}


def test_rebatch_inside_a_dag_pipeline():
    pipeline = Pipeline.from_dag(
        source=MemorySource(data={"x": X, "y": Y}),
        nodes={"group": RebatchNode(RebatchNodeConfig(group_size=2)), "center": GroupCenter(),
               "ungroup": RebatchNode(RebatchNodeConfig(group_size=2, inverse=True))},
        edges={"group": [], "center": ["group"], "ungroup": ["center"]}, sink="ungroup", batch_size=4)
    got = np.concatenate([np.asarray(b["x"]) for b in pipeline])
    pairs = X.reshape(4, 2, 3)
    np.testing.assert_allclose(got, (pairs - pairs.mean(axis=1, keepdims=True)).reshape(8, 3))
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["y"]) for b in pipeline]), Y)


ERRORS = [
    (lambda: RebatchNode(RebatchNodeConfig(group_size=3)).apply_batch(batch(), CTX), ValueError,
     r"RebatchNode cannot split .data\['x'\] of shape \(8, 3\) into groups of group_size=3: the leading axis 8 is "
     r"not a multiple of 3; use a batch_size divisible by 3"),
    (lambda: RebatchNode(RebatchNodeConfig(group_size=4, inverse=True)).apply_batch(batch(), CTX), ValueError,
     r"RebatchNode\(inverse=True\) expects .data\['x'\] grouped as \(M, 4, ...\), got shape \(8, 3\)"),
    (lambda: RebatchNodeConfig(group_size=0), ValueError, r"RebatchNodeConfig.group_size must be an int >= 1, got 0"),
    (lambda: RebatchNodeConfig(inverse="no"), TypeError, r"RebatchNodeConfig.inverse must be True or False"),
    (lambda: RebatchNode({"group_size": 2}), TypeError, r"config must be a RebatchNodeConfig, got"),
    (lambda: SplitFieldConfig(), ValueError, r"SplitFieldConfig.fields must name at least one field"),
    (lambda: SplitFieldConfig(fields="x"), TypeError,
     r"SplitFieldConfig.fields must be None or a tuple of field names"),
    (lambda: SplitField(SplitFieldConfig(fields=("x",)), operator=len), TypeError,
     r"SplitField operator must be an operator \(an OperatorModule\) or None"),
    (lambda: SplitField(("x",)), TypeError, r"config must be a SplitFieldConfig"),
    (lambda: SplitField(SplitFieldConfig(fields=("z",))).apply_batch(batch(), CTX), KeyError,
     r"SplitField routes fields \['z'\], but the records have fields \['x', 'y'\]"),
]


@pytest.mark.parametrize("make,error,message", ERRORS)
def test_error_messages(make, error, message):
    with pytest.raises(error, match=message):
        make()
