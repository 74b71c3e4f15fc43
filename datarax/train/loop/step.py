"""The jitted train and eval steps, over a flat list of variable values.

The step takes the values of every `nnx.Variable` of (model, optimizer[, pipeline]) as one flat
list, donates it, and returns the new list, which `VariableBinding` writes straight back into the
same `Variable` objects. `nnx.jit` would traverse the module graph on every call; this keeps the
user's modules current after every step (callbacks, evaluation and checkpoints see live state)
without that traversal, and lets XLA update the parameters and optimizer state in place. The
consequence: an array taken from the model during training is deleted by the next step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.train.loop.ema import ParamEMA
from datarax.train.loop.guard import GUARD, GuardState, StepGuardConfig, check_step, guard_positions
from datarax.train.loop.masking import masked_mean, per_record, per_record_metrics, record_mask, takes_mask
from datarax.train.loop.precision import (
    LossScale,
    all_finite,
    cast_floats,
    compute_dtype,
    float32_outputs,
    keep_if,
    next_scale,
    restore_dtypes,
)
from datarax.train.metrics.accumulated import Metric, add_totals, metric_scalars

RECORD_IDS = "_trainers_record_ids"
EPOCH = "_trainers_epoch"
RECORDS = "__records__"  # an eval step's count of valid records (a batch with skipped ones)

CHANGED_STRUCTURE = "the training state changed structure inside the step"
NO_NEW_VARIABLES = "a loss_fn must not add or remove Variables"

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
            raise RuntimeError(f"{CHANGED_STRUCTURE}: {len(paths)} variables after, {len(self.paths)} before; "
                               f"{NO_NEW_VARIABLES}")
        return [v.get_value() if isinstance(v, nnx.Variable) else v for _, v in flat]


class JointModule(nnx.Module):
    """The model and the pipeline, optimised together (the optimizer is built over this)."""

    def __init__(self, model: nnx.Module, pipeline: nnx.Module):
        self.model = model
        self.pipeline = pipeline


class TrainState(nnx.Module):
    """What one train step reads and updates: the trainable module(s), the optimizer, and when
    switched on the parameters' moving average, the float16 loss scale and the bad-step guard."""

    def __init__(self, trainable: nnx.Module, optimizer: nnx.Optimizer, *, ema: ParamEMA | None = None,
                 loss_scale: LossScale | None = None, guard: GuardState | None = None):
        self.trainable = trainable
        self.optimizer = optimizer
        self.ema = ema
        self.loss_scale = loss_scale
        self.guard = guard


def split_loss(out: Any) -> tuple[jax.Array, Any]:
    """A loss function's result as (loss, aux)."""
    if isinstance(out, tuple):
        if len(out) != 2:
            raise ValueError(f"loss_fn must return a scalar loss or (loss, aux), got a tuple of {len(out)}")
        return out
    return out, None


