"""The errors and warnings of saving and restoring checkpoints."""

from __future__ import annotations

from datarax.core.errors import DataraxError, DataraxWarning


class CheckpointMismatchError(DataraxError, ValueError):
    """A checkpoint that is intact but was written by a different run set-up (data, batch size, model)."""


class CheckpointRestoreError(DataraxError, RuntimeError):
    """No checkpoint in the directory could be restored."""


class CheckpointSaveError(DataraxError, RuntimeError):
    """A checkpoint write failed (raised from the next save, `wait` or `close` when asynchronous)."""


class CorruptCheckpointWarning(DataraxWarning):
    """The latest checkpoint could not be read; an earlier one is used instead (or a fresh start)."""
