"""What `datarax inspect` shows: element spec, host stages, per-stage output shapes, the graph, the fingerprint.

Device-stage shapes come from `jax.eval_shape` (nothing compiled or run), per process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.pipeline.compiled import make_context


def spec_text(spec: Any) -> str:
    """`float32 (32, 28, 28, 1)` for a ShapeDtypeStruct (nested dicts joined by commas); an
    encoded field (one bytes or str object per record) is `encoded (bytes or text)`."""
    if isinstance(spec, Mapping):
        return ", ".join(f"{k}: {spec_text(v)}" for k, v in spec.items())
    if np.dtype(spec.dtype) == np.dtype(object):
        return "encoded (bytes or text)" + (f" {tuple(spec.shape)}" if spec.shape else "")
    return f"{np.dtype(spec.dtype).name} {tuple(spec.shape)}"


def settings_text(stage: Any) -> str:
    """A host stage's settings that differ from their defaults (and its function, for a `HostMap`)."""
    parts = []
    fn = getattr(stage, "fn", None)
    if callable(fn):
        parts.append(f"fn={getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}")
    config = getattr(stage, "config", None)
    if dataclasses.is_dataclass(config):
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            default = f.default if f.default is not dataclasses.MISSING else \
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING
            if value != default:
                parts.append(f"{f.name}={value!r}")
    digest = getattr(stage, "tokenizer_hash", None)
    if digest:
        parts.append(f"tokenizer={digest}")
    return ", ".join(parts)


def host_parts(pipeline) -> tuple[Any, list[Any]]:
    """`(the source read, the host stages after it)` of a pipeline."""
    from datarax.host.stage import HostStageSource

    source = pipeline.source
    if isinstance(source, HostStageSource):
        return source.source, list(source.stages)
    return source, []


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


def graph_lines(pipeline, stage_names: list[str] | None = None, host_names: list[str] | None = None) -> list[str]:
    """The stage graph as indented text: host stages in a chain under the source, then each
    device node under the deepest of its inputs."""
    from datarax.pipeline.dag import DagProgram

    program = pipeline.program
    source, hosts = host_parts(pipeline)
    lines = [f"  [source] {type(source).__name__}"]
    for i, stage in enumerate(hosts):
        label = host_names[i] if host_names and i < len(host_names) else f"host {i}"
        lines.append(f"  {'   ' * i}└─ {label} ({type(stage).__name__}, on the host)")
    pad = "   " * len(hosts)
    if isinstance(program, DagProgram):
        depth: dict[str, int] = {}
        for name, preds in zip(program.order, program.preds):
            depth[name] = 1 + max((depth[p] for p in preds), default=0)
            inputs = ", ".join(preds) if preds else ("host stages" if hosts else "source")
            kind = type(program.nodes[name]).__name__
            sink = "  => output" if name == program.sink else ""
            lines.append(f"  {pad}{'   ' * (depth[name] - 1)}└─ {name} ({kind}) <- {inputs}{sink}")
        return lines
    stages = list(getattr(program, "stages", []))
    for i, stage in enumerate(stages):
        label = stage_names[i] if stage_names else str(i)
        tail = "  => output" if i == len(stages) - 1 else ""
        lines.append(f"  {pad}{'   ' * i}└─ {label} ({type(stage).__name__}){tail}")
    if not stages:
        lines.append(f"  {pad}└─ (no device stages)  => output")
    return lines


def _count(source: Any, pipeline: Any) -> tuple[str, str]:
    """(records, batches) as text; a stream of unknown length says so."""
    from datarax.sources.stream import StreamSourceModule

    if isinstance(source, StreamSourceModule) and source.num_records() is None:
        return "a stream of unknown length", "an unknown number (known only after reading an epoch) per epoch"
    return f"{len(source):,} records", f"{len(pipeline):,} per epoch"


def describe(pipeline, *, config_path: str | None = None, stage_labels: list[str] | None = None,
             dag: bool = False) -> str:
    """The full `datarax inspect` report for a built pipeline.

    `stage_labels` names the configuration's stages in order, host stages first (a DAG's nodes
    are named by the DAG itself, so with `dag=True` the labels name only host stages).
    """
    source, hosts = host_parts(pipeline)
    labels = list(stage_labels or [])
    host_labels, device_labels = labels[:len(hosts)], labels[len(hosts):]
    out = []
    if config_path:
        out.append(f"config       {config_path}")
    resident = "device-resident" if pipeline.source.device_arrays() is not None else "host-resident (prefetched)"
    records, batches = _count(pipeline.source, pipeline)
    out.append(f"source       {type(source).__name__}: {records}, {resident}")
    out.append(f"sampler      {pipeline.sampler.structure()}")
    out.append(f"batches      {batches} of batch_size {pipeline.batch_size}"
               + (" (drop_remainder)" if pipeline.drop_remainder else ""))
    out.append("element spec (one record)")
    record = dict(source.element_spec())
    out.extend(spec_lines(record))
    if hosts:
        out.append("host stages (on the background reader; outputs per record)")
        for i, stage in enumerate(hosts):
            label = host_labels[i] if i < len(host_labels) else f"host {i}"
            settings = settings_text(stage)
            out.append(f"  {label} ({type(stage).__name__})" + (f"  {settings}" if settings else ""))
            if getattr(stage, "executor", None) is not None and hasattr(stage.executor, "reason"):
                out.append(f"    runs on {stage.executor}")
            record = stage.output_spec(dict(record))
            out.extend(spec_lines(record, "    "))
    out.append("stage outputs (per process batch)")
    for i, (name, cls, spec) in enumerate(stage_specs(pipeline)):
        label = device_labels[i] if not dag and i < len(device_labels) else name
        out.append(f"  {label} ({cls})")
        out.extend(spec_lines(spec, "    "))
    out.append("output spec (a full batch)")
    out.extend(spec_lines(pipeline.output_spec()))
    out.append("graph")
    out.extend(graph_lines(pipeline, None if dag else device_labels, host_labels))
    out.append(f"fingerprint  {pipeline.fingerprint}")
    return "\n".join(out)
