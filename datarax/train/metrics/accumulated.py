"""Metrics accumulated as sums over batches: perplexity, per-class accuracy, a confusion matrix.

A plain metric function (`fn(batch, aux) -> scalar`) gives one number per batch, and evaluation
averages them weighted by batch size: right for a per-record mean, wrong for anything whose weight
is not the batch size (tokens under a mask, records of one class). A `Metric` instead returns
*sums* from inside the jitted step (`update`), which `Trainer.evaluate` adds up over the whole
epoch, on the host in float64 / int64, before dividing once (`compute`):

    perplexity = exp(sum of the real tokens' losses / number of real tokens)

A train step reports each step's own `compute`; `Trainer.evaluate()` returns the scalars of
`compute` (`ppl`, `ppl/token_loss`, `classes/3`, `classes/mean`, ...) and keeps each metric's full
`result` (a confusion matrix) in `trainer.last_eval_results[name]`.

Where the predictions come from: `logits` names a field of the loss function's aux when that is a
dict, and None means the aux itself; `labels`, `targets` and `mask` name batch fields. A `mask`
(bool or 0/1) weighs each record or token, so padding rows or tokens count for nothing.

Example:
    >>> metrics = {"ppl": Perplexity(targets="tokens", mask="loss_mask", shift=True),
    ...            "classes": PerClassAccuracy(num_classes=10, labels="label")}
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from datarax.core.checks import check_bool, check_field_name, check_int


class Metric(abc.ABC):
    """Abstract base of metrics accumulated as sums (the module docstring says why).

    Subclasses implement `update` (jax.numpy, inside the jitted step; returns a dict of arrays
    that add up across batches) and `compute` (numpy, on the host, from the summed dict).
    """

    @abc.abstractmethod
    def update(self, batch: Mapping[str, jax.Array], aux: Any) -> dict[str, jax.Array]:
        """This batch's sums (a dict of arrays; sums of several batches are their elementwise sum)."""

    @abc.abstractmethod
    def compute(self, totals: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Scalars for logging from summed `totals`: key "" is the metric's own name, any other key
        `k` is logged as `<name>/k`."""

    def result(self, totals: Mapping[str, np.ndarray]) -> Any:
        """The metric's full value from summed `totals` (default: what `compute` returns)."""
        return self.compute(totals)


def add_totals(totals: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Elementwise sums of per-batch sums, in float64 (floats) or int64 (integers) on the host."""
    out: dict[str, np.ndarray] = {}
    for part in totals:
        for key, value in part.items():
            value = np.asarray(value)
            value = value.astype(np.float64 if np.issubdtype(value.dtype, np.floating) else np.int64)
            out[key] = value if key not in out else out[key] + value
    return out


def _field(batch: Mapping[str, Any], name: str, owner: str) -> jax.Array:
    if not isinstance(batch, Mapping) or name not in batch:
        fields = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise KeyError(f"{owner} reads the batch field {name!r}, which the batch does not have (fields {fields}); "
                       f"set {owner}(...) to the field holding it")
    return batch[name]


def _logits(aux: Any, key: str | None, owner: str) -> jax.Array:
    if key is None:
        if isinstance(aux, Mapping) or aux is None:
            raise TypeError(f"{owner}(logits=None) reads the loss function's aux as the logits, but the aux is "
                            f"{'a dict' if isinstance(aux, Mapping) else 'missing'}; return (loss, logits) from "
                            "loss_fn, or name the aux entry with logits='...'")
        return aux
    if not isinstance(aux, Mapping) or key not in aux:
        raise KeyError(f"{owner}(logits={key!r}) reads aux[{key!r}], but the loss function's aux is "
                       f"{sorted(aux) if isinstance(aux, Mapping) else type(aux).__name__}; return (loss, "
                       f"{{{key!r}: logits, ...}}) from loss_fn")
    return aux[key]


def _weights(batch: Mapping[str, Any], mask: str | None, shape: tuple, owner: str) -> jax.Array:
    if mask is None:
        return jnp.ones(shape, jnp.float32)
    return jnp.broadcast_to(jnp.asarray(_field(batch, mask, owner), jnp.float32), shape)


def token_losses(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Cross-entropy of each position: `-log softmax(logits)[target]` (float32, shape of `targets`)."""
    return optax.softmax_cross_entropy_with_integer_labels(jnp.asarray(logits, jnp.float32), targets)


class Perplexity(Metric):
    """Token-weighted perplexity: `exp(sum of real tokens' losses / number of real tokens)`.

    Args:
        targets: the batch field of target token ids (int, `[..., T]`).
        logits: the field of the loss's aux dict holding the logits `[..., T, V]` (None: the aux itself).
        mask: the batch field marking real target tokens (e.g. `loss_mask`; None: all count).
        shift: next-token prediction: the logits at position t score the target at t + 1
            (`logits[..., :-1, :]` against `targets[..., 1:]`, weighted by `mask[..., 1:]`).

    `compute` gives `""` (the perplexity) and `"token_loss"` (mean loss per real token).
    """

    def __init__(self, *, targets: str = "tokens", logits: str | None = None, mask: str | None = None,
                 shift: bool = False):
        self.targets = check_field_name(targets, "Perplexity targets")
        self.logits = None if logits is None else check_field_name(logits, "Perplexity logits")
        self.mask = None if mask is None else check_field_name(mask, "Perplexity mask")
        self.shift = check_bool(shift, "Perplexity shift")

    def update(self, batch: Mapping[str, jax.Array], aux: Any) -> dict[str, jax.Array]:
        logits = _logits(aux, self.logits, "Perplexity")
        targets = _field(batch, self.targets, "Perplexity")
        weights = _weights(batch, self.mask, targets.shape, "Perplexity")
        if self.shift:
            logits, targets, weights = logits[..., :-1, :], targets[..., 1:], weights[..., 1:]
        losses = token_losses(logits, targets)
        return {"loss_sum": jnp.sum(losses * weights), "tokens": jnp.sum(weights)}

    def compute(self, totals: Mapping[str, np.ndarray]) -> dict[str, float]:
        tokens = float(totals["tokens"])
        mean = float(totals["loss_sum"]) / tokens if tokens > 0 else math.nan
        return {"": math.exp(mean) if math.isfinite(mean) else math.nan, "token_loss": mean}


class _ClassMetric(Metric):
    """Shared set-up of the class metrics: where labels, predictions and weights come from."""

    def __init__(self, num_classes: int, *, labels: str = "label", logits: str | None = None,
                 mask: str | None = None):
        owner = type(self).__name__
        self.num_classes = check_int(num_classes, f"{owner} num_classes", 2)
        self.labels = check_field_name(labels, f"{owner} labels")
        self.logits = None if logits is None else check_field_name(logits, f"{owner} logits")
        self.mask = None if mask is None else check_field_name(mask, f"{owner} mask")

    def _inputs(self, batch, aux) -> tuple[jax.Array, jax.Array, jax.Array]:
        owner = type(self).__name__
        labels = jnp.asarray(_field(batch, self.labels, owner), jnp.int32)
        predictions = jnp.argmax(_logits(aux, self.logits, owner), axis=-1).astype(jnp.int32)
        weights = _weights(batch, self.mask, labels.shape, owner)
        # A label outside [0, num_classes) counts nowhere rather than in a wrong class.
        weights = jnp.where((labels >= 0) & (labels < self.num_classes), weights, 0.0)
        return labels.reshape(-1), predictions.reshape(-1), weights.reshape(-1)


def confusion_matrix(labels: jax.Array, predictions: jax.Array, num_classes: int,
                     weights: jax.Array | None = None) -> jax.Array:
    """`[num_classes, num_classes]` counts: row = true class, column = predicted class (float32).

    Example:
        >>> confusion_matrix(jnp.array([0, 1, 1]), jnp.array([0, 0, 1]), 2).tolist()
        [[1.0, 0.0], [1.0, 1.0]]
    """
    labels, predictions = jnp.asarray(labels).reshape(-1), jnp.asarray(predictions).reshape(-1)
    weights = jnp.ones(labels.shape, jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32).reshape(-1)
    flat = jnp.clip(labels, 0, num_classes - 1) * num_classes + jnp.clip(predictions, 0, num_classes - 1)
    counts = jnp.zeros(num_classes * num_classes, jnp.float32).at[flat].add(weights)
    return counts.reshape(num_classes, num_classes)


def per_class_accuracy(confusion: np.ndarray) -> np.ndarray:
    """Per true class, the share predicted right (NaN for a class with no records)."""
    confusion = np.asarray(confusion, np.float64)
    support = confusion.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(support > 0, np.diag(confusion) / support, np.nan)


class PerClassAccuracy(_ClassMetric):
    """Accuracy per true class, accumulated as per-class counts.

    Args:
        num_classes: the number of classes (labels outside `[0, num_classes)` are not counted).
        labels: the batch field of integer labels.
        logits: the aux dict's field of the logits (None: the aux itself); predictions are their argmax.
        mask: the batch field weighing each record (None: all count).

    `compute` gives `"<c>"` for every class with records and `"mean"` (their unweighted mean,
    the balanced accuracy); `result` the `[num_classes]` vector (NaN where a class had none).
    """

    def update(self, batch: Mapping[str, jax.Array], aux: Any) -> dict[str, jax.Array]:
        labels, predictions, weights = self._inputs(batch, aux)
        label = jnp.clip(labels, 0, self.num_classes - 1)
        zeros = jnp.zeros(self.num_classes, jnp.float32)
        return {"correct": zeros.at[label].add(weights * (predictions == labels)),
                "count": zeros.at[label].add(weights)}

    def result(self, totals: Mapping[str, np.ndarray]) -> np.ndarray:
        count = np.asarray(totals["count"], np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, np.asarray(totals["correct"], np.float64) / count, np.nan)

    def compute(self, totals: Mapping[str, np.ndarray]) -> dict[str, float]:
        accuracy = self.result(totals)
        seen = ~np.isnan(accuracy)
        out = {str(c): float(accuracy[c]) for c in np.flatnonzero(seen)}
        out["mean"] = float(accuracy[seen].mean()) if seen.any() else math.nan
        return out


class ConfusionMatrix(_ClassMetric):
    """A confusion matrix (rows: true class, columns: predicted class), accumulated as counts.

    Takes the arguments of `PerClassAccuracy`. `result` is the `[num_classes, num_classes]`
    matrix of (weighted) counts; `compute` logs only `"accuracy"` (its trace over its sum): a
    matrix is not a scalar, so read it from `trainer.last_eval_results[name]`.
    """

    def update(self, batch: Mapping[str, jax.Array], aux: Any) -> dict[str, jax.Array]:
        labels, predictions, weights = self._inputs(batch, aux)
        return {"counts": confusion_matrix(labels, predictions, self.num_classes, weights)}

    def result(self, totals: Mapping[str, np.ndarray]) -> np.ndarray:
        counts = np.asarray(totals["counts"], np.float64)
        return counts.astype(np.int64) if np.all(counts == np.round(counts)) else counts

    def compute(self, totals: Mapping[str, np.ndarray]) -> dict[str, float]:
        counts = np.asarray(totals["counts"], np.float64)
        total = counts.sum()
        return {"accuracy": float(np.trace(counts) / total) if total > 0 else math.nan}


def metric_scalars(name: str, metric: Metric, totals: Mapping[str, np.ndarray]) -> dict[str, float]:
    """`metric.compute(totals)` with its keys made full names (`name`, `name/key`)."""
    return {name if key == "" else f"{name}/{key}": float(value) for key, value in metric.compute(totals).items()}
