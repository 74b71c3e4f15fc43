"""The kit's checkpoints: one Orbax checkpoint per save (model, optimizer, iterator, metadata) and
the run configuration it was written under. The pieces that do not need the kit (errors,
integrity, hashing, trees, retention, locking) are in `datarax.checkpoint`."""

from datarax.train.checkpointing.checkpointer import Checkpointer as Checkpointer
