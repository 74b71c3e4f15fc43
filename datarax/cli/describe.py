"""What `datarax inspect` shows: element spec, per-stage output shapes, the graph, the fingerprint.

Shapes come from `jax.eval_shape` over the pipeline's own stages, so nothing is compiled or
run and no data moves; per-stage shapes are per process (before any sharding lays the batch out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.pipeline.compiled import make_context


def spec_text(spec: Any) -> str:
    """`float32 (32, 28, 28, 1)` for a ShapeDtypeStruct (nested dicts joined by commas)."""
    if isinstance(spec, Mapping):
        return ", ".join(f"{k}: {spec_text(v)}" for k, v in spec.items())
    return f"{np.dtype(spec.dtype).name} {tuple(spec.shape)}"


def spec_lines(spec: Mapping[str, Any], indent: str = "  ") -> list[str]:
    width = max((len(k) for k in spec), default=0)
    return [f"{indent}{k:<{width}}  {spec_text(v)}" for k, v in spec.items()]


def _node_outputs(program: Any, elements: Element, ctx: BatchContext) -> list[tuple[str, Any, Element]]:
    """(name, module, output) of every stage or DAG node, in execution order; a program without
    `trace` is one node."""
    trace = getattr(program, "trace", None)
    if trace is None:
        return [("program", program, program(elements, ctx))]
    return list(trace(elements, ctx))


def stage_specs(pipeline) -> list[tuple[str, str, dict]]:
    """(name, class name, output data spec) per stage or DAG node, traced abstractly."""
    batch, ids = pipeline.input_spec()
    names: list[tuple[str, str]] = []

    def outputs(data, record_ids):
        ctx = make_context(record_ids, 0, record_ids.shape[0])
        outs = _node_outputs(pipeline.program, Element(dict(data), {}), ctx)
        names[:] = [(name, type(module).__name__) for name, module, _ in outs]
        return [out.data for _, _, out in outs]

    shapes = jax.eval_shape(outputs, batch, ids)
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
