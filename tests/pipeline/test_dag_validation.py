"""Every DagProgram validation error, with its message."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.operator import BatchContext
from datarax.operators import ElementOperator
from datarax.pipeline.dag import DagError, DagProgram
from datarax.sources import MemorySource
from datarax.typing import Element


def op():
    return ElementOperator(fn=lambda el: el)


class Two(nnx.Module):
    def __call__(self, a, b):
        return a


class One(nnx.Module):
    def __call__(self, a):
        return a


class OptionalSecond(nnx.Module):
    def __call__(self, a, b=None):
        return a


CASES = [
    ("cycle", lambda: ({"a": op(), "b": op(), "c": op(), "s": One()},
                       {"a": ["c"], "b": ["a"], "c": ["b"], "s": ["a"]}, "s"),
     DagError, r"edges form a cycle: (a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"),
    ("self loop", lambda: ({"a": op()}, {"a": ["a"]}, "a"), DagError, r"cycle: a -> a"),
    ("unknown predecessor", lambda: ({"a": op()}, {"a": ["source"]}, "a"),
     DagError, r"edges\['a'\] names unknown node 'source'.*empty list .* means 'consumes the source batch'"),
    ("unknown edges key", lambda: ({"a": op()}, {"a": [], "ghost": []}, "a"),
     DagError, r"edges has an entry for unknown node 'ghost'; the nodes are \['a'\]"),
    ("missing edges entry", lambda: ({"a": op(), "b": op()}, {"a": []}, "a"),
     DagError, r"node 'b' has no entry in edges; add edges\['b'\] = \[\]"),
    ("sink not a node", lambda: ({"a": op()}, {"a": []}, "out"),
     DagError, r"sink must be the name of a node, got 'out'; the nodes are \['a'\]"),
    ("unreachable", lambda: ({"a": op(), "dead": op(), "s": One()}, {"a": [], "dead": [], "s": ["a"]}, "s"),
     DagError, r"nodes \['dead'\] do not lead to the sink 's'.*connect them"),
    ("plain arity too many", lambda: ({"a": op(), "b": op(), "c": op(), "m": Two()},
                                      {"a": [], "b": [], "c": [], "m": ["a", "b", "c"]}, "m"),
     DagError, r"DAG node 'm' \(Two\) has __call__ taking 2 positional input\(s\) \['a', 'b'\], but edges\['m'\] "
               r"gives it 3 predecessors"),
    ("plain arity too few", lambda: ({"a": op(), "m": Two()}, {"a": [], "m": ["a"]}, "m"),
     DagError, r"DAG node 'm' \(Two\) has __call__ taking 2 .* gives it 1 predecessors, i.e. 1 input"),
    ("plain arity source", lambda: ({"m": Two()}, {"m": []}, "m"),
     DagError, r"gives it no predecessors \(it consumes the source batch\)"),
    ("operator with two inputs", lambda: ({"a": op(), "b": op(), "c": op()}, {"a": [], "b": [], "c": ["a", "b"]}, "c"),
     DagError, r"DAG node 'c' is an operator \(ElementOperator\), which takes one input, but edges\['c'\] lists 2"),
    ("duplicate node names", lambda: ([("a", op()), ("a", op())], {"a": []}, "a"),
     DagError, r"duplicate DAG node name 'a'"),
    ("duplicate predecessor", lambda: ({"a": op(), "m": Two()}, {"a": [], "m": ["a", "a"]}, "m"),
     DagError, r"edges\['m'\] lists \['a'\] more than once"),
    ("edge list is a string", lambda: ({"a": op(), "b": op()}, {"a": [], "b": "a"}, "b"),
     TypeError, r"edges\['b'\] must be a list of predecessor names, got 'a'; write edges\['b'\] = \['a'\]"),
    ("node not a module", lambda: ({"a": lambda x: x}, {"a": []}, "a"),
     TypeError, r"nodes\['a'\] must be an nnx.Module .* got function"),
    ("empty nodes", lambda: ({}, {}, "a"), DagError, r"nodes is empty"),
    ("nodes wrong type", lambda: ("a", {}, "a"), TypeError, r"nodes must be a dict of name -> nnx.Module"),
    ("edges wrong type", lambda: ({"a": op()}, ["a"], "a"), TypeError, r"edges must be a dict"),
    ("bad node name", lambda: ({"": op()}, {"": []}, ""), TypeError, r"DAG node names must be non-empty strings"),
]


@pytest.mark.parametrize("make,error,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_validation_error_messages(make, error, message):
    nodes, edges, sink = make()
    with pytest.raises(error, match=message):
        DagProgram(nodes, edges, sink)


def test_from_dag_reports_validation_errors():
    source = MemorySource(data={"x": np.zeros((4, 1), np.float32)})
    with pytest.raises(DagError, match="cycle: a -> a"):
        Pipeline.from_dag(source=source, nodes={"a": op()}, edges={"a": ["a"]}, sink="a", batch_size=2)


def test_optional_positional_parameters_count_as_inputs():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DagProgram({"a": op(), "m": OptionalSecond()}, {"a": [], "m": ["a"]}, "m")
        DagProgram({"a": op(), "b": op(), "m": OptionalSecond()}, {"a": [], "b": [], "m": ["a", "b"]}, "m")


class BadReturn(nnx.Module):
    def __call__(self, a):
        return a["x"]


def test_plain_node_returning_an_array_is_a_clear_error():
    dag = DagProgram({"m": BadReturn()}, {"m": []}, "m")
    with pytest.raises(TypeError, match=r"DAG node 'm' \(BadReturn\) returned Array.*must return a dict of batched"):
        dag(Element({"x": jnp.zeros((2, 1))}), BatchContext.for_batch(2))


def test_structure_describes_wiring_so_fingerprints_differ():
    a = DagProgram({"a": op(), "b": op(), "m": Two()}, {"a": [], "b": [], "m": ["a", "b"]}, "m")
    b = DagProgram({"a": op(), "b": op(), "m": Two()}, {"a": [], "b": [], "m": ["b", "a"]}, "m")
    c = DagProgram({"a": op(), "b": op(), "m": Two()}, {"a": [], "b": ["a"], "m": ["a", "b"]}, "m")
    assert len({a.structure(), b.structure(), c.structure()}) == 3
    assert a.structure().endswith("Two<-(a,b); sink=m]")
