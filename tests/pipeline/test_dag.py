import contextlib
import io
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from on_cpu import float64_on_cpu

from datarax import Pipeline
from datarax.core.operator import BatchContext
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline.dag import DagProgram
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.typing import Element

ROOT = Path(__file__).resolve().parents[2]
N, B = 20, 8


def normalize(element, key=None):
    return element.update_data({"image": element.data["image"] / 255.0})


def augment(element, key):
    key1, _ = jax.random.split(key)
    flip = jax.random.bernoulli(key1, 0.5)
    image = jax.lax.cond(flip, lambda img: jnp.flip(img, axis=1), lambda img: img, element.data["image"])
    return element.update_data({"image": image})


class Merge(nnx.Module):
    def __call__(self, augmented, clean):
        return {"image": (augmented["image"] + clean["image"]) / 2, "label": clean["label"]}


def make_data(n=N):
    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 255, (n, 4, 4, 1)).astype(np.float32),
            "label": np.arange(n, dtype=np.int32)}


def seed_dag(batch_size=B, shuffle=True, resident=True):
    source = MemorySource(MemorySourceConfig(shuffle=shuffle, seed=3, device_resident=resident), data=make_data())
    normalizer = ElementOperator(ElementOperatorConfig(stochastic=False), fn=normalize, rngs=nnx.Rngs(0))
    augmenter = ElementOperator(ElementOperatorConfig(stochastic=True, stream_name="augmentations"),
                                fn=augment, rngs=nnx.Rngs(42))
    pipeline = Pipeline.from_dag(
        source=source, nodes={"augment": augmenter, "normalize": normalizer, "merge": Merge()},
        edges={"augment": [], "normalize": [], "merge": ["augment", "normalize"]}, sink="merge",
        batch_size=batch_size, rngs=nnx.Rngs(0))
    return pipeline, augmenter


def reference(images, record_ids, epoch, stage_key):
    """The seed DAG written by hand: (flip-by-record-key(x) + x / 255) / 2."""
    base = jax.random.fold_in(jax.random.wrap_key_data(stage_key), epoch)
    keys = jax.vmap(lambda r: jax.random.split(jax.random.fold_in(base, r))[0])(jnp.asarray(record_ids))
    flip = np.asarray(jax.vmap(lambda k: jax.random.bernoulli(k, 0.5))(keys))
    augmented = np.where(flip[:, None, None, None], images[:, :, ::-1], images)
    return (augmented + images / 255.0) / 2


@pytest.mark.parametrize("resident", [True, False])
def test_seed_dag_equals_hand_written_computation(resident):
    pipeline, augmenter = seed_dag(resident=resident)
    data = make_data()
    for epoch in range(2):
        batches = list(pipeline)
        assert [len(b["label"]) for b in batches] == [8, 8, 4]
        ids = np.concatenate([np.asarray(b["label"]) for b in batches])
        np.testing.assert_array_equal(np.sort(ids), np.arange(N))
        got = np.concatenate([np.asarray(b["image"]) for b in batches])
        want = reference(data["image"][ids], ids, epoch, np.asarray(augmenter.key[...]))
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dag_keys_depend_on_record_not_batch():
    by_size = []
    for batch_size in (4, 7):
        pipeline, _ = seed_dag(batch_size=batch_size)
        out = {k: np.concatenate([np.asarray(b[k]) for b in pipeline]) for k in ("image", "label")}
        by_size.append(out["image"][np.argsort(out["label"])])
    np.testing.assert_array_equal(by_size[0], by_size[1])


def test_examples_dag_runs_and_prints_batch_shapes():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(ROOT / "examples" / "dag.py"), run_name="__main__")
    lines = out.getvalue().strip().splitlines()
    assert lines[-3:] == [f"DAG batch {i}: images (32, 28, 28, 1), labels (32,)" for i in range(3)]


def scale(factor):
    return ElementOperator(fn=lambda el: el.update_data({"x": el.data["x"] * factor}))


def add_const(value):
    return ElementOperator(fn=lambda el: el.update_data({"x": el.data["x"] + value}))


class Sum(nnx.Module):
    def __call__(self, *inputs):
        return {"x": sum(d["x"] for d in inputs)}


class Sub(nnx.Module):
    def __call__(self, a, b):
        return {"x": a["x"] - b["x"]}


def test_diamond_dag_matches_jnp_and_respects_edge_order():
    # source -> a -> (b, c) -> d = b - c, and e = d + source-fed f
    dag = DagProgram(
        nodes=[("f", scale(10.0)), ("a", add_const(1.0)), ("b", scale(2.0)), ("c", scale(3.0)),
               ("d", Sub()), ("e", Sum())],
        edges={"f": [], "a": [], "b": ["a"], "c": ["a"], "d": ["c", "b"], "e": ["d", "f"]}, sink="e")
    x = jnp.arange(12.0).reshape(4, 3)
    out = dag(Element({"x": x}), BatchContext.for_batch(4))
    np.testing.assert_allclose(out.data["x"], 3 * (x + 1) - 2 * (x + 1) + 10 * x)
    assert dag.order == ("f", "a", "b", "c", "d", "e")


