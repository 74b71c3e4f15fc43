"""The marginal-likelihood arms of `recipes.learned_augmentation`: invariances learned by the training kit.

`marglik`: the same `ConvNet`, wrapped in `datarax.train.invariance.InvariantModel` (its outputs
averaged over `copies` rotated copies of each digit, drawn by the pipeline's own
`RotationOperator`, keys by record identity), trained on the MAP loss (cross-entropy plus the
prior's penalty, `with_prior`) by `Trainer`; every `every` steps from `burn_in` on,
`MarginalLikelihood` moves the rotation's half-width (a `"triangle"` magnitude: it can start at 0,
and Adam moves it as fast near 180 as near 0) and the layerwise prior precision along the
gradient of the model's Laplace evidence, until step `until` (a third of the steps); from then
on the widths and prior stay fixed, and the network trains on each copy's cross-entropy without
the prior's penalty (`InvariantModel.settled`). No validation data, no regulariser weight, one run
per start.

`marglik_affine`: one run learning rotation, translation and scale widths jointly (an
`AffineOperator` with those three learnable, all from 0): do the widths the data does not call
for stay small (Immer et al. 2022's affine result)?

Test-time augmentation (TTA) for both arms is the recipe's: the softmax averaged over `tta_copies`
copies drawn by the learned widths (`accuracy`), as for the grid's chosen range.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from datarax import Pipeline
from datarax.operators.image import AffineOperator, RotationOperator
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train.invariance import InvariantModel, MarginalLikelihood, MarginalLikelihoodConfig, with_prior
from recipes import common
from recipes.models import ConvNet

# The three widths of the joint arm: AffineOperator's magnitude name -> its range (the bound the
# magnitude lives in), to report each width as a fraction of its range.
AFFINE_WIDTHS = {"degrees": 180.0, "translate": 1.0, "scale": 0.9}


def invariant_loss(model: InvariantModel, batch: dict):
    """Cross-entropy of the invariant model's averaged logits while the marginal likelihood moves the
    widths; once the model is settled (`until`), the mean cross-entropy of the copies, each scored on
    its own as augmentation trains. aux: the averaged logits."""
    logits = model.copy_outputs(batch)
    averaged = logits.mean(axis=0)
    invariant = optax.softmax_cross_entropy_with_integer_labels(averaged, batch["label"]).mean()
    labels = jnp.broadcast_to(batch["label"], logits.shape[:2])
    copies = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    settled = jax.lax.stop_gradient(model.settled[...])
    return (1.0 - settled) * invariant + settled * copies, averaged


def accuracy_metric(batch: dict, logits):
    return (logits.argmax(-1) == batch["label"]).mean()


def stage(start: float, seed: int, affine: bool, parameterisation: str) -> nnx.Module:
    """The learnable augmentation: a rotation from `start` degrees, or rotation, shift and zoom from 0."""
    if affine:
        return AffineOperator(degrees=0.0, translate=0.0, scale=0.0, learnable=tuple(AFFINE_WIDTHS),
                              parameterisation=parameterisation, field="image", rngs=nnx.Rngs(augment=seed))
    return RotationOperator(degrees=start, learnable=True, parameterisation=parameterisation, field="image",
                            rngs=nnx.Rngs(augment=seed))


def train_source(data: dict, seed: int) -> MemorySource:
    """The training split as a shuffled source (`data["train"]` is `(images, labels)`)."""
    return MemorySource(MemorySourceConfig(shuffle=True, seed=seed),
                        data={"image": data["train"][0], "label": data["train"][1]})


def convnet(data: dict, seed: int, cfg: dict, num_classes: int) -> ConvNet:
    """The recipes' classifier for `data`'s square single-channel images, sized by `cfg`."""
    size = data["train"][0].shape[1]
    return ConvNet(1, num_classes, widths=cfg["widths"], image_size=(size, size), hidden=cfg["hidden"], seed=seed)


def train_marglik(run_dir, data: dict, seed: int, cfg: dict, *, start: float, affine: bool, label: str,
                  callbacks: list, optimizer: optax.GradientTransformation, num_classes: int) -> tuple:
    """One marginal-likelihood run; returns `(net, widths, marglik, run)`: the trained network, its learned
    widths (AffineOperator's magnitude names, or `degrees`), the callback (history, hyper-step times) and
    `common.train_run`'s outcome."""
    settings = cfg["marglik"]
    pipeline = Pipeline(train_source(data, seed), [stage(start, seed, affine, settings["parameterisation"])],
                        batch_size=cfg["batch_size"], drop_remainder=True)
    net = convnet(data, seed, cfg, num_classes)
    model = InvariantModel(net, pipeline, copies=settings["copies"], prior_precision=settings["prior_precision"],
                           prior=settings.get("prior", "layerwise"), copies_per_call=settings.get("copies_per_call"))
    config = dict(settings["config"])
    if affine:  # the joint widths keep their own ramp and hyper-steps to the end (docs/recipes.md)
        config["warmup"] = settings.get("affine_warmup", config["warmup"])
    else:  # the rotation arm: its own hyper-step rate, and the last hyper-step as a share of the steps
        config["learning_rate"] = settings.get("rotation_learning_rate", config["learning_rate"])
        if settings.get("settle") is not None:
            config["until"] = max(config["burn_in"], round(cfg["steps"] * settings["settle"]))
    marglik = MarginalLikelihood(model, pipeline, MarginalLikelihoodConfig(**config, seed=seed))
    _, run = common.train_run(run_dir, model, optimizer, pipeline.raw_loader(), with_prior(invariant_loss),
                              steps=cfg["steps"], metrics={"accuracy": accuracy_metric}, label=label,
                              log_every=cfg["steps"], callbacks=[marglik, *callbacks], checkpoint=False,
                              goodput_plot=False)
    operator = pipeline.stages[0]
    widths = {name: float(m.value()) for name, m in operator.magnitudes.items() if m.learnable}
    return net, widths, marglik, run
