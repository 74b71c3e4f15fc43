"""The marginal-likelihood hyper-step: learns a pipeline's augmentation magnitudes and a prior precision.

Every `every` training steps from `burn_in` on, `MarginalLikelihood` (a callback) runs
`hyper_steps` hyper-steps on an `InvariantModel`. Each draws `records` training records at random
(a numpy generator keyed by the seed and the hyper-step's count, so a resumed run draws what an
uninterrupted one does), reads them through the pipeline's source, estimates the Laplace log
evidence of the model at the current weights on them (`datarax.train.invariance.laplace`), and
takes one Adam step on the stages' learnable magnitudes and one on the log prior precision
along its gradient; then `prior_steps` more Adam steps on the prior precision alone reuse that
sample's kernel (no pass of the model: the prior precision moves with the weights, as Immer et
al. 2023 refit it several times per estimate). The training loss never moves the
hyperparameters; the hyper-step never moves the weights.

Why this learns an invariance from a width of 0: the copies are part of the model, so the
objective sees the width at the current weights with no lookahead horizon, and it is two-sided,
the fit of the data against the Occam term `-1/2 log det`, so no width reward has to be tuned.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax.core.checks import check_bool, check_choice, check_int, check_number, describe_value
from datarax.pipeline.pipeline import Pipeline
from datarax.pipeline.raw import EPOCH, RECORD_IDS
from datarax.sharding.placement import committed_together
from datarax.train.callbacks.base import Callback, Schedule, StepLogs
from datarax.train.invariance.laplace import LIKELIHOODS, laplace_terms, log_marginal_likelihood
from datarax.train.invariance.model import InvariantModel, PriorPrecision, model_params

if TYPE_CHECKING:
    from datarax.train import Trainer

KERNELS = ("full", "single_output")
OUTPUTS = "_marglik_outputs"  # the draws of the single-output kernel, beside a hyper-step's records
CLASS_CHUNK = 4096  # records read at a time to learn every record's class (grouped draws)
FORWARD_MAGNITUDES = 2  # at most this many magnitude scalars: their gradient in forward mode (see _hyper_step)


@dataclasses.dataclass(frozen=True)
class MarginalLikelihoodConfig:
    """Settings of the marginal-likelihood hyper-step.

    Attributes:
        every: training steps between hyper-step occasions (M).
        burn_in: no hyper-step before this training step (the weights should fit first).
        until: no hyper-step after this training step (None: to the end of training). From the
            first step past it the widths and prior stay where they are and the model is
            `settled` (`InvariantModel.settled`): `with_prior` stops adding the prior's penalty, and
            a loss may train each copy on its own.
        warmup: hyper-steps over which both Adam rates ramp linearly up to their values (the k-th,
            counting from 1, at k / warmup of them; 0: full rates from the first). While the weights
            fit nothing yet, the data cannot tell the widths apart and the Occam term alone widens
            every one of them; the ramp keeps that early push small.
        hyper_steps: hyper-steps per occasion, each on a fresh sample.
        learning_rate: Adam's rate on the magnitudes' raw parameters.
        prior_learning_rate: Adam's rate on the log prior precision.
        prior_steps: extra Adam steps on the log prior precision per hyper-step, on its sample's kernel.
        records: training records per hyper-step (H).
        subset_size: records per kernel block (m; divides `records`; None: `records`, one block):
            larger is a tighter bound and costs `(m C)^2 P` per block (`m^2 P` with the
            single-output kernel).
        kernel: "full" (every output's Jacobian: C reverse passes per record) or "single_output"
            (one output drawn per block, one pass per record; `datarax.train.invariance.laplace`).
        grouped: draw each kernel block's records from one class where it can (a categorical
            likelihood only): records are taken from the classes in a random order, each class's
            in a random order, so consecutive blocks hold one class each (Immer et al. 2023's
            grouped subsets). The block-diagonal bound drops the kernel between blocks; an
            invariance makes records of one class alike, so their block keeps what the width is
            judged by. The classes are read from every record's `targets` once, on first use.
        learn_prior: learn the prior precision (else it stays at the model's start).
        likelihood: "categorical" (softmax over the outputs) or "gaussian".
        noise_precision: the Gaussian likelihood's precision.
        targets: the batch field holding the labels or regression targets.
        seed: the records (and single outputs) each hyper-step draws.
    """

    every: int = 10
    burn_in: int = 100
    until: int | None = None
    warmup: int = 0
    hyper_steps: int = 1
    learning_rate: float = 0.05
    prior_learning_rate: float = 0.1
    prior_steps: int = 10
    records: int = 64
    subset_size: int | None = None
    kernel: str = "single_output"
    grouped: bool = False
    learn_prior: bool = True
    likelihood: str = "categorical"
    noise_precision: float = 1.0
    targets: str = "label"
    seed: int = 0

    def __post_init__(self):
        name = type(self).__name__
        check_int(self.every, f"{name}.every", 1)
        check_int(self.burn_in, f"{name}.burn_in", 0)
        if self.until is not None:
            check_int(self.until, f"{name}.until", self.burn_in,
                      why=f" (the last step a hyper-step runs at, at least burn_in={self.burn_in}; None: to the end)")
        check_int(self.warmup, f"{name}.warmup", 0)
        check_int(self.hyper_steps, f"{name}.hyper_steps", 1)
        check_number(self.learning_rate, f"{name}.learning_rate", 0.0, open_low=True)
        check_number(self.prior_learning_rate, f"{name}.prior_learning_rate", 0.0, open_low=True)
        check_int(self.prior_steps, f"{name}.prior_steps", 0)
        check_int(self.records, f"{name}.records", 1)
        if self.subset_size is None:
            object.__setattr__(self, "subset_size", self.records)
        check_int(self.subset_size, f"{name}.subset_size", 1, high=self.records,
                  why=" (records per kernel block, at most records)")
        if self.records % self.subset_size:
            raise ValueError(f"{name}.subset_size={self.subset_size} must divide records={self.records} (the "
                             f"records are cut into kernel blocks of that size); e.g. subset_size="
                             f"{max(d for d in range(1, self.subset_size + 1) if self.records % d == 0)}")
        check_choice(self.kernel, f"{name}.kernel", KERNELS)
        check_bool(self.grouped, f"{name}.grouped")
        check_bool(self.learn_prior, f"{name}.learn_prior")
        check_choice(self.likelihood, f"{name}.likelihood", LIKELIHOODS)
        check_number(self.noise_precision, f"{name}.noise_precision", 0.0, open_low=True)
        if not isinstance(self.targets, str) or not self.targets:
            raise TypeError(f"{name}.targets must be a batch field name, got {self.targets!r}")
        check_int(self.seed, f"{name}.seed", 0)
        if self.grouped and self.likelihood != "categorical":
            raise ValueError(f"{name}.grouped=True groups records by class, which needs likelihood='categorical', "
                             f"got {self.likelihood!r}; set grouped=False")


def ramp(rate: float, warmup: int) -> float | optax.Schedule:
    """`rate`, or with `warmup` > 0 a schedule of Adam's update count k: `rate * min(1, (k + 1) / warmup)`."""
    if not warmup:
        return rate
    return lambda count: rate * jax.numpy.minimum(1.0, (count + 1) / warmup)


def learned_magnitudes(path: tuple, value: Any) -> bool:
    """Filter of an `InvariantModel`'s stage parameters (its learnable magnitudes)."""
    return isinstance(value, nnx.Param) and path[:1] == ("augment",)


class MarginalLikelihood(Callback):
    """Runs the marginal-likelihood hyper-step on schedule while a `Trainer` trains an `InvariantModel`.

    Args:
        model: the trainer's `InvariantModel`.
        pipeline: its training pipeline (the records of a hyper-step are read from its source,
            positions drawn over its sampler's epoch).
        config: the hyper-step's settings.

    `history` records the hyperparameters after each occasion (`step`, `log_marglik` and its parts
    per training record, every `InvariantModel.widths()` entry); `seconds` each hyper-step's wall
    time (from the end of the training steps queued before it to its result, which it waits for).
    Both, the Adam states and the count travel in checkpoints.
    A hyper-step whose estimate is not finite raises `FloatingPointError` before it writes anything.

    Example:
        >>> marglik = MarginalLikelihood(invariant, pipeline, MarginalLikelihoodConfig(every=10))  # doctest: +SKIP
        >>> Trainer(invariant, optax.adam(1e-3), pipeline.raw_loader(), with_prior(loss_fn),  # doctest: +SKIP
        ...         callbacks=[marglik]).fit(600)
    """

    # After the checkpoint callback restores (-100) and before it saves a step (-100), so a saved
    # step holds its hyper-step and a resumed run repeats none.
    order = -200

    def __init__(self, model: InvariantModel, pipeline: Pipeline,
                 config: MarginalLikelihoodConfig = MarginalLikelihoodConfig()):
        if not isinstance(model, InvariantModel):
            raise TypeError(f"MarginalLikelihood: model must be an InvariantModel, got {describe_value(model)}")
        if not isinstance(pipeline, Pipeline) or pipeline.program is not model.augment:
            raise ValueError("MarginalLikelihood: pipeline must be the pipeline the InvariantModel was built over "
                             "(its stages make the copies and its source holds the records)")
        if not isinstance(config, MarginalLikelihoodConfig):
            raise TypeError(f"MarginalLikelihood: config must be a MarginalLikelihoodConfig, got "
                            f"{describe_value(config)}")
        if config.records > len(pipeline.sampler):
            raise ValueError(f"MarginalLikelihoodConfig.records={config.records} is more than the "
                             f"{len(pipeline.sampler)} records of an epoch; lower it")
        self.model, self.pipeline, self.config = model, pipeline, config
        _, _, magnitudes, prior, _ = nnx.split(model, model_params, learned_magnitudes, PriorPrecision, ...)
        if not jax.tree.leaves(magnitudes) and not config.learn_prior:
            raise ValueError("MarginalLikelihood has nothing to learn: the pipeline has no learnable magnitude "
                             "(build its operators with learnable=True) and learn_prior is False")
        self.tx = optax.adam(ramp(config.learning_rate, config.warmup))
        # The prior's Adam counts 1 + prior_steps updates a hyper-step.
        self.prior_tx = optax.adam(ramp(config.prior_learning_rate, config.warmup * (1 + config.prior_steps)))
        self.opt_state = (self.tx.init(magnitudes), self.prior_tx.init(prior))
        self._opt_treedef = jax.tree.structure(self.opt_state)
        self.schedule = Schedule(every_steps=config.every)
        self.count = 0  # hyper-steps run
        self._settled = False  # whether this callback has set the model's `settled` (a host flag: no device read)
        self._classes: np.ndarray | None = None  # every record's class, for grouped draws
        self._epoch_classes: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, its ids, their classes)
        self.history: list[dict] = []
        self.seconds: list[float] = []
        self._step = jax.jit(self._hyper_step, static_argnums=0)

    def event_order(self, event: str) -> int:
        return 0 if event == "on_train_begin" else self.order

    def _hyper_step(self, graphdef: Any, theta: Any, magnitudes: Any, prior: Any, rest: Any, opt_state: Any,
                    batch: dict) -> tuple:
        config, records = self.config, self.model.num_records
        batch = dict(batch)
        outputs = batch.pop(OUTPUTS)

        def log_evidence(terms, prior):
            deltas = nnx.merge(graphdef, theta, magnitudes, prior, rest).prior_precision
            return log_marginal_likelihood(terms, deltas)

        def objective(magnitudes):
            def apply(theta, sample):
                model = nnx.merge(graphdef, theta, magnitudes, prior, rest)
                # All copies in one call whatever the model's copies_per_call: the recipe's CNN on a 2-core CPU
                # took 122 ms a hyper-step in one-copy calls against 97 ms in one call.
                return model.outputs(sample, through_augmentation=True, copies_per_call=model.copies)

            # Matmuls inside the model at float32 too: a TPU's default keeps about three digits.
            with jax.default_matmul_precision("float32"):
                terms = laplace_terms(apply, theta, batch, batch[config.targets], num_records=records,
                                      subset_size=config.subset_size, likelihood=config.likelihood,
                                      noise_precision=config.noise_precision,
                                      single_outputs=outputs if config.kernel == "single_output" else None)
            parts = log_evidence(terms, prior)
            return -parts["log_marglik"] / records, (parts, terms)

        # The magnitudes' gradient differentiates through the per-record Jacobians (second order). With a
        # few magnitudes, forward mode (one tangent each, through the Jacobians' reverse passes) costs less
        # than reverse over reverse, which keeps every intermediate of the Jacobians for its backward pass
        # (0.12 s against 0.19 s a hyper-step: the recipe's CNN, 6 copies, 32 records, a quiet 2-core CPU);
        # past `FORWARD_MAGNITUDES` scalars one reverse pass is cheaper.
        scalars = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(magnitudes))
        if not scalars:  # the prior precision alone
            g_magnitudes, (_, (parts, terms)) = magnitudes, objective(magnitudes)
        elif scalars <= FORWARD_MAGNITUDES:
            g_magnitudes, (parts, terms) = jax.jacfwd(objective, has_aux=True)(magnitudes)
        else:
            (_, (parts, terms)), g_magnitudes = jax.value_and_grad(objective, has_aux=True)(magnitudes)
        terms = jax.lax.stop_gradient(terms)

        def prior_loss(p):
            return -log_evidence(terms, p)["log_marglik"] / records

        g_prior = jax.grad(prior_loss)(prior)
        state, prior_state = opt_state
        updates, state = self.tx.update(g_magnitudes, state, magnitudes)
        magnitudes = optax.apply_updates(magnitudes, updates)
        if config.learn_prior:
            def prior_step(carry):
                prior, prior_state, g_prior = carry
                updates, prior_state = self.prior_tx.update(g_prior, prior_state, prior)
                prior = optax.apply_updates(prior, updates)
                return prior, prior_state, jax.grad(prior_loss)(prior)

            # A loop rather than unrolled steps: one compiled step, however many `prior_steps`.
            prior, prior_state, _ = jax.lax.fori_loop(0, 1 + config.prior_steps, lambda _, c: prior_step(c),
                                                      (prior, prior_state, g_prior))
        return magnitudes, prior, (state, prior_state), parts

    def draw(self, epoch: int) -> dict[str, np.ndarray]:
        """The untransformed records of the next hyper-step (with record ids and epoch) and the
        single-output kernel's draws, as numpy arrays."""
        rng = np.random.default_rng([self.config.seed, self.count])
        if self.config.grouped:
            ids = self._grouped_ids(rng, epoch)
        else:
            positions = rng.choice(len(self.pipeline.sampler), self.config.records, replace=False)
            ids = np.asarray(self.pipeline.sampler.indices(positions.astype(np.int64), epoch))
        if ids.ndim != 1:
            raise ValueError(f"MarginalLikelihood reads single records, but the pipeline's sampler gives records of "
                             f"shape {ids.shape[1:]} (a windowed sampler); use a record sampler")
        batch = dict(self.pipeline.source.read(ids, epoch))
        if self.config.targets not in batch:
            raise KeyError(f"MarginalLikelihoodConfig.targets={self.config.targets!r} is not a field of the "
                           f"source's records {sorted(batch)}; name the labels' field")
        batch[RECORD_IDS] = ids.astype(np.int32)
        batch[EPOCH] = np.full(ids.shape, epoch, np.int32)
        batch[OUTPUTS] = rng.integers(0, 2**30, self.config.records // self.config.subset_size).astype(np.int32)
        return batch

    def _grouped_ids(self, rng: np.random.Generator, epoch: int) -> np.ndarray:
        """`records` record ids of the epoch, class by class in a random class order (`grouped`)."""
        if self._epoch_classes is None or self._epoch_classes[0] != epoch:  # once an epoch, not every hyper-step
            ids = np.asarray(self.pipeline.sampler.indices(np.arange(len(self.pipeline.sampler), dtype=np.int64),
                                                           epoch))
            if ids.ndim != 1:
                raise ValueError(f"MarginalLikelihood reads single records, but the pipeline's sampler gives records "
                                 f"of shape {ids.shape[1:]} (a windowed sampler); use a record sampler")
            if self._classes is None:
                self._classes = self._read_classes()
            self._epoch_classes = (epoch, ids, self._classes[ids])
        _, ids, classes = self._epoch_classes
        order = rng.permutation(np.unique(classes))
        rank = np.empty(order.max() + 1, np.int64)
        rank[order] = np.arange(len(order))
        # Shuffle, then a stable sort by the class's rank: classes in a random order, records shuffled within.
        shuffled = rng.permutation(len(ids))
        chosen = shuffled[np.argsort(rank[classes[shuffled]], kind="stable")][:self.config.records]
        return ids[chosen]

    def _read_classes(self) -> np.ndarray:
        """Every record's class (`targets`), by record id, read from the source in chunks."""
        source, field = self.pipeline.source, self.config.targets
        classes = np.empty(len(source), np.int64)
        for begin in range(0, len(source), CLASS_CHUNK):
            ids = np.arange(begin, min(begin + CLASS_CHUNK, len(source)))
            batch = source.read(ids, 0)
            if field not in batch:
                raise KeyError(f"MarginalLikelihoodConfig.targets={field!r} is not a field of the source's records "
                               f"{sorted(batch)}; name the labels' field")
            values = np.asarray(batch[field])
            if values.shape != ids.shape or not np.issubdtype(values.dtype, np.integer) or values.min() < 0:
                raise ValueError(f"MarginalLikelihoodConfig.grouped=True needs one non-negative integer class per "
                                 f"record in {field!r}, got shape {values.shape[1:] or '()'} dtype {values.dtype}; "
                                 "set grouped=False")
            classes[ids] = values
        return classes

    def hyper_step(self, epoch: int) -> dict[str, float]:
        """One hyper-step now (updating the model's hyperparameters in place); the log evidence per
        training record and its parts, at the hyperparameters it started from."""
        batch = self.draw(epoch)
        graphdef, theta, magnitudes, prior, rest = nnx.split(self.model, model_params, learned_magnitudes,
                                                             PriorPrecision, ...)
        # Every array committed where the step's outputs will be: uncommitted ones in the first call (a fresh
        # optimiser state, or a model no step has run) would make the second hyper-step compile the same
        # program again (2.5 s in the recipe).
        leaves, treedef = jax.tree.flatten((theta, magnitudes, prior, rest, self.opt_state))
        theta, magnitudes, prior, rest, opt_state = jax.tree.unflatten(treedef, committed_together(leaves))
        jax.block_until_ready(theta)  # the training steps queued before it are not the hyper-step's time
        began = time.perf_counter()
        magnitudes, prior, opt_state, parts = self._step(graphdef, theta, magnitudes, prior, rest, opt_state, batch)
        out = {k: float(v) / self.model.num_records for k, v in parts.items()}  # waits for the step
        if not all(np.isfinite(v) for v in out.values()) or not all(
                np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves((magnitudes, prior))):
            raise FloatingPointError(f"the marginal likelihood's hyper-step {self.count} gave a non-finite estimate "
                                     f"{out}; the hyperparameters were left as they were. A prior precision far "
                                     "from the data's scale, or a learning rate too large, can cause it")
        nnx.update(self.model, magnitudes, prior)
        self.opt_state = opt_state
        self.seconds.append(time.perf_counter() - began)
        self.count += 1
        return out

    def on_train_begin(self, trainer: Trainer) -> None:
        if trainer.model is not self.model:
            raise ValueError("MarginalLikelihood's model is not the trainer's model: build the Trainer over the "
                             "same InvariantModel")
        self.schedule.reset(trainer.step)

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        until = self.config.until
        past = until is not None and logs.step > until  # several steps a call can step past `until`
        if not past and self.schedule.due(logs.step) and logs.step >= self.config.burn_in:
            for _ in range(self.config.hyper_steps):
                out = self.hyper_step(logs.epoch)
            self.history.append({"step": logs.step, **out, **self.model.widths()})
        if until is not None and logs.step >= until and not self._settled:
            # Every later training step sees it (idempotent after a resume that restored it: no device read),
            # placed as the value it replaces, so the training step does not compile again.
            current, one = self.model.settled[...], jnp.ones((), jnp.float32)
            self.model.settled[...] = jax.device_put(one, current.sharding) if current.committed else one
            self._settled = True

    def median_s(self, skip: int = 1) -> float:
        """Median wall time of a hyper-step, the first `skip` (compilation) left out."""
        times = self.seconds[skip:] or self.seconds
        return float(np.median(times)) if times else float("nan")

    def get_state(self) -> dict:
        leaves = [np.asarray(x).tolist() for x in jax.tree.leaves(self.opt_state)]
        return {"count": self.count, "opt_state": leaves, "history": self.history}

    def set_state(self, state: dict) -> None:
        current = jax.tree.leaves(self.opt_state)
        if len(state["opt_state"]) != len(current):
            raise ValueError(f"MarginalLikelihood state holds {len(state['opt_state'])} optimizer arrays, this run "
                             f"has {len(current)}: the checkpoint was written with other hyperparameters")
        leaves = [np.asarray(v, dtype=c.dtype).reshape(c.shape) for v, c in zip(state["opt_state"], current)]
        self.opt_state = jax.tree.unflatten(self._opt_treedef, [jax.numpy.asarray(x) for x in leaves])
        self.count = int(state["count"])
        self.history = list(state.get("history", []))
