"""From a configuration file to a `Pipeline` (and, with a `[trainer]` section, a Trainer).

Example:
    >>> from datarax.config import load_pipeline
    >>> pipeline = load_pipeline("experiment.toml")
    >>> for batch in pipeline:
    ...     ...
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Any

from datarax.config import loader
from datarax.config.components import ComponentSpec, Context
from datarax.config.schema import ConfigError, Problems, format_path
from datarax.config.spec import TOP_LEVEL_KEYS, RunSpec, ShardingSection, TrainerSpec, validate

DEFAULT_TRAINER = "trainers:Trainer"
CHECKPOINT_CALLBACK = "trainers.callbacks:CheckpointCallback"


def load_spec(path: str | os.PathLike, *, environ: Mapping[str, str] | None = None,
              overrides: Sequence[str] = ()) -> RunSpec:
    """Reads and validates a configuration file.

    Raises:
        ConfigError: listing every problem found (file, include, override and schema problems).
    """
    problems = Problems(os.fspath(path))
    loaded = loader.load(path, top_level=TOP_LEVEL_KEYS, environ=environ, overrides=overrides, problems=problems)
    if problems.items and not loaded.files:
        problems.raise_if_any()  # nothing could be read at all
    ctx = Context(problems, loaded.base_dir, top_level=TOP_LEVEL_KEYS)
    spec = validate(loaded.raw, ctx, path=os.fspath(path), overrides=loaded.overrides)
    problems.raise_if_any()
    return spec


def _build(spec: ComponentSpec, **extra: Any) -> Any:
    """Constructs a component, turning a constructor's complaint into a one-line ConfigError at its path."""
    try:
        return spec.build(**extra)
    except (TypeError, ValueError, KeyError, FileNotFoundError, ImportError) as exc:
        raise ConfigError([f"{format_path(spec.path)} could not be built: {exc}"]) from exc


def _takes(factory: Any, name: str) -> bool:
    try:
        target = factory.__init__ if isinstance(factory, type) else factory
        return name in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


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


def build_pipeline(spec: RunSpec):
    """The `Pipeline` a validated configuration describes."""
    from datarax.pipeline.pipeline import Pipeline

    run = spec.run
    source = _build(spec.source)
    kwargs: dict[str, Any] = {"drop_remainder": run.drop_remainder, "prefetch": run.prefetch}
    if spec.sampler is not None:
        extra = {"num_records": len(source)} if _takes(spec.sampler.factory, "num_records") else {}
        kwargs["sampler"] = _build(spec.sampler, **extra)
    if spec.sharding is not None:
        kwargs["sharding"] = build_sharding(spec.sharding)
    try:
        if spec.dag is not None:
            nodes = {name: _build(node) for name, node in spec.dag.nodes.items()}
            return Pipeline.from_dag(source=source, nodes=nodes, edges=spec.dag.edges, sink=spec.dag.sink,
                                     batch_size=run.batch_size, **kwargs)
        stages = [_build(stage) for stage in spec.stages]
        return Pipeline(source, stages, run.batch_size, **kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        where = "dag" if spec.dag is not None else "stages"
        raise ConfigError([f"{where}: the pipeline could not be built: {exc}"]) from exc


def load_pipeline(path: str | os.PathLike, *, environ: Mapping[str, str] | None = None,
                  overrides: Sequence[str] = ()):
    """`build_pipeline(load_spec(path, ...))`."""
    return build_pipeline(load_spec(path, environ=environ, overrides=overrides))


@dataclasses.dataclass
class TrainerRun:
    """A built trainer and the target `fit` should reach."""

    trainer: Any
    num_steps: int | None
    num_epochs: int | None
    checkpoint_dir: str | None

    def fit(self):
        return self.trainer.fit(self.num_steps, num_epochs=self.num_epochs)


def _optimizer(trainer: TrainerSpec):
    import optax

    if callable(trainer.optimizer):
        return trainer.optimizer()
    parts = []
    for name, fn, kwargs in trainer.optimizer:
        try:
            parts.append(fn(**kwargs))
        except TypeError as exc:
            raise ConfigError([f"trainer.optimizer.{name} could not be built: {exc}"]) from exc
    return parts[0] if len(parts) == 1 else optax.chain(*parts)


def build_trainer(spec: RunSpec, *, pipeline: Any = None, extra_callbacks: Sequence[Any] = ()) -> TrainerRun:
    """The trainer a configuration's `[trainer]` section describes, over its pipeline.

    With `checkpoint_dir` set, a checkpoint callback restores the newest checkpoint when training
    begins, so running the same configuration again resumes where the last run stopped.
    """
    from flax import nnx

    from datarax.config.registry import import_object

    if spec.trainer is None:
        raise ConfigError(["trainer is missing: add a [trainer] table with model, loss, optimizer and steps "
                           "(see docs/config.md)"], spec.path)
    section = spec.trainer.section
    base_dir = os.path.dirname(os.path.abspath(spec.path))
    pipeline = build_pipeline(spec) if pipeline is None else pipeline
    model_args = dict(section.model_args)
    if _takes(section.model, "rngs") and "rngs" not in model_args:
        model_args["rngs"] = nnx.Rngs(spec.run.seed)
    try:
        model = section.model(**model_args)
    except (TypeError, ValueError) as exc:
        raise ConfigError([f"trainer.model could not be built: {exc}"], spec.path) from exc
    callbacks = [_build(c) for c in spec.trainer.callbacks]
    checkpoint_dir = None
    if section.checkpoint_dir is not None:
        checkpoint_dir = os.path.normpath(os.path.join(base_dir, os.path.expanduser(section.checkpoint_dir)))
        checkpoint = import_object(CHECKPOINT_CALLBACK)
        callbacks.insert(0, checkpoint(checkpoint_dir, every_steps=section.checkpoint_every,
                                       max_to_keep=section.max_to_keep))
    trainer_cls = section.trainer_class or import_object(DEFAULT_TRAINER)
    try:
        trainer = trainer_cls(model, _optimizer(spec.trainer), pipeline, section.loss, metrics=section.metrics,
                              callbacks=[*callbacks, *extra_callbacks],
                              train_pipeline_params=section.train_pipeline_params)
    except (TypeError, ValueError) as exc:
        raise ConfigError([f"trainer could not be built: {exc}"], spec.path) from exc
    return TrainerRun(trainer, section.steps, section.epochs, checkpoint_dir)
