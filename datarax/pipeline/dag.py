"""The stage program of a DAG pipeline: named NNX modules wired by their predecessors.

An operator node takes its single predecessor's `Element` (or the source batch) and the
`BatchContext`; a plain `nnx.Module` takes its predecessors' data dicts positionally, in edge
order, plus keyword-only `ctx`/`states` if it declares them. Per-record state flows along edges.
Every node must lead to the sink. See docs/dag.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from flax import nnx

from datarax.core.checks import describe_value
from datarax.core.element import Element
from datarax.core.errors import DataraxError
from datarax.core.operator import BatchContext, OperatorModule


class DagError(DataraxError, ValueError):
    """A DAG whose nodes, edges or sink are inconsistent."""


def _named_nodes(nodes: Any) -> dict[str, nnx.Module]:
    """`nodes` as an ordered name -> module dict (a dict, or a sequence of (name, module) pairs)."""
    if isinstance(nodes, Mapping):
        pairs = list(nodes.items())
    elif isinstance(nodes, Sequence) and not isinstance(nodes, str) and all(
            isinstance(p, tuple) and len(p) == 2 for p in nodes):
        pairs = list(nodes)
    else:
        raise TypeError(f"nodes must be a dict of name -> nnx.Module (or a list of (name, module) pairs), "
                        f"got {describe_value(nodes)}")
    if not pairs:
        raise DagError("nodes is empty; a DAG needs at least one node, e.g. nodes={'normalize': op}")
    named: dict[str, nnx.Module] = {}
    for name, module in pairs:
        if not isinstance(name, str) or not name:
            raise TypeError(f"DAG node names must be non-empty strings, got {name!r}")
        if name in named:
            raise DagError(f"duplicate DAG node name {name!r}; give every node its own name")
        if not isinstance(module, nnx.Module):
            raise TypeError(
                f"nodes[{name!r}] must be an nnx.Module (an operator, or a plain module for batch-level "
                f"work), got {describe_value(module)}; wrap a function with "
                "ElementOperator(ElementOperatorConfig(), fn=...)"
            )
        named[name] = module
    return named


def _predecessors(names: Sequence[str], edges: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(edges, Mapping):
        raise TypeError(f"edges must be a dict of node name -> list of predecessor names, got {describe_value(edges)}")
    for name in edges:
        if name not in names:
            raise DagError(f"edges has an entry for unknown node {name!r}; the nodes are {list(names)}. "
                           "Add it to nodes or remove its edges entry")
    preds: dict[str, tuple[str, ...]] = {}
    for name in names:
        if name not in edges:
            raise DagError(f"node {name!r} has no entry in edges; add edges[{name!r}] = [] to feed it the "
                           "source batch, or list its predecessors")
        listed = edges[name]
        if isinstance(listed, str) or not isinstance(listed, Sequence):
            raise TypeError(f"edges[{name!r}] must be a list of predecessor names, got {listed!r}; "
                            f"write edges[{name!r}] = [{listed!r}] for a single predecessor")
        for p in listed:
            if p not in names:
                raise DagError(f"edges[{name!r}] names unknown node {p!r}; the nodes are {list(names)}. "
                               "An empty list (edges[...] = []) means 'consumes the source batch'")
        duplicated = sorted({p for p in listed if list(listed).count(p) > 1})
        if duplicated:
            raise DagError(f"edges[{name!r}] lists {duplicated} more than once ({list(listed)}); "
                           "list each predecessor once")
        preds[name] = tuple(listed)
    return preds


def _find_cycle(nodes: Sequence[str], preds: Mapping[str, tuple[str, ...]]) -> list[str]:
    """One cycle among `nodes` (each has a predecessor inside the set), as a closed path."""
    inside = set(nodes)
    path: list[str] = []
    node = nodes[0]
    while node not in path:
        path.append(node)
        node = next(p for p in preds[node] if p in inside)
    cycle = path[path.index(node):] + [node]
    return cycle[::-1]  # predecessor -> successor order reads as data flow


def _topological_order(names: Sequence[str], preds: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Kahn's algorithm, ties broken by the order the nodes were given in (so it is stable)."""
    remaining = {n: len(preds[n]) for n in names}
    users: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for p in preds[n]:
            users[p].append(n)
    ready = [n for n in names if remaining[n] == 0]
    order: list[str] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for user in users[node]:
            remaining[user] -= 1
            if remaining[user] == 0:
                ready.append(user)
        ready.sort(key=list(names).index)
    if len(order) < len(names):
        stuck = [n for n in names if n not in order]
        cycle = _find_cycle([n for n in stuck if any(p in stuck for p in preds[n])], preds)
        raise DagError(f"edges form a cycle: {' -> '.join(cycle)}; a DAG node cannot consume its own "
                       "output, directly or through other nodes. Remove one of these edges")
    return tuple(order)


def _ancestors(node: str, preds: Mapping[str, tuple[str, ...]]) -> set[str]:
    seen, todo = set(), [node]
    while todo:
        for p in preds[todo.pop()]:
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return seen


def _signature(module: nnx.Module) -> inspect.Signature | None:
    try:
        return inspect.signature(module.__call__)
    except (TypeError, ValueError):
        return None


