"""Optimizers for joint training: one optax transformation over the model and the pipeline."""

from __future__ import annotations

import jax
import optax


def joint_optimizer(model: optax.GradientTransformation,
                    pipeline: optax.GradientTransformation) -> optax.GradientTransformation:
    """One optimizer for `Trainer(..., train_pipeline_params=True)` with its own rule for the pipeline."""
    for name, value in (("model", model), ("pipeline", pipeline)):
        if not isinstance(value, optax.GradientTransformation):
            raise TypeError(f"joint_optimizer: {name} must be an optax GradientTransformation, got "
                            f"{type(value).__name__}; pass e.g. {name}=optax.adam(1e-3)")

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "pipeline" if getattr(path[0], "key", None) == "pipeline" else "model", params)

    return optax.multi_transform({"model": model, "pipeline": pipeline}, labels)
