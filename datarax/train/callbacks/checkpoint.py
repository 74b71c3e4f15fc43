"""Checkpointing callback: restore at the start, save on a schedule, force the final save."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from datarax.train.callbacks.base import Callback, Schedule, StepLogs
from datarax.train.checkpointing import Checkpointer, RestoredCheckpoint, resolve_on_damaged

if TYPE_CHECKING:
    from datarax.train.trainer import Trainer


class CheckpointCallback(Callback):
    """Saves model, optimizer, iterator and metadata as one Orbax checkpoint.

    At train begin it restores the newest readable checkpoint in `directory` (unless
    `restore=False`); it saves whenever the schedule fires, and always at train end, including a
    stop by SIGTERM/SIGINT (a forced save, whatever the schedule). Background-write errors are
    raised from the next save or from train end.

    Args:
        directory: the checkpoint root directory.
        every_steps / every_secs / on_steps: the save schedule (see `Schedule`).
        max_to_keep: newest checkpoints kept (None: all).
        asynchronous: write arrays in the background (default) or block on every save.
        restore: restore the latest checkpoint when training begins.
        on_damaged: when the directory holds checkpoints but none can be restored (unreadable, or
            failing the integrity check): "refuse" (raise `CheckpointRestoreError`, on every run)
            or "start_fresh" (warn and train from step 0). None: the environment variable
            DATARAX_ON_DAMAGED_CHECKPOINTS, else "refuse".

    While training, the callback's `Checkpointer` holds an exclusive lock on `directory`: a second
    run on the same directory fails with `CheckpointLockedError` naming this run's pid.

    Example:
        >>> ckpt = CheckpointCallback("run/ckpt", every_steps=500, max_to_keep=3)
        >>> Trainer(model, optax.adam(1e-3), pipeline, loss_fn, callbacks=[ckpt]).fit(num_steps=10_000)
    """

    order = -100  # restore before any other callback reads the step

    def __init__(self, directory: Any, *, every_steps: int | None = None, every_secs: float | None = None,
                 on_steps: Sequence[int] = (), max_to_keep: int | None = 3, asynchronous: bool = True,
                 restore: bool = True, on_damaged: str | None = None):
        self.schedule = Schedule(every_steps=every_steps, every_secs=every_secs, on_steps=on_steps)
        self.directory = directory
        self.max_to_keep = max_to_keep
        self.asynchronous = asynchronous
        self.restore = restore
        self.on_damaged = resolve_on_damaged(on_damaged)
        self.restored: RestoredCheckpoint | None = None
        self._checkpointer: Checkpointer | None = None
        self._restored_once = False

    @property
    def checkpointer(self) -> Checkpointer:
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self.directory, max_to_keep=self.max_to_keep,
                                              asynchronous=self.asynchronous, on_damaged=self.on_damaged)
        return self._checkpointer

    def on_train_begin(self, trainer: Trainer) -> None:
        if self.restore and not self._restored_once:
            self._restored_once = True
            self.restored = trainer.restore_checkpoint(self.checkpointer)
        self.schedule.reset(trainer.step)

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if self.schedule.due(logs.step):
            trainer.save_checkpoint(self.checkpointer)

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        checkpointer = self.checkpointer
        checkpointer.wait()
        if trainer.step not in checkpointer.steps():
            trainer.save_checkpoint(checkpointer, forced=True, wait=True)
        self.close()

    def close(self) -> None:
        if self._checkpointer is not None:
            checkpointer, self._checkpointer = self._checkpointer, None
            checkpointer.close()
