"""Records a host stage skipped (`on_error="skip"`) stay out of the loss, its gradient and every metric.

A skipped record is zeros with a False `<field>_ok` flag (`datarax.host.stage.BadRecords`); a row is
valid when all its bool `<name>_ok` flags are True (`record_mask`). When a batch carries flags:

* `loss_fn(model, batch, mask)` gets the mask and returns the mean over the valid rows itself:

      def loss_fn(model, batch, mask):
          logits = model(batch["image"])
          per_record = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
          return (per_record * mask).sum() / jnp.maximum(mask.sum(), 1)

* any other loss is computed per record (a batch of one under `jax.vmap`) and averaged over the
  valid rows; a model with batch statistics (`nnx.BatchNorm` in train mode) is refused there (give
  its loss the `mask` argument), and random streams draw a key per row.

Metric functions are computed per record and averaged over the valid rows, a `Metric` adds only the
valid rows' sums, and a CLU collection gets `mask=`. Micro-batches are weighted by their valid
rows; a batch with no valid record contributes a zero loss and gradient.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

OK_SUFFIX = "_ok"


def record_mask(batch: Any) -> jax.Array | None:
    """bool[B]: True for the rows whose every `<name>_ok` flag is True; None when the batch has no
    such flag (a bool field of one value per row whose name ends in `_ok`)."""
    if not isinstance(batch, Mapping):
        return None
    leaves = list(batch.values())
    rows = getattr(leaves[0], "shape", (None,))[:1] if leaves else (None,)
    flags = [v for k, v in batch.items() if isinstance(k, str) and k.endswith(OK_SUFFIX)
             and getattr(v, "dtype", None) == jnp.bool_ and tuple(getattr(v, "shape", ())) == tuple(rows)]
    if not flags:
        return None
    mask = flags[0]
    for flag in flags[1:]:
        mask = mask & flag
    return mask


def takes_mask(loss_fn: Callable) -> bool:
    """Whether `loss_fn` has a parameter named `mask` (it then masks the loss itself)."""
    try:
        return "mask" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False


def _rows(tree: Any, rows: int, what: str) -> Any:
    def check(x):
        if getattr(x, "ndim", 0) == 0 or x.shape[0] != rows:
            raise ValueError(f"a batch with skipped records (a '<field>{OK_SUFFIX}' flag) is scored per record, so "
                             f"{what} must have one row per record ({rows}); it has a leaf of shape "
                             f"{getattr(x, 'shape', ())}. Return per-record values there, or drop the metric")
        return x
    return jax.tree.map(check, tree)


def per_record(loss_fn: Callable, model: nnx.Module, data: Mapping[str, jax.Array],
               split: Callable[[Any], tuple[jax.Array, Any]]) -> tuple[jax.Array, Any]:
    """`(losses[B], aux)`: `loss_fn` on each record as a batch of one, under `jax.vmap`; `split`
    turns a loss function's result into (loss, aux). The model's state after the call is the first
    record's (random-stream counts advance once)."""
    graphdef, keys, batch_stats, rest = nnx.split(model, nnx.RngKey, nnx.BatchStat, ...)
    if jax.tree.leaves(batch_stats):
        raise ValueError(f"{type(model).__name__} keeps batch statistics (nnx.BatchStat), which a loss computed "
                         f"record by record would take over single records; a batch with skipped records (a "
                         f"'<field>{OK_SUFFIX}' flag) then needs a loss that masks them itself: give it a mask "
                         "argument, loss_fn(model, batch, mask) (see datarax.train.loop.masking)")
    rows = jax.tree.leaves(data)[0].shape[0]

    def one(row: Mapping[str, jax.Array], index: jax.Array):
        own_keys = jax.tree.map(lambda k: jax.random.fold_in(k, index), keys)
        copy = nnx.merge(graphdef, own_keys, batch_stats, rest, copy=True)
        loss, aux = split(loss_fn(copy, jax.tree.map(lambda x: x[None], row)))
        _, _, _, after = nnx.split(copy, nnx.RngKey, nnx.BatchStat, ...)
        return jnp.reshape(loss, ()).astype(jnp.float32), aux, after

    losses, aux, after = jax.vmap(one)(dict(data), jnp.arange(rows))
    nnx.update(model, jax.tree.map(lambda x: x[0], after))
    # A batch of one gave aux leaves of (1, ...): one row per record is (B, ...).
    aux = jax.tree.map(lambda x: x[:, 0] if x.ndim >= 2 and x.shape[1] == 1 else x, aux)
    return losses, aux


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean of `values` over the rows where `mask` is True (0 when none is)."""
    weights = mask.astype(jnp.float32).reshape(mask.shape + (1,) * (values.ndim - 1))
    return (values * weights).sum(0) / jnp.maximum(mask.sum(), 1)


def masked_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The sum of `values` over the rows where `mask` is True."""
    weights = mask.astype(values.dtype).reshape(mask.shape + (1,) * (values.ndim - 1))
    return (values * weights).sum(0)


def per_record_metrics(metric_fns: Mapping[str, Any], data: Mapping[str, jax.Array], aux: Any,
                       mask: jax.Array, is_metric: Callable[[Any], bool]) -> dict[str, Any]:
    """Each metric over the valid rows only: a function's per-record values averaged, a `Metric`'s
    per-record sums added (`is_metric` tells the two apart)."""
    rows = mask.shape[0]
    aux = _rows(aux, rows, "the loss's aux")
    out = {}
    for name, fn in metric_fns.items():
        def one(row, row_aux, fn=fn):
            batch, aux1 = jax.tree.map(lambda x: x[None], (row, row_aux))
            return fn.update(batch, aux1) if is_metric(fn) else jnp.asarray(fn(batch, aux1), jnp.float32)

        values = jax.vmap(one)(dict(data), aux)
        out[name] = jax.tree.map(lambda v: masked_sum(v, mask), values) if is_metric(fn) \
            else masked_mean(jnp.reshape(values, (rows,)), mask)
    return out
