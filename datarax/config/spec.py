"""The schema of a run configuration, and its validation into a `RunSpec`.

The top-level keys (`RunSection`: batch_size, seed, prefetch, ...), a `[source.<name>]` table,
`[[stages]]` (host stages first) or a `[dag]`, optional `[sampler.<name>]`, `[sharding]`, `[eval]`
(overrides of this pipeline, see `eval_table`) and `[trainer]` (validated by `datarax.train` when
it is loaded) tables, `allow = [...]` (the user's modules import paths may name,
`datarax.config.allow`) and `imports = [...]` (allowed modules imported for their side effects
first). docs/config.md has every key and a complete example.
"""

from __future__ import annotations

import dataclasses
import graphlib
from collections.abc import Callable
from typing import Any

from datarax.batching import DISPATCH_AHEAD, check_settings
from datarax.config import registry
from datarax.config.allow import AllowList, NotAllowedError
from datarax.config.components import ComponentSpec, Context, component
from datarax.config.loader import merge_tables
from datarax.config.schema import (
    FieldError,
    Problems,
    build_dataclass,
    check_keys,
    convert,
    field_checked,
    is_table,
    suggestion,
)
from datarax.control.retry import RetryPolicy
from datarax.core.checks import is_int


def check_positive(name: str, value: Any, minimum: int = 1) -> None:
    """`core.checks.is_int` and a lower bound, worded in TOML terms ("an integer") at the key `name`."""
    if value is not None and not (is_int(value) and value >= minimum):
        raise FieldError(name, f"must be an integer >= {minimum}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RunSection:
    """The top-level keys (tables are checked by their own schemas)."""

    source: Any
    batch_size: int = 32
    seed: int = 0
    drop_remainder: bool = False
    prefetch: int = 2
    dispatch_ahead: int = DISPATCH_AHEAD
    epochs: int = 1
    sampler: Any = None
    stages: Any = ()
    dag: Any = None
    sharding: Any = None
    trainer: Any = None
    eval: Any = None
    retry_policy: RetryPolicy | None = None  # a table such as { max_retries = 3, backoff_s = 0.5 }

    def __post_init__(self):
        field_checked(check_settings, batch_size=self.batch_size, drop_remainder=self.drop_remainder,
                      prefetch=self.prefetch, dispatch_ahead=self.dispatch_ahead)
        check_positive("seed", self.seed, 0)
        check_positive("epochs", self.epochs)


# `allow` is read before everything else (it decides what the other tables may import), then
# `imports` (modules imported for their side effects before any component is validated or built).
TOP_LEVEL_KEYS = (*(f.name for f in dataclasses.fields(RunSection)), "allow", "imports")


@dataclasses.dataclass(frozen=True)
class ShardingSection:
    """`[sharding]`: lay batches out over a device mesh (`datarax.sharding.DataSharding`).

    Attributes:
        mesh_shape: devices per mesh axis; default one axis over every device.
        axis_names: the mesh axes' names.
        batch_axes: the axis (or axes) the batch is split over; default the first.
        mask_key: the validity-mask field of padded final batches; false for none (then
            `drop_remainder = true` is required).
    """

    mesh_shape: tuple[int, ...] | None = None
    axis_names: tuple[str, ...] = ("data",)
    batch_axes: str | tuple[str, ...] | None = None
    mask_key: str | bool = "mask"

    def __post_init__(self):
        if self.mesh_shape is not None:
            if not all(is_int(n) and n >= 1 for n in self.mesh_shape):
                raise FieldError("mesh_shape", f"must hold positive integers, got {list(self.mesh_shape)}")
            if len(self.mesh_shape) != len(self.axis_names):
                raise FieldError("axis_names", f"must name every mesh axis: mesh_shape {list(self.mesh_shape)} has "
                                               f"{len(self.mesh_shape)} axes, axis_names {list(self.axis_names)}")
        if self.mask_key is True:
            raise FieldError("mask_key", "must be a field name or false, got true")
        axes = (self.batch_axes,) if isinstance(self.batch_axes, str) else self.batch_axes or ()
        for axis in axes:
            if axis not in self.axis_names:
                raise FieldError("batch_axes", f"names axis {axis!r}{suggestion(axis, self.axis_names)}; the mesh axes "
                                               f"are {list(self.axis_names)}")


@dataclasses.dataclass
class DagSpec:
    nodes: dict[str, ComponentSpec]
    edges: dict[str, list[str]]
    sink: str


@dataclasses.dataclass
class RunSpec:
    """A validated configuration: everything resolved and checked, nothing constructed yet."""

    run: RunSection
    source: ComponentSpec
    sampler: ComponentSpec | None
    stages: list[ComponentSpec]
    dag: DagSpec | None
    sharding: ShardingSection | None
    trainer: Any  # a `datarax.train.config.TrainerSpec` when the kit validated a [trainer] table
    path: str
    overrides: list[str]
    allow: AllowList = dataclasses.field(default_factory=AllowList)
    eval: RunSpec | None = None  # the evaluation pipeline, when the file has an [eval] table
    key_prefix: str = ""  # "eval." for the [eval] pipeline: where its keys sit in the file

    @property
    def host_stages(self) -> list[ComponentSpec]:
        """The leading host stages of `stages` (they run on the background reader)."""
        out = []
        for stage in self.stages:
            if stage.kind != "host_stage":
                break
            out.append(stage)
        return out

    @property
    def device_stages(self) -> list[ComponentSpec]:
        """The stages after the host stages (the compiled program)."""
        return self.stages[len(self.host_stages):]


def _stages(value: Any, ctx: Context) -> list[ComponentSpec]:
    if not isinstance(value, (list, tuple)):
        ctx.problems.add(("stages",), f"must be an array of stage tables ([[stages]] blocks), got {value!r}")
        return []
    specs = [component(stage, "stage", ("stages", i), ctx) for i, stage in enumerate(value)]
    first_device = next((i for i, s in enumerate(specs) if s is not None and s.kind != "host_stage"), None)
    for i, stage in enumerate(specs):
        if stage is not None and stage.kind == "host_stage" and first_device is not None and i > first_device:
            device = specs[first_device]
            ctx.problems.add(stage.path, f"is a host stage after the device stage stages[{first_device}] "
                                         f"({device.name}); host stages run on the background reader before the "
                                         f"compiled program, so move it above stages[{first_device}]")
    return specs


def _dag(value: Any, ctx: Context) -> DagSpec | None:
    problems, path = ctx.problems, ("dag",)
    if not is_table(value):
        problems.add(path, f"must be a table with sink and nodes, got {value!r}")
        return None
    check_keys(value, ("sink", "nodes"), path, problems)
    nodes_table = value.get("nodes")
    if not is_table(nodes_table) or not nodes_table:
        problems.add((*path, "nodes"), "must be a table of named nodes ([dag.nodes.<name>] blocks), got "
                                       f"{nodes_table!r}")
        return None
    names = list(nodes_table)
    nodes, edges = {}, {}
    for name, node in nodes_table.items():
        here = (*path, "nodes", name)
        inputs = node.get("inputs", []) if is_table(node) else []
        inputs = convert(inputs, list[str], (*here, "inputs"), problems) or []
        for i, pred in enumerate(inputs):
            if pred not in names:
                problems.add((*here, "inputs", i), f"names unknown node {pred!r}{suggestion(pred, names)} (nodes: "
                                                   f"{', '.join(names)}; inputs = [] reads the source batch)")
        edges[name] = inputs
        nodes[name] = component(node, "stage", here, ctx, extra_keys=("inputs",))
        if nodes[name] is not None and nodes[name].kind == "host_stage":
            problems.add(nodes[name].path, "is a host stage, which cannot be a DAG node (a DAG runs in the compiled "
                                           "program); list host stages in [[stages]], where they run before the DAG")
            nodes[name] = None
    sink = value.get("sink")
    if not isinstance(sink, str):
        problems.add((*path, "sink"), f"must name the node whose output is the batch, got {sink!r}")
    elif sink not in names:
        problems.add((*path, "sink"), f"names unknown node {sink!r}{suggestion(sink, names)} "
                                      f"(nodes: {', '.join(names)})")
    try:
        graphlib.TopologicalSorter({n: [p for p in e if p in names] for n, e in edges.items()}).prepare()
    except graphlib.CycleError as exc:
        cycle = " -> ".join(reversed(exc.args[1]))
        problems.add((*path, "nodes"), f"form a cycle ({cycle}); a node cannot consume its own output")
    else:
        if isinstance(sink, str) and sink in names:
            feeding, todo = {sink}, [sink]
            while todo:
                for pred in edges[todo.pop()]:
                    if pred in names and pred not in feeding:
                        feeding.add(pred)
                        todo.append(pred)
            for name in names:
                if name not in feeding:
                    problems.add((*path, "nodes", name), f"does not lead to the sink {sink!r}, so its output would "
                                                         "be discarded; list it in a downstream node's inputs or "
                                                         "remove it")
    return DagSpec(nodes, edges, sink) if isinstance(sink, str) else None


SectionValidator = Callable[[Any, Context], Any]
_SECTIONS: dict[str, SectionValidator] = {}


def register_section(name: str, validate_section: SectionValidator) -> None:
    """Lets a package above datarax (the training kit) validate one top-level table.

    `datarax.train` registers `[trainer]` when imported, so `datarax.config` never names the kit.

    Args:
        name: the top-level key (it must already be one of `TOP_LEVEL_KEYS`).
        validate_section: `(value, ctx) -> spec or None`, reporting problems to `ctx.problems`.
    """
    if name not in TOP_LEVEL_KEYS:
        raise ValueError(f"section {name!r} is not a top-level key; choose from {list(TOP_LEVEL_KEYS)}")
    _SECTIONS[name] = validate_section


def _section(name: str, value: Any, ctx: Context) -> Any:
    if name not in _SECTIONS and ctx.pipeline_only:
        return None  # `load_pipeline` builds nothing from this table; `datarax validate` checks it
    if name not in _SECTIONS:
        ctx.problems.add((name,), "is validated by a package that is not loaded; import it first "
                                  "(`import datarax.train` for [trainer]; the datarax command line does)")
        return None
    return _SECTIONS[name](value, ctx)


def _imports(value: Any, ctx: Context) -> None:
    """Imports each module of the file's `imports` list, in order, when the allow-list permits it."""
    names = convert(value, list[str], ("imports",), ctx.problems)
    for i, name in enumerate(names or ()):
        try:
            registry.import_module(name, ctx.search_dirs, ctx.allow)
        except NotAllowedError as exc:
            ctx.problems.add(("imports", i), str(exc))
        except (ImportError, ValueError) as exc:
            ctx.problems.add(("imports", i), f"names {name!r}, which cannot be imported: {exc}")
        except Exception as exc:  # the module raised while importing; show what, keep validating
            ctx.problems.add(("imports", i), f"names {name!r}, whose module raised {type(exc).__name__} on import: "
                                             f"{exc}")


def _allow(value: Any, ctx: Context) -> None:
    """Adds the file's `allow` entries to `ctx.allow` (the caller's own entries stay)."""
    names = convert(value, list[str], ("allow",), ctx.problems)
    if names is None:
        return
    for i, name in enumerate(names):
        try:
            ctx.allow = ctx.allow.extended([name])
        except ValueError as exc:
            ctx.problems.add(("allow", i), str(exc))


# The keys an [eval] table may override: the pipeline's, not the run's (epochs, trainer, allow).
EVAL_KEYS = ("source", "sampler", "stages", "dag", "sharding", "batch_size", "seed", "drop_remainder", "prefetch",
             "dispatch_ahead")


def eval_table(raw: dict[str, Any], ctx: Context) -> dict[str, Any] | None:
    """The evaluation pipeline's configuration: `[eval]` merged over the training pipeline's keys.

    Tables merge as for includes; the source reads in stored order and `sampler` and
    `drop_remainder` are not inherited unless `[eval]` sets them (docs/config.md, "Evaluation").
    """
    value = raw["eval"]
    if not is_table(value):
        ctx.problems.add(("eval",), f"must be a table of pipeline keys to override, e.g. [eval.source.hf] with "
                                    f"files = [\"test.parquet\"], got {value!r}")
        return None
    check_keys(value, EVAL_KEYS, ("eval",), ctx.problems)
    out = {k: v for k, v in raw.items() if k in EVAL_KEYS and k not in ("sampler", "drop_remainder")}
    if "stages" in value:
        out.pop("dag", None)
    for key in ("stages", "dag", "sampler", "batch_size", "seed", "drop_remainder", "prefetch", "dispatch_ahead"):
        if key in value:
            out[key] = value[key]
    if "sharding" in value:
        out["sharding"] = merge_tables(out.get("sharding", {}), value["sharding"]) \
            if is_table(value["sharding"]) and is_table(out.get("sharding")) else value["sharding"]
    train_source, eval_source = out.get("source"), value.get("source")
    if eval_source is not None:
        same = is_table(train_source) and is_table(eval_source) and len(train_source) == 1 and \
            list(train_source) == list(eval_source)
        out["source"] = merge_tables(train_source, eval_source) if same else eval_source
    source = out.get("source")
    if is_table(source) and len(source) == 1:
        (name, params), = source.items()
        given = eval_source.get(name, {}) if is_table(eval_source) else {}
        entry = registry.discover("source")[0].get(name)
        takes_shuffle = entry is not None and entry.config_cls is not None and \
            "shuffle" in {f.name for f in dataclasses.fields(entry.config_cls)}
        if takes_shuffle and is_table(params) and not (is_table(given) and "shuffle" in given):
            out["source"] = {name: {**params, "shuffle": False}}
    return out


def _eval(raw: dict[str, Any], ctx: Context, path: str) -> RunSpec | None:
    """The `[eval]` pipeline, validated; its problems are reported under `eval.` unless the same
    problem was already reported for the training pipeline (a key both inherit)."""
    table = eval_table(raw, ctx)
    if table is None:
        return None
    own = Problems(ctx.problems.source)
    spec = validate(table, dataclasses.replace(ctx, problems=own, root=table), path=path)
    spec.key_prefix = "eval."
    seen = set(ctx.problems.items)
    ctx.problems.items.extend(f"eval.{item}" for item in own.items if item not in seen)
    return spec


def validate(raw: dict[str, Any], ctx: Context, *, path: str = "<config>",
             overrides: list[str] | None = None) -> RunSpec:
    """Checks a loaded configuration; every problem goes to `ctx.problems` (the caller raises)."""
    problems = ctx.problems
    ctx.root = raw
    if "allow" in raw:
        _allow(raw["allow"], ctx)
    if "imports" in raw:
        _imports(raw["imports"], ctx)
    tables = {k: raw[k] for k in ("source", "sampler", "stages", "dag", "sharding", "trainer", "eval") if k in raw}
    scalars = {k: v for k, v in raw.items() if k not in tables and k not in ("allow", "imports")}
    if "source" not in raw:
        problems.add(("source",), "is required but missing: add a [source.<name>] table, e.g. [source.memory] "
                                  "with data = \"package.module:function\"")
    run = build_dataclass(RunSection, {"source": raw.get("source"), **scalars}, (), problems)
    if run is not None:
        ctx.seed = run.seed
    source = component(raw["source"], "source", ("source",), ctx) if "source" in raw else None
    sampler = component(raw["sampler"], "sampler", ("sampler",), ctx, filled=("num_records",)) \
        if "sampler" in raw else None
    stages = _stages(raw["stages"], ctx) if "stages" in raw else []
    dag = _dag(raw["dag"], ctx) if "dag" in raw else None
    device = [s for s in stages if s is not None and s.kind != "host_stage"]
    if device and "dag" in raw:
        problems.add(("dag",), f"cannot be combined with device stages (stages[{stages.index(device[0])}] "
                               f"{device[0].name}); describe the compiled part with one of them (with a [dag], "
                               "stages may hold only host stages, which run before it)")
    sharding = None
    if "sharding" in raw:
        if is_table(raw["sharding"]):
            sharding = build_dataclass(ShardingSection, raw["sharding"], ("sharding",), problems)
        else:
            problems.add(("sharding",), f"must be a table, got {raw['sharding']!r}")
    evaluation = _eval(raw, ctx, path) if "eval" in raw else None
    trainer = _section("trainer", raw["trainer"], ctx) if "trainer" in raw else None
    return RunSpec(run, source, sampler, stages, dag, sharding, trainer, path, overrides or [], ctx.allow, evaluation)
