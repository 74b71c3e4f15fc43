"""What the training optimizer covers: one optax transformation over the model (and the pipeline)."""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import nnx

from datarax.train.invariance.model import InvariantModel


def joint_optimizer(model: optax.GradientTransformation,
                    pipeline: optax.GradientTransformation) -> optax.GradientTransformation:
    """One optimizer for `Trainer(..., train_pipeline_params=True)` with its own rule for the pipeline.

    Pipeline parameters (augmentation magnitudes, front-end filters) have few entries and start far
    from where they end up, so they want a larger, unscheduled step than the model. In joint mode the
    trainer optimises one module whose attributes are `model` and `pipeline`; the labels of this
    `optax.multi_transform` split the parameters on that first key.

    Example:
        >>> tx = joint_optimizer(optax.adamw(1e-3), optax.adam(3e-2))
        >>> isinstance(tx, optax.GradientTransformation)
        True
    """
    for name, value in (("model", model), ("pipeline", pipeline)):
        if not isinstance(value, optax.GradientTransformation):
            raise TypeError(f"joint_optimizer: {name} must be an optax GradientTransformation, got "
                            f"{type(value).__name__}; pass e.g. {name}=optax.adam(1e-3)")

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "pipeline" if getattr(path[0], "key", None) == "pipeline" else "model", params)

    return optax.multi_transform({"model": model, "pipeline": pipeline}, labels)


def trained_params(module: nnx.Module, joint: bool) -> Any:
    """The filter of the variables the training loss trains: every `nnx.Param` of `module` (and, when
    `joint`, of the pipeline), except in an `InvariantModel`, whose stage magnitudes and prior
    precision only its marginal likelihood learns."""
    if not isinstance(module, InvariantModel):
        return nnx.Param
    if joint:
        raise ValueError("train_pipeline_params=True would train an InvariantModel's stage magnitudes with the "
                         "training loss; its MarginalLikelihood callback learns them: leave it False")
    return InvariantModel.trained


def check_optimizer_filter(optimizer: nnx.Optimizer, wrt: Any) -> None:
    """A ready `nnx.Optimizer` for an `InvariantModel` must cover its network only."""
    if wrt is InvariantModel.trained and optimizer.wrt is not wrt:
        raise ValueError("the nnx.Optimizer of an InvariantModel must leave its stage magnitudes to the marginal "
                         "likelihood: build it with nnx.Optimizer(model, tx, wrt=InvariantModel.trained), or pass "
                         "the optax transformation itself")
