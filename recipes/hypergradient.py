"""Augmentation magnitudes learned from the validation loss by hypergradient (no regulariser, no lam).

The model trains on the training loss as usual (its own optimiser, augmented batches from the
pipeline). Every `every` training steps one *hyper-step* updates the pipeline's learnable
magnitudes `phi` (e.g. a `RotationOperator`'s `degrees`, held as the logit of a bounded value):

    theta_0 = the model's current parameters (a copy; the model itself is not changed)
    theta_k = theta_{k-1} - eta * grad_theta CE(theta_{k-1}; augment(x_k; phi, keys(ids_k, epoch)))
    h(phi)  = CE(theta_K; validation batch, not augmented)
    phi    <- phi - Adam(grad_phi h)

i.e. the exact reverse-mode gradient of the validation loss after `unroll` (K) plain SGD steps of
rate `inner_learning_rate` (eta), the second-order DARTS / T1-T2 "lookahead" hypergradient
(Liu et al. 2019; Luketina et al. 2016) for K = 1 and truncated back-propagation through K
inner steps for K > 1. It is not an implicit-function approximation and not first-order: the
mixed derivative d(grad_theta CE)/d(phi) is differentiated through the augmentation (datarax's
warps are bilinear, so differentiable in their angle). The inner steps are SGD, not the model's
real optimiser (AdamW): the lookahead only asks which way phi should move for one (or K) steps
of descent, and an Adam step's normalisation would make that direction depend on the moment
estimates. The unrolled parameters are thrown away after the hyper-step.

The inner batches' augmentation is keyed by record id and epoch, as the pipeline keys it
(`fold_in(fold_in(stage_key, epoch), record_id)`): the lookahead augments record i of epoch e
exactly as the training pipeline does. Each inner step runs under `jax.checkpoint`, so the
backward pass *regenerates* the augmented batch from its keys instead of storing it; only the
K parameter vectors are kept. A hyper-step (the K inner steps, the validation loss, its gradient
and the Adam update; the records are drawn on the host) is one compiled program.

Example:
    >>> stepper = HyperStep(model, pipeline.program, (train_x, train_y), (val_x, val_y),
    ...                     HypergradientConfig(every=10, unroll=1))
    >>> stepper(model, pipeline.program, epoch=0)  # one hyper-step: updates the magnitudes in place
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax.core.operator import BatchContext
from datarax.pipeline.scan import ScanBatch
from datarax.train.callbacks import Callback, StepLogs
from recipes.models import classification_loss

if TYPE_CHECKING:
    from datarax.train import Trainer


@dataclasses.dataclass(frozen=True)
class HypergradientConfig:
    """Settings of the hypergradient method (fixed in advance: none of them is searched).

    Attributes:
        every: M, training steps between hyper-steps.
        unroll: K, inner SGD steps the hypergradient is back-propagated through (1: one-step lookahead).
        inner_learning_rate: eta, the rate of the inner SGD steps.
        learning_rate: Adam's rate on the magnitudes' logits.
        batch_size: records per inner step.
        val_batch_size: validation records per hyper-step.
    """

    every: int = 10
    unroll: int = 1
    inner_learning_rate: float = 0.1
    learning_rate: float = 0.05
    batch_size: int = 64
    val_batch_size: int = 256

    def __post_init__(self):
        for name in ("every", "unroll", "batch_size", "val_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"HypergradientConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("inner_learning_rate", "learning_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ValueError(f"HypergradientConfig.{name} must be a finite number > 0, got {value!r}")


def lookahead_loss(model: nnx.Module, program: nnx.Module, train: tuple, val: tuple, ids: jax.Array,
                   val_ids: jax.Array, epoch: jax.Array, *, inner_learning_rate: float,
                   loss_fn: Callable = classification_loss) -> jax.Array:
    """h(phi): the validation loss after `len(ids)` inner SGD steps on batches augmented by `program`.

    Args:
        model: the classifier; its parameters are the start theta_0 (not changed).
        program: the stage program whose `nnx.Param`s are the magnitudes phi.
        train: (images, labels) arrays of the whole training split.
        val: (images, labels) arrays of the whole validation split.
        ids: int32[K, B], the training records of each inner step.
        val_ids: int32[V], the validation records.
        epoch: the epoch the augmentation keys are drawn for.
        inner_learning_rate: eta.
        loss_fn: `loss_fn(model, {"image", "label"}) -> (loss, aux)`.

    Differentiate it with respect to the program's parameters (`nnx.grad(..., argnums=1)`).
    """
    train, val = tuple(map(jnp.asarray, train)), tuple(map(jnp.asarray, val))
    model_def, theta0, model_rest = nnx.split(model, nnx.Param, ...)
    program_def, phi, program_rest = nnx.split(program, nnx.Param, ...)

    def loss_at(theta, batch):
        return loss_fn(nnx.merge(model_def, theta, model_rest), batch)[0]

    def inner(theta, step_ids):
        data = {"image": train[0][step_ids], "label": train[1][step_ids]}
        ctx = BatchContext(step_ids, epoch, jnp.ones(step_ids.shape, bool))
        batch = ScanBatch(data, ctx).transform(nnx.merge(program_def, phi, program_rest))
        grads = jax.grad(loss_at)(theta, batch)
        return jax.tree.map(lambda t, g: t - inner_learning_rate * g, theta, grads)

    # Remat: the backward pass recomputes each augmented batch from its record keys. K is small and
    # static, so the steps are unrolled: a lax.scan over them ran the forward 5x slower on XLA:CPU.
    theta = theta0
    for k in range(ids.shape[0]):
        theta = jax.checkpoint(inner)(theta, ids[k])
    return loss_at(theta, {"image": val[0][val_ids], "label": val[1][val_ids]})


class HyperStep:
    """One compiled hyper-step: the hypergradient of `lookahead_loss` and an Adam update of the magnitudes.

    Args:
        model: the classifier (read, never changed by a hyper-step).
        program: the stage program holding the learnable magnitudes (e.g. `pipeline.program`);
            updated in place, so the pipeline's next batches use the new values.
        train: (images, labels) of the training split (NHWC images as the pipeline's source holds them).
        val: (images, labels) of the validation split.
        config: the method's settings.
        loss_fn: `loss_fn(model, batch) -> (loss, aux)`.
        seed: draws the records of every hyper-step (a numpy generator on the host).
    """

    def __init__(self, model: nnx.Module, program: nnx.Module, train: tuple, val: tuple,
                 config: HypergradientConfig = HypergradientConfig(), *, loss_fn: Callable = classification_loss,
                 seed: int = 0):
        if not jax.tree.leaves(nnx.state(program, nnx.Param)):
            raise ValueError("program has no learnable magnitude (nnx.Param): build its operators with learnable=True")
        self.config = config
        self.train = tuple(jnp.asarray(a) for a in train)
        self.val = tuple(jnp.asarray(a) for a in val)
        self.rng = np.random.default_rng(seed)
        self.tx = optax.adam(config.learning_rate)
        self.opt_state = self.tx.init(nnx.state(program, nnx.Param))
        self.seconds: list[float] = []

        def step(model, program, opt_state, ids, val_ids, epoch):
            def h(program):
                return lookahead_loss(model, program, self.train, self.val, ids, val_ids, epoch,
                                      inner_learning_rate=config.inner_learning_rate, loss_fn=loss_fn)

            loss, grads = nnx.value_and_grad(h)(program)
            phi = nnx.state(program, nnx.Param)
            updates, opt_state = self.tx.update(grads, opt_state, phi)
            nnx.update(program, optax.apply_updates(phi, updates))
            return loss, grads, opt_state

        self._step = nnx.jit(step)

    def draw(self) -> tuple[np.ndarray, np.ndarray]:
        """The records of the next hyper-step: int32[K, B] training ids and int32[V] validation ids."""
        c = self.config
        n, v = len(self.train[1]), len(self.val[1])
        ids = np.stack([self.rng.choice(n, c.batch_size, replace=c.batch_size > n) for _ in range(c.unroll)])
        return ids.astype(np.int32), self.rng.choice(v, min(c.val_batch_size, v), replace=False).astype(np.int32)

    def __call__(self, model: nnx.Module, program: nnx.Module, epoch: int) -> dict:
        """Runs one hyper-step (updating `program` in place); its validation loss and hypergradient."""
        ids, val_ids = self.draw()
        began = time.perf_counter()
        loss, grads, self.opt_state = self._step(model, program, self.opt_state, ids, val_ids,
                                                 jnp.asarray(epoch, jnp.int32))
        loss = float(loss)  # waits for the step, so the time below is the hyper-step's
        self.seconds.append(time.perf_counter() - began)
        return {"val_loss": loss, "grads": [float(g) for g in jax.tree.leaves(grads)]}

    def median_s(self, skip: int = 1) -> float:
        """Median wall time of a hyper-step, the first `skip` (compilation) left out."""
        times = self.seconds[skip:] or self.seconds
        return float(np.median(times)) if times else float("nan")


class HypergradientCallback(Callback):
    """Runs a `HyperStep` every `config.every` training steps of a `Trainer` and records the magnitudes.

    Args:
        stepper: the hyper-step (its `config.every` is M).
        program: the training pipeline's stage program (`pipeline.program`).
        values: `values(program) -> {name: float}`, the magnitudes to record (e.g. in degrees).
    """

    def __init__(self, stepper: HyperStep, program: nnx.Module, values: Callable[[nnx.Module], dict]):
        self.stepper = stepper
        self.program = program
        self.values = values
        self.history: list[dict] = []
        self.hyper_steps = 0

    def on_train_begin(self, trainer: Trainer) -> None:
        self.history.append({"step": trainer.step, **self.values(self.program)})

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if logs.step % self.stepper.config.every:
            return
        out = self.stepper(trainer.model, self.program, logs.epoch)
        self.hyper_steps += 1
        self.history.append({"step": logs.step, "val_loss": out["val_loss"], **self.values(self.program)})
