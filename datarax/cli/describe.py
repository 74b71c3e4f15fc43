"""What `datarax inspect` shows: element spec, per-stage output shapes, the graph, the fingerprint.

Shapes come from `jax.eval_shape` over the pipeline's own stages, so nothing is compiled or
run and no data moves; per-stage shapes are per process (before any sharding lays the batch out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from datarax.core.element import Element
from datarax.core.operator import BatchContext


def spec_text(spec: Any) -> str:
    """`float32 (32, 28, 28, 1)` for a ShapeDtypeStruct (nested dicts joined by commas)."""
    if isinstance(spec, Mapping):
        return ", ".join(f"{k}: {spec_text(v)}" for k, v in spec.items())
    return f"{np.dtype(spec.dtype).name} {tuple(spec.shape)}"


def spec_lines(spec: Mapping[str, Any], indent: str = "  ") -> list[str]:
    width = max((len(k) for k in spec), default=0)
    return [f"{indent}{k:<{width}}  {spec_text(v)}" for k, v in spec.items()]


def _input_batch(pipeline) -> tuple[dict, jax.ShapeDtypeStruct]:
    idx_shape = pipeline.sampler.indices(np.zeros((pipeline.batch_size,), np.int64), 0).shape
    spec = pipeline.source.element_spec()
    batch = {k: jax.ShapeDtypeStruct(idx_shape + tuple(v.shape), v.dtype) for k, v in spec.items()}
    return batch, jax.ShapeDtypeStruct(idx_shape, jnp.int32)


def _context(ids: jax.Array) -> BatchContext:
    flat = ids if ids.ndim == 1 else ids[:, 0]
    return BatchContext(flat.astype(jnp.int32), jnp.zeros((), jnp.int32), jnp.ones(flat.shape, bool))


def _node_outputs(program: Any, elements: Element, ctx: BatchContext) -> list[tuple[str, str, Element]]:
    """(name, class name, output) of every stage or DAG node, in execution order."""
    from datarax.pipeline.chain import Chain
    from datarax.pipeline.dag import DagProgram

    outputs = []
    if isinstance(program, Chain):
        for i, stage in enumerate(program.stages):
            elements = stage.apply_batch(elements, ctx)
            outputs.append((str(i), type(stage).__name__, elements))
    elif isinstance(program, DagProgram):
        done: dict[str, Element] = {}
        for name, preds, wants in zip(program.order, program.preds, program._wants):
            inputs = [done[p] for p in preds] if preds else [elements]
            done[name] = program._run_node(name, program.nodes[name], inputs, ctx, wants)
            outputs.append((name, type(program.nodes[name]).__name__, done[name]))
    else:
        outputs.append(("program", type(program).__name__, program(elements, ctx)))
    return outputs


def stage_specs(pipeline) -> list[tuple[str, str, dict]]:
    """(name, class name, output data spec) per stage or DAG node, traced abstractly."""
    batch, ids = _input_batch(pipeline)
    names: list[tuple[str, str]] = []

    def trace(data, record_ids):
        outs = _node_outputs(pipeline.program, Element(dict(data), {}), _context(record_ids))
        names[:] = [(n, c) for n, c, _ in outs]
        return [out.data for _, _, out in outs]

    shapes = jax.eval_shape(trace, batch, ids)
    return [(n, c, s) for (n, c), s in zip(names, shapes)]


def graph_lines(pipeline, stage_names: list[str] | None = None) -> list[str]:
    """The stage graph as indented text: each node under the deepest of its inputs."""
    from datarax.pipeline.dag import DagProgram

    program = pipeline.program
    source = type(pipeline.source).__name__
    lines = [f"  [source] {source}"]
    if isinstance(program, DagProgram):
        depth: dict[str, int] = {}
        for name, preds in zip(program.order, program.preds):
            depth[name] = 1 + max((depth[p] for p in preds), default=0)
            inputs = ", ".join(preds) if preds else "source"
            kind = type(program.nodes[name]).__name__
            sink = "  => output" if name == program.sink else ""
            lines.append(f"  {'   ' * (depth[name] - 1)}└─ {name} ({kind}) <- {inputs}{sink}")
        return lines
    stages = list(getattr(program, "stages", []))
    for i, stage in enumerate(stages):
        label = stage_names[i] if stage_names else str(i)
        tail = "  => output" if i == len(stages) - 1 else ""
        lines.append(f"  {'   ' * i}└─ {label} ({type(stage).__name__}){tail}")
    if not stages:
        lines.append("  └─ (no stages)  => output")
    return lines


def describe(pipeline, *, config_path: str | None = None, stage_labels: list[str] | None = None) -> str:
    """The full `datarax inspect` report for a built pipeline."""
    source = pipeline.source
    out = []
    if config_path:
        out.append(f"config       {config_path}")
    resident = "device-resident" if source.device_arrays() is not None else "host-resident (prefetched)"
    out.append(f"source       {type(source).__name__}: {len(source):,} records, {resident}")
    out.append(f"sampler      {pipeline.sampler.structure()}")
    out.append(f"batches      {len(pipeline):,} per epoch of batch_size {pipeline.batch_size}"
               + (" (drop_remainder)" if pipeline.drop_remainder else ""))
    out.append("element spec (one record)")
    out.extend(spec_lines(source.element_spec()))
    out.append("stage outputs (per process batch)")
    for i, (name, cls, spec) in enumerate(stage_specs(pipeline)):
        label = stage_labels[i] if stage_labels and i < len(stage_labels) else name
        out.append(f"  {label} ({cls})")
        out.extend(spec_lines(spec, "    "))
    out.append("output spec (a full batch)")
    out.extend(spec_lines(pipeline.output_spec()))
    out.append("graph")
    out.extend(graph_lines(pipeline, stage_labels))
    out.append(f"fingerprint  {pipeline.fingerprint}")
    return "\n".join(out)
