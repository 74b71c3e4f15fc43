"""The jitted train and eval steps, over a flat list of variable values.

The step takes the values of every `nnx.Variable` of (model, optimizer[, pipeline]) as one
flat list, donates it, and returns the new list, which is written straight back into the same
`Variable` objects. That keeps the user's modules current after every step (callbacks, eval and
checkpoints see live state) without an NNX graph traversal per step, and lets XLA update the
parameters and optimizer state in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.train.metrics import Metric, add_totals, metric_scalars

RECORD_IDS = "_trainers_record_ids"
EPOCH = "_trainers_epoch"

LossFn = Callable[[nnx.Module, dict], Any]
MetricFn = Callable[[dict, Any], jax.Array] | Metric


class VariableBinding:
    """The `Variable`s of a module tree in a fixed order, read and written without traversal."""

    def __init__(self, root: nnx.Module):
        self.graphdef, state = nnx.split(root)
        self.paths = [path for path, _ in nnx.to_flat_state(state)]
        by_path = {path: v for path, v in nnx.iter_graph(root) if isinstance(v, nnx.Variable)}
        self.variables = [by_path[path] for path in self.paths]
        # Plain array-backed Variables are read and written raw (several times cheaper per step);
        # anything else (e.g. array refs) goes through the full get/set.
        self._raw = all(isinstance(v.get_raw_value(), jax.Array) for v in self.variables)

    def values(self) -> list:
        if self._raw:
            return [v.get_raw_value() for v in self.variables]
        return [v.get_value() for v in self.variables]

    def assign(self, values: list) -> None:
        if self._raw:
            for variable, value in zip(self.variables, values):
                variable.set_raw_value(value)
        else:
            for variable, value in zip(self.variables, values):
                variable.set_value(value)

    def merge(self, values: list) -> nnx.Module:
        """A copy of the root module holding `values` (used inside the traced step)."""
        return nnx.merge(self.graphdef, nnx.from_flat_state(list(zip(self.paths, values))))

    def values_of(self, root: nnx.Module) -> list:
        """The values of a merged copy, in this binding's order."""
        flat = nnx.to_flat_state(nnx.state(root))
        paths = [path for path, _ in flat]
        if paths != self.paths:
            raise RuntimeError(f"the training state changed structure inside the step: {len(paths)} variables "
                               f"after, {len(self.paths)} before; a loss_fn must not add or remove Variables")
        return [v.get_value() if isinstance(v, nnx.Variable) else v for _, v in flat]


class JointModule(nnx.Module):
    """The model and the pipeline, optimised together (the optimizer is built over this)."""

    def __init__(self, model: nnx.Module, pipeline: nnx.Module):
        self.model = model
        self.pipeline = pipeline


class TrainState(nnx.Module):
    """What one train step reads and updates: the trainable module(s) and the optimizer."""

    def __init__(self, trainable: nnx.Module, optimizer: nnx.Optimizer):
        self.trainable = trainable
        self.optimizer = optimizer


def split_loss(out: Any) -> tuple[jax.Array, Any]:
    """A loss function's result as (loss, aux)."""
    if isinstance(out, tuple):
        if len(out) != 2:
            raise ValueError(f"loss_fn must return a scalar loss or (loss, aux), got a tuple of {len(out)}")
        return out
    return out, None


def check_loss(loss: Any) -> jax.Array:
    if getattr(loss, "shape", None) != ():
        raise ValueError(f"loss_fn must return a scalar loss (shape ()), got shape {getattr(loss, 'shape', None)}; "
                         "reduce it with .mean() or .sum()")
    return loss


CLU_STATE = "__clu_collection__"


def is_metric_collection(metrics: Any) -> bool:
    """Whether `metrics` is a CLU `clu.metrics.Collection` subclass (checked by its interface, so
    CLU is not imported here)."""
    return isinstance(metrics, type) and all(hasattr(metrics, name) for name in
                                              ("single_from_model_output", "merge", "compute"))


def model_outputs(batch: Any, aux: Any, loss: jax.Array) -> dict[str, Any]:
    """The keyword arguments a CLU collection's metrics read: the batch's fields, the loss function's
    aux (a dict is spread; anything else is passed as `logits`) and `loss`."""
    outputs = dict(batch) if isinstance(batch, Mapping) else {}
    if isinstance(aux, Mapping):
        outputs.update(aux)
    elif aux is not None:
        outputs["logits"] = aux
    outputs["loss"] = loss
    return outputs


