"""MetricLogger: writes train and eval metrics to console, JSONL, TensorBoard or CLU writers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from datarax.monitoring.writers import ConsoleWriter, MetricWriter, check_writer
from datarax.train.callbacks.base import Callback, Schedule, StepLogs

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer


class MetricLogger(Callback):
    """Writes `train/<name>` metrics on a schedule and `eval/<name>` after every evaluation.

    Train metrics are one call late (see `StepLogs`), so writing never waits for the device, and they
    are read from the device only when the schedule fires, so between writes the host runs ahead.
    With `Trainer(steps_per_execution=K)` the step written is the last of the call in which the
    schedule's step was crossed (a K dividing `every_steps` keeps it exact). The final step's metrics
    are always written at train end.

    Args:
        writers: objects with `write_scalars(step, scalars)`: `ConsoleWriter`, `JsonlWriter`,
            `TensorBoardWriter`, or a CLU `MetricWriter` (default: one ConsoleWriter).
        every_steps / every_secs / on_steps: when to write train metrics (default every 100 steps).

    Example:
        >>> from datarax.train import ConsoleWriter
        >>> logger = MetricLogger([ConsoleWriter()], every_steps=50)
    """

    order = 10  # after callbacks that add values to the logs (e.g. LearningRateLogger)

    def __init__(self, writers: Sequence[MetricWriter] | None = None, *, every_steps: int | None = None,
                 every_secs: float | None = None, on_steps: Sequence[int] = ()):
        writers = [ConsoleWriter()] if writers is None else list(writers)
        self.writers = [check_writer(w, f"writers[{i}]") for i, w in enumerate(writers)]
        if every_steps is None and every_secs is None and not on_steps:
            every_steps = 100
        self.schedule = Schedule(every_steps=every_steps, every_secs=every_secs, on_steps=on_steps)
        self._last_written: int | None = None

    def _write(self, step: int, scalars: dict[str, float]) -> None:
        for writer in self.writers:
            writer.write_scalars(step, scalars)

    def on_train_begin(self, trainer: Trainer) -> None:
        self.schedule.reset(trainer.step)
        self._last_written = None

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        # The schedule first: looking at the metrics reads them from the device.
        if logs.metrics_step is not None and self.schedule.due(logs.metrics_step) and logs.metrics:
            self._write(logs.metrics_step, {f"train/{k}": v for k, v in logs.metrics.items()})
            self._last_written = logs.metrics_step

    def on_eval_end(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None:
        self._write(step, {f"eval/{k}": v for k, v in metrics.items()})

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if logs.metrics and logs.metrics_step != self._last_written:
            self._write(logs.metrics_step, {f"train/{k}": v for k, v in logs.metrics.items()})
        for writer in self.writers:
            flush = getattr(writer, "flush", None)
            if flush is not None:
                flush()
