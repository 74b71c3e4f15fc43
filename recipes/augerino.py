"""Pieces of a learned augmentation policy: the policy stage, the width-rewarded loss, a tracker.

The policy is an ordinary pipeline stage, so `Trainer(..., train_pipeline_params=True)` trains
its magnitudes with the classifier. Its learnable magnitudes are bounded (`low + (high - low) *
sigmoid(raw)`, see `datarax.operators.learnable`); it writes their mean *width* (each as the
fraction of its allowed range it spans) into the batch, and the loss subtracts
`reward * width` (the Augerino objective, Benton et al. 2020): without the reward the training
loss alone always prefers no augmentation, with it the widths grow until wider augmentation starts
to cost more training loss than the reward pays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorConfig, OperatorModule
from datarax.operators.strategies import SelectorOperator
from recipes.models import classification_loss
from datarax.train.callbacks import Callback, StepLogs

if TYPE_CHECKING:
    from datarax.train import Trainer

WIDTH_FIELD = "aug_width"


class AugmentationPolicy(OperatorModule):
    """Applies `operators` in order and adds the mean width of their learnable magnitudes.

    Args:
        operators: image operators (and selectors) to apply; their learnable magnitudes count
            towards the width.
        scales: the unit each magnitude's width is measured in, keyed like `magnitudes()`
            (e.g. `{"Affine.degrees": 15.0}`); a magnitude not listed uses its allowed range.
    """

    def __init__(self, operators: Sequence[OperatorModule], scales: Mapping[str, float] | None = None):
        self.config = OperatorConfig()
        self.operators = nnx.List(list(operators))
        self.scales = dict(scales or {})
        unknown = sorted(set(self.scales) - set(self.magnitudes()))
        if unknown:
            raise ValueError(f"scales names {unknown}, which are not learnable magnitudes of the policy; "
                             f"choose from {sorted(self.magnitudes())}")

    def magnitudes(self) -> dict[str, jax.Array]:
        """Current values of the learnable magnitudes, keyed `Operator.name`."""
        out = {}
        for op in self.operators:
            for name, magnitude in getattr(op, "magnitudes", {}).items():
                if magnitude.learnable:
                    out[f"{type(op).__name__.removesuffix('Operator')}.{name}"] = magnitude
        return out

    def widths(self) -> dict[str, jax.Array]:
        """Each learnable magnitude in units of its scale (`(value - low) / scale`)."""
        return {k: (m() - m.low) / self.scales.get(k, m.high - m.low) for k, m in self.magnitudes().items()}

    def selection_probabilities(self) -> dict[str, list[float]]:
        """softmax(logits) of every learnable selector (`selection`, `selection1`, ...)."""
        selectors = [op for op in self.operators if isinstance(op, SelectorOperator) and op.logits is not None]
        return {f"selection{i or ''}": jax.nn.softmax(op.logits[...]) for i, op in enumerate(selectors)}

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        for op in self.operators:
            elements = op.apply_batch(elements, ctx)
        widths = list(self.widths().values())
        width = jnp.mean(jnp.stack(widths)) if widths else jnp.zeros(())
        return elements.update_data({WIDTH_FIELD: jnp.broadcast_to(width, ctx.record_ids.shape)})

    def structure(self) -> str:
        return (f"AugmentationPolicy(scales={sorted(self.scales.items())})["
                + ", ".join(op.structure() for op in self.operators) + "]")


def width_rewarded_loss(reward: float):
    """Cross-entropy minus `reward * width` (width from the policy's field; 0 when absent)."""

    def loss_fn(model: nnx.Module, batch: dict):
        loss, logits = classification_loss(model, batch)
        if WIDTH_FIELD in batch:
            loss = loss - reward * batch[WIDTH_FIELD].mean()
        return loss, logits

    return loss_fn


def policy_values(policy: AugmentationPolicy) -> dict[str, float | list[float]]:
    """Host values of the policy's magnitudes and selection probabilities."""
    values: dict = {k: float(m()) for k, m in policy.magnitudes().items()}
    values.update({k: [float(p) for p in v] for k, v in policy.selection_probabilities().items()})
    return values


class PolicyTracker(Callback):
    """Records the policy's magnitudes every `every` steps; the history travels in checkpoints."""

    order = -20  # before the checkpoint callback saves (callback states are saved with it)

    def __init__(self, policy: AugmentationPolicy, every: int):
        self.policy = policy
        self.every = every
        self.history: list[dict] = []

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if logs.step % self.every == 0 or logs.step == 1:
            self.history.append({"step": logs.step, **policy_values(self.policy)})

    def get_state(self) -> dict:
        return {"history": self.history}

    def set_state(self, state: dict) -> None:
        self.history = list(state.get("history", []))
