"""Checkpoints: one Orbax checkpoint per save (model, optimizer, iterator, metadata), its integrity
hashes and the run configuration it was written under."""

from datarax.train.checkpointing.checkpointer import Checkpointer as Checkpointer
from datarax.train.checkpointing.errors import CheckpointMismatchError as CheckpointMismatchError
from datarax.train.checkpointing.errors import CheckpointRestoreError as CheckpointRestoreError
from datarax.train.checkpointing.errors import CheckpointSaveError as CheckpointSaveError
from datarax.train.checkpointing.errors import CorruptCheckpointWarning as CorruptCheckpointWarning
from datarax.train.checkpointing.hashing import state_sha256 as state_sha256