def step_metrics(metric_fns: Any, batch: Any, aux: Any, loss: jax.Array) -> dict[str, Any]:
    """`{"loss": ..., name: value}` from a `{name: fn(batch, aux) or Metric}` mapping or a CLU
    collection; a `datarax.train.metrics.Metric` gives its dict of sums (see `host_metrics`)."""
    metrics = {"loss": loss}
    if is_metric_collection(metric_fns):
        computed = metric_fns.single_from_model_output(**model_outputs(batch, aux, loss)).compute()
        metrics.update({k: jnp.asarray(v, jnp.float32) for k, v in computed.items() if k != "loss"})
    else:
        for name, fn in metric_fns.items():
            if isinstance(fn, Metric):
                metrics[name] = fn.update(batch, aux)
            else:
                metrics[name] = jnp.asarray(fn(batch, aux), jnp.float32)
    return metrics


def host_metrics(out: Mapping[str, Any], metric_fns: Any) -> dict[str, float]:
    """Host floats of one step's metrics: scalars as they are, a `Metric`'s sums through its `compute`."""
    host = jax.device_get(dict(out))
    scalars: dict[str, float] = {}
    for name, value in host.items():
        metric = metric_fns.get(name) if isinstance(metric_fns, Mapping) else None
        if isinstance(metric, Metric):
            scalars.update(metric_scalars(name, metric, add_totals([value])))
        else:
            scalars[name] = float(value)
    return scalars


def make_train_step(binding: VariableBinding, loss_fn: LossFn, metric_fns: Mapping[str, MetricFn] | type,
                    joint: bool) -> Callable:
    """step(values, batch) -> (new values, {"loss": ..., metric: ...}) for `binding`'s TrainState."""

    def step(values, batch):
        state = binding.merge(values)
        batch = dict(batch)
        if joint:
            ids, epoch = batch.pop(RECORD_IDS), batch.pop(EPOCH)

        def objective(trainable):
            if joint:
                model = trainable.model
                data = trainable.pipeline.transform(batch, record_ids=ids, epoch=epoch[0])
            else:
                model, data = trainable, batch
            loss, aux = split_loss(loss_fn(model, data))
            return check_loss(loss), (aux, data)

        (loss, (aux, data)), grads = nnx.value_and_grad(objective, has_aux=True)(state.trainable)
        state.optimizer.update(state.trainable, grads)
        return binding.values_of(state), step_metrics(metric_fns, data, aux, loss)

    return step


def make_eval_step(binding: VariableBinding, loss_fn: LossFn, metric_fns: Mapping[str, MetricFn] | type) -> Callable:
    """step(values, batch) -> {"loss": ..., metric: ...} for `binding`'s model, in eval mode.

    With a CLU collection the step returns `{"loss": ..., CLU_STATE: collection}`, whose
    collections `Trainer.evaluate` merges across batches before computing them (CLU's semantics).
    """

    def step(values, batch):
        model = binding.merge(values)
        model.eval()
        loss, aux = split_loss(loss_fn(model, batch))
        loss = check_loss(loss)
        if is_metric_collection(metric_fns):
            return {"loss": loss, CLU_STATE: metric_fns.single_from_model_output(**model_outputs(batch, aux, loss))}
        return step_metrics(metric_fns, batch, aux, loss)

    return step


def batch_signature(batch: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(batch)
    return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


class TimedJit:
    """`jax.jit` that reports how long each call spent tracing and compiling.

    A call that compiles (a new batch shape, or anything else that misses the jit cache) blocks
    for tracing and compilation; the execution itself is still dispatched asynchronously, so the
    call's host time is the compile time. Misses are detected from the jit cache size where JAX
    exposes it, else from batch shapes not seen before.
    """

    def __init__(self, fn: Callable, donate_values: bool):
        self._jit = jax.jit(fn, donate_argnums=(0,) if donate_values else ())
        self._cache_size = getattr(self._jit, "_cache_size", None)
        self._seen: set = set()

    def __call__(self, values: list, batch: Any) -> tuple[Any, float]:
        if self._cache_size is not None:
            before = self._cache_size()
            start = time.perf_counter()
            out = self._jit(values, batch)
            elapsed = time.perf_counter() - start
            return out, (elapsed if self._cache_size() != before else 0.0)
        sig = batch_signature(batch)
        if sig in self._seen:
            return self._jit(values, batch), 0.0
        start = time.perf_counter()
        out = self._jit(values, batch)
        self._seen.add(sig)
        return out, time.perf_counter() - start
