"""From a configuration file to a `Pipeline` (`datarax.train.config` builds the `[trainer]` part).

Example:
    >>> from datarax.config import load_pipeline
    >>> pipeline = load_pipeline("experiment.toml", allow=["my_transforms"])
    >>> for batch in pipeline:
    ...     ...
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from datarax.config import files, loader, sizes
from datarax.config.allow import AllowList
from datarax.config.components import ComponentSpec, Context, parameters_of
from datarax.config.schema import ConfigError, Problems, format_path
from datarax.config.spec import TOP_LEVEL_KEYS, RunSpec, ShardingSection, validate


def load_spec(path: str | os.PathLike, *, environ: Mapping[str, str] | None = None,
              overrides: Sequence[str] = (), allow: Sequence[str] = (), pipeline_only: bool = False) -> RunSpec:
    """Reads and validates a configuration file.

    Args:
        path: the TOML file.
        environ: where `DATARAX_<KEY>` overrides are read (default `os.environ`).
        overrides: `key.path=value` overrides, applied last.
        allow: modules the file's import paths may name, added to the file's own `allow` list.
        pipeline_only: leave a table whose package is not loaded (`[trainer]` without
            `datarax.train`) unchecked rather than an error.

    Raises:
        ConfigError: listing every problem found.
    """
    problems = Problems(os.fspath(path))
    if isinstance(allow, str):
        allow = [allow]
    try:
        allowed = AllowList(tuple(allow))
    except ValueError as exc:
        raise ConfigError([f"allow= {exc}"], os.fspath(path)) from None
    loaded = loader.load(path, top_level=TOP_LEVEL_KEYS, environ=environ, overrides=overrides, problems=problems)
    if problems.items and not loaded.files:
        problems.raise_if_any()  # nothing could be read at all
    ctx = Context(problems, loaded.base_dir, top_level=TOP_LEVEL_KEYS, allow=allowed, pipeline_only=pipeline_only)
    spec = validate(loaded.raw, ctx, path=os.fspath(path), overrides=loaded.overrides)
    problems.raise_if_any()
    return spec


def build_component(spec: ComponentSpec, **extra: Any) -> Any:
    """Constructs a component, turning a constructor's complaint into a one-line ConfigError at its path."""
    try:
        return spec.build(**extra)
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError, FileNotFoundError, ImportError) as exc:
        raise ConfigError([f"{format_path(spec.path)} could not be built: {files.first_line(exc)}"]) from exc


def takes_argument(factory: Any, name: str) -> bool:
    return name in parameters_of(factory)[0]


