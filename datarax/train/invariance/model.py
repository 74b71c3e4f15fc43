"""The invariant model: a model's outputs averaged over copies of each record drawn by a pipeline's stages.

    f_inv(x_i) = 1/S sum_s f(T(x_i; eta, key(i, epoch, s)))

`T` is the pipeline's stage program (its learnable operators' magnitudes are `eta`), run on S
copies of every record of an untransformed batch (`Pipeline.raw_loader()`), each copy with its
own key by record identity: copy s of record i draws as record `i * S + s` would in the same
epoch (`fold_in(fold_in(stage_key, epoch), i * S + s)`), so the copies do not depend on the
batch, its order or a resume point, and S = 1 is the pipeline itself. The augmentation is part of
the model, in training and at test (Immer et al. 2022, "Invariance Learning in Deep Neural
Networks with Differentiable Laplace Approximations"): the marginal likelihood of this model
(`datarax.train.invariance.laplace`) sees the magnitudes at the current weights.

The training loss never moves `eta`: the model's forward pass stops their gradient, and the
trainer's optimizer covers only the inner model's parameters (`InvariantModel.trained`). The
prior precision `delta` of those parameters (one per parameter tensor, "layerwise", the default
of the published method, or one for all, "scalar") is held here, as its log in a
`PriorPrecision` variable checkpointed with the model, so the MAP training loss (`with_prior`)
and the marginal likelihood read the same value.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import check_choice, check_int, check_number, describe_value
from datarax.core.operator import BatchContext
from datarax.operators.learnable import Magnitude
from datarax.pipeline.compiled import run_program
from datarax.pipeline.pipeline import Pipeline
from datarax.pipeline.raw import EPOCH, RECORD_IDS

INT32_IDS = 2**31  # virtual record ids `i * copies + s` must stay int32
PRIOR_STRUCTURES = ("layerwise", "scalar")


class PriorPrecision(nnx.Variable):
    """The log prior precision of an `InvariantModel`'s parameters: a hyperparameter, never trained by
    the training loss (the marginal likelihood's hyper-step updates it)."""


class Settled(nnx.Variable):
    """1.0 once `MarginalLikelihood` has run its last hyper-step (`MarginalLikelihoodConfig.until`),
    else 0.0: the widths and prior are fixed from then on. `with_prior` stops adding the prior's
    penalty, and a loss may read it to train each copy on its own (`InvariantModel.copy_outputs`)."""


def model_params(path: tuple, value: Any) -> bool:
    """Filter of the parameters the training loss trains: the `nnx.Param`s of the inner model."""
    return isinstance(value, nnx.Param) and path[:1] == ("model",)


def check_invariance(*, copies: int, field: str, prior_precision: float, prior: str,
                     copies_per_call: int | None = None) -> None:
    """Checks `InvariantModel`'s settings (also those of a configuration's `[trainer.marglik]`)."""
    check_int(copies, "copies", 1, why=" (copies of each record averaged)")
    if copies_per_call is not None:
        check_int(copies_per_call, "copies_per_call", 1, high=copies,
                  why=f" (copies the network runs on per call, at most copies={copies}; None: all in one call)")
    if not isinstance(field, str) or not field:
        raise TypeError(f"field must be the name of the stage output the model reads, got {field!r}")
    check_number(prior_precision, "prior_precision", 0.0, float("inf"), open_low=True)
    check_choice(prior, "prior", PRIOR_STRUCTURES)


class InvariantModel(nnx.Module):
    """`model`'s outputs averaged over `copies` copies of each record drawn by `pipeline`'s stages.

    Args:
        model: the network; called on the stages' output `field`, one call on all copies of the
            batch (`copies * B` rows, or `copies_per_call * B` a call), returning one output per row.
        pipeline: the training pipeline; its stage program (shared, not copied: the pipeline's
            learnable magnitudes are the model's) makes the copies, and its epoch's record count
            is the N of the prior penalty.
        copies: S, the copies averaged per record, in training and at test.
        field: the stage output the network reads.
        prior_precision: the starting prior precision `delta` of the network's parameters.
        prior: "layerwise" (one precision per parameter tensor) or "scalar" (one for all).
        copies_per_call: run the network on this many copies of the batch a call, the calls
            unrolled in one program (None: all copies in one call). The same function; on a CPU,
            XLA ran the rotated-digit recipe's CNN on eight batch-sized calls in about 60% of the
            time of one eight-times-larger call (docs/invariance.md), while an accelerator
            prefers the one large call.

    Calling it takes an untransformed batch from `pipeline.raw_loader()` (its record ids and
    epoch are the copies' keys) and returns the averaged outputs `(B, C)`. Train it with the
    batches of `pipeline.raw_loader()` and a loss that calls `model(batch)`:

    Example:
        >>> invariant = InvariantModel(net, pipeline, copies=8)  # doctest: +SKIP
        >>> def loss_fn(model, batch):  # doctest: +SKIP
        ...     logits = model(batch)
        ...     return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits
        >>> trainer = Trainer(invariant, optax.adam(1e-3), pipeline.raw_loader(), with_prior(loss_fn),  # doctest: +SKIP
        ...                   callbacks=[MarginalLikelihood(invariant, pipeline)])
    """

    trained = staticmethod(model_params)

    def __init__(self, model: nnx.Module, pipeline: Pipeline, *, copies: int = 8, field: str = "image",
                 prior_precision: float = 1.0, prior: str = "layerwise", copies_per_call: int | None = None):
        if not isinstance(model, nnx.Module):
            raise TypeError(f"InvariantModel: model must be an nnx.Module, got {describe_value(model)}")
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"InvariantModel: pipeline must be a datarax Pipeline (its stages make the copies), got "
                            f"{describe_value(pipeline)}")
        check_invariance(copies=copies, field=field, prior_precision=prior_precision, prior=prior,
                         copies_per_call=copies_per_call)
        outputs = pipeline.output_spec()
        if field not in outputs:
            raise ValueError(f"InvariantModel: field {field!r} is not an output of the pipeline's stages (they give "
                             f"{sorted(outputs)}); pass field=... naming the one the model reads")
        records = len(pipeline.source)
        if records * copies >= INT32_IDS:
            raise ValueError(f"InvariantModel: copies={copies} of {records} records need record ids up to "
                             f"{records * copies}, past int32; use fewer copies")
        self.model = model
        self.augment = pipeline.program
        self.copies = int(copies)
        self.copies_per_call = self.copies if copies_per_call is None else int(copies_per_call)
        self.field = field
        self.num_records = len(pipeline.sampler)
        tensors = len(jax.tree.leaves(nnx.state(model, nnx.Param)))
        shape = (tensors,) if prior == "layerwise" else ()
        self.log_prior_precision = PriorPrecision(jnp.full(shape, jnp.log(prior_precision), jnp.float32))
        self.settled = Settled(jnp.zeros((), jnp.float32))

    def __call__(self, batch: Mapping[str, jax.Array]) -> jax.Array:
        """The averaged outputs of an untransformed batch; the stages' magnitudes get no gradient."""
        return self.outputs(batch)

    def outputs(self, batch: Mapping[str, jax.Array], *, through_augmentation: bool = False,
                copies_per_call: int | None = None) -> jax.Array:
        """The averaged outputs `(B, ...)` of an untransformed batch holding `record_ids` and `epoch`.

        With `through_augmentation=True` the gradient reaches the stages' parameters (the marginal
        likelihood's hyper-step); otherwise the copies are constants to the gradient.
        `copies_per_call` overrides the model's for this call (the hyper-step runs all copies in
        one call: its Jacobian passes were slower in pieces).
        """
        return self.copy_outputs(batch, through_augmentation=through_augmentation,
                                 copies_per_call=copies_per_call).mean(axis=0)

    def copy_outputs(self, batch: Mapping[str, jax.Array], *, through_augmentation: bool = False,
                     copies_per_call: int | None = None) -> jax.Array:
        """Every copy's outputs `(S, B, ...)` before the average (`outputs` is their mean over axis 0):
        for a loss on each copy, e.g. the copies' mean cross-entropy, as data augmentation trains."""
        missing = [k for k in (RECORD_IDS, EPOCH) if k not in batch]
        if missing:
            raise KeyError(f"InvariantModel takes an untransformed batch from pipeline.raw_loader(), with the record "
                           f"ids and epoch the copies are keyed by; this batch has no {missing} (fields: "
                           f"{sorted(batch)})")
        data = {k: v for k, v in batch.items() if k not in (RECORD_IDS, EPOCH)}
        ids = jnp.asarray(batch[RECORD_IDS], jnp.int32)
        if ids.ndim != 1:
            raise ValueError(f"InvariantModel keys copies by single records, but the batch's record ids have shape "
                             f"{ids.shape} (a windowed sampler); use a record sampler")
        size, copies = ids.shape[0], self.copies
        # Copy-major rows: row s * B + b is copy s of record b, drawn as record ids[b] * S + s.
        tiled = jax.tree.map(lambda x: jnp.concatenate([x] * copies), data)
        virtual = (ids[None, :] * copies + jnp.arange(copies, dtype=jnp.int32)[:, None]).reshape(-1)
        epoch = jnp.asarray(batch[EPOCH], jnp.int32).reshape(-1)[0]
        ctx = BatchContext(virtual, epoch, jnp.ones(virtual.shape, bool))
        x = run_program(self.augment, tiled, ctx)[self.field]
        if not through_augmentation:
            x = jax.lax.stop_gradient(x)
        rows = (self.copies_per_call if copies_per_call is None else copies_per_call) * size
        if rows >= x.shape[0]:
            out = self.model(x)
        else:  # unrolled calls of copies_per_call copies each (the last may hold fewer)
            out = jnp.concatenate([self.model(x[i:i + rows]) for i in range(0, x.shape[0], rows)])
        return out.reshape(copies, size, *out.shape[1:])

    @property
    def prior_precision(self) -> jax.Array:
        """delta: `()`, or `(tensors,)` in the order of `jax.tree.leaves` of the network's parameters."""
        return jnp.exp(self.log_prior_precision[...])

    def prior_penalty(self) -> jax.Array:
        """`theta' D theta / (2 N)`: the Gaussian prior's share per training record, added to a mean loss
        (`with_prior`, until the model is `settled`), so training finds the MAP the Laplace
        approximation is taken at."""
        theta = jax.tree.leaves(nnx.state(self, model_params))
        deltas = jnp.broadcast_to(jax.lax.stop_gradient(self.prior_precision), (len(theta),))
        square = sum(deltas[i] * jnp.sum(jnp.square(p)) for i, p in enumerate(theta))
        return square / (2.0 * self.num_records)

    def magnitudes(self) -> dict[str, Magnitude]:
        """The learnable magnitudes of the stages, keyed by path (`"stages.0.magnitudes.degrees"`)."""
        return {".".join(map(str, path)): m for path, m in nnx.iter_graph(self.augment)
                if isinstance(m, Magnitude) and m.learnable}

    def widths(self) -> dict[str, float]:
        """Host values of the learnable magnitudes (`Magnitude.value()`) and of `prior_precision` (its
        geometric mean over the tensors when layerwise)."""
        out = {name: float(m.value()) for name, m in self.magnitudes().items()}
        out["prior_precision"] = float(jnp.exp(jnp.mean(self.log_prior_precision[...])))
        return out


def with_prior(loss_fn: Callable) -> Callable:
    """`loss_fn` plus the model's `InvariantModel.prior_penalty()`: the MAP objective of a mean loss,
    while the marginal likelihood still moves the hyperparameters. Once the model is settled
    (`MarginalLikelihoodConfig.until`) the penalty is no longer added: the Laplace approximation is
    not taken again, and the network trains on the loss alone.

    A `loss_fn(model, batch, mask)` keeps its `mask` argument (`datarax.train.loop.masking`).
    """
    if "mask" in _parameters(loss_fn):
        def masked(model, batch, mask):
            return _add(loss_fn(model, batch, mask=mask), model)

        return masked

    def loss(model, batch):
        return _add(loss_fn(model, batch), model)

    return loss


def _parameters(fn: Callable) -> Mapping[str, Any]:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}


def _add(out: Any, model: Any) -> Any:
    if not isinstance(model, InvariantModel):
        raise TypeError(f"with_prior: the loss's model must be an InvariantModel (it holds the prior precision), "
                        f"got {describe_value(model)}")
    penalty = model.prior_penalty() * (1.0 - jax.lax.stop_gradient(model.settled[...]))
    if isinstance(out, tuple):
        return (out[0] + penalty, *out[1:])
    return out + penalty
