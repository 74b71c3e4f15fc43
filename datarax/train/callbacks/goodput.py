"""GoodputMonitor: measures exposed device idle with a watcher thread and writes a stall report."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from datarax.monitoring.stages import reader_breakdown, since
from datarax.monitoring.watcher import ReadyWatcher
from datarax.train.callbacks.base import Callback, CheckpointInfo, Schedule, StepLogs
from datarax.train.metrics.goodput import GoodputLedger, eval_goodput
from datarax.train.metrics.goodput_history import RunHistory, cumulative

if TYPE_CHECKING:
    from datarax.train.loop.trainer import Trainer

MAX_STEPS_IN_JSON = 2000
REPORT = "goodput.json"


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


def report_text(report: dict) -> str:
    """The report's sentences, one per line: headline, training verdict, evaluation, across runs."""
    lines = [report.get("headline", ""), report.get("diagnosis", "")]
    lines.append((report.get("eval") or {}).get("verdict", ""))
    lines.append((report.get("guard") or {}).get("text", ""))
    cumulative_ = report.get("cumulative") or {}
    if cumulative_.get("runs", 0) > 1:
        lines.append(cumulative_["text"])
    return "\n".join(line for line in lines if line)


class GoodputMonitor(Callback):
    """Tracks goodput and data stalls per step; writes a JSON summary and a PNG timeline.

    Per call it records the host time blocked in next(), the exposed device idle before the step
    (previous result ready -> this step dispatched; a watcher thread waits on every step's output),
    the part of that idle spent waiting for data, the device step time and the compile time with its
    cause; per run the first-batch latency, checkpoint and evaluation time, and the background
    reader's time per part. `datarax.train.metrics.goodput` defines the terms. The monitor sees each
    step first (`order`): after a checkpoint save, its watcher would get the step only after the
    save, which would then look like device time. With a `directory` every run of the job is
    recorded in `goodput_history.json` while it trains (`datarax.train.metrics.goodput_history`). A
    run that trains no steps (a finished job run again) leaves the files as they were.

    Args:
        directory: where `goodput.json`, `goodput.png` and `goodput_history.json` go (None:
            nowhere, and no history across runs).
        window: calls (steps, or K steps each with `steps_per_execution`) in the rolling window.
        plot: write the PNG timeline (needs matplotlib).
        verbose: print the report's sentences at train end (stderr).
        history_every_steps / history_every_secs: how often the history is rewritten while
            training, besides the first step, every checkpoint save and the end (default every
            10 s): the steps a kill loses after the last record are not counted.

    Example:
        >>> monitor = GoodputMonitor("run/", plot=False)
        >>> monitor.window
        100
    """

    order = -1000  # first to see each step, so the watcher waits on it before any save starts

    def event_order(self, event: str) -> int:
        # ...and last to see the end, so the run's end comes after the final checkpoint save.
        return 1000 if event == "on_train_end" else self.order

    def __init__(self, directory: Any = None, *, window: int = 100, plot: bool = True, verbose: bool = True,
                 history_every_steps: int | None = None, history_every_secs: float | None = None):
        GoodputLedger(window)  # validates window
        if history_every_steps is None and history_every_secs is None:
            history_every_secs = 10.0
        self.history_schedule = Schedule(every_steps=history_every_steps, every_secs=history_every_secs)
        self.directory = None if directory is None else Path(directory)
        self.window = window
        self.plot = plot
        self.verbose = verbose
        self.ledger = GoodputLedger(window)
        self.eval_ledgers: list[GoodputLedger] = []
        self.history: RunHistory | None = None
        self._watcher: ReadyWatcher | None = None
        self._eval_watcher: ReadyWatcher | None = None
        self._run: float | None = None
        self._began_at = time.time()
        self._reader_before: list[dict] = []
        self._eval_reader: list[dict] = []
        self._eval_reader_before: list[dict] = []
        self.report: dict | None = None

    def _ensure_run(self, trainer: Trainer) -> None:
        """Starts a new ledger when a new `fit` began (events may reach us before on_train_begin)."""
        if self._run != trainer.fit_began_at:
            self.close()
            self._run = trainer.fit_began_at
            self.ledger = GoodputLedger(self.window)
            self.ledger.start(trainer.fit_began_at)
            self.eval_ledgers = []
            self._eval_reader = []
            self.report = None
            self.history = None
            self._began_at = time.time()
            self._reader_before = trainer.reader_timings()
            self._watcher = ReadyWatcher(self.ledger.set_ready, name="trainers-goodput-watcher")

    def on_train_begin(self, trainer: Trainer) -> None:
        self._ensure_run(trainer)

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self._ensure_run(trainer)
        index = self.ledger.add_step(logs.step, logs.batch_size, logs.data_wait[0], logs.data_wait[1],
                                     logs.dispatched_at, logs.compile_seconds, logs.compile_cause, logs.steps)
        self._watcher.submit(index, logs.output)
        if self.directory is not None:
            if self.history is None:
                # The first step: a restore (if any) is done, so this run's starting point is known.
                self.history = RunHistory(self.directory)
                self.history.begin(began_at=self._began_at, start_step=logs.step - logs.steps,
                                   resumed_from=trainer.resumed_from)
                self.history_schedule.reset(logs.step - logs.steps)
                self._record(trainer)
            elif self.history_schedule.due(logs.step):
                self._record(trainer)

    def _record(self, trainer: Trainer, *, checkpoint: int | None = None, finished: bool = False) -> None:
        if self.history is None:
            return
        _, last, busy = self.ledger.busy_so_far()
        self.history.update(last_step=max(trainer.step, last), wall_s=time.perf_counter() - self.ledger.begin,
                            busy_s=busy, checkpoint=checkpoint, finished=finished)

    def on_checkpoint_save(self, trainer: Trainer, info: CheckpointInfo) -> None:
        self._ensure_run(trainer)
        self.ledger.add_interval("checkpoint_save", info.began_at, info.began_at + info.seconds)
        self._record(trainer, checkpoint=info.step)

    def on_checkpoint_restore(self, trainer: Trainer, info: CheckpointInfo) -> None:
        self._ensure_run(trainer)
        self.ledger.add_interval("checkpoint_restore", info.began_at, info.began_at + info.seconds)

    def on_eval_begin(self, trainer: Trainer, step: int) -> None:
        self._ensure_run(trainer)
        ledger = GoodputLedger(self.window)
        ledger.start(time.perf_counter())
        self.eval_ledgers.append(ledger)
        self._eval_reader_before = trainer.eval_reader_timings()
        self._eval_watcher = ReadyWatcher(ledger.set_ready, name="trainers-goodput-eval-watcher")

    def on_eval_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if self._eval_watcher is None:
            return
        ledger = self.eval_ledgers[-1]
        index = ledger.add_step(logs.step, logs.batch_size, logs.data_wait[0], logs.data_wait[1],
                                logs.dispatched_at, logs.compile_seconds, logs.compile_cause)
        self._eval_watcher.submit(index, logs.output)

    def on_eval_end(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None:
        if self._eval_watcher is None:
            return
        watcher, self._eval_watcher = self._eval_watcher, None
        watcher.close()
        ledger = self.eval_ledgers[-1]
        ledger.finish(time.perf_counter())
        self.ledger.add_interval("eval", ledger.begin, ledger.end)
        self._eval_reader = _add_parts(self._eval_reader, since(trainer.eval_reader_timings(),
                                                                self._eval_reader_before))

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        self._ensure_run(trainer)
        self.close()
        self.ledger.finish(time.perf_counter())
        parts = since(trainer.reader_timings(), self._reader_before)
        self.ledger.reader = reader_breakdown(parts) if parts else None
        report = self.summary()
        if len(self.ledger) == 0:
            self.report = self._rerun_report(trainer, report)
        else:
            report["eval"] = eval_goodput(self.eval_ledgers, reader_breakdown(self._eval_reader)
                                          if self._eval_reader else None)
            guard = getattr(trainer, "guard", None)
            if guard is not None and guard.summary() is not None:  # skipped steps are counted, never hidden
                report["guard"] = {"skipped_steps": guard.skipped_count, "steps": list(guard.skipped),
                                   "incidents": list(guard.incidents), "text": guard.summary()}
            if self.history is not None:
                self._record(trainer, finished=True)
                report["cumulative"] = cumulative(self.history.all_segments())
            report["text"] = report_text(report)
            self.report = report
            if self.directory is not None:
                self.write(self.directory)
        if self.verbose:
            print("\n".join(f"[goodput] {line}" for line in self.report["text"].splitlines()), file=sys.stderr,
                  flush=True)

    def _rerun_report(self, trainer: Trainer, report: dict) -> dict:
        """This run trained nothing: keep the files, and say where the last real report is."""
        previous = None
        path = None if self.directory is None else self.directory / REPORT
        if path is not None and path.exists():
            try:
                previous = json.loads(path.read_text())
            except (OSError, ValueError):
                previous = None
        why = (f"this run trained no steps (it began at step {trainer.step}, the target)" if trainer.target_step
               is not None and trainer.step >= trainer.target_step else "this run trained no steps")
        if previous is not None and previous.get("steps"):
            note = (f"{why}; {path} keeps the report of the last run that trained ({previous['steps']} steps): "
                    f"{previous.get('diagnosis', '')}")
        else:
            note = f"{why}; there is no earlier report to keep"
        report.update(diagnosis=note, text=note, previous=previous)
        return report

    def close(self) -> None:
        for name in ("_watcher", "_eval_watcher"):
            watcher = getattr(self, name)
            if watcher is not None:
                setattr(self, name, None)
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
        paths = {"json": directory / REPORT}
        tmp = directory / f"{REPORT}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(_jsonable(summary), indent=1))
        os.replace(tmp, paths["json"])
        if self.plot:
            from datarax.train.metrics.timeline import plot_timeline

            paths["png"] = plot_timeline(self.ledger, directory / "goodput.png", summary=self.report)
        return paths


def _add_parts(total: list[dict], more: list[dict]) -> list[dict]:
    """Two reader breakdowns' parts added by name (first-seen order)."""
    out = {p["name"]: dict(p) for p in total}
    for part in more:
        if part["name"] in out:
            for key in ("seconds", "calls", "records"):
                out[part["name"]][key] += part[key]
        else:
            out[part["name"]] = dict(part)
    return list(out.values())