def _check_arity(name: str, module: nnx.Module, num_preds: int) -> None:
    inputs = max(num_preds, 1)
    if isinstance(module, OperatorModule):
        if num_preds > 1:
            raise DagError(
                f"DAG node {name!r} is an operator ({type(module).__name__}), which takes one input, but "
                f"edges[{name!r}] lists {num_preds} predecessors; merge them first with a plain nnx.Module "
                f"node whose __call__ takes {num_preds} arguments"
            )
        return
    sig = _signature(module)
    if sig is None:
        return
    params = list(sig.parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= inputs <= len(positional):
        got = f"{num_preds} predecessors" if num_preds else "no predecessors (it consumes the source batch)"
        raise DagError(
            f"DAG node {name!r} ({type(module).__name__}) has __call__ taking {len(positional)} positional "
            f"input(s) {[p.name for p in positional]}, but edges[{name!r}] gives it {got}, i.e. {inputs} "
            f"input(s); make __call__ take one argument per predecessor, in edge order"
        )


def _keyword_only(module: nnx.Module, keyword: str) -> bool:
    sig = _signature(module)
    return (sig is not None and keyword in sig.parameters
            and sig.parameters[keyword].kind == inspect.Parameter.KEYWORD_ONLY)


def node_structure(module: nnx.Module) -> str:
    """A node's description for the iterator fingerprint: its `structure()` or its class."""
    structure = getattr(module, "structure", None)
    if callable(structure):
        return structure()
    return f"{type(module).__module__}.{type(module).__qualname__}"


def _union_states(inputs: Sequence[Element]) -> dict:
    state: dict = {}
    for el in reversed(inputs):
        state.update(el.state)
    return state


class DagProgram(nnx.Module):
    """Runs named NNX modules in dependency order; the sink's output is the batch.

    Args:
        nodes: name -> module (or a list of (name, module) pairs). See the module docstring for
            what operators and plain modules receive.
        edges: name -> list of predecessor names, in the order they are passed; `[]` means the
            node consumes the source batch. Every node needs an entry.
        sink: the node whose output the pipeline yields.

    Raises:
        DagError: on unknown or duplicate names, a cycle, a missing sink, nodes that do not lead
            to the sink, or a node whose input count does not match its predecessors.

    Example:
        >>> dag = DagProgram({"a": op_a, "b": op_b, "m": Merge()},
        ...                  {"a": [], "b": [], "m": ["a", "b"]}, sink="m")
        >>> out = dag(Element(batch), BatchContext.for_batch(32))
    """

    def __init__(self, nodes: Mapping[str, nnx.Module] | Sequence[tuple[str, nnx.Module]],
                 edges: Mapping[str, Sequence[str]], sink: str):
        named = _named_nodes(nodes)
        names = list(named)
        preds = _predecessors(names, edges)
        if not isinstance(sink, str) or sink not in named:
            raise DagError(f"sink must be the name of a node, got {sink!r}; the nodes are {names}")
        order = _topological_order(names, preds)
        feeding = _ancestors(sink, preds) | {sink}
        dead = [n for n in names if n not in feeding]
        if dead:
            raise DagError(
                f"nodes {dead} do not lead to the sink {sink!r}, so their output would be discarded; "
                "connect them (list them in a downstream node's edges) or remove them"
            )
        for name in order:
            _check_arity(name, named[name], len(preds[name]))
        self.nodes = nnx.Dict(named)
        self.order = order
        self.preds = tuple(preds[n] for n in order)
        self.sink = sink
        self._wants = tuple((_keyword_only(named[n], "ctx"), _keyword_only(named[n], "states")) for n in order)

    def _run_node(self, name: str, module: nnx.Module, inputs: list[Element], ctx: BatchContext,
                  wants: tuple[bool, bool]) -> Element:
        if isinstance(module, OperatorModule):
            return module.apply_batch(inputs[0], ctx)
        kwargs: dict[str, Any] = {}
        if wants[0]:
            kwargs["ctx"] = ctx
        if wants[1]:
            kwargs["states"] = tuple(el.state for el in inputs)
        out = module(*(el.data for el in inputs), **kwargs)
        if isinstance(out, Element):
            return out
        if isinstance(out, Mapping):
            return Element(dict(out), _union_states(inputs))
        raise TypeError(
            f"DAG node {name!r} ({type(module).__name__}) returned {describe_value(out)}; a plain module node must "
            "return a dict of batched arrays (field -> array) or an Element"
        )

    def __call__(self, elements: Element, ctx: BatchContext) -> Element:
        # Every node leads to the sink (checked at construction), so the sink runs last.
        for _, _, out in self.trace(elements, ctx):
            pass
        return out

    def trace(self, elements: Element, ctx: BatchContext) -> Iterator[tuple[str, nnx.Module, Element]]:
        """`(name, module, output)` for every node, in the order they run; the sink comes last."""
        outputs: dict[str, Element] = {}
        for name, preds, wants in zip(self.order, self.preds, self._wants):
            inputs = [outputs[p] for p in preds] if preds else [elements]
            outputs[name] = self._run_node(name, self.nodes[name], inputs, ctx, wants)
            yield name, self.nodes[name], outputs[name]

    def structure(self) -> str:
        parts = [f"{n}={node_structure(self.nodes[n])}<-({','.join(p)})" for n, p in zip(self.order, self.preds)]
        return "Dag[" + "; ".join(parts) + f"; sink={self.sink}]"
