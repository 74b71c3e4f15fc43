"""The `Trainer`'s argument checks; `check_settings` (the plain values) is shared with the `[trainer]`
table of a configuration file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flax import nnx

from datarax.core.checks import check_bool, check_int
from datarax.pipeline.pipeline import Pipeline
from datarax.train.loop.ema import check_decay
from datarax.train.loop.param_sharding import PARAM_SHARDINGS
from datarax.train.loop.precision import check_precision
from datarax.train.loop.step import is_metric_collection
from datarax.train.metrics.accumulated import Metric


def check_settings(*, accumulate_steps: Any = 1, steps_per_execution: Any = 1, precision: Any = "f32",
                   param_sharding: Any = None, ema_decay: Any = None, allow_config_change: Any = False,
                   train_pipeline_params: Any = False) -> None:
    """Raises the `Trainer`'s error for the first setting that is out of its range."""
    check_bool(train_pipeline_params, "train_pipeline_params")
    check_bool(allow_config_change, "allow_config_change")
    check_int(accumulate_steps, "accumulate_steps", 1, why=" (micro-batches per step)")
    check_int(steps_per_execution, "steps_per_execution", 1, why=" (optimizer steps per jitted call)")
    check_precision(precision)
    if param_sharding is not None and param_sharding not in PARAM_SHARDINGS:
        raise ValueError(f"param_sharding must be one of {PARAM_SHARDINGS} or None, got {param_sharding!r}")
    if ema_decay is not None:
        check_decay(ema_decay)


def check_inputs(model: Any, train_pipeline: Any, loss_fn: Callable, *, eval_pipeline: Any, metrics: Any,
                 eval_every_steps: Any, run_config: Any, **settings: Any) -> Any:
    """Raises the `Trainer`'s error for the first argument it cannot take; returns `metrics` as a dict
    (or the CLU collection class)."""
    if not isinstance(model, nnx.Module):
        raise TypeError(f"model must be an nnx.Module, got {type(model).__name__}")
    for name, value in (("train_pipeline", train_pipeline), ("eval_pipeline", eval_pipeline)):
        if value is not None and not isinstance(value, Pipeline):
            raise TypeError(f"{name} must be a datarax Pipeline, got {type(value).__name__}")
    if train_pipeline is None:
        raise TypeError("train_pipeline must be a datarax Pipeline, got None")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(model, batch), got {loss_fn!r:.80}")
    if not is_metric_collection(metrics):
        if isinstance(metrics, type):
            raise TypeError(f"metrics must be a mapping of name -> fn(batch, aux) or a clu.metrics.Collection "
                            f"subclass, got the class {metrics.__name__}")
        metrics = dict(metrics or {})
        for name, fn in metrics.items():
            if not isinstance(name, str) or not (callable(fn) or isinstance(fn, Metric)) or name == "loss":
                raise TypeError(f"metrics must map names (not 'loss') to fn(batch, aux) or a "
                                f"datarax.train.metrics.accumulated.Metric, got {name!r}: {fn!r:.60}")
    check_settings(**settings)
    accumulate_steps, param_sharding = settings["accumulate_steps"], settings["param_sharding"]
    if train_pipeline.batch_size % accumulate_steps:
        raise ValueError(f"accumulate_steps={accumulate_steps} must divide the training pipeline's batch_size="
                         f"{train_pipeline.batch_size} (each step's batch is split into accumulate_steps equal "
                         "micro-batches); pick a batch_size that is a multiple of accumulate_steps")
    if run_config is not None and not isinstance(run_config, Mapping):
        raise TypeError(f"run_config must be a mapping of the run's settings (e.g. {{'learning_rate': 1e-3}}) or "
                        f"None, got {type(run_config).__name__}")
    if settings["train_pipeline_params"] and getattr(train_pipeline, "sharding", None) is not None:
        raise ValueError("train_pipeline_params=True trains on unsharded batches, but train_pipeline has "
                         f"sharding={train_pipeline.sharding!r}; drop one of the two")
    if param_sharding is not None and getattr(train_pipeline, "sharding", None) is None:
        raise ValueError(f"param_sharding={param_sharding!r} lays the training state out over the training "
                         "pipeline's mesh, but train_pipeline has no sharding; build it with "
                         "Pipeline(..., sharding=DataSharding.data_parallel()) or drop param_sharding")
    if eval_every_steps is not None and eval_pipeline is None:
        raise ValueError(f"eval_every_steps={eval_every_steps!r} needs an eval_pipeline; pass "
                         "eval_pipeline=Pipeline(...) or drop eval_every_steps")
    return metrics
