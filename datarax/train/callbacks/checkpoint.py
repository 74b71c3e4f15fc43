"""Checkpointing callback: restore at the start, save on a schedule, force the final save."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from datarax.checkpoint.policies import check_best, resolve_on_damaged
from datarax.train.callbacks.base import Callback, Schedule, StepLogs
from datarax.train.checkpointing.checkpointer import Checkpointer, RestoredCheckpoint

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer


class CheckpointCallback(Callback):
    """Saves model, optimizer, iterator and metadata as one Orbax checkpoint.

    Restores the newest readable checkpoint at train begin (unless `restore=False`), saves when the
    schedule fires, and always at train end (a SIGTERM/SIGINT stop included). `load_best(trainer)`
    restores the best checkpoint. While training, the directory is locked: a second run on it fails
    with `CheckpointLockedError`.

    Args:
        directory: the checkpoint root directory.
        every_steps / every_secs / on_steps: the save schedule (see `Schedule`).
        max_to_keep: newest checkpoints kept (None: all).
        asynchronous: write arrays in the background (default) or block on every save.
        restore: restore the latest checkpoint when training begins.
        on_damaged: when no checkpoint in the directory can be restored: "refuse" (raise
            `CheckpointRestoreError`) or "start_fresh"; None: `$DATARAX_ON_DAMAGED_CHECKPOINTS`, else "refuse".
        keep_best: also keep the k best checkpoints by `best_metric`, beside the `max_to_keep` newest.
        best_metric: "eval/<name>" or "train/<name>", as loggers name metrics: its newest value when saved.
            With an eval metric, a save due at a step the trainer also evaluates at waits for that
            evaluation (the state is the same) and carries its value; a train metric's value is the last
            one read, one step late as loggers see it.
        best_mode: "min" (lower is better) or "max".

    Example:
        >>> ckpt = CheckpointCallback("run/ckpt", every_steps=500, max_to_keep=3)
        >>> best = CheckpointCallback("run/ckpt", every_steps=500, max_to_keep=1, keep_best=3,
        ...                           best_metric="eval/loss")
    """

    order = -100  # restore before any other callback reads the step

    def event_order(self, event: str) -> int:
        # A save after an evaluation comes after every callback has taken it in (early stopping's
        # patience), so the checkpoint holds their state as of that evaluation.
        return 900 if event == "on_eval_end" else self.order

    def __init__(self, directory: Any, *, every_steps: int | None = None, every_secs: float | None = None,
                 on_steps: Sequence[int] = (), max_to_keep: int | None = 3, asynchronous: bool = True,
                 restore: bool = True, on_damaged: str | None = None, keep_best: int | None = None,
                 best_metric: str | None = None, best_mode: str = "min"):
        self.schedule = Schedule(every_steps=every_steps, every_secs=every_secs, on_steps=on_steps)
        self.directory = directory
        self.max_to_keep = max_to_keep
        self.asynchronous = asynchronous
        self.restore = restore
        self.on_damaged = resolve_on_damaged(on_damaged)
        self.keep_best, self.best_metric, self.best_mode = check_best(keep_best, best_metric, best_mode)
        # A save due at a step an evaluation may follow waits for it (see best_metric).
        self._waits_for_eval = self.best_metric is not None and self.best_metric.startswith("eval/")
        self._deferred: int | None = None
        self.restored: RestoredCheckpoint | None = None
        self._checkpointer: Checkpointer | None = None
        self._restored_once = False

    @property
    def checkpointer(self) -> Checkpointer:
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self.directory, max_to_keep=self.max_to_keep,
                                              asynchronous=self.asynchronous, on_damaged=self.on_damaged,
                                              keep_best=self.keep_best, best_metric=self.best_metric,
                                              best_mode=self.best_mode)
        return self._checkpointer

    def on_train_begin(self, trainer: Trainer) -> None:
        if self.restore and not self._restored_once:
            self._restored_once = True
            self.restored = trainer.restore_checkpoint(self.checkpointer)
        self.schedule.reset(trainer.step)
        self._deferred = None

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if self.schedule.due(logs.step):
            if self._waits_for_eval:
                self._deferred = logs.step
            else:
                trainer.save_checkpoint(self.checkpointer)

    def _save_deferred(self, trainer: Trainer) -> None:
        if self._deferred is not None and self._deferred == trainer.step:
            trainer.save_checkpoint(self.checkpointer)
        self._deferred = None

    def on_eval_end(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None:
        self._save_deferred(trainer)

    def on_data_wait_begin(self, trainer: Trainer, step: int) -> None:
        self._save_deferred(trainer)  # before the next batch is read: still the deferred step's state

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self._save_deferred(trainer)
        checkpointer = self.checkpointer
        checkpointer.wait()
        if trainer.step not in checkpointer.steps():
            trainer.save_checkpoint(checkpointer, forced=True, wait=True)
        self.close()

    def load_best(self, trainer: Trainer) -> RestoredCheckpoint | None:
        """Restores the best checkpoint by `best_metric` into `trainer` (None when no checkpoint
        carries a value of it); a checkpointer opened for this is closed again."""
        opened_here = self._checkpointer is None
        try:
            return trainer.restore_checkpoint(self.checkpointer, best=True)
        finally:
            if opened_here:
                self.close()

    def close(self) -> None:
        if self._checkpointer is not None:
            checkpointer, self._checkpointer = self._checkpointer, None
            checkpointer.close()