def check_loss(loss: Any, rows: int | None = None) -> jax.Array:
    """`loss` as a scalar: a scalar as it is, one loss per record (shape `(rows,)`) averaged."""
    shape = getattr(loss, "shape", None)
    if rows is not None and shape == (rows,):
        return loss.mean()
    if shape != ():
        per_record = f" or one loss per record (shape ({rows},))" if rows is not None else ""
        raise ValueError(f"loss_fn must return a scalar loss (shape ()){per_record}, got shape {shape}; "
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


def step_outputs(metric_fns: Any, batch: Any, aux: Any, loss: jax.Array, mask: jax.Array | None = None
                 ) -> dict[str, Any]:
    """`{"loss": ..., name: value}` of one batch before any reduction: a function's scalar, a
    `datarax.train.metrics.accumulated.Metric`'s dict of sums, or for a CLU collection `{CLU_STATE: collection}`.
    With a `mask` of valid records (`datarax.train.loop.masking`), over those records only."""
    if is_metric_collection(metric_fns):
        outputs = model_outputs(batch, aux, loss)
        if mask is not None:
            outputs["mask"] = mask
        return {"loss": loss, CLU_STATE: metric_fns.single_from_model_output(**outputs)}
    if mask is not None:
        return {"loss": loss, **per_record_metrics(metric_fns, batch, aux, mask, lambda fn: isinstance(fn, Metric))}
    metrics = {"loss": loss}
    for name, fn in metric_fns.items():
        metrics[name] = fn.update(batch, aux) if isinstance(fn, Metric) else jnp.asarray(fn(batch, aux), jnp.float32)
    return metrics


def computed(out: dict[str, Any]) -> dict[str, Any]:
    """A train step's metrics: a CLU collection replaced by its `compute()`."""
    out = dict(out)
    collection = out.pop(CLU_STATE, None)
    if collection is not None:
        out.update({k: jnp.asarray(v, jnp.float32) for k, v in collection.compute().items() if k != "loss"})
    return out


def batch_loss(loss_fn: LossFn, model: nnx.Module, data: Any, mask: jax.Array | None, dtype: Any
               ) -> tuple[jax.Array, Any]:
    """`(loss, aux)` of one (micro-)batch in float32: `loss_fn(model, data)`, or with a `mask` of
    valid records the loss over those only (`loss_fn(model, data, mask)` when it takes one, else
    per record; `datarax.train.loop.masking`)."""
    with float32_outputs(model, dtype):  # the loss in float32, whatever the compute dtype
        if mask is None:
            loss, aux = split_loss(loss_fn(model, data))
        elif takes_mask(loss_fn):
            loss, aux = split_loss(loss_fn(model, data, mask=mask))
        else:
            losses, aux = per_record(loss_fn, model, data, split_loss)
            return masked_mean(losses, mask), aux
    rows = batch_rows_of(data)
    if mask is not None and getattr(loss, "shape", None) == (rows,):  # per-record losses: the valid rows' mean
        return masked_mean(loss.astype(jnp.float32), mask), aux
    return check_loss(loss, rows).astype(jnp.float32), aux


def batch_rows_of(data: Any) -> int | None:
    """The leading axis of a batch's fields (None for a batch with no arrays)."""
    leaves = [x for x in jax.tree.leaves(data) if getattr(x, "ndim", 0)]
    return leaves[0].shape[0] if leaves else None


def combine_micro_batches(stacked: dict[str, Any], metric_fns: Any, k: int, weights: jax.Array | None = None
                          ) -> dict[str, Any]:
    """One step's metrics from the `step_outputs` of its k equal micro-batches (stacked on axis 0):
    the loss and metric functions averaged (a per-record mean of the whole batch; with `weights`,
    each micro-batch's share of the batch's valid records, their weighted sum), a `Metric`'s sums
    added, CLU collections merged before `compute()`."""
    out = {}
    for name, value in stacked.items():
        if name == CLU_STATE:
            merged = jax.tree.map(lambda x: x[0], value)
            for i in range(1, k):
                merged = merged.merge(jax.tree.map(lambda x, i=i: x[i], value))
            out[CLU_STATE] = merged
        elif isinstance(metric_fns, Mapping) and isinstance(metric_fns.get(name), Metric):
            out[name] = jax.tree.map(lambda x: x.sum(axis=0), value)
        elif weights is not None:
            out[name] = (value * weights).sum(axis=0)
        else:
            out[name] = value.mean(axis=0)
    return computed(out)


def split_batch(batch: Any, k: int) -> Any:
    """`batch` with every leaf's leading axis of n rows split into (k, n // k) micro-batches."""

    def split(x):
        rows = x.shape[0] if getattr(x, "ndim", 0) else None
        if rows is None or rows % k:
            raise ValueError(f"accumulate_steps={k} splits each batch into {k} micro-batches, but a batch field "
                             f"has {rows if rows is not None else 'no'} rows (shape {getattr(x, 'shape', ())}); "
                             "use a batch_size divisible by accumulate_steps and drop_remainder=True")
        return x.reshape(k, rows // k, *x.shape[1:])

    return jax.tree.map(split, batch)


# Micro-batches traced one after the other (no loop) up to this many on the CPU: XLA:CPU runs the
# convolutions and matmuls of a loop body (a `lax.scan`'s while loop, unrolled or not) many times
# slower than the same ops outside a loop (a CNN step: 5.6 s against 0.18 s for two micro-batches;
# `python -m benchmarks accumulate`). Past it the program would grow too large to compile quickly.
MAX_TRACED_MICRO_BATCHES = 16


def accumulate(micro_step: Callable, carry: Any, micro_batches: Any, k: int) -> tuple[Any, Any]:
    """`jax.lax.scan(micro_step, carry, micro_batches)`, traced as k calls in a row on the CPU
    (for k up to `MAX_TRACED_MICRO_BATCHES`) and as the scan elsewhere (the TPU runs it well)."""
    if jax.default_backend() != "cpu" or k > MAX_TRACED_MICRO_BATCHES:
        return jax.lax.scan(micro_step, carry, micro_batches)
    outs = []
    for i in range(k):
        carry, out = micro_step(carry, jax.tree.map(lambda x, i=i: x[i], micro_batches))
        outs.append(out)
    return carry, jax.tree.map(lambda *xs: jnp.stack(xs), *outs)


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


class HostMetrics(MutableMapping):
    """Host floats of one step's metrics, read from the device the first time they are used.

    The trainer hands every callback the previous call's metrics in this form: looking at them
    (`logs.metrics["loss"]`, `dict(logs.metrics)`, `if logs.metrics:`) waits for that call's result
    and copies it to the host once; a callback that does not look costs nothing. Values set before
    the read (`metrics["learning_rate"] = x`, `x` possibly a device scalar) are read with it.
    """

    def __init__(self, out: Mapping[str, Any] | None = None, metric_fns: Any = None):
        self._out, self._metric_fns = out, metric_fns
        self._values: dict[str, float] | None = None if out is not None else {}
        self._added: dict[str, Any] = {}

    @property
    def is_read(self) -> bool:
        """Whether the values are on the host already (reading them costs no wait)."""
        return self._values is not None and not self._added

    def read(self) -> dict[str, float]:
        """The values (read from the device now if they were not yet)."""
        if self._values is None:
            self._values = host_metrics(self._out, self._metric_fns)
            self._out = None
        if self._added:
            added, self._added = jax.device_get(self._added), {}
            self._values.update({name: float(value) for name, value in added.items()})
        return self._values

    def __getitem__(self, name: str) -> float:
        return self.read()[name]

    def __setitem__(self, name: str, value: Any) -> None:
        if self._values is None:
            self._added[name] = value
        else:
            self._values[name] = float(value)

    def __delitem__(self, name: str) -> None:
        del self.read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.read())

    def __len__(self) -> int:
        return len(self.read())

    def __repr__(self) -> str:
        return f"HostMetrics({self.read()!r})" if self.is_read else "HostMetrics(<not read yet>)"


def make_train_step(binding: VariableBinding, loss_fn: LossFn, metric_fns: Mapping[str, MetricFn] | type,
                    joint: bool, *, accumulate_steps: int = 1, precision: str = "f32",
                    guard: StepGuardConfig | None = None) -> Callable:
    """step(values, batch) -> (new values, {"loss": ..., metric: ...}) for `binding`'s TrainState.

    The gradient is taken with respect to the trainable module's `nnx.Param`s; the rest of its state
    (RNG counts, batch statistics) is threaded through the forward pass. With `accumulate_steps=k`
    the batch is split into k micro-batches that a `jax.lax.scan` (or, on the CPU for small k, a
    traced sequence) runs one after the other, adding their gradients; the optimizer then applies
    their mean once, so a per-record mean loss gets the gradient of the whole batch. `precision`
    casts parameters and float inputs inside the loss (`datarax.train.loop.precision`); the
    TrainState's `ema` and `loss_scale`, when present, are updated after the optimizer. With a
    `guard` (the TrainState's `guard` then holds its `GuardState`) a bad step's update is dropped
    inside the step (`datarax.train.loop.guard`) and its verdict returned under `GUARD`.
    """
    dtype = compute_dtype(precision)
    kept = [a or b for a, b in zip((path[0] == "loss_scale" for path in binding.paths), guard_positions(binding.paths))]

    def forward(module, batch, valid_total):
        """(objective, loss, aux, data, mask, weight): the loss to differentiate (over valid
        records: their sum over all of the step's valid records), the (micro-)batch's loss, and its
        share `weight` of the step (None without skipped records)."""
        batch = dict(batch)
        if joint:
            ids, epoch = batch.pop(RECORD_IDS), batch.pop(EPOCH)
            model, data = module.model, module.pipeline.transform(batch, record_ids=ids, epoch=epoch[0])
        else:
            model, data = module, batch
        mask = record_mask(data) if valid_total is not None else None
        loss, aux = batch_loss(loss_fn, model, data, mask, dtype)
        if mask is None:
            return loss, loss, aux, data, None, None
        weight = mask.sum() / valid_total
        return loss * weight, loss, aux, data, mask, weight

    def step(values, batch):
        state = binding.merge(values)
        graphdef, params, rest = nnx.split(state.trainable, nnx.Param, ...)
        scale = state.loss_scale.scale.get_value() if state.loss_scale is not None else None
        mask = record_mask(batch)  # records a host stage skipped: out of the loss and metrics
        valid_total = None if mask is None else jnp.maximum(mask.sum(), 1).astype(jnp.float32)

        def objective(params, rest, batch):
            # copy=True: `rest` holds the Variables of the step's own trace; a BatchNorm in train
            # mode writes its statistics inside this (grad) trace, which flax refuses on those.
            module = nnx.merge(graphdef, cast_floats(params, dtype), rest, copy=True)
            value, loss, aux, data, micro_mask, weight = forward(module, cast_floats(batch, dtype), valid_total)
            _, new_params, new_rest = nnx.split(module, nnx.Param, ...)
            if jax.tree.structure((new_params, new_rest)) != jax.tree.structure((params, rest)):
                raise RuntimeError(f"{CHANGED_STRUCTURE} (in the forward pass); {NO_NEW_VARIABLES}")
            new_rest = restore_dtypes(new_rest, rest)
            return (value if scale is None else value * scale), (loss, aux, data, micro_mask, weight, new_rest)

        grad_fn = jax.value_and_grad(objective, has_aux=True)
        if accumulate_steps == 1:
            (_, (loss, aux, data, micro_mask, _, rest)), grads = grad_fn(params, rest, batch)
            metrics = computed(step_outputs(metric_fns, data, aux, loss, micro_mask))
        else:
            def micro_step(carry, micro):
                rest, total = carry
                (_, (loss, aux, data, micro_mask, weight, rest)), grads = grad_fn(params, rest, micro)
                outs = step_outputs(metric_fns, data, aux, loss, micro_mask)
                return (rest, jax.tree.map(jnp.add, total, grads)), (outs, weight)

            zeros = jax.tree.map(jnp.zeros_like, params)
            (rest, total), (outs, weights) = accumulate(micro_step, (rest, zeros),
                                                        split_batch(batch, accumulate_steps), accumulate_steps)
            # Without skipped records each micro-batch is a k-th of the batch; with them each was
            # already weighted by its share of the valid records (`forward`).
            grads = jax.tree.map(lambda g: g / accumulate_steps, total) if mask is None else total
            metrics = combine_micro_batches(outs, metric_fns, accumulate_steps, weights)
        if scale is not None:
            grads = jax.tree.map(lambda g: g / scale, grads)
        applies = None
        if state.guard is not None:
            applies, metrics[GUARD] = check_step(state.guard, guard, metrics["loss"], grads, check_grads=scale is None)
        nnx.update(state.trainable, rest)
        state.optimizer.update(state.trainable, grads)
        if state.ema is not None:
            state.ema.update(state.trainable.model if joint else state.trainable)
        if scale is not None:
            # A step with non-finite gradients changes nothing but the scale: it is skipped and retried smaller.
            finite = all_finite(grads)
            new_scale, good = next_scale(scale, state.loss_scale.good_steps.get_value(), finite)
            state.loss_scale.scale.set_value(new_scale)
            state.loss_scale.good_steps.set_value(good)
            applies = finite if applies is None else applies & finite
            metrics = {**metrics, "loss_scale": scale}
        if applies is None:
            return binding.values_of(state), metrics
        return keep_if(applies, binding.values_of(state), list(values), always=kept), metrics

    return step


def scan_steps(step: Callable) -> Callable:
    """steps(values, batches) -> (new values, the last step's metrics): `step` applied to each of a
    sequence of equally shaped batches in turn, in one program.

    The batches are stacked inside the program and a `jax.lax.scan` carries the state through them:
    one dispatch for K steps, a compile time that does not grow with K, and the state materialised
    between steps as between separate calls. Unrolled steps (Keras' JAX trainer) let XLA fuse one
    step's optimizer update into the next and compile K times the program. The CPU backend compiles
    a convolution inside a loop body with a generic emitter (the vision recipe's CNN step ran about
    14x slower), so on the CPU keep `steps_per_execution=1` for convolutional models.
    """

    def steps(values, batches):
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *batches)
        values, outs = jax.lax.scan(step, values, stacked)
        return values, jax.tree.map(lambda x: x[-1], outs)

    return steps