def test_dag_trace_yields_each_node_output_as_running_the_nodes_by_hand():
    nodes = [("f", scale(10.0)), ("a", add_const(1.0)), ("b", scale(2.0)), ("c", scale(3.0)), ("d", Sub()),
             ("e", Sum())]
    dag = DagProgram(nodes=nodes, edges={"f": [], "a": [], "b": ["a"], "c": ["a"], "d": ["c", "b"], "e": ["d", "f"]},
                     sink="e")
    x = jnp.arange(12.0).reshape(4, 3)
    ctx = BatchContext.for_batch(4)
    source = Element({"x": x})
    by_hand = {"f": nodes[0][1].apply_batch(source, ctx), "a": nodes[1][1].apply_batch(source, ctx)}
    by_hand["b"] = nodes[2][1].apply_batch(by_hand["a"], ctx)
    by_hand["c"] = nodes[3][1].apply_batch(by_hand["a"], ctx)
    by_hand["d"] = Element(nodes[4][1](by_hand["c"].data, by_hand["b"].data))
    by_hand["e"] = Element(nodes[5][1](by_hand["d"].data, by_hand["f"].data))
    traced = list(dag.trace(source, ctx))
    assert [name for name, _, _ in traced] == list(dag.order)
    for name, module, out in traced:
        assert module is dag.nodes[name]
        np.testing.assert_array_equal(np.asarray(out.data["x"]), np.asarray(by_hand[name].data["x"]))
    np.testing.assert_array_equal(np.asarray(dag(source, ctx).data["x"]), np.asarray(traced[-1][2].data["x"]))


def set_state(name, value):
    return ElementOperator(fn=lambda el: el.update_state({name: jnp.float32(value)}))


def read_state():
    return ElementOperator(fn=lambda el: el.update_data({"seen": jnp.float32(sum(el.state.values()))}))


class Gather(nnx.Module):
    def __call__(self, a, b, *, states, ctx):
        return Element({"x": a["seen"] + b["seen"], "ids": ctx.record_ids},
                       {"a": states[0].get("a", jnp.zeros(4)), "b": states[1].get("b", jnp.zeros(4))})


def test_state_flows_along_edges_only():
    # "a" runs before "rb" in topological order but is not its predecessor: rb must not see its state.
    dag = DagProgram(
        nodes={"a": set_state("a", 1.0), "b": set_state("b", 2.0), "ra": read_state(), "rb": read_state(),
               "g": Gather()},
        edges={"a": [], "b": [], "ra": ["a"], "rb": ["b"], "g": ["ra", "rb"]}, sink="g")
    ctx = BatchContext.for_batch(4, record_ids=[5, 6, 7, 8])
    out = dag(Element({"x": jnp.zeros((4, 2))}), ctx)
    np.testing.assert_allclose(out.data["x"], np.full(4, 3.0))
    np.testing.assert_array_equal(out.data["ids"], [5, 6, 7, 8])
    np.testing.assert_allclose(out.state["a"], np.ones(4))
    np.testing.assert_allclose(out.state["b"], np.full(4, 2.0))


def test_plain_node_returning_dict_keeps_union_of_predecessor_states():
    dag = DagProgram(nodes={"a": set_state("w", 1.0), "b": set_state("w", 2.0), "m": Sum()},
                     edges={"a": [], "b": [], "m": ["b", "a"]}, sink="m")
    out = dag(Element({"x": jnp.ones((3, 1))}), BatchContext.for_batch(3))
    np.testing.assert_allclose(out.state["w"], np.full(3, 2.0))  # earliest predecessor in edge order wins


class Scaled(nnx.Module):
    def __init__(self, value):
        self.w = nnx.Param(jnp.asarray(value))

    def __call__(self, data):
        return {"x": jnp.sin(data["x"] * self.w[...])}


def test_gradient_of_param_inside_a_dag_branch_matches_finite_differences():
    with float64_on_cpu():
        x = jnp.asarray(np.linspace(-1, 1, 6).reshape(3, 2))
        pipeline = Pipeline.from_dag(source=MemorySource(data={"x": np.asarray(x)}),
                                     nodes={"s": Scaled(0.7), "c": scale(2.0), "m": Sum()},
                                     edges={"s": [], "c": [], "m": ["s", "c"]}, sink="m", batch_size=3)

        def loss(p):
            return jnp.sum(p.transform({"x": x})["x"] ** 2)

        grad = nnx.jit(nnx.grad(loss))(pipeline).program.nodes["s"].w[...]  # inside a user's jit + grad
        param = pipeline.program.nodes["s"].w
        eps = 1e-6
        param[...] = 0.7 + eps
        up = loss(pipeline)
        param[...] = 0.7 - eps
        down = loss(pipeline)
        want = 2 * jnp.sum((jnp.sin(0.7 * x) + 2 * x) * jnp.cos(0.7 * x) * x)  # by hand
        assert abs(float(grad)) > 1e-3
        np.testing.assert_allclose(grad, (up - down) / (2 * eps), rtol=1e-6)
        np.testing.assert_allclose(grad, want, rtol=1e-12)
