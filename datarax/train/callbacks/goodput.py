"""GoodputMonitor: measures exposed device idle with a watcher thread and writes a stall report."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from datarax.monitoring.watcher import ReadyWatcher
from datarax.train.callbacks.base import Callback, CheckpointInfo, StepLogs
from datarax.train.goodput import GoodputLedger

if TYPE_CHECKING:
    from datarax.train.trainer import Trainer

MAX_STEPS_IN_JSON = 2000


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class GoodputMonitor(Callback):
    """Tracks goodput and data stalls per step; writes a JSON summary and a PNG timeline.

    Per step it records the host time blocked in next(), the exposed device idle before the
    step (previous result ready -> this step dispatched; a watcher thread waits on every step's
    output), the part of that idle spent waiting for data, the device step time and compile
    time; per run the first-batch latency and checkpoint save/restore and eval time. See
    `datarax.train.goodput` for the definitions and docs/trainers.md for an example report.

    Args:
        directory: where `goodput.json` and `goodput.png` go at train end (None: nowhere).
        window: steps in the rolling window.
        plot: write the PNG timeline (needs matplotlib).
        verbose: print the diagnosis line at train end.

    Example:
        >>> monitor = GoodputMonitor("run/")
        >>> Trainer(..., callbacks=[monitor]).fit(num_steps=1000)
        >>> monitor.summary()["diagnosis"]
        'compute-bound: exposed data stall 0.4%; ...'
    """

    order = -1000  # first to see each step, so the watcher waits on it before any save starts

    def event_order(self, event: str) -> int:
        # ...and last to see the end, so the run's end comes after the final checkpoint save.
        return 1000 if event == "on_train_end" else self.order

    def __init__(self, directory: Any = None, *, window: int = 100, plot: bool = True, verbose: bool = True):
        GoodputLedger(window)  # validates window
        self.directory = None if directory is None else Path(directory)
        self.window = window
        self.plot = plot
        self.verbose = verbose
        self.ledger = GoodputLedger(window)
        self._watcher: ReadyWatcher | None = None
        self._eval_began = 0.0
        self._run: float | None = None
        self.report: dict | None = None

    def _ensure_run(self, trainer: Trainer) -> None:
        """Starts a new ledger when a new `fit` began (events may reach us before on_train_begin)."""
        if self._run != trainer.fit_began_at:
            self.close()
            self._run = trainer.fit_began_at
            self.ledger = GoodputLedger(self.window)
            self.ledger.start(trainer.fit_began_at)
            self.report = None
            self._watcher = ReadyWatcher(self.ledger.set_ready, name="trainers-goodput-watcher")

    def on_train_begin(self, trainer: Trainer) -> None:
        self._ensure_run(trainer)

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self._ensure_run(trainer)
        index = self.ledger.add_step(logs.step, logs.batch_size, logs.data_wait[0], logs.data_wait[1],
                                     logs.dispatched_at, logs.compile_seconds)
        self._watcher.submit(index, logs.output)

    def on_checkpoint_save(self, trainer: Trainer, info: CheckpointInfo) -> None:
        self._ensure_run(trainer)
        self.ledger.add_interval("checkpoint_save", info.began_at, info.began_at + info.seconds)

    def on_checkpoint_restore(self, trainer: Trainer, info: CheckpointInfo) -> None:
        self._ensure_run(trainer)
        self.ledger.add_interval("checkpoint_restore", info.began_at, info.began_at + info.seconds)

    def on_eval_begin(self, trainer: Trainer, step: int) -> None:
        self._eval_began = time.perf_counter()

    def on_eval_end(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None:
        self._ensure_run(trainer)
        self.ledger.add_interval("eval", self._eval_began, time.perf_counter())

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self._ensure_run(trainer)
        self.close()
        self.ledger.finish(time.perf_counter())
        self.report = self.summary()
        if self.directory is not None:
            self.write(self.directory)
        if self.verbose:
            print(f"[goodput] {self.report['diagnosis']}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            watcher.close()

    def summary(self) -> dict:
        """The current summary (see `GoodputLedger.summary`); steps still in flight are left out."""
        return self.ledger.summary()

    def write(self, directory: Any) -> dict[str, Path]:
        """Writes `goodput.json` (and `goodput.png` when plotting) into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        summary = dict(self.report or self.summary())
        per_step = summary.pop("per_step", {})
        summary["per_step_last"] = {k: v[-MAX_STEPS_IN_JSON:] for k, v in per_step.items()}
        paths = {"json": directory / "goodput.json"}
        paths["json"].write_text(json.dumps(_jsonable(summary), indent=1))
        if self.plot:
            from datarax.train.timeline import plot_timeline

            paths["png"] = plot_timeline(self.ledger, directory / "goodput.png")
        return paths