def build_sharding(section: ShardingSection) -> Any:
    """A `DataSharding` over this process's view of the devices."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from datarax.sharding import DataSharding

    devices = jax.devices()
    shape = section.mesh_shape or (len(devices),)
    size = int(np.prod(shape))
    if size != len(devices):
        raise ConfigError([f"sharding.mesh_shape {list(shape)} needs {size} devices, but JAX sees {len(devices)}; "
                           f"use a shape whose product is {len(devices)} (or leave mesh_shape out)"])
    mesh = Mesh(np.array(devices).reshape(shape), section.axis_names)
    mask_key = section.mask_key if isinstance(section.mask_key, str) else None
    try:
        return DataSharding(mesh, section.batch_axes, mask_key)
    except (TypeError, ValueError) as exc:
        raise ConfigError([f"sharding could not be built: {exc}"]) from exc


def _host_outputs(spec: RunSpec, source: Any, hosts: list[Any]) -> None:
    """Each host stage's output spec from the one before it; a `ConfigError` at the stage that cannot
    take its input (or at `stages`, for encoded source fields without host stages)."""
    from datarax.core.fields import ENCODED

    record = dict(source.element_spec())
    for stage_spec, stage in zip(spec.host_stages, hosts):
        try:
            record = stage.output_spec(dict(record))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError([f"{format_path(stage_spec.path)} cannot take the records of "
                               f"{format_path(spec.source.path)}: {files.first_line(exc)}"]) from exc
    encoded = sorted(k for k, v in record.items() if v.dtype == ENCODED)
    if encoded:
        after = "after the host stages, " if hosts else ""
        raise ConfigError([f"stages: {after}the records of {format_path(spec.source.path)} still hold encoded fields "
                           f"{encoded} (bytes or text), which the compiled stages cannot take; decode them first with "
                           "a host stage at the head of [[stages]]: decode_image = { field = ..., size = 224 }, "
                           "decode_audio = { field = ..., length = 16000 }, tokenize = { field = ..., tokenizer = "
                           "\"tokenizer.json\" } or host_map = { fn = \"pkg.mod:fn\", outputs = [...] }"])


def build_pipeline(spec: RunSpec):
    """The `Pipeline` a validated configuration describes; a problem building the `[eval]` pipeline
    is named under `eval.` (`eval.source.image_folder could not be built: ...`)."""
    try:
        return _build_pipeline(spec)
    except ConfigError as exc:
        if not spec.key_prefix:
            raise
        raise ConfigError([p if p.startswith(spec.key_prefix) else spec.key_prefix + p for p in exc.problems],
                          exc.source) from exc


def _build_pipeline(spec: RunSpec):
    from flax import nnx

    from datarax.pipeline.pipeline import Pipeline

    run = spec.run
    source = build_component(spec.source)
    # The top-level seed is the pipeline's: host stages without a seed of their own draw from it.
    kwargs: dict[str, Any] = {"drop_remainder": run.drop_remainder, "prefetch": run.prefetch,
                              "dispatch_ahead": run.dispatch_ahead, "retry_policy": run.retry_policy,
                              "rngs": nnx.Rngs(run.seed)}
    if spec.sampler is not None:
        extra = {"num_records": len(source)} if takes_argument(spec.sampler.factory, "num_records") else {}
        extra.update({k: files.record_field(source, v) for k, v in spec.sampler.kwargs.items()
                      if isinstance(v, files.FieldRef)})
        kwargs["sampler"] = build_component(spec.sampler, **extra)
    if spec.sharding is not None:
        kwargs["sharding"] = build_sharding(spec.sharding)
    hosts = [build_component(stage) for stage in spec.host_stages]
    _host_outputs(spec, source, hosts)
    sizes.check_batch_fits_epoch(run.batch_size, sizes.epoch_records(source, kwargs.get("sampler")), run.drop_remainder)
    host_resident = source.device_arrays() is None
    held = sizes.held_bytes(source, *hosts)
    sizes.check_memory(run.batch_size, run.prefetch, sizes.spec_bytes(source.element_spec()), host_resident, "read",
                       run.dispatch_ahead, held)
    try:
        if spec.dag is not None:
            nodes = {name: build_component(node) for name, node in spec.dag.nodes.items()}
            pipeline = Pipeline.from_dag(source=source, nodes=nodes, edges=spec.dag.edges, sink=spec.dag.sink,
                                         batch_size=run.batch_size, host_stages=hosts, **kwargs)
        else:
            stages = [build_component(stage) for stage in spec.device_stages]
            pipeline = Pipeline(source, [*hosts, *stages], run.batch_size, **kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        where = "dag" if spec.dag is not None else "stages"
        raise ConfigError([f"{where}: the pipeline could not be built: {files.first_line(exc)}"]) from exc
    # The stages may grow a record (a resize up, a one-hot): check what they output too.
    sizes.check_memory(run.batch_size, run.prefetch, sizes.spec_bytes(pipeline.output_spec()) // run.batch_size,
                       host_resident, "out of the stages", run.dispatch_ahead, held)
    return pipeline


def check_pipeline(spec: RunSpec, short: list[str] | None = None) -> list[Any]:
    """What `datarax validate` builds: the pipeline (and the `[eval]` one), reading files only as far
    as checking needs; `short` gets the training files read short. Returns the pipelines, closed."""
    pipelines = []
    for part in (spec, spec.eval):
        if part is None:
            continue
        with files.probing(part.run.batch_size) as probed:
            pipeline = build_pipeline(part)
        if short is not None and part is spec:
            short.extend(probed)
        close = getattr(pipeline.source, "close", None)
        if close is not None:
            close()
        pipelines.append(pipeline)
    return pipelines


def load_pipeline(path: str | os.PathLike, *, environ: Mapping[str, str] | None = None,
                  overrides: Sequence[str] = (), allow: Sequence[str] = ()):
    """`build_pipeline(load_spec(path, ..., pipeline_only=True))`: the training pipeline of any
    configuration, a `[trainer]` table included, whatever was imported before."""
    return build_pipeline(load_spec(path, environ=environ, overrides=overrides, allow=allow, pipeline_only=True))


