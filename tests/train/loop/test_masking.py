"""Records skipped by `on_error="skip"` contribute nothing to the loss, its gradient or any metric:
one SGD step on a batch holding a skipped record lands where a step on the batch without it does,
computed by hand with `jax.grad` over the good records only."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from PIL import Image

from datarax import Pipeline
from datarax.host import DecodeImage
from datarax.sources import ImageFolderSource
from datarax.train import Trainer
from datarax.train.loop.masking import record_mask

GOOD = 7


def folder(tmp_path, corrupt: bool):
    """Two classes of small PNGs; with `corrupt`, one more file that is no image (sorted among them)."""
    root = tmp_path / ("with" if corrupt else "without")
    for i in range(GOOD):
        label = "a" if i < 4 else "b"
        (root / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(
            root / label / f"{i}.png")
    if corrupt:
        (root / "a" / "2x.png").write_bytes(b"not an image")
    return str(root)


def pipeline(root: str, batch_size: int) -> Pipeline:
    return Pipeline(ImageFolderSource(root=root), [DecodeImage(size=4, on_error="skip")], batch_size=batch_size)


class Classifier(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(48, 2, rngs=rngs)

    def __call__(self, image):
        return self.linear(image.reshape(image.shape[0], -1).astype(jnp.float32) / 255.0)


def xent(model, batch):
    logits = model(batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits


def xent_masked(model, batch, mask):
    logits = model(batch["image"])
    per_record = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    return (per_record * mask).sum() / jnp.maximum(mask.sum(), 1), logits


def accuracy(batch, logits):
    return (logits.argmax(-1) == batch["label"]).mean()


def one_step(root: str, batch_size: int, loss_fn, k: int = 1):
    model = Classifier(nnx.Rngs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skipped record's warning, the unshuffled pipeline's
        trainer = Trainer(model, optax.sgd(1.0), pipeline(root, batch_size), loss_fn, accumulate_steps=k,
                          metrics={"accuracy": accuracy}, eval_pipeline=pipeline(root, batch_size))
        result = trainer.fit(num_steps=1)
        evaluation = trainer.evaluate()
    return model, result.metrics, evaluation, trainer.last_eval_records


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Parameters after one SGD(1.0) step, the loss and the accuracy, over the good records only, by hand."""
    root = folder(tmp_path_factory.mktemp("ref"), corrupt=False)
    batch = next(iter(pipeline(root, GOOD)))
    model = Classifier(nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    loss, grads = jax.value_and_grad(lambda p: xent(nnx.merge(graphdef, p), batch)[0])(params)
    stepped = jax.tree.map(lambda p, g: p - g, params, grads)
    logits = model(batch["image"])
    return {"params": jax.tree.leaves(stepped), "loss": float(loss), "accuracy": float(accuracy(batch, logits))}


@pytest.mark.parametrize("loss_fn, k", [(xent, 1), (xent_masked, 1), (xent, 2), (xent_masked, 2)],
                         ids=["per-record", "mask-argument", "per-record-k2", "mask-argument-k2"])
def test_a_skipped_record_changes_no_parameter_loss_or_metric(tmp_path, reference, loss_fn, k):
    from datarax.host.stage import SkippedRecordWarning

    root = folder(tmp_path, corrupt=True)
    with pytest.warns(SkippedRecordWarning, match=r"could not decode record 3 .*2x\.png"):
        batch = next(iter(pipeline(root, GOOD + 1)))
    assert np.asarray(batch["image_ok"]).tolist().count(False) == 1  # the corrupt file, decoded as zeros
    model, metrics, evaluation, records = one_step(root, GOOD + 1, loss_fn, k)
    for got, want in zip(jax.tree.leaves(nnx.state(model)), reference["params"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert metrics["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(reference["accuracy"], rel=1e-6)
    assert records == GOOD  # the evaluation counted the good records only
    assert set(evaluation) == {"loss", "accuracy"}


def test_without_the_mask_the_skipped_record_would_train():
    """The reference is not vacuous: the zeros of a skipped record move the parameters otherwise."""
    model = Classifier(nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    image = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 4, 4, 3)), jnp.uint8).at[1].set(0)
    batch = {"image": image, "label": jnp.asarray([0, 1], jnp.int32)}
    both = jax.grad(lambda p: xent(nnx.merge(graphdef, p), batch)[0])(params)
    first = jax.grad(lambda p: xent(nnx.merge(graphdef, p), jax.tree.map(lambda x: x[:1], batch))[0])(params)
    assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(both), jax.tree.leaves(first)))


@pytest.mark.parametrize("fields, expected", [
    ({"x": np.zeros(3)}, None),
    ({"x": np.zeros(3), "image_ok": np.array([True, False, True])}, [True, False, True]),
    ({"image_ok": np.array([True, False, True]), "audio_ok": np.array([False, True, True])}, [False, False, True]),
    ({"x": np.zeros(3), "label_ok": np.array([1, 0, 1])}, None),  # not a bool flag
    ({"x": np.zeros(3), "pair_ok": np.ones((3, 2), bool)}, None),  # not one flag per row
])
def test_record_mask_ands_every_ok_flag(fields, expected):
    mask = record_mask({k: jnp.asarray(v) for k, v in fields.items()})
    assert (None if mask is None else np.asarray(mask).tolist()) == expected


def test_a_batch_norm_model_needs_a_loss_that_takes_the_mask(tmp_path):
    class Normed(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.BatchNorm(48, rngs=rngs)
            self.linear = nnx.Linear(48, 2, rngs=rngs)

        def __call__(self, image):
            return self.linear(self.norm(image.reshape(image.shape[0], -1).astype(jnp.float32) / 255.0))

    root = folder(tmp_path, corrupt=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(Normed(nnx.Rngs(0)), optax.sgd(0.1), pipeline(root, GOOD + 1), xent)
        with pytest.raises(ValueError, match=r"Normed keeps batch statistics .* give it a mask argument, "
                                             r"loss_fn\(model, batch, mask\)"):
            trainer.fit(num_steps=1)
        masked = Trainer(Normed(nnx.Rngs(0)), optax.sgd(0.1), pipeline(root, GOOD + 1), xent_masked)
        assert np.isfinite(masked.fit(num_steps=1).metrics["loss"])
