"""Untransformed batches with their context, for training a pipeline's parameters in your own step."""

from __future__ import annotations

import jax.numpy as jnp

from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorModule

RECORD_IDS = "record_ids"
EPOCH = "epoch"


class ContextStage(OperatorModule):
    """A batch-level stage that copies the batch's record ids and epoch into the data.

    A pipeline with only this stage yields the untransformed batch plus the exact `BatchContext`
    (record ids, epoch) the full pipeline would have used for it, so a training step can run the
    full pipeline's stages itself, inside its gradient:
    `pipeline.transform(batch, record_ids=batch[ids_key], epoch=batch[epoch_key][0])`.
    """

    def __init__(self, ids_key: str = RECORD_IDS, epoch_key: str = EPOCH):
        for name, key in (("ids_key", ids_key), ("epoch_key", epoch_key)):
            if not isinstance(key, str) or not key:
                raise TypeError(f"ContextStage {name} must be a non-empty str, got {key!r}")
        if ids_key == epoch_key:
            raise ValueError(f"ContextStage ids_key and epoch_key must differ, both are {ids_key!r}")
        self.config = None
        self.ids_key, self.epoch_key = ids_key, epoch_key

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        for key in (self.ids_key, self.epoch_key):
            if key in elements.data:
                raise ValueError(f"the source already has a field {key!r}, the name ContextStage writes to; pass "
                                 f"raw_loader(ids_key=..., epoch_key=...) with names the data does not use")
        size = ctx.record_ids.shape[0]
        return elements.update_data({self.ids_key: ctx.record_ids,
                                     self.epoch_key: jnp.broadcast_to(ctx.epoch, (size,)).astype(jnp.int32)})

    def structure(self) -> str:
        return f"ContextStage({self.ids_key!r}, {self.epoch_key!r})"
