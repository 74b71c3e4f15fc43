"""Optimizers for joint training: one optax transformation over the model and the pipeline."""

from __future__ import annotations

import jax
import optax


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