def make_eval_step(binding: VariableBinding, loss_fn: LossFn, metric_fns: Mapping[str, MetricFn] | type,
                   precision: str = "f32") -> Callable:
    """step(values, batch) -> {"loss": ..., metric: ...} for `binding`'s model, in eval mode, in the
    precision policy's compute dtype.

    With a CLU collection the step returns `{"loss": ..., CLU_STATE: collection}`, whose
    collections `Trainer.evaluate` merges across batches before computing them (CLU's semantics).
    """
    dtype = compute_dtype(precision)

    def step(values, batch):
        graphdef, params, rest = nnx.split(binding.merge(values), nnx.Param, ...)
        model = nnx.merge(graphdef, cast_floats(params, dtype), rest)
        model.eval()
        mask = record_mask(batch)  # records a host stage skipped: out of the loss and metrics
        loss, aux = batch_loss(loss_fn, model, cast_floats(batch, dtype), mask, dtype)
        out = step_outputs(metric_fns, batch, aux, loss, mask)
        if mask is not None:
            out[RECORDS] = mask.sum()
        return out

    return step


def batch_signature(batch: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(batch)
    return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


class TimedJit:
    """`jax.jit` that reports how long each call spent tracing and compiling.

    A call that compiles (a new batch shape, or any other jit cache miss) blocks for tracing and
    compilation, while the execution is still dispatched asynchronously, so the call's host time is
    the compile time. Misses are read from the jit cache size where JAX exposes it, else from batch
    shapes not seen before.
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
