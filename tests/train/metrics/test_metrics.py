"""Accumulated metrics against numpy references: uneven eval batches, masks, and the Trainer's wiring."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.sources import MemorySource
from datarax.train import ConfusionMatrix, PerClassAccuracy, Perplexity, Trainer
from datarax.train.metrics.accumulated import add_totals, confusion_matrix, per_class_accuracy

N, T, V, C = 11, 6, 7, 4  # 11 records: eval batches of 4, 4 and 3


def data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = rng.random((N, T)) < 0.6
    mask[3] = False  # a record with no real token
    return {"x": rng.normal(size=(N, 2)).astype(np.float32),
            "tokens": rng.integers(0, V, (N, T)).astype(np.int32),
            "logits": (3 * rng.normal(size=(N, T, V))).astype(np.float32),
            "loss_mask": mask,
            "label": np.array([0, 1, 2, 1, 1, 0, 2, 2, 1, 0, 1], np.int32),  # class 3 never occurs
            "class_logits": rng.normal(size=(N, C)).astype(np.float32),
            "valid": np.array([1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0], np.float32)}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def numpy_perplexity(d, shift: bool) -> tuple[float, float]:
    logits, targets, mask = d["logits"], d["tokens"], d["loss_mask"].astype(np.float64)
    if shift:
        logits, targets, mask = logits[:, :-1], targets[:, 1:], mask[:, 1:]
    nll = -np.take_along_axis(log_softmax(logits), targets[..., None], -1)[..., 0]
    mean = float((nll * mask).sum() / mask.sum())
    return math.exp(mean), mean


def numpy_confusion(d, weights) -> np.ndarray:
    predictions = d["class_logits"].argmax(-1)
    out = np.zeros((C, C))
    np.add.at(out, (d["label"], predictions), weights)
    return out


def loss_fn(model, batch):
    loss = jnp.mean(model(batch["x"]) ** 2)  # the metrics read the logits stored in the data
    return loss, {"logits": batch["logits"], "class_logits": batch["class_logits"]}


def evaluate(metrics, d) -> Trainer:
    train = Pipeline(MemorySource(shuffle=True, data=d), batch_size=N)
    evaluation = Pipeline(MemorySource(data=d), batch_size=4)
    trainer = Trainer(nnx.Linear(2, 1, rngs=nnx.Rngs(0)), optax.sgd(0.1), train, loss_fn, eval_pipeline=evaluation,
                      metrics=metrics, compilation_cache=False)
    trainer.evaluate()
    return trainer


@pytest.mark.parametrize("shift", [False, True])
def test_perplexity_is_token_weighted_over_uneven_batches(shift):
    d = data()
    trainer = evaluate({"ppl": Perplexity(targets="tokens", logits="logits", mask="loss_mask", shift=shift)}, d)
    expected, mean = numpy_perplexity(d, shift)
    metrics = trainer.last_eval_metrics
    assert metrics["ppl"] == pytest.approx(expected, rel=1e-5)
    assert metrics["ppl/token_loss"] == pytest.approx(mean, rel=1e-5)
    assert trainer.last_eval_results["ppl"]["token_loss"] == pytest.approx(mean, rel=1e-5)
    # What a batch-size weighted mean of per-batch perplexities would have said instead.
    per_batch = [numpy_perplexity({k: v[i:i + 4] for k, v in d.items()}, shift)[0] for i in (0, 4, 8)]
    naive = float(np.average(per_batch, weights=[4, 4, 3]))
    assert abs(naive - expected) > 1e-3 * expected


def test_class_metrics_with_a_mask_match_numpy():
    d = data(1)
    metrics = {"classes": PerClassAccuracy(C, labels="label", logits="class_logits", mask="valid"),
               "confusion": ConfusionMatrix(C, labels="label", logits="class_logits", mask="valid")}
    trainer = evaluate(metrics, d)
    confusion = numpy_confusion(d, d["valid"])
    np.testing.assert_array_equal(trainer.last_eval_results["confusion"], confusion.astype(np.int64))
    support = confusion.sum(1)
    per_class = np.where(support > 0, np.diag(confusion) / np.where(support > 0, support, 1), np.nan)
    np.testing.assert_allclose(trainer.last_eval_results["classes"], per_class, equal_nan=True)
    got = trainer.last_eval_metrics
    for c in range(3):
        assert got[f"classes/{c}"] == pytest.approx(per_class[c])
    assert "classes/3" not in got  # a class with no records has no accuracy, rather than 0
    assert got["classes/mean"] == pytest.approx(np.nanmean(per_class))
    assert got["confusion/accuracy"] == pytest.approx(np.trace(confusion) / confusion.sum())


def test_metrics_report_each_train_step_and_mix_with_plain_functions():
    d = data(2)
    metrics = {"ppl": Perplexity(logits="logits", mask="loss_mask"),
               "mean_x": lambda batch, aux: batch["x"].mean()}
    train = Pipeline(MemorySource(shuffle=True, data=d), batch_size=N)
    trainer = Trainer(nnx.Linear(2, 1, rngs=nnx.Rngs(0)), optax.sgd(0.1), train, loss_fn, metrics=metrics,
                      compilation_cache=False)
    result = trainer.fit(num_steps=1)
    # One batch holds the whole (shuffled) dataset: the step's perplexity is the dataset's.
    assert result.metrics["ppl"] == pytest.approx(numpy_perplexity(d, False)[0], rel=1e-5)
    assert result.metrics["mean_x"] == pytest.approx(float(d["x"].mean()), abs=1e-6)


def test_pure_functions_and_totals():
    np.testing.assert_array_equal(confusion_matrix(jnp.array([0, 1, 1, 2]), jnp.array([0, 0, 1, 1]), 3),
                                  [[1, 0, 0], [1, 1, 0], [0, 1, 0]])
    np.testing.assert_allclose(per_class_accuracy(np.array([[2, 0], [1, 1]])), [1.0, 0.5])
    totals = add_totals([{"n": np.int32(2), "s": np.float32(0.5)}, {"n": np.int32(3), "s": np.float32(0.25)}])
    assert totals["n"].dtype == np.int64 and int(totals["n"]) == 5 and float(totals["s"]) == 0.75


@pytest.mark.parametrize("make, match", [
    (lambda: PerClassAccuracy(1), r"PerClassAccuracy num_classes must be an int >= 2, got 1"),
    (lambda: Perplexity(targets=""), r"Perplexity targets must be a non-empty field name, got ''"),
    (lambda: Perplexity(shift=1), r"Perplexity shift must be True or False, got 1"),
])
def test_bad_settings_are_named(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_a_missing_field_or_logits_entry_is_named():
    d = data()
    with pytest.raises(KeyError, match=r"Perplexity reads the batch field 'targets', which the batch does not have"):
        evaluate({"ppl": Perplexity(targets="targets", logits="logits")}, d)
    with pytest.raises(KeyError, match=r"Perplexity\(logits='scores'\) reads aux\['scores'\]"):
        evaluate({"ppl": Perplexity(logits="scores")}, d)
